//! `softmm_mm`: an address space and its system calls.

use std::ffi::c_char;
use std::sync::Arc;

use softmm::{AddressSpace, MmConfig, TASK_SIZE};

use crate::{guard, guard64, neg, put, softmm_file, softmm_phys};

/// An address space (`mm_struct`): VMAs, page tables, the `mmap` family.
/// Thread-safe: any thread may call into it while CPUs access it.
pub struct softmm_mm {
    pub(crate) inner: Arc<AddressSpace>,
}

/// A value or `-errno` as an `i64`.
pub(crate) fn ret64(r: softmm::Result<u64>) -> i64 {
    match r {
        // Addresses and brk values are below the 47-bit user limit.
        Ok(v) => v as i64,
        Err(e) => i64::from(neg(e)),
    }
}

/// `0` or `-errno`.
fn ret(r: softmm::Result<()>) -> i32 {
    r.map_or_else(neg, |()| 0)
}

/// The address space of a live handle, or `None` for null.
///
/// # Safety
///
/// `mm` is null or a live handle.
pub(crate) unsafe fn mm_ref<'a>(mm: *const softmm_mm) -> Option<&'a AddressSpace> {
    // SAFETY: null or live (the caller's contract).
    unsafe { mm.as_ref() }.map(|m| &*m.inner)
}

/// Makes an empty address space over `phys` with Linux's x86-64 defaults
/// (47-bit user space, `mmap_base` below the stack, per-VMA faults).
///
/// # Safety
///
/// `phys` is null or a live handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_new(phys: *const softmm_phys, out: *mut *mut softmm_mm) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(phys) = (unsafe { phys.as_ref() }) else { return -libc::EINVAL };
        if out.is_null() {
            return -libc::EINVAL;
        }
        match AddressSpace::new(&phys.inner, MmConfig::default()) {
            // SAFETY: not null and valid (the caller's contract).
            Ok(inner) => unsafe { put(out, Box::into_raw(Box::new(softmm_mm { inner }))) },
            Err(e) => neg(e),
        }
    })
}

/// `fork`'s copy of the address space: private pages shared copy-on-write,
/// shared mappings shared, `MADV_DONTFORK` ranges left out. `-ENOMEM` if
/// frames run out.
///
/// # Safety
///
/// `mm` is null or a live handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_fork(mm: *const softmm_mm, out: *mut *mut softmm_mm) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        if out.is_null() {
            return -libc::EINVAL;
        }
        match mm.fork() {
            // SAFETY: not null and valid (the caller's contract).
            Ok(inner) => unsafe { put(out, Box::into_raw(Box::new(softmm_mm { inner }))) },
            Err(e) => neg(e),
        }
    })
}

/// Releases the handle; the address space dies (returning its frames) when
/// no CPU is attached to it either. `NULL` is ignored.
///
/// # Safety
///
/// `mm` is null or a live handle from `softmm_mm_new`/`softmm_mm_fork`.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_free(mm: *mut softmm_mm) {
    guard(|| {
        if !mm.is_null() {
            // SAFETY: a live handle made by `Box::into_raw` (the caller's contract).
            drop(unsafe { Box::from_raw(mm) });
        }
        0
    });
}

/// `mmap`: returns the address or `-errno`, as Linux for the same
/// arguments (`PROT_*`, `MAP_*` values of `<sys/mman.h>`). `file` is
/// `NULL` for anonymous memory (`-EBADF` without `MAP_ANONYMOUS`).
///
/// # Safety
///
/// `mm` and `file` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn softmm_mmap(
    mm: *const softmm_mm,
    addr: u64,
    len: u64,
    prot: i32,
    flags: i32,
    file: *const softmm_file,
    offset: u64,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        // SAFETY: null or live (the caller's contract).
        let file = unsafe { file.as_ref() }.map(|f| &f.inner);
        ret64(mm.mmap(addr, len, prot, flags, file, offset))
    })
}

/// `munmap`: `0` or `-errno`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_munmap(mm: *const softmm_mm, addr: u64, len: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.munmap(addr, len))
    })
}

/// `mprotect`: `0` or `-errno`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mprotect(mm: *const softmm_mm, addr: u64, len: u64, prot: i32) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.mprotect(addr, len, prot))
    })
}

/// `mremap`: the new address or `-errno`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mremap(
    mm: *const softmm_mm,
    old_addr: u64,
    old_len: u64,
    new_len: u64,
    flags: i32,
    new_addr: u64,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        ret64(mm.mremap(old_addr, old_len, new_len, flags, new_addr))
    })
}

/// `madvise`: `0` or `-errno`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_madvise(mm: *const softmm_mm, addr: u64, len: u64, advice: i32) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.madvise(addr, len, advice))
    })
}

/// `brk`: the new break, or the old one if the move was refused (brk
/// reports no errno); `-EINVAL` only for a null handle.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_brk(mm: *const softmm_mm, brk: u64) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        ret64(Ok(mm.brk(brk)))
    })
}

/// `mincore`: one byte per page of `[addr, addr + len)` into `vec`, bit 0
/// set if resident. `0` or `-errno`.
///
/// # Safety
///
/// `mm` is null or a live handle; `vec` is valid for writes of
/// `(len + 4095) / 4096` bytes, as Linux requires.
#[no_mangle]
pub unsafe extern "C" fn softmm_mincore(mm: *const softmm_mm, addr: u64, len: u64, vec: *mut u8) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        // A range past user space fails before the vector is touched: give
        // it none, so no slice is made from a length that cannot be.
        let pages = if len > TASK_SIZE { 0 } else { len.div_ceil(4096) as usize };
        // A NULL vector is an empty one: the range is checked first, as
        // Linux's `mincore` checks it before `copy_to_user` faults.
        let v: &mut [u8] = if pages == 0 || vec.is_null() {
            &mut []
        } else {
            // SAFETY: valid for `pages` bytes of writes (the caller's contract).
            unsafe { std::slice::from_raw_parts_mut(vec, pages) }
        };
        ret(mm.mincore(addr, len, v))
    })
}

/// Declares the main thread's initial stack pointer: the VMA holding it is
/// named `[stack]` in the maps (Linux's `mm->start_stack`).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_set_start_stack(mm: *const softmm_mm, sp: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        mm.set_start_stack(sp);
        0
    })
}

/// Writes the `/proc/pid/maps` text into `buf` (at most `len` bytes, NUL
/// terminated when `len > 0`, truncated if it does not fit) and returns its
/// full length without the NUL, as `snprintf` does: call with `len = 0` to
/// size the buffer.
///
/// # Safety
///
/// `mm` is null or a live handle; `buf` is null with `len == 0`, or valid
/// for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_mm_maps(mm: *const softmm_mm, buf: *mut c_char, len: usize) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        let text = mm.maps_text();
        if len > 0 {
            if buf.is_null() {
                return -i64::from(libc::EFAULT);
            }
            let n = text.len().min(len - 1);
            // SAFETY: `buf` is valid for `len > n` bytes (the caller's
            // contract); the source is a Rust string of at least `n` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast(), n);
                buf.add(n).write(0);
            }
        }
        text.len() as i64
    })
}

/// `mlock`: locks the pages of the range and faults them in; `0` or `-errno`
/// (`EPERM`, `ENOMEM` past the memlock limit or for a hole, `EINVAL`,
/// `EAGAIN`).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mlock(mm: *const softmm_mm, addr: u64, len: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.mlock(addr, len))
    })
}

/// `mlock2`: `softmm_mlock`, or with `MLOCK_ONFAULT` (1) locks pages as they
/// are faulted in; `0` or `-errno` (`EINVAL` for another flag).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mlock2(mm: *const softmm_mm, addr: u64, len: u64, flags: i32) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.mlock2(addr, len, flags))
    })
}

/// `munlock`: unlocks the range; `0` or `-errno` (`ENOMEM` for a hole).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_munlock(mm: *const softmm_mm, addr: u64, len: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.munlock(addr, len))
    })
}

/// `mlockall`: `MCL_CURRENT` (1), `MCL_FUTURE` (2), `MCL_ONFAULT` (4); `0` or
/// `-errno` (`EINVAL`, `EPERM`, `ENOMEM`).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mlockall(mm: *const softmm_mm, flags: i32) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.mlockall(flags))
    })
}

/// `munlockall`: unlocks every mapping and clears `MCL_FUTURE`; `0`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_munlockall(mm: *const softmm_mm) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.munlockall())
    })
}

/// `mseal` (Linux 6.10+): seals the VMAs of the range against unmapping,
/// moving, `mprotect` and discarding advice (`EPERM` from those); `0` or
/// `-errno` (`EINVAL` for flags or a bad range, `ENOMEM` for a hole).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_mseal(mm: *const softmm_mm, addr: u64, len: u64, flags: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.mseal(addr, len, flags))
    })
}

/// `prctl(PR_SET_MDWE, bits, 0, 0, 0)`: memory-deny-write-execute
/// (`PR_MDWE_REFUSE_EXEC_GAIN` 1, `PR_MDWE_NO_INHERIT` 2); `0` or `-errno`
/// (`EINVAL`, `EPERM` to change bits once set). Then `mmap` and `mprotect`
/// refuse writable-executable or newly executable mappings with `EACCES`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_prctl_set_mdwe(mm: *const softmm_mm, bits: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        ret(mm.prctl_set_mdwe(bits, 0, 0, 0))
    })
}

/// `prctl(PR_GET_MDWE, 0, 0, 0, 0)`: the MDWE bits set (`>= 0`), or
/// `-errno`.
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_prctl_get_mdwe(mm: *const softmm_mm) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        mm.prctl_get_mdwe(0, 0, 0, 0).map_or_else(|e| i64::from(neg(e)), |b| b as i64)
    })
}
