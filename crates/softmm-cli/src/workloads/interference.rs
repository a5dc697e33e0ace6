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

use std::sync::atomic::{AtomicBool, Ordering};

use super::space::Space;
use super::{pft, Measured, Params, SoftEnv};

/// The interfering thread: a thread of the address space (the harness gives
/// it a parked CPU, so the address space counts as multithreaded) that only
/// maps and unmaps.
pub fn mapper<S: Space>(s: &S, stop: &AtomicBool, size: u64) -> Result<u64, i32> {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let a = s.mmap(0, size, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None, 0)?;
        s.munmap(a, size)?;
        n += 1;
    }
    Ok(n)
}

pub fn run(env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    pft::run_passes(env, p, p.mode == "interfered")
}
