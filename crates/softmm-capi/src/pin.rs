//! `softmm_pinned`: pages pinned (`pin_user_pages`, `FOLL_PIN`) or
//! referenced (`get_user_pages`, `FOLL_GET`) for a device, and the
//! device's view of them.

use std::ffi::c_void;
use std::sync::RwLock;

use softmm::{Foll, PinnedPages};

use crate::{buf_mut, buf_ref, guard, guard64, neg, put, softmm_mm};

/// `FOLL_WRITE`: the device will write: COW is broken first and the
/// mapping must be writable.
pub const SOFTMM_FOLL_WRITE: u32 = 1;
/// `FOLL_LONGTERM`: a pin held indefinitely (RDMA, VFIO, io_uring
/// buffers), charged against `RLIMIT_MEMLOCK` (`memlock_limit`).
pub const SOFTMM_FOLL_LONGTERM: u32 = 0x100;

/// Pinned or referenced pages of an address space: the frames stay
/// allocated, and readable and writable through this handle, until
/// `softmm_pinned_unpin` or `softmm_pinned_free`, even if the guest unmaps
/// them. Thread-safe: any thread may read, write and unpin (an unpin
/// waits for reads and writes in progress).
pub struct softmm_pinned {
    /// `None` once unpinned.
    pages: RwLock<Option<PinnedPages>>,
}

// The handle is shared between threads: what it holds must allow that.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<RwLock<Option<PinnedPages>>>();
};

/// The pages of a live handle, under its read lock, or `-EINVAL` for a
/// null or unpinned handle.
///
/// # Safety
///
/// `p` is null or a live handle.
unsafe fn with_pages(p: *const softmm_pinned, f: impl FnOnce(&PinnedPages) -> i32) -> i32 {
    // SAFETY: null or live (the caller's contract).
    let Some(p) = (unsafe { p.as_ref() }) else { return -libc::EINVAL };
    let pages = p.pages.read().unwrap_or_else(|e| e.into_inner());
    pages.as_ref().map_or(-libc::EINVAL, f)
}

/// The `FOLL_*` flags of a request; `None` for a bit that is not
/// `SOFTMM_FOLL_WRITE` or `SOFTMM_FOLL_LONGTERM` (Linux's
/// `is_valid_gup_args` refuses internal and unknown flags with `EINVAL`).
fn foll(flags: u32) -> Option<Foll> {
    Foll::from_bits(flags)
}

/// Makes the handle of a pin or reference request.
///
/// # Safety
///
/// `mm` is null or a live handle; `out` is null or valid for a write.
unsafe fn take(
    mm: *const softmm_mm,
    flags: u32,
    out: *mut *mut softmm_pinned,
    f: impl FnOnce(&softmm::AddressSpace, Foll) -> softmm::Result<PinnedPages>,
) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -libc::EINVAL };
        if out.is_null() {
            return -libc::EINVAL;
        }
        let Some(flags) = foll(flags) else { return -libc::EINVAL };
        match f(&mm.inner, flags) {
            Ok(pages) => {
                let h = Box::new(softmm_pinned { pages: RwLock::new(Some(pages)) });
                // SAFETY: not null and valid (the caller's contract).
                unsafe { put(out, Box::into_raw(h)) }
            }
            Err(e) => neg(e),
        }
    })
}

/// `pin_user_pages(addr, npages, flags)`: faults in (for write with
/// `SOFTMM_FOLL_WRITE`, breaking COW) and pins the `npages` pages from the
/// page of `addr`, all or none. Linux's errnos: `-EFAULT` (an unmapped
/// page, a mapping the access is not allowed in, a page whose fault
/// raises a signal), `-ENOMEM` (frames, or a long-term pin past
/// `memlock_limit`), `-EOVERFLOW` (a range that wraps), `-EAGAIN` (a page
/// changed by others faster than it could be pinned, 64 times), `-EINVAL`
/// (an unknown flag, a `NULL` handle or `out`).
///
/// # Safety
///
/// `mm` is null or a live handle; `out` is null or valid for a write of a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_pin_user_pages(
    mm: *const softmm_mm,
    addr: u64,
    npages: u64,
    flags: u32,
    out: *mut *mut softmm_pinned,
) -> i32 {
    let Ok(n) = usize::try_from(npages) else { return -libc::EOVERFLOW };
    // SAFETY: the caller's contract.
    unsafe { take(mm, flags, out, |mm, f| mm.pin_user_pages(addr, n, f)) }
}

/// `get_user_pages(addr, npages, flags)`: as `softmm_pin_user_pages`, but
/// takes references (`FOLL_GET`) rather than pins: a short-term access,
/// invisible to `page_maybe_dma_pinned`. `SOFTMM_FOLL_LONGTERM` is
/// `-EINVAL`, as in Linux.
///
/// # Safety
///
/// As `softmm_pin_user_pages`.
#[no_mangle]
pub unsafe extern "C" fn softmm_get_user_pages(
    mm: *const softmm_mm,
    addr: u64,
    npages: u64,
    flags: u32,
    out: *mut *mut softmm_pinned,
) -> i32 {
    let Ok(n) = usize::try_from(npages) else { return -libc::EOVERFLOW };
    // SAFETY: the caller's contract.
    unsafe { take(mm, flags, out, |mm, f| mm.get_user_pages(addr, n, f)) }
}

/// The device reads `len` bytes at byte `offset` of the pinned pages
/// (offset 0 is the start of the first page) into `buf`. `-EFAULT` for a
/// range past the pages or a `NULL` `buf` with a nonzero `len`; `-EINVAL`
/// for a `NULL` or unpinned handle.
///
/// # Safety
///
/// `p` is null or a live handle; `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_pinned_read(p: *const softmm_pinned, offset: u64, buf: *mut c_void, len: usize) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe {
            with_pages(p, |pages| match buf_mut(buf, len) {
                Some(b) => pages.read(offset, b).map_or_else(neg, |()| 0),
                None => -libc::EFAULT,
            })
        }
    })
}

/// The device writes `len` bytes of `buf` at byte `offset` of the pinned
/// pages: the guest sees them at once (the frames are its own). `-EPERM`
/// for pages taken without `SOFTMM_FOLL_WRITE`; otherwise as
/// `softmm_pinned_read`.
///
/// # Safety
///
/// `p` is null or a live handle; `buf` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_pinned_write(
    p: *const softmm_pinned,
    offset: u64,
    buf: *const c_void,
    len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe {
            with_pages(p, |pages| match buf_ref(buf, len) {
                Some(b) => pages.write(offset, b).map_or_else(neg, |()| 0),
                None => -libc::EFAULT,
            })
        }
    })
}

/// The number of pages held: `npages` of the request, or 0 once unpinned.
/// `-EINVAL` for a `NULL` handle.
///
/// # Safety
///
/// `p` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_pinned_npages(p: *const softmm_pinned) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(p) = (unsafe { p.as_ref() }) else { return -i64::from(libc::EINVAL) };
        let pages = p.pages.read().unwrap_or_else(|e| e.into_inner());
        pages.as_ref().map_or(0, |pages| pages.len() as i64)
    })
}

/// `unpin_user_pages_dirty_lock(pages, npages, make_dirty)` (for
/// references, `put_page`): releases the pages, first marking them dirty
/// if `make_dirty` is nonzero and they were taken with
/// `SOFTMM_FOLL_WRITE`, so that what the device wrote reaches a
/// host-backed file at its next writeback. The long-term charge is
/// returned. The handle stays, empty (reads and writes `-EINVAL`), until
/// `softmm_pinned_free`. `-EINVAL` for a `NULL` or already unpinned handle.
///
/// # Safety
///
/// `p` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_pinned_unpin(p: *const softmm_pinned, make_dirty: i32) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(p) = (unsafe { p.as_ref() }) else { return -libc::EINVAL };
        let taken = p.pages.write().unwrap_or_else(|e| e.into_inner()).take();
        match taken {
            Some(pages) => {
                pages.unpin(make_dirty != 0);
                0
            }
            None => -libc::EINVAL,
        }
    })
}

/// Frees the handle, unpinning first if `softmm_pinned_unpin` was not
/// called (marking the pages dirty if they were taken with
/// `SOFTMM_FOLL_WRITE`: the device may have written). `NULL` is ignored.
///
/// # Safety
///
/// `p` is null or a live handle, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn softmm_pinned_free(p: *mut softmm_pinned) {
    guard(|| {
        if !p.is_null() {
            // SAFETY: a live handle made by `Box::into_raw` (the caller's contract).
            drop(unsafe { Box::from_raw(p) });
        }
        0
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{softmm_mm_free, softmm_mm_new, softmm_mmap, softmm_munmap, softmm_phys_free, softmm_phys_new};

    #[test]
    fn pinned_pages_outlive_the_mapping_and_unpin_once() {
        let mut phys = std::ptr::null_mut();
        let mut mm = std::ptr::null_mut();
        // SAFETY: valid outputs; handles live until freed below.
        unsafe {
            assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let a = softmm_mmap(mm, 0, 8192, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, std::ptr::null(), 0) as u64;
            let mut p = std::ptr::null_mut();
            assert_eq!(softmm_pin_user_pages(mm, a, 2, 0x2, &mut p), -libc::EINVAL, "an internal flag");
            assert_eq!(softmm_get_user_pages(mm, a, 2, SOFTMM_FOLL_LONGTERM, &mut p), -libc::EINVAL);
            assert_eq!(softmm_pin_user_pages(mm, a + 8192, 1, 0, &mut p), -libc::EFAULT, "unmapped");
            assert!(p.is_null());
            assert_eq!(softmm_pin_user_pages(mm, a, 2, SOFTMM_FOLL_WRITE | SOFTMM_FOLL_LONGTERM, &mut p), 0);
            assert_eq!(softmm_pinned_npages(p), 2);
            let mut stats = crate::softmm_mm_stats {
                size: std::mem::size_of::<crate::softmm_mm_stats>() as u32,
                ..Default::default()
            };
            assert_eq!(crate::softmm_mm_get_stats(mm, &mut stats), 0);
            assert_eq!(stats.pinned_vm, 2);
            assert_eq!(softmm_pinned_write(p, 4096 + 8, b"dev".as_ptr().cast(), 3), 0);
            let mut back = [0u8; 3];
            assert_eq!(softmm_access_remote(mm, a + 4096 + 8, &mut back), 3);
            assert_eq!(&back, b"dev", "the guest sees the device's write");
            assert_eq!(softmm_pinned_read(p, 8189, back.as_mut_ptr().cast(), 3), 0);
            assert_eq!(softmm_pinned_read(p, 8191, back.as_mut_ptr().cast(), 2), -libc::EFAULT, "past the pages");
            assert_eq!(softmm_munmap(mm, a, 8192), 0);
            back = [0; 3];
            assert_eq!(softmm_pinned_read(p, 4096 + 8, back.as_mut_ptr().cast(), 3), 0);
            assert_eq!(&back, b"dev", "the frames outlive the mapping");
            assert_eq!(softmm_pinned_unpin(p, 1), 0);
            assert_eq!(softmm_pinned_unpin(p, 1), -libc::EINVAL);
            assert_eq!(softmm_pinned_npages(p), 0);
            assert_eq!(softmm_pinned_read(p, 0, back.as_mut_ptr().cast(), 1), -libc::EINVAL);
            assert_eq!(crate::softmm_mm_get_stats(mm, &mut stats), 0);
            assert_eq!(stats.pinned_vm, 0, "the long-term charge returned");
            softmm_pinned_free(p);

            let a =
                softmm_mmap(mm, 0, 4096, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, std::ptr::null(), 0)
                    as u64;
            assert_eq!(softmm_get_user_pages(mm, a, 1, 0, &mut p), 0);
            assert_eq!(softmm_pinned_write(p, 0, b"x".as_ptr().cast(), 1), -libc::EPERM, "taken for read");
            softmm_pinned_free(p);
            softmm_pinned_free(std::ptr::null_mut());
            assert_eq!(softmm_pinned_read(std::ptr::null(), 0, back.as_mut_ptr().cast(), 1), -libc::EINVAL);
            softmm_mm_free(mm);
            let mut s = crate::softmm_phys_stats::default();
            assert_eq!(crate::softmm_phys_get_stats(phys, &mut s), 0);
            assert_eq!(s.frames_used, 0, "no frame leaked");
            softmm_phys_free(phys);
        }
    }

    /// Reads guest memory as a debugger does.
    unsafe fn softmm_access_remote(mm: *const softmm_mm, addr: u64, buf: &mut [u8]) -> i64 {
        // SAFETY: `buf` is valid for its length; the caller's handle.
        unsafe { crate::softmm_access_remote_read(mm, addr, buf.as_mut_ptr().cast(), buf.len(), 0) }
    }
}
