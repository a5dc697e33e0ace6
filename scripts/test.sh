#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/integration/property/differential/stress
# tests, and the loom models (built with --cfg loom in a separate target directory).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The `checked` profile: release optimizations with overflow checks and debug
# assertions on (see Cargo.toml).
cargo test --profile checked --workspace
cargo test --profile checked -p softmm --features shared-write-stats --test shared_writes
# Memory on demand (PhysConfig::on_demand) behaves as a prefaulted arena:
# the semantic tests again, their arenas reserved instead of prefaulted.
SOFTMM_ON_DEMAND=1 cargo test --profile checked -p softmm --test semantics --test access_remote --test hardening
# loom: the library's unit tests built with --cfg loom, where the whole crate
# runs on loom's atomics and locks (crate::sync) and crossbeam-epoch on its own
# loom support (--cfg crossbeam_loom); the only tests are the `loom_tests`
# modules: sync's primitives, tlb's shootdown, and fault's models of the real
# fault handler against real munmap and mprotect calls, and migrate's models of
# move_pages against a lock-free fault, munmap, two CPUs of a page shared by fork
# (the batched flush over two address spaces), and writes to a page-cache page;
# host_file's model of writeback against a Cpu's store.
RUSTFLAGS="--cfg loom --cfg crossbeam_loom" CARGO_TARGET_DIR=target/loom cargo test --release -p softmm --lib
# Miri on the library's unit tests (arena, page tables, shootdown, sync
# primitives, copies), where the nightly Miri component is installed.
if cargo +nightly miri --version >/dev/null 2>&1; then
  MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks" \
    cargo +nightly miri test -p softmm --lib
else
  echo "miri: nightly component not installed, skipped"
fi
