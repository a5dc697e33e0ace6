#!/usr/bin/env bash
# The inline TLB ABI's micro-benchmark: builds the C library (release) and
# crates/softmm-capi/benches/c_tlb.c against it, runs it (native load,
# inline hit, a C API call per access), then the Rust accessor's twin
# (crates/softmm-capi/examples/tlb_hit.rs) with the same loops, so that
# one run of this script gives all the rows. CC picks the compiler.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
crate=$root/crates/softmm-capi
cargo build --release -p softmm-capi --lib --example tlb_hit --manifest-path "$root/Cargo.toml"
exe=$target/release/c-tlb-bench
${CC:-cc} -O2 -std=c11 -Wall -Wextra -Werror -pthread -I"$crate/include" "$crate/benches/c_tlb.c" \
  "$target/release/libsoftmm_capi.a" -ldl -lm -o "$exe"
"$exe"
"$target/release/examples/tlb_hit"
