//! The system calls of an address space, one file per family, each an
//! `impl AddressSpace` block over the core in `mm/` (as Asterinas's
//! `vmar_impls/` over its `Vmar`): `mmap` (`mmap.rs`), `mprotect`,
//! `mremap`, `madvise` (and `MADV_GUARD_*`), `brk`, `mincore`, `msync`,
//! the NUMA policy calls (`set_mempolicy`, `mbind`, `migrate_pages(2)`,
//! `get_mempolicy`: `mempolicy.rs`), `move_pages`, `fork`, the
//! `/proc/pid/maps` view (`maps.rs`) and forced remote access
//! (`access_remote.rs`: `access_remote_vm`, `/proc/pid/mem`). `munmap`
//! with its policies (`munmap.rs`, seed 002) over the core's detach, zap
//! and reservation.
//!
//! A system call takes `mmap_lock` (or runs lock-free where its policy
//! says), checks its arguments as Linux does before changing anything, and
//! calls the core's page-table-level operations (zap, change_protection,
//! move_ptes, split) and the features (`fault`, `gup`, `hugetlb`,
//! `migrate`, `pin`) below it.

mod access_remote;
mod brk;
mod fork;
#[cfg(all(test, loom))]
mod loom_tests;
mod madvise;
mod maps;
mod mdwe;
mod mempolicy;
mod mincore;
mod mlock;
mod mmap;
// `mmap_host` is `unsafe` at the API boundary: the caller vouches for its memory.
#[allow(unsafe_code)]
mod mmap_host;
mod mmio;
mod move_pages;
mod mprotect;
mod mremap;
mod mseal;
mod msync;
mod munmap;
#[cfg(all(test, not(loom)))]
mod publish_tests;
mod watch;

pub use maps::MapEntry;

/// `addr + PAGE_ALIGN(len)`, the end of the range `madvise` and `mseal`
/// act on: `EINVAL` if the length rounds up past 2^64 or the range wraps
/// (Linux's `len && !PAGE_ALIGN(len)` and `end < start` checks).
fn aligned_end(addr: u64, len: u64) -> crate::error::Result<u64> {
    let alen = crate::page_align(len);
    if len != 0 && alen == 0 {
        return Err(crate::error::Errno::Inval);
    }
    addr.checked_add(alen).ok_or(crate::error::Errno::Inval)
}
