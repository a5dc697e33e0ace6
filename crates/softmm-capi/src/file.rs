//! `softmm_file`: an in-memory file opened with an access mode.

use std::ffi::{c_char, c_void, CStr};

use softmm::{File, OpenFile};

use crate::{buf_mut, buf_ref, guard, guard64, neg, put, softmm_phys};

/// An in-memory (tmpfs-like) file with a page cache, opened with an access
/// mode as a file descriptor is: `mmap` checks the protection against it
/// (`-EACCES`). Thread-safe.
pub struct softmm_file {
    pub(crate) inner: OpenFile,
}

/// The arguments every function that makes a file takes: the arena, the
/// name as UTF-8, and an output pointer; `Err(-EINVAL)` for a null one or a
/// name that is not UTF-8.
///
/// # Safety
///
/// `phys` is null or a live handle; `name` is null or a NUL-terminated
/// string.
pub(crate) unsafe fn file_args<'a>(
    phys: *const softmm_phys,
    name: *const c_char,
    out: *mut *mut softmm_file,
) -> Result<(&'a softmm_phys, &'a str), i32> {
    // SAFETY: null or live (the caller's contract).
    let Some(phys) = (unsafe { phys.as_ref() }) else { return Err(-libc::EINVAL) };
    if name.is_null() || out.is_null() {
        return Err(-libc::EINVAL);
    }
    // SAFETY: a NUL-terminated string (the caller's contract).
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else { return Err(-libc::EINVAL) };
    Ok((phys, name))
}

/// Creates a file named `name` (shown in the maps) of `size` bytes, zero
/// filled, opened with `flags`' access mode (`O_RDONLY`, `O_WRONLY` or
/// `O_RDWR`; other bits are ignored). `-EINVAL` for a bad mode or name,
/// `-EFBIG` for a size past the file size limit.
///
/// # Safety
///
/// `phys` is null or a live handle; `name` is null or a NUL-terminated
/// string; `out` is null or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_create(
    phys: *const softmm_phys,
    name: *const c_char,
    size: u64,
    flags: i32,
    out: *mut *mut softmm_file,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract is `file_args`'.
        let (phys, name) = match unsafe { file_args(phys, name, out) } {
            Ok(args) => args,
            Err(e) => return e,
        };
        let (readable, writable) = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => (true, false),
            libc::O_WRONLY => (false, true),
            libc::O_RDWR => (true, true),
            _ => return -libc::EINVAL,
        };
        match File::create(&phys.inner, name, size) {
            Ok(file) => {
                let inner = OpenFile::new(&file, readable, writable);
                // SAFETY: `out` is not null and valid (the caller's contract).
                unsafe { put(out, Box::into_raw(Box::new(softmm_file { inner }))) }
            }
            Err(e) => neg(e),
        }
    })
}

/// Releases the handle; the file lives on while a mapping of it does.
/// `NULL` is ignored.
///
/// # Safety
///
/// `file` is null or a live handle from `softmm_file_create`.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_free(file: *mut softmm_file) {
    guard(|| {
        if !file.is_null() {
            // SAFETY: a live handle made by `Box::into_raw` (the caller's contract).
            drop(unsafe { Box::from_raw(file) });
        }
        0
    });
}

/// `pwrite`: writes `len` bytes of `buf` at `offset`, growing the file;
/// returns the bytes written or `-errno` (`-EBADF` if not opened for
/// writing, `-EFBIG`, `-EINVAL` for an offset past the file size limit).
///
/// # Safety
///
/// `file` is null or a live handle; `buf` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_pwrite(
    file: *const softmm_file,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -i64::from(libc::EINVAL) };
        if !file.inner.writable {
            return -i64::from(libc::EBADF);
        }
        // SAFETY: the caller's contract.
        let Some(data) = (unsafe { buf_ref(buf, len) }) else { return -i64::from(libc::EFAULT) };
        match file.inner.file.write_at(offset, data) {
            Ok(n) => n as i64,
            Err(e) => i64::from(neg(e)),
        }
    })
}

/// `pread`: reads up to `len` bytes at `offset` into `buf`; returns the
/// bytes read (0 at or past the end) or `-errno` (`-EBADF` if not opened
/// for reading).
///
/// # Safety
///
/// `file` is null or a live handle; `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_pread(file: *const softmm_file, buf: *mut c_void, len: usize, offset: u64) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -i64::from(libc::EINVAL) };
        if !file.inner.readable {
            return -i64::from(libc::EBADF);
        }
        // SAFETY: the caller's contract.
        let Some(data) = (unsafe { buf_mut(buf, len) }) else { return -i64::from(libc::EFAULT) };
        match file.inner.file.read_at(offset, data) {
            Ok(n) => n as i64,
            Err(e) => i64::from(neg(e)),
        }
    })
}

/// `ftruncate`: sets the file's size (unmapping pages past a shrunk end
/// from every address space). `-EINVAL` if not opened for writing, as
/// Linux.
///
/// # Safety
///
/// `file` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_truncate(file: *const softmm_file, size: u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -libc::EINVAL };
        if !file.inner.writable {
            return -libc::EINVAL;
        }
        file.inner.file.set_len(size).map_or_else(neg, |()| 0)
    })
}
