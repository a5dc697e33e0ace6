//! Configuration from C: `softmm_phys_config` for an arena (size, NUMA
//! nodes, memory on demand) and `softmm_mm_config` for an address space
//! (fault, unmap, pin, migrate, shootdown, hugetlb, atomic-alignment and
//! other policies by name, layout, limits and capabilities). Each struct starts with its own
//! `size`, which its `*_default` function sets: a struct from an older
//! header (a smaller `size`) gets the defaults of the fields it lacks, one
//! from a newer header is accepted if the fields this library does not
//! know are zero (`-E2BIG` otherwise), as Linux's `copy_struct_from_user`
//! (`crate::sized`).

use std::ffi::{c_char, CStr};

use softmm::{
    AddressSpace, AtomicAlignment, FaultPolicy, HostFileCoherence, HugetlbPolicy, MadvisePolicy, MigratePolicy,
    MmConfig, PhysConfig, PhysMem, PinPolicy, PlacementPolicy, PostingPolicy, ShootdownPolicy, ShootdownTargets,
    UnmapPolicy, WriterPolicy,
};

use crate::sized::{read_sized, SizedStruct};
use crate::{guard, neg, put, softmm_mm, softmm_phys};

/// How to build an arena. Fill it with `softmm_phys_config_default`, then
/// change the fields wanted.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct softmm_phys_config {
    /// `sizeof(softmm_phys_config)`, set by `softmm_phys_config_default`.
    pub size: u32,
    /// NUMA nodes the frames are split into (1 to 1024; default 1).
    pub nodes: u32,
    /// Arena size in bytes, rounded up to whole frames per node (default
    /// 256 MiB).
    pub bytes: u64,
    /// Nonzero: memory on demand. The arena is only reserved, the host
    /// backs frames when they are first used and takes freed ones back;
    /// a guest can then overcommit the host. Zero (the default): the arena
    /// is backed at once, and `-ENOMEM` if the host cannot.
    pub on_demand: i32,
    /// Huge (2 MiB) pages set aside per node for hugetlb mappings and
    /// hugetlbfs files (`vm.nr_hugepages` spread over the nodes; default 0).
    /// They are carved out of the arena, whose `bytes` must hold them.
    /// Added in 0.1.1 (a struct without it has 0).
    pub hugepages: u64,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers only.
unsafe impl SizedStruct for softmm_phys_config {
    /// Up to `on_demand` (0.1.0).
    const MIN_SIZE: usize = 24;
    const OLDER: &'static [usize] = &[24];
}

/// How to build an address space. Fill it with `softmm_mm_config_default`,
/// then change the fields wanted; a policy left `NULL` is the default.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct softmm_mm_config {
    /// `sizeof(softmm_mm_config)`, set by `softmm_mm_config_default`.
    pub size: u32,
    /// Nonzero: align anonymous mappings whose length is a multiple of
    /// 2 MiB to 2 MiB (Linux 6.7+ with THP; default 1).
    pub thp_align: i32,
    /// How page faults synchronize with mapping changes: "mmap-lock",
    /// "speculative", "per-vma" or "per-vma-seq" (the default, `NULL`).
    pub fault_policy: *const c_char,
    /// How large unmaps synchronize: "locked", "sectioned", "downgrade" or
    /// "lock-free"; `NULL` for the default.
    pub unmap_policy: *const c_char,
    /// How page pinning synchronizes: "per-page", "batched" or "per-vma";
    /// `NULL` for the default.
    pub pin_policy: *const c_char,
    /// One past the highest user address (`TASK_SIZE`, default 2^47 - 4096).
    pub task_size: u64,
    /// Top of the top-down mmap area (`mm->mmap_base`).
    pub mmap_base: u64,
    /// `vm.mmap_min_addr` (default 4096).
    pub mmap_min_addr: u64,
    /// Start of the brk heap (`mm->start_brk`).
    pub start_brk: u64,
    /// `RLIMIT_STACK`: how far a growsdown VMA may grow (default 8 MiB).
    pub stack_limit: u64,
    /// `RLIMIT_MEMLOCK` in bytes (default 8 MiB; `UINT64_MAX` is infinity).
    pub memlock_limit: u64,
    /// `vm.max_map_count` (default 65530).
    pub max_map_count: u64,
    /// Pages mapped around a file read fault (default 16).
    pub fault_around_pages: u64,
    // Added in 0.1.1: a struct from an older header has the defaults.
    /// How page migration batches its TLB flushes: "one-by-one" or
    /// "batched"; `NULL` for the default.
    pub migrate_policy: *const c_char,
    /// Which CPUs a TLB shootdown waits for: "access-sections" or
    /// "next-access"; `NULL` for the default.
    pub shootdown_policy: *const c_char,
    /// How hugetlb faults synchronize with PMD unsharing and truncate:
    /// "i-mmap-rwsem", "vma-lock" or "lock-free"; `NULL` for the default.
    pub hugetlb_policy: *const c_char,
    /// `stack_guard_gap`: the gap kept below a growsdown stack (default
    /// 256 pages).
    pub stack_guard_gap: u64,
    /// `CONFIG_LSM_MMAP_MIN_ADDR` (default 0): the effective minimum of
    /// hints, searches and stack growth is the larger of it and
    /// `mmap_min_addr`.
    pub lsm_mmap_min_addr: u64,
    /// Nonzero: the process has `CAP_IPC_LOCK` (locks and long-term pins
    /// without `memlock_limit`; default 0).
    pub cap_ipc_lock: i32,
    /// Nonzero: the process has `CAP_SYS_NICE` (`MPOL_MF_MOVE_ALL`, moving
    /// shared pages; default 0).
    pub cap_sys_nice: i32,
    // Added in 0.2.0: a struct from an older header has the defaults.
    /// Which CPUs a shootdown asks: "broadcast", "fill-owners" or
    /// "fill-owners-ranges"; `NULL` for the default.
    pub shootdown_targets: *const c_char,
    /// How a shootdown posts its requests: "locked", "lock-free",
    /// "shared-barrier" or "adaptive"; `NULL` for the default.
    pub posting_policy: *const c_char,
    /// Whether `MADV_DONTNEED`/`MADV_FREE` take `mmap_lock`: "mmap-lock"
    /// or "per-vma"; `NULL` for the default.
    pub madvise_policy: *const c_char,
    /// How `mmap`/`munmap` serialize: "reserve", "short", "short-spin",
    /// "short-collect", "short-own-rcu" (who frees a writer's old VMAs) or
    /// "range" (range-parallel writers); `NULL` for the default.
    pub writer_policy: *const c_char,
    /// Where a non-fixed `mmap` places a mapping: "linux" or "arenas";
    /// `NULL` for the default.
    pub placement_policy: *const c_char,
    // Added in 0.2.2: a struct from an older header has the default.
    /// What a `MAP_SHARED` mapping of a host file is: "shared" (the
    /// host's own shared mapping, as Linux's: both sides see each other's
    /// writes at once, `SIGBUS` past the host's end of file; the
    /// default) or "cache" (softmm's page cache, written back at
    /// `msync`); `NULL` for the default.
    pub host_file_coherence: *const c_char,
    // Added in 0.2.3: a struct from an older header has the default.
    /// What an atomic that is not naturally aligned does: "strict"
    /// (`SIGBUS`/`BUS_ADRALN`, as aarch64; the default) or "split" (made,
    /// as x86's split locks: atomic against every access inside one
    /// 8-byte word, against other split atomics across words or pages);
    /// `NULL` for the default.
    pub atomic_alignment: *const c_char,
}

// SAFETY: `repr(C)`, starts with its `u32` size, integers and raw
// pointers only.
unsafe impl SizedStruct for softmm_mm_config {
    /// Up to `fault_around_pages` (0.1.0).
    const MIN_SIZE: usize = 96;
    /// 0.1.0, then up to `cap_sys_nice` (0.1.1), `placement_policy`
    /// (0.2.0), `host_file_coherence` (0.2.2).
    const OLDER: &'static [usize] = &[96, 144, 184, 192];
}

/// Fills `out` with the defaults of `softmm_phys_new` (and sets its `size`).
///
/// # Safety
///
/// `out` is null or valid for a write of a `softmm_phys_config`.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_config_default(out: *mut softmm_phys_config) -> i32 {
    guard(|| {
        // SAFETY: null or valid (the caller's contract).
        unsafe { put(out, phys_config_default()) }
    })
}

/// The defaults of `softmm_phys_new`, its `size` set.
fn phys_config_default() -> softmm_phys_config {
    let d = PhysConfig::default();
    softmm_phys_config {
        size: std::mem::size_of::<softmm_phys_config>() as u32,
        nodes: d.nodes as u32,
        bytes: d.bytes,
        on_demand: i32::from(d.on_demand),
        hugepages: d.hugepages,
    }
}

/// Makes an arena as `config` says. `-EINVAL` for a `config` whose `size`
/// is not one a `softmm_phys_config_default` ever set, or a configuration
/// `PhysMem::new` refuses (no nodes, too many, fewer than two frames a
/// node, more huge pages than the nodes hold); `-E2BIG` for a struct from
/// a newer header whose new fields are not zero; `-ENOMEM` if the host
/// cannot back (or, on demand, reserve) it.
///
/// # Safety
///
/// `config` is null or valid for reads of its `size` bytes; `out` is null
/// or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_new_config(config: *const softmm_phys_config, out: *mut *mut softmm_phys) -> i32 {
    guard(|| {
        // SAFETY: null or valid for its size (the caller's contract).
        let c = match unsafe { read_sized(config, phys_config_default()) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if out.is_null() {
            return -libc::EINVAL;
        }
        let config =
            PhysConfig::new(c.bytes).nodes(c.nodes as usize).on_demand(c.on_demand != 0).hugepages(c.hugepages);
        match PhysMem::new(config) {
            // SAFETY: `out` is not null and valid (the caller's contract).
            Ok(inner) => unsafe { put(out, Box::into_raw(Box::new(softmm_phys { inner }))) },
            Err(e) => neg(e),
        }
    })
}

/// Fills `out` with the defaults of `softmm_mm_new` (policies `NULL`).
///
/// # Safety
///
/// `out` is null or valid for a write of a `softmm_mm_config`.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_config_default(out: *mut softmm_mm_config) -> i32 {
    guard(|| {
        // SAFETY: null or valid (the caller's contract).
        unsafe { put(out, mm_config_default()) }
    })
}

/// The defaults of `softmm_mm_new` (policies `NULL`), its `size` set.
pub(crate) fn mm_config_default() -> softmm_mm_config {
    let d = MmConfig::default();
    softmm_mm_config {
        size: std::mem::size_of::<softmm_mm_config>() as u32,
        thp_align: i32::from(d.thp_align),
        fault_policy: std::ptr::null(),
        unmap_policy: std::ptr::null(),
        pin_policy: std::ptr::null(),
        task_size: d.task_size,
        mmap_base: d.mmap_base,
        mmap_min_addr: d.mmap_min_addr,
        start_brk: d.start_brk,
        stack_limit: d.stack_limit,
        memlock_limit: d.memlock_limit,
        max_map_count: d.max_map_count as u64,
        fault_around_pages: d.fault_around_pages,
        migrate_policy: std::ptr::null(),
        shootdown_policy: std::ptr::null(),
        hugetlb_policy: std::ptr::null(),
        stack_guard_gap: d.stack_guard_gap,
        lsm_mmap_min_addr: d.lsm_mmap_min_addr,
        cap_ipc_lock: i32::from(d.cap_ipc_lock),
        cap_sys_nice: i32::from(d.cap_sys_nice),
        shootdown_targets: std::ptr::null(),
        posting_policy: std::ptr::null(),
        madvise_policy: std::ptr::null(),
        writer_policy: std::ptr::null(),
        placement_policy: std::ptr::null(),
        host_file_coherence: std::ptr::null(),
        atomic_alignment: std::ptr::null(),
    }
}

/// A policy name, or `None` (the default) for `NULL`; `Err` for a name
/// that is not UTF-8.
///
/// # Safety
///
/// `name` is null or a NUL-terminated string.
unsafe fn policy_name<'a>(name: *const c_char) -> Result<Option<&'a str>, ()> {
    if name.is_null() {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated string (the caller's contract).
    unsafe { CStr::from_ptr(name) }.to_str().map(Some).map_err(|_| ())
}

/// The `MmConfig` that `c` describes; `None` for an unknown policy name.
///
/// # Safety
///
/// The policy pointers of `c` are null or NUL-terminated strings.
pub(crate) unsafe fn mm_config(c: &softmm_mm_config) -> Option<MmConfig> {
    let mut m = MmConfig::default()
        .thp_align(c.thp_align != 0)
        .task_size(c.task_size)
        .mmap_base(c.mmap_base)
        .mmap_min_addr(c.mmap_min_addr)
        .start_brk(c.start_brk)
        .stack_limit(c.stack_limit)
        .memlock_limit(c.memlock_limit)
        .max_map_count(usize::try_from(c.max_map_count).ok()?)
        .fault_around_pages(c.fault_around_pages)
        .stack_guard_gap(c.stack_guard_gap)
        .lsm_mmap_min_addr(c.lsm_mmap_min_addr)
        .cap_ipc_lock(c.cap_ipc_lock != 0)
        .cap_sys_nice(c.cap_sys_nice != 0);
    // Each policy field: its name, if not `NULL`, selects the policy.
    macro_rules! policy {
        ($field:ident, $ty:ty, $set:ident) => {
            // SAFETY: null or NUL-terminated (the caller's contract).
            if let Some(n) = unsafe { policy_name(c.$field) }.ok()? {
                m = m.$set(<$ty>::from_name(n)?);
            }
        };
    }
    policy!(fault_policy, FaultPolicy, policy);
    policy!(unmap_policy, UnmapPolicy, unmap_policy);
    policy!(pin_policy, PinPolicy, pin_policy);
    policy!(migrate_policy, MigratePolicy, migrate_policy);
    policy!(shootdown_policy, ShootdownPolicy, shootdown_policy);
    policy!(hugetlb_policy, HugetlbPolicy, hugetlb_policy);
    policy!(shootdown_targets, ShootdownTargets, shootdown_targets);
    policy!(posting_policy, PostingPolicy, posting_policy);
    policy!(madvise_policy, MadvisePolicy, madvise_policy);
    policy!(writer_policy, WriterPolicy, writer_policy);
    policy!(placement_policy, PlacementPolicy, placement);
    policy!(host_file_coherence, HostFileCoherence, host_file_coherence);
    policy!(atomic_alignment, AtomicAlignment, atomic_alignment);
    Some(m)
}

/// Makes an address space over `phys` as `config` says. `-EINVAL` for a
/// `config` whose `size` is not one a `softmm_mm_config_default` ever set,
/// an unknown policy name, or a layout `AddressSpace::new` refuses (see
/// `MmConfig`'s validity rules: e.g. a `mmap_base` above `task_size`;
/// `softmm_mm_config_check` names the rule); `-E2BIG` for a struct from a
/// newer header whose new fields are not zero.
///
/// # Safety
///
/// `phys` is null or a live handle; `config` is null or valid for reads of
/// its `size` bytes, its policy pointers null or NUL-terminated strings;
/// `out` is null or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_new_config(
    phys: *const softmm_phys,
    config: *const softmm_mm_config,
    out: *mut *mut softmm_mm,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        // SAFETY: null or valid for its size (the caller's contract).
        let c = match unsafe { read_sized(config, mm_config_default()) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        if out.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: the policy pointers are null or strings (the caller's contract).
        let Some(m) = (unsafe { mm_config(&c) }) else { return -libc::EINVAL };
        match AddressSpace::new(&phys.inner, m) {
            // SAFETY: `out` is not null and valid (the caller's contract).
            Ok(inner) => unsafe { put(out, Box::into_raw(Box::new(softmm_mm { inner }))) },
            Err(e) => neg(e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_and_names_select_policies() {
        let mut c = std::mem::MaybeUninit::<softmm_mm_config>::uninit();
        // SAFETY: valid for a write.
        assert_eq!(unsafe { softmm_mm_config_default(c.as_mut_ptr()) }, 0);
        // SAFETY: just written.
        let mut c = unsafe { c.assume_init() };
        // SAFETY: the policy pointers are null.
        let m = unsafe { mm_config(&c) }.unwrap();
        assert_eq!(m.policy, MmConfig::default().policy);
        c.fault_policy = c"mmap-lock".as_ptr();
        c.unmap_policy = c"lock-free".as_ptr();
        // SAFETY: the policy pointers are null or strings.
        let m = unsafe { mm_config(&c) }.unwrap();
        assert_eq!((m.policy, m.unmap_policy), (FaultPolicy::MmapLock, UnmapPolicy::LockFree));
        c.pin_policy = c"no-such".as_ptr();
        // SAFETY: as above.
        assert!(unsafe { mm_config(&c) }.is_none());
        c.pin_policy = std::ptr::null();
        c.migrate_policy = c"one-by-one".as_ptr();
        c.hugetlb_policy = c"vma-lock".as_ptr();
        c.shootdown_policy = c"next-access".as_ptr();
        c.cap_sys_nice = 1;
        // SAFETY: as above.
        let m = unsafe { mm_config(&c) }.unwrap();
        assert_eq!(
            (m.migrate_policy, m.hugetlb_policy, m.shootdown_policy, m.cap_sys_nice),
            (MigratePolicy::OneByOne, HugetlbPolicy::VmaLock, ShootdownPolicy::NextAccess, true)
        );
        c.shootdown_targets = c"broadcast".as_ptr();
        c.posting_policy = c"locked".as_ptr();
        c.madvise_policy = c"mmap-lock".as_ptr();
        c.writer_policy = c"reserve".as_ptr();
        c.placement_policy = c"arenas".as_ptr();
        // SAFETY: as above.
        let m = unsafe { mm_config(&c) }.unwrap();
        assert_eq!(
            (m.shootdown_targets, m.posting_policy, m.madvise_policy, m.writer_policy, m.placement),
            (
                ShootdownTargets::Broadcast,
                PostingPolicy::Locked,
                MadvisePolicy::MmapLock,
                WriterPolicy::Reserve,
                PlacementPolicy::Arenas
            )
        );
        c.host_file_coherence = c"cache".as_ptr();
        // SAFETY: as above.
        assert_eq!(unsafe { mm_config(&c) }.unwrap().host_file_coherence, HostFileCoherence::Cache);
        c.host_file_coherence = c"coherent".as_ptr();
        // SAFETY: as above.
        assert!(unsafe { mm_config(&c) }.is_none());
        c.host_file_coherence = std::ptr::null();
        c.atomic_alignment = c"split".as_ptr();
        // SAFETY: as above.
        assert_eq!(unsafe { mm_config(&c) }.unwrap().atomic_alignment, AtomicAlignment::Split);
        c.atomic_alignment = c"bus-lock".as_ptr();
        // SAFETY: as above.
        assert!(unsafe { mm_config(&c) }.is_none());
        c.atomic_alignment = std::ptr::null();
        c.writer_policy = c"fast".as_ptr();
        // SAFETY: as above.
        assert!(unsafe { mm_config(&c) }.is_none());
    }

    /// A struct from a 0.1.1 header (without the fields of 0.2.0) reads
    /// the new fields as the defaults.
    #[test]
    fn a_config_of_the_previous_header_takes_the_new_defaults() {
        let mut c = mm_config_default();
        c.size = std::mem::offset_of!(softmm_mm_config, shootdown_targets) as u32;
        c.writer_policy = c"no-such".as_ptr();
        // SAFETY: valid for its size; the pointers past it are never read.
        let r = unsafe { read_sized(&c, mm_config_default()) }.unwrap();
        assert!(r.writer_policy.is_null());
        // SAFETY: the policy pointers are null.
        assert!(unsafe { mm_config(&r) }.is_some());
    }

    #[test]
    fn a_config_of_the_first_version_gets_the_defaults_of_later_fields() {
        let mut c = phys_config_default();
        c.hugepages = 99;
        c.bytes = 1 << 20;
        c.size = softmm_phys_config::MIN_SIZE as u32;
        let mut phys = std::ptr::null_mut();
        // SAFETY: valid for its (smaller) size; `phys` valid for a write.
        assert_eq!(unsafe { softmm_phys_new_config(&c, &mut phys) }, 0, "hugepages not read: 0");
        let mut m = mm_config_default();
        m.size = softmm_mm_config::MIN_SIZE as u32;
        m.cap_sys_nice = 1;
        m.migrate_policy = c"no-such".as_ptr();
        let mut mm = std::ptr::null_mut();
        // SAFETY: as above; the handles are freed below.
        unsafe {
            assert_eq!(softmm_mm_new_config(phys, &m, &mut mm), 0, "fields past its size not read");
            assert!(!(*mm).inner.config().cap_sys_nice);
            crate::softmm_mm_free(mm);
            m.size = 95;
            assert_eq!(softmm_mm_new_config(phys, &m, &mut mm), -libc::EINVAL);
            crate::softmm_phys_free(phys);
        }
    }
}
