//! `softmm_phys`: the frame arena.

use std::sync::Arc;

use softmm::{PhysConfig, PhysMem};

use crate::{guard, neg, put};

/// A frame arena (`PhysMem`): the guest's physical memory. Thread-safe.
pub struct softmm_phys {
    pub(crate) inner: Arc<PhysMem>,
}

/// What an arena holds, after pending frees have run (leak checks: all
/// four are 0 once every address space and file made from it is freed).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct softmm_phys_stats {
    /// Frames allocated (the shared zero page not counted).
    pub frames_used: u64,
    /// Page-table pages allocated.
    pub page_tables: u64,
    /// VMAs alive.
    pub vmas: u64,
    /// Reverse-map entries (file, address space).
    pub rmap_entries: u64,
}

/// Makes an arena of `bytes` bytes (rounded up to whole pages), backed by
/// host memory at once. `-EINVAL` for 0 or a size the host cannot address,
/// `-ENOMEM` if the host cannot back it.
///
/// # Safety
///
/// `out` is null or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_new(bytes: u64, out: *mut *mut softmm_phys) -> i32 {
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        match PhysMem::new(PhysConfig::new(bytes)) {
            // SAFETY: `out` is not null and valid (the caller's contract).
            Ok(inner) => unsafe { put(out, Box::into_raw(Box::new(softmm_phys { inner }))) },
            Err(e) => neg(e),
        }
    })
}

/// Releases the caller's handle; the arena lives on while address spaces
/// or files made from it do. `NULL` is ignored.
///
/// # Safety
///
/// `phys` is null or a handle from `softmm_phys_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_free(phys: *mut softmm_phys) {
    guard(|| {
        if !phys.is_null() {
            // SAFETY: a live handle made by `Box::into_raw` (the caller's contract).
            drop(unsafe { Box::from_raw(phys) });
        }
        0
    });
}

/// Runs pending deferred frees and reports what the arena holds.
///
/// # Safety
///
/// `phys` is null or a live handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_phys_get_stats(phys: *const softmm_phys, out: *mut softmm_phys_stats) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        let s = phys.inner.quiesce();
        let stats = softmm_phys_stats {
            frames_used: s.frames_used,
            page_tables: s.page_tables,
            vmas: s.vmas,
            rmap_entries: s.rmap_entries,
        };
        // SAFETY: null or valid (the caller's contract).
        unsafe { put(out, stats) }
    })
}
