//! Host memory in the guest: [`softmm_mmap_host`] (unicorn's
//! `uc_mem_map_ptr`).

use std::ffi::c_void;

use crate::mm::mm_ref;
use crate::{guard64, neg, softmm_mm};

/// Called once when softmm no longer uses memory mapped by
/// [`softmm_mmap_host`], with the `ctx` given there.
pub type softmm_release_fn = Option<unsafe extern "C" fn(ctx: *mut c_void)>;

/// The caller's callback and context, sent to whichever thread unmaps last.
struct Release {
    f: unsafe extern "C" fn(*mut c_void),
    ctx: *mut c_void,
}

// SAFETY: `softmm_mmap_host`'s contract: the callback may run on any thread
// with its context.
unsafe impl Send for Release {}

/// Maps `len` bytes of the caller's memory at `host` into the guest and
/// returns the guest address or `-errno`: shared, so a guest store is a
/// store to `host` and a store to `host` is seen by the guest's next load.
/// `prot` is `mmap`'s; `flags` may hold `MAP_FIXED`,
/// `MAP_FIXED_NOREPLACE` and `MAP_32BIT` (with `addr` as `mmap`'s hint or
/// fixed address) and nothing else. The mapping is Linux's `VM_PFNMAP`: a
/// fork shares it, `mremap` moves or shrinks it but growing it is
/// `-EFAULT`, pins and remote access are `-EFAULT`, `MADV_DONTNEED` is
/// `-EINVAL`.
///
/// `release`, if not `NULL`, is called exactly once with `ctx`, on the
/// thread that ends the last mapping of this memory (a munmap, mremap or
/// `MAP_FIXED` over it, the end of the last address space holding it:
/// a `softmm_mm_free`, or the `softmm_cpu_free`, `softmm_cpu_attach` or
/// `softmm_cpu_detach` of the last CPU attached to an address space whose
/// handle was freed before) and only once no CPU can reach it any more: the
/// memory may be freed then. It must not call into softmm for this
/// address space.
///
/// Errors, with nothing mapped and `release` not called: `-EINVAL` for a
/// null handle, a null or not page-aligned `host`, a `len` that is zero or
/// not a multiple of 4096, another flag; then `mmap`'s errnos.
///
/// # Safety
///
/// `mm` is null or a live handle. `[host, host + len)` is memory the
/// caller owns, readable and writable until `release` is called (for ever
/// if `release` is `NULL`); while it is mapped the caller's own accesses
/// to it are atomic or ordered with the guest's by the caller. `release`
/// may be called on any thread.
#[no_mangle]
pub unsafe extern "C" fn softmm_mmap_host(
    mm: *const softmm_mm,
    addr: u64,
    len: u64,
    prot: i32,
    flags: i32,
    host: *mut c_void,
    release: softmm_release_fn,
    ctx: *mut c_void,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        let release = release.map(|f| {
            let r = Release { f, ctx };
            Box::new(move || {
                let r = r;
                // SAFETY: the caller's callback with its context, once.
                unsafe { (r.f)(r.ctx) }
            }) as Box<dyn FnOnce() + Send>
        });
        // SAFETY: the caller's contract is `mmap_host`'s.
        match unsafe { mm.mmap_host(addr, len, prot, flags, host.cast(), release) } {
            Ok(a) => a as i64,
            Err(e) => i64::from(neg(e)),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::{softmm_mm_free, softmm_mm_new, softmm_munmap, softmm_phys_free, softmm_phys_new};

    unsafe extern "C" fn count(ctx: *mut c_void) {
        // SAFETY: the test's counter, alive across the calls.
        unsafe { &*(ctx as *const AtomicU64) }.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn the_release_is_called_once_at_the_munmap_and_never_on_an_error() {
        #[repr(C, align(4096))]
        struct Page([u8; 4096]);
        let mut page = Box::new(Page([0; 4096]));
        let host = page.0.as_mut_ptr().cast::<c_void>();
        let calls = AtomicU64::new(0);
        let ctx = &calls as *const AtomicU64 as *mut c_void;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: live handles, a page that outlives its mapping.
        unsafe {
            let (mut phys, mut mm) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(softmm_phys_new(1 << 20, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            assert_eq!(softmm_mmap_host(std::ptr::null(), 0, 4096, rw, 0, host, Some(count), ctx), -22);
            assert_eq!(softmm_mmap_host(mm, 0, 4095, rw, 0, host, Some(count), ctx), -22);
            assert_eq!(softmm_mmap_host(mm, 0, 4096, rw, libc::MAP_PRIVATE, host, Some(count), ctx), -22);
            let a = softmm_mmap_host(mm, 0, 4096, rw, 0, host, Some(count), ctx);
            assert!(a > 0, "{a}");
            assert_eq!(calls.load(Ordering::SeqCst), 0);
            assert_eq!(softmm_munmap(mm, a as u64, 4096), 0);
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            let b = softmm_mmap_host(mm, 0, 4096, rw, 0, host, None, std::ptr::null_mut());
            assert!(b > 0);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
        page.0[0] = 1;
    }
}
