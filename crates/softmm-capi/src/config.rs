//! Configuration from C: `softmm_phys_config` for an arena (size, NUMA
//! nodes, memory on demand) and `softmm_mm_config` for an address space
//! (fault, unmap and pin policies by name, layout and limits). Each struct
//! starts with its own `size`, which its `*_default` function sets: a later
//! version that appends fields can tell an older caller's struct apart.

use std::ffi::{c_char, CStr};

use softmm::{AddressSpace, FaultPolicy, MmConfig, PhysConfig, PhysMem, PinPolicy, UnmapPolicy};

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
}

/// Fills `out` with the defaults of `softmm_phys_new` (and sets its `size`).
///
/// # Safety
///
/// `out` is null or valid for a write of a `softmm_phys_config`.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_config_default(out: *mut softmm_phys_config) -> i32 {
    guard(|| {
        let d = PhysConfig::default();
        let c = softmm_phys_config {
            size: std::mem::size_of::<softmm_phys_config>() as u32,
            nodes: d.nodes as u32,
            bytes: d.bytes,
            on_demand: i32::from(d.on_demand),
        };
        // SAFETY: null or valid (the caller's contract).
        unsafe { put(out, c) }
    })
}

/// Makes an arena as `config` says. `-EINVAL` for a `config` not filled by
/// `softmm_phys_config_default` (a wrong `size`) or a configuration
/// `PhysMem::new` refuses (no nodes, too many, fewer than two frames a
/// node); `-ENOMEM` if the host cannot back (or, on demand, reserve) it.
///
/// # Safety
///
/// `config` is null or valid for a read; `out` is null or valid for a write
/// of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_new_config(config: *const softmm_phys_config, out: *mut *mut softmm_phys) -> i32 {
    guard(|| {
        // SAFETY: null or valid (the caller's contract).
        let Some(c) = (unsafe { config.as_ref() }) else { return -libc::EINVAL };
        if out.is_null() || c.size as usize != std::mem::size_of::<softmm_phys_config>() {
            return -libc::EINVAL;
        }
        let config = PhysConfig::new(c.bytes).nodes(c.nodes as usize).on_demand(c.on_demand != 0);
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
        let d = MmConfig::default();
        let c = softmm_mm_config {
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
        };
        // SAFETY: null or valid (the caller's contract).
        unsafe { put(out, c) }
    })
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
        .fault_around_pages(c.fault_around_pages);
    // SAFETY: null or NUL-terminated (the caller's contract).
    if let Some(n) = unsafe { policy_name(c.fault_policy) }.ok()? {
        m = m.policy(FaultPolicy::from_name(n)?);
    }
    // SAFETY: as above.
    if let Some(n) = unsafe { policy_name(c.unmap_policy) }.ok()? {
        m = m.unmap_policy(UnmapPolicy::from_name(n)?);
    }
    // SAFETY: as above.
    if let Some(n) = unsafe { policy_name(c.pin_policy) }.ok()? {
        m = m.pin_policy(PinPolicy::from_name(n)?);
    }
    Some(m)
}

/// Makes an address space over `phys` as `config` says. `-EINVAL` for a
/// `config` not filled by `softmm_mm_config_default` (a wrong `size`), an
/// unknown policy name, or a layout `AddressSpace::new` refuses (see
/// `MmConfig`'s validity rules: e.g. a `mmap_base` above `task_size`).
///
/// # Safety
///
/// `phys` is null or a live handle; `config` is null or valid for a read,
/// its policy pointers null or NUL-terminated strings; `out` is null or
/// valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_new_config(
    phys: *const softmm_phys,
    config: *const softmm_mm_config,
    out: *mut *mut softmm_mm,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        // SAFETY: null or valid (the caller's contract).
        let Some(c) = (unsafe { config.as_ref() }) else { return -libc::EINVAL };
        if out.is_null() || c.size as usize != std::mem::size_of::<softmm_mm_config>() {
            return -libc::EINVAL;
        }
        // SAFETY: the policy pointers are null or strings (the caller's contract).
        let Some(m) = (unsafe { mm_config(c) }) else { return -libc::EINVAL };
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
    }
}
