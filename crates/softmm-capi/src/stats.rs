//! Statistics, flattened into size-versioned structs: an address space's
//! (`softmm_mm_stats`, its TLB shootdowns and unmaps included), a CPU's
//! (`softmm_cpu_stats`: faults and TLB), an arena's (`softmm_meminfo`:
//! frames, commit accounting, the huge page pool) and a NUMA node's
//! (`softmm_node_stats`). The caller sets `size` to `sizeof` the struct
//! before the call, which fills it as `crate::sized::write_sized` says.

use crate::cpu::owned;
use crate::sized::{write_sized, SizedStruct};
use crate::{guard, softmm_cpu, softmm_mm, softmm_phys};

/// An address space's counters (Rust: `AddressSpace::stats`). Counters
/// only grow; the page counts are the current ones.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct softmm_mm_stats {
    /// Set by the caller to `sizeof(softmm_mm_stats)`; the call stores the
    /// bytes it wrote.
    pub size: u32,
    /// Always 0.
    pub reserved: u32,
    /// VMAs (`map_count`).
    pub map_count: u64,
    /// Resident pages, the zero page included (`VmRSS` in pages).
    pub rss_pages: u64,
    /// 4 KiB pages mapped by hugetlb mappings (`HugetlbPages`; not in
    /// `rss_pages`, as in Linux).
    pub hugetlb_pages: u64,
    /// Pages charged to long-term pins (`VmPin` in pages).
    pub pinned_vm: u64,
    /// `mmap_lock` taken for write.
    pub mmap_lock_write: u64,
    /// `mmap_lock` taken for read outside CPUs' faults.
    pub mmap_lock_read: u64,
    /// Pages `move_pages`, `mbind` and `migrate_pages` moved.
    pub pages_migrated: u64,
    /// PTE locks those migrations took.
    pub migrate_ptl_locks: u64,
    /// hugetlb faults that mapped a huge page.
    pub hugetlb_faults: u64,
    /// TLB flushes initiated.
    pub tlb_flushes: u64,
    /// Flush requests sent to other threads' CPUs (Linux's IPIs).
    pub tlb_flush_requests: u64,
    /// Requests that waited for a CPU inside an access.
    pub tlb_flush_waits: u64,
    /// Process-wide barriers (`membarrier`) issued by flushes.
    pub tlb_barriers: u64,
    /// Nanoseconds initiators waited for CPUs inside an access.
    pub tlb_flush_wait_ns: u64,
    /// Unmaps (`munmap`, `mremap` and `brk` shrinks).
    pub unmap_unmaps: u64,
    /// Nanoseconds in them.
    pub unmap_total_ns: u64,
    /// Nanoseconds they held `mmap_lock` for write.
    pub unmap_write_hold_ns: u64,
    /// Nanoseconds they held it for read.
    pub unmap_read_hold_ns: u64,
    /// Nanoseconds they waited to take it for write again.
    pub unmap_lock_wait_ns: u64,
    /// Nanoseconds clearing page-table entries.
    pub unmap_zap_ns: u64,
    /// Nanoseconds detaching page tables.
    pub unmap_pgtable_ns: u64,
    /// TLB shootdowns of their gathers.
    pub unmap_flushes: u64,
    /// Nanoseconds in those shootdowns.
    pub unmap_flush_ns: u64,
    /// Of those, nanoseconds waiting for other threads' CPUs.
    pub unmap_flush_wait_ns: u64,
    /// Nanoseconds freeing frames after the flushes.
    pub unmap_free_ns: u64,
    /// Frames freed.
    pub unmap_frames: u64,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_mm_stats {
    /// The whole struct of 0.1.1.
    const MIN_SIZE: usize = std::mem::size_of::<softmm_mm_stats>();
}

/// A CPU's counters (Rust: `Cpu::stats`): the faults its accesses raised
/// and its TLB's misses and flushes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct softmm_cpu_stats {
    /// Set by the caller to `sizeof(softmm_cpu_stats)`; the call stores the
    /// bytes it wrote.
    pub size: u32,
    /// Always 0.
    pub reserved: u32,
    /// Page faults handled.
    pub faults: u64,
    /// Of those, attempts without `mmap_lock` (per-VMA or speculative).
    pub fault_lockless_attempts: u64,
    /// Lock-free attempts that completed.
    pub fault_lockless_successes: u64,
    /// Lock-free attempts that fell back to `mmap_lock`.
    pub fault_fallbacks: u64,
    /// `mmap_lock` read acquisitions by faults.
    pub fault_mmap_lock_acquisitions: u64,
    /// TLB misses (page-table walks).
    pub tlb_misses: u64,
    /// Full TLB flushes done on shootdowns.
    pub tlb_flushes: u64,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_cpu_stats {
    /// The whole struct of 0.1.1.
    const MIN_SIZE: usize = std::mem::size_of::<softmm_cpu_stats>();
}

/// An arena's memory, as `/proc/meminfo` shows a machine's (Rust:
/// `PhysMem::stats`, `committed_pages`, `overcommit().commit_limit()`,
/// `huge_page_stats`). Counts in 4 KiB frames unless named otherwise.
/// Frames whose free waits for a grace period still count as used
/// (`softmm_phys_get_stats` runs those frees first).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct softmm_meminfo {
    /// Set by the caller to `sizeof(softmm_meminfo)`; the call stores the
    /// bytes it wrote.
    pub size: u32,
    /// NUMA nodes of the arena.
    pub nodes: u32,
    /// Frames in the arena, the shared zero page included (`MemTotal`).
    pub frames_total: u64,
    /// Frames allocated, the zero page and the huge page pool not counted.
    pub frames_used: u64,
    /// Page-table pages (`PageTables`).
    pub page_tables: u64,
    /// VMAs alive in all the arena's address spaces.
    pub vmas: u64,
    /// Reverse-map entries ((file, address space) pairs).
    pub rmap_entries: u64,
    /// Host memory backing the arena now, in bytes (all of it unless the
    /// arena is on demand).
    pub host_resident_bytes: u64,
    /// Pages committed by private writable mappings (`Committed_AS`).
    pub committed_pages: u64,
    /// The commit limit under `OVERCOMMIT_NEVER` (`CommitLimit`).
    pub commit_limit_pages: u64,
    /// Huge pages in the pool (`HugePages_Total`).
    pub hugepages_total: u64,
    /// Of those, free ones, reserved ones included (`HugePages_Free`).
    pub hugepages_free: u64,
    /// Reserved for mappings but not yet faulted in (`HugePages_Rsvd`).
    pub hugepages_rsvd: u64,
    /// Surplus huge pages (`HugePages_Surp`; always 0).
    pub hugepages_surp: u64,
    /// Huge pages the pool handed out since the arena was made.
    pub hugepages_allocations: u64,
    /// Huge page allocations refused (no unreserved page free).
    pub hugepages_alloc_failures: u64,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_meminfo {
    /// The whole struct of 0.1.1.
    const MIN_SIZE: usize = std::mem::size_of::<softmm_meminfo>();
}

/// One NUMA node of an arena (Rust: `PhysMem::node_stats`,
/// `huge_page_node_stats`; Linux's `/sys/devices/system/node/nodeN`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct softmm_node_stats {
    /// Set by the caller to `sizeof(softmm_node_stats)`; the call stores
    /// the bytes it wrote.
    pub size: u32,
    /// Always 0.
    pub reserved: u32,
    /// Frames of the node, the zero page left out.
    pub frames_total: u64,
    /// Frames free on the node.
    pub frames_free: u64,
    /// Huge pages carved out of the node (`nr_hugepages` of the node).
    pub hugepages_total: u64,
    /// Of those, free ones (`free_hugepages` of the node).
    pub hugepages_free: u64,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_node_stats {
    /// The whole struct of 0.1.1.
    const MIN_SIZE: usize = std::mem::size_of::<softmm_node_stats>();
}

/// Fills `out` with the address space's counters. `-EINVAL` for a `NULL`
/// handle or `out`, or an `out->size` below the first version's.
///
/// # Safety
///
/// `mm` is null or a live handle; `out` is null or valid for reads and
/// writes of its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_get_stats(mm: *const softmm_mm, out: *mut softmm_mm_stats) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -libc::EINVAL };
        let mm = &mm.inner;
        let s = mm.stats();
        let (t, u) = (s.tlb, s.unmap);
        let v = softmm_mm_stats {
            size: 0,
            reserved: 0,
            map_count: s.map_count as u64,
            rss_pages: s.rss_pages,
            hugetlb_pages: s.hugetlb_pages,
            pinned_vm: mm.pinned_vm(),
            mmap_lock_write: s.mmap_lock_write,
            mmap_lock_read: s.mmap_lock_read,
            pages_migrated: s.pages_migrated,
            migrate_ptl_locks: s.migrate_ptl_locks,
            hugetlb_faults: s.hugetlb_faults,
            tlb_flushes: t.flushes,
            tlb_flush_requests: t.flush_requests,
            tlb_flush_waits: t.flush_waits,
            tlb_barriers: t.barriers,
            tlb_flush_wait_ns: t.flush_wait_ns,
            unmap_unmaps: u.unmaps,
            unmap_total_ns: u.total_ns,
            unmap_write_hold_ns: u.write_hold_ns,
            unmap_read_hold_ns: u.read_hold_ns,
            unmap_lock_wait_ns: u.lock_wait_ns,
            unmap_zap_ns: u.zap_ns,
            unmap_pgtable_ns: u.pgtable_ns,
            unmap_flushes: u.flushes,
            unmap_flush_ns: u.flush_ns,
            unmap_flush_wait_ns: u.flush_wait_ns,
            unmap_free_ns: u.free_ns,
            unmap_frames: u.frames,
        };
        // SAFETY: null or valid for its size (the caller's contract).
        unsafe { write_sized(out, v) }
    })
}

/// Fills `out` with the CPU's counters. Like every `softmm_cpu_*` call,
/// only from the CPU's thread (`-EPERM`) and not while a section is open
/// on it (`-EBUSY`); `-EINVAL` for a `NULL` handle or `out`, or an
/// `out->size` below the first version's.
///
/// # Safety
///
/// `cpu` is null or a live handle; `out` is null or valid for reads and
/// writes of its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_get_stats(cpu: *mut softmm_cpu, out: *mut softmm_cpu_stats) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let c = match unsafe { owned(cpu) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        let s = c.cpu.stats();
        let f = s.fault;
        let v = softmm_cpu_stats {
            size: 0,
            reserved: 0,
            faults: f.faults,
            fault_lockless_attempts: f.spec_attempts,
            fault_lockless_successes: f.spec_successes,
            fault_fallbacks: f.fallbacks,
            fault_mmap_lock_acquisitions: f.mmap_lock_acquisitions,
            tlb_misses: s.tlb_misses,
            tlb_flushes: s.tlb_flushes,
        };
        // SAFETY: null or valid for its size (the caller's contract).
        unsafe { write_sized(out, v) }
    })
}

/// Fills `out` with the arena's memory counts. `-EINVAL` for a `NULL`
/// handle or `out`, or an `out->size` below the first version's.
///
/// # Safety
///
/// `phys` is null or a live handle; `out` is null or valid for reads and
/// writes of its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_get_meminfo(phys: *const softmm_phys, out: *mut softmm_meminfo) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        let p = &phys.inner;
        let s = p.stats();
        let h = p.huge_page_stats();
        let v = softmm_meminfo {
            size: 0,
            nodes: p.nodes() as u32,
            frames_total: s.frames_total,
            frames_used: s.frames_used,
            page_tables: s.page_tables,
            vmas: s.vmas,
            rmap_entries: s.rmap_entries,
            host_resident_bytes: p.host_resident_bytes(),
            committed_pages: p.committed_pages(),
            commit_limit_pages: p.overcommit().commit_limit(),
            hugepages_total: h.total,
            hugepages_free: h.free,
            hugepages_rsvd: h.rsvd,
            hugepages_surp: h.surp,
            hugepages_allocations: h.allocations,
            hugepages_alloc_failures: h.alloc_failures,
        };
        // SAFETY: null or valid for its size (the caller's contract).
        unsafe { write_sized(out, v) }
    })
}

/// Fills `out` with node `node`'s counts. `-ENODEV` for a node the arena
/// does not have (as `move_pages` for such a node); `-EINVAL` for a `NULL`
/// handle or `out`, or an `out->size` below the first version's.
///
/// # Safety
///
/// `phys` is null or a live handle; `out` is null or valid for reads and
/// writes of its `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_get_node_stats(
    phys: *const softmm_phys,
    node: u32,
    out: *mut softmm_node_stats,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        if out.is_null() {
            return -libc::EINVAL;
        }
        let p = &phys.inner;
        let node = node as usize;
        let Some(n) = p.node_stats().get(node).copied() else { return -libc::ENODEV };
        // An arena without a pool may list no node of it.
        let h = p.huge_page_node_stats().get(node).copied().unwrap_or_default();
        let v = softmm_node_stats {
            size: 0,
            reserved: 0,
            frames_total: n.frames_total,
            frames_free: n.frames_free,
            hugepages_total: h.total,
            hugepages_free: h.free,
        };
        // SAFETY: null or valid for its size (the caller's contract).
        unsafe { write_sized(out, v) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        softmm_cpu_free, softmm_cpu_new, softmm_cpu_write_uint, softmm_mm_free, softmm_mm_new, softmm_mmap,
        softmm_phys_free, softmm_phys_new,
    };

    fn sized<T: SizedStruct + Default>() -> T {
        let mut v = T::default();
        // SAFETY: every implementer starts with its `u32` size.
        unsafe { (&raw mut v).cast::<u32>().write(std::mem::size_of::<T>() as u32) };
        v
    }

    #[test]
    fn each_stats_struct_reports_its_counters() {
        let (mut phys, mut mm, mut cpu) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid outputs; handles live until freed below.
        unsafe {
            assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            assert_eq!(softmm_cpu_new(mm, &mut cpu), 0);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let a = softmm_mmap(mm, 0, 8192, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, std::ptr::null(), 0) as u64;
            assert_eq!(softmm_cpu_write_uint(cpu, a, 8, 1, std::ptr::null_mut()), 0);

            let mut c: softmm_cpu_stats = sized();
            assert_eq!(softmm_cpu_get_stats(cpu, &mut c), 0);
            assert_eq!((c.faults, c.size as usize), (1, std::mem::size_of::<softmm_cpu_stats>()));
            assert!(c.tlb_misses >= 1);
            let cpu_addr = cpu as usize;
            let other = std::thread::spawn(move || {
                let mut c: softmm_cpu_stats = sized();
                // The handle is live; the call refuses this thread.
                softmm_cpu_get_stats(cpu_addr as *mut softmm_cpu, &mut c)
            });
            assert_eq!(other.join().unwrap(), -libc::EPERM);

            let mut m: softmm_mm_stats = sized();
            assert_eq!(softmm_mm_get_stats(mm, &mut m), 0);
            assert_eq!((m.map_count, m.rss_pages), (1, 1));
            m.size = 8;
            assert_eq!(softmm_mm_get_stats(mm, &mut m), -libc::EINVAL, "smaller than the first version");
            assert_eq!(softmm_mm_get_stats(mm, std::ptr::null_mut()), -libc::EINVAL);

            let mut i: softmm_meminfo = sized();
            assert_eq!(softmm_phys_get_meminfo(phys, &mut i), 0);
            assert_eq!((i.nodes, i.frames_total, i.frames_used), (1, 256, 1));
            assert_eq!(i.committed_pages, 2, "the private writable mapping");
            assert_eq!(softmm_phys_get_meminfo(std::ptr::null(), &mut i), -libc::EINVAL);

            let mut n: softmm_node_stats = sized();
            assert_eq!(softmm_phys_get_node_stats(phys, 0, &mut n), 0);
            assert_eq!(n.frames_total - n.frames_free, 1);
            assert_eq!(softmm_phys_get_node_stats(phys, 1, &mut n), -libc::ENODEV);

            assert_eq!(softmm_cpu_free(cpu), 0);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
    }
}
