//! `interference`: pft's N faulting threads (each pass: the slices are
//! mapped untimed, every thread writes one byte per page of its own slice,
//! timed, the mapping is removed untimed), either alone (`alone`) or while
//! one more thread of the same address space loops mmap/munmap of an
//! unrelated `size`-byte region (`interfered`; seed 001's will-it-scale mmap
//! remark). The region is mapped read-only so that it never merges with the
//! faulters' read-write mapping: the faulters see the writer's `mmap_lock`
//! traffic, not changes of their own VMA. Operations are pages faulted by
//! the faulters; the table gives the interfered throughput relative to the
//! one alone.

use super::{pft, Measured, Params, SoftEnv};

/// Runs pft's passes, with [`pft::mapper`] beside them in `interfered` mode.
pub fn run(env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    pft::run_passes(env, p, p.mode == "interfered")
}
