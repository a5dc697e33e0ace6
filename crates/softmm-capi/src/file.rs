//! `softmm_file`: an in-memory file opened with an access mode.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

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
/// or a size above `INT64_MAX` (as `ftruncate`'s negative length).
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
        let Some((readable, writable)) = access_mode(flags) else { return -libc::EINVAL };
        match File::create(&phys.inner, name, size) {
            // SAFETY: `out` is not null and valid (the caller's contract).
            Ok(file) => unsafe { put_file(out, &file, readable, writable) },
            Err(e) => neg(e),
        }
    })
}

/// The access mode of `open` flags as (readable, writable); `None` for a
/// bad one.
fn access_mode(flags: i32) -> Option<(bool, bool)> {
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => Some((true, false)),
        libc::O_WRONLY => Some((false, true)),
        libc::O_RDWR => Some((true, true)),
        _ => None,
    }
}

/// Stores a new handle of `file` opened with that mode through `out`.
///
/// # Safety
///
/// `out` is not null and valid for a write of a pointer.
unsafe fn put_file(out: *mut *mut softmm_file, file: &Arc<File>, readable: bool, writable: bool) -> i32 {
    let inner = OpenFile::new(file, readable, writable);
    // SAFETY: the caller's contract.
    unsafe { put(out, Box::into_raw(Box::new(softmm_file { inner }))) }
}

/// Creates a file on hugetlbfs (`open(O_CREAT)` on a hugetlbfs mount, then
/// `ftruncate(size)`): its pages are 2 MiB pages of the arena's pool
/// (`softmm_phys_config.hugepages`), allocated by faults and
/// `softmm_file_fallocate`, reserved by shared mappings (`mmap` fails with
/// `-ENOMEM` when the pool cannot reserve them). Mappings of it must be
/// 2 MiB aligned in address and offset. `-EINVAL` for a `size` that is not
/// a multiple of 2 MiB, a bad mode or name.
///
/// # Safety
///
/// As `softmm_file_create`.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_create_hugetlbfs(
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
        let Some((readable, writable)) = access_mode(flags) else { return -libc::EINVAL };
        match File::create_hugetlbfs(&phys.inner, name, size) {
            // SAFETY: `out` is not null and valid (the caller's contract).
            Ok(file) => unsafe { put_file(out, &file, readable, writable) },
            Err(e) => neg(e),
        }
    })
}

/// `vfs_fallocate`'s argument checks that come before the file's access
/// mode: `EINVAL` for a negative offset or a length that is not positive,
/// `EOPNOTSUPP` for an unknown mode or combination.
fn fallocate_args(mode: i32, offset: i64, len: i64) -> Result<(), i32> {
    const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const MODE_MASK: i32 = 0x02 | 0x08 | 0x10 | 0x20 | 0x40;
    if offset < 0 || len <= 0 {
        return Err(-libc::EINVAL);
    }
    if mode & !(MODE_MASK | KEEP_SIZE) != 0 {
        return Err(-libc::EOPNOTSUPP);
    }
    match mode & MODE_MASK {
        0 | 0x10 | 0x40 => Ok(()),
        PUNCH_HOLE if mode & KEEP_SIZE != 0 => Ok(()),
        0x08 | 0x20 if mode & KEEP_SIZE == 0 => Ok(()),
        _ => Err(-libc::EOPNOTSUPP),
    }
}

/// `fallocate(mode, offset, len)` (`FALLOC_FL_*` of `<linux/falloc.h>`),
/// with `vfs_fallocate`'s checks in order: `-EINVAL` for a negative
/// offset or a length that is not positive, `-EOPNOTSUPP` for an unknown
/// mode, then `-EBADF` if the file is not open for writing, `-EFBIG` past
/// the largest offset. On a hugetlbfs file: allocation (`0`,
/// `FALLOC_FL_KEEP_SIZE`; `-ENOSPC` when the pool runs out, the pages
/// allocated before staying) and `FALLOC_FL_PUNCH_HOLE |
/// FALLOC_FL_KEEP_SIZE`; on an in-memory file only the hole punch
/// (`-EOPNOTSUPP` otherwise). A punched page is unmapped from every
/// mapping and reads as zeros after.
///
/// # Safety
///
/// `file` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_fallocate(file: *const softmm_file, mode: i32, offset: i64, len: i64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -libc::EINVAL };
        if let Err(e) = fallocate_args(mode, offset, len) {
            return e;
        }
        if !file.inner.writable {
            return -libc::EBADF;
        }
        file.inner.file.fallocate(mode, offset as u64, len as u64).map_or_else(neg, |()| 0)
    })
}

/// The file's size in bytes (`fstat`'s `st_size`) into `*out`. `-EINVAL`
/// for a `NULL` handle or `out`.
///
/// # Safety
///
/// `file` is null or a live handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_get_size(file: *const softmm_file, out: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -libc::EINVAL };
        // SAFETY: null or valid (the caller's contract).
        unsafe { put(out, file.inner.file.len()) }
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
/// returns the bytes written or `-errno`, in Linux's order: `-EINVAL` for
/// an offset above `INT64_MAX` (negative as `loff_t`), `-EBADF` if not
/// opened for writing, `-EFAULT`, `-EFBIG` past the file size limit.
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
        // `ksys_pwrite64`'s `pos < 0`, before the descriptor's mode.
        if offset > i64::MAX as u64 {
            return -i64::from(libc::EINVAL);
        }
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
/// bytes read (0 at or past the end) or `-errno`, in Linux's order:
/// `-EINVAL` for an offset above `INT64_MAX`, `-EBADF` if not opened for
/// reading, `-EFAULT`.
///
/// # Safety
///
/// `file` is null or a live handle; `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_pread(file: *const softmm_file, buf: *mut c_void, len: usize, offset: u64) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -i64::from(libc::EINVAL) };
        // `ksys_pread64`'s `pos < 0`, before the descriptor's mode.
        if offset > i64::MAX as u64 {
            return -i64::from(libc::EINVAL);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{softmm_mm_free, softmm_mm_new, softmm_mmap, softmm_phys_config_default, softmm_phys_free};

    #[test]
    fn a_hugetlbfs_file_takes_its_pages_from_the_pool() {
        let mut pc = std::mem::MaybeUninit::uninit();
        let (mut phys, mut mm, mut f, mut ro) =
            (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid outputs; handles live until freed below.
        unsafe {
            assert_eq!(softmm_phys_config_default(pc.as_mut_ptr()), 0);
            let mut pc = pc.assume_init();
            pc.bytes = 16 << 20;
            pc.hugepages = 2;
            assert_eq!(crate::softmm_phys_new_config(&pc, &mut phys), 0);
            assert_eq!(softmm_mm_new(phys, &mut mm), 0);
            let huge = 2u64 << 20;
            assert_eq!(softmm_file_create_hugetlbfs(phys, c"h".as_ptr(), 4096, libc::O_RDWR, &mut f), -libc::EINVAL);
            assert_eq!(softmm_file_create_hugetlbfs(phys, c"h".as_ptr(), huge, 3, &mut f), -libc::EINVAL);
            assert_eq!(softmm_file_create_hugetlbfs(phys, c"h".as_ptr(), huge, libc::O_RDWR, &mut f), 0);
            assert_eq!(softmm_file_create_hugetlbfs(phys, c"r".as_ptr(), huge, libc::O_RDONLY, &mut ro), 0);
            let mut size = 0;
            assert_eq!(softmm_file_get_size(f, &mut size), 0);
            assert_eq!(size, huge);
            assert_eq!(softmm_file_fallocate(ro, 0, 0, 0), -libc::EINVAL, "length checked before the mode");
            assert_eq!(softmm_file_fallocate(ro, 0x100, 0, 1), -libc::EOPNOTSUPP);
            assert_eq!(softmm_file_fallocate(ro, 0, 0, 1), -libc::EBADF);
            assert_eq!(softmm_file_fallocate(f, 0, 0, 3 * huge as i64), -libc::ENOSPC, "two pages in the pool");
            let mut mi = crate::softmm_meminfo {
                size: std::mem::size_of::<crate::softmm_meminfo>() as u32,
                ..Default::default()
            };
            assert_eq!(crate::softmm_phys_get_meminfo(phys, &mut mi), 0);
            assert_eq!((mi.hugepages_total, mi.hugepages_free), (2, 0), "the pages allocated before stay");
            assert_eq!(
                softmm_file_fallocate(f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 2 * huge as i64),
                0
            );
            assert_eq!(crate::softmm_phys_get_meminfo(phys, &mut mi), 0);
            assert_eq!(mi.hugepages_free, 2);
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let a = softmm_mmap(mm, 0, huge, rw, libc::MAP_SHARED, f, 0);
            assert!(a > 0 && a as u64 % huge == 0, "{a}");
            assert_eq!(crate::softmm_phys_get_meminfo(phys, &mut mi), 0);
            assert_eq!(mi.hugepages_rsvd, 1, "a shared mapping reserves its page");
            softmm_file_free(f);
            softmm_file_free(ro);
            softmm_mm_free(mm);
            softmm_phys_free(phys);
        }
    }
}
