//! softmm's semantics, one module per theme: the mapping calls and their
//! errnos, files, accessors and the emulator, remote access, memory
//! policies, pinning, migration, hugetlb, the hardening regressions, the
//! layering rules, and the comparisons with the host kernel that run in this
//! process or a forked child (instruction fetches, fork, pinning through
//! io_uring, the host's huge page pool).
//!
//! One binary (one link) for all of them. What they share in this process:
//! the host's huge page pool, reserved through `softmm-hostsys`, whose lock
//! serializes the reservations of every thread and process; `execute`
//! installs its signal handlers in a forked child only. `SOFTMM_ON_DEMAND`
//! (read by `softmm_testkit::common::phys` at each call) reruns the
//! modules that use it on memory on demand (`scripts/test.sh`).

mod access_remote;
mod accessors;
mod alloc_watch;
mod big_munmap;
mod compat32;
mod emulator;
mod emulator_hooks;
mod execute;
mod file_errnos;
mod fork_host;
mod get_mempolicy;
mod hardening;
mod host_file;
mod host_file_shared;
mod host_mem;
mod hugetlb;
mod hugetlb_fork_share;
mod hugetlb_migrate;
mod hugetlb_pin;
mod hugetlb_share;
mod layering;
mod lock_seal;
mod lock_seal_host;
mod madvise_policies;
mod maps_names;
mod mempolicy;
mod migrate;
mod mmio;
mod on_demand;
mod pin;
mod pin_host;
mod placement;
mod semantics;
mod split_atomics;
mod watch_targets;
mod watchpoints;
