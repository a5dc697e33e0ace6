//! Access from outside the guest, for loaders and debuggers: forced reads
//! and writes (Linux's `access_remote_vm`, what `/proc/<pid>/mem` and
//! `ptrace` use), `msync`, and files backed by host files.

use std::ffi::{c_char, c_void};
use std::os::fd::FromRawFd;

use softmm::OpenFile;

use crate::{buf_mut, buf_ref, file_args, guard, guard64, neg, put, softmm_file, softmm_mm, softmm_phys};

/// The address space of a live handle, or `None` for null.
///
/// # Safety
///
/// `mm` is null or a live handle.
unsafe fn mm_ref<'a>(mm: *const softmm_mm) -> Option<&'a softmm::AddressSpace> {
    // SAFETY: null or live (the caller's contract).
    unsafe { mm.as_ref() }.map(|m| &*m.inner)
}

/// `access_remote_vm` for a read: copies up to `len` bytes at guest
/// address `addr` into `buf` and returns how many it copied; it stops at
/// the first page it cannot read, and 0 means the first one (where
/// `/proc/<pid>/mem` says `EIO`). With `force` nonzero (`FOLL_FORCE`)
/// pages without `PROT_READ` (`PROT_NONE`, execute-only) are read too.
/// `-EINVAL` for a `NULL` handle, `-EFAULT` for a `NULL` `buf` with a
/// nonzero `len`.
///
/// # Safety
///
/// `mm` is null or a live handle; `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_access_remote_read(
    mm: *const softmm_mm,
    addr: u64,
    buf: *mut c_void,
    len: usize,
    force: i32,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        // SAFETY: the caller's contract.
        let Some(data) = (unsafe { buf_mut(buf, len) }) else { return -i64::from(libc::EFAULT) };
        mm.access_remote_read(addr, data, force != 0) as i64
    })
}

/// `access_remote_vm` for a write (`FOLL_WRITE`): copies `len` bytes of
/// `buf` to guest address `addr` and returns how many it wrote, stopping
/// at the first page it cannot write. With `force` nonzero
/// (`FOLL_FORCE`, what `PTRACE_POKEDATA` and `/proc/<pid>/mem` use) a
/// private mapping without `PROT_WRITE` — text a loader patches, a
/// debugger's breakpoint — is written as Linux does: copy-on-write breaks,
/// the guest sees the new bytes, the page stays read-only to the guest and
/// the file keeps its own. A shared mapping without `PROT_WRITE` is never
/// written (0).
///
/// # Safety
///
/// `mm` is null or a live handle; `buf` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn softmm_access_remote_write(
    mm: *const softmm_mm,
    addr: u64,
    buf: *const c_void,
    len: usize,
    force: i32,
) -> i64 {
    guard64(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -i64::from(libc::EINVAL) };
        // SAFETY: the caller's contract.
        let Some(data) = (unsafe { buf_ref(buf, len) }) else { return -i64::from(libc::EFAULT) };
        mm.access_remote_write(addr, data, force != 0) as i64
    })
}

/// `msync(addr, len, flags)` (`MS_ASYNC`, `MS_SYNC`, `MS_INVALIDATE` of
/// `<sys/mman.h>`): with `MS_SYNC`, the dirty pages of host-backed files
/// mapped shared in the range are written back. Linux's errnos: `-EINVAL`
/// (flags, alignment), `-ENOMEM` (a hole in the range), `-EBUSY`
/// (`MS_INVALIDATE` on locked memory), `-EIO` (the host write failed).
///
/// # Safety
///
/// `mm` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_msync(mm: *const softmm_mm, addr: u64, len: u64, flags: i32) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm_ref(mm) }) else { return -libc::EINVAL };
        mm.msync(addr, len, flags).map_or_else(neg, |()| 0)
    })
}

/// A file whose pages come from the host file open at `fd`, as `mmap` of
/// that descriptor sees it: its size, its contents read on fault, its
/// access mode (`O_RDONLY`: no shared writable mapping, `-EACCES`). Dirty
/// shared pages go back to the host on `softmm_msync(MS_SYNC)`,
/// `softmm_file_sync` and when the file is last unmapped and freed. `fd`
/// is duplicated: the caller keeps its own. `name` is what the maps show.
/// `-EBADF` for a bad `fd`, `-ENODEV` if it is not a regular file,
/// `-EINVAL` for a `NULL` argument.
///
/// # Safety
///
/// `phys` is null or a live handle; `name` is null or a NUL-terminated
/// string; `out` is null or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_open_host(
    phys: *const softmm_phys,
    fd: i32,
    name: *const c_char,
    out: *mut *mut softmm_file,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract is `file_args`'.
        let (phys, name) = match unsafe { file_args(phys, name, out) } {
            Ok(args) => args,
            Err(e) => return e,
        };
        // SAFETY: `F_DUPFD_CLOEXEC` on any integer is a plain system call;
        // a bad descriptor is `EBADF`.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EBADF);
        }
        // SAFETY: `dup` is a descriptor just made, owned by nothing else.
        let host = unsafe { std::fs::File::from_raw_fd(dup) };
        match OpenFile::from_host(&phys.inner, host, name) {
            // SAFETY: `out` is not null and valid (the caller's contract).
            Ok(inner) => unsafe { put(out, Box::into_raw(Box::new(softmm_file { inner }))) },
            Err(e) => neg(e),
        }
    })
}

/// `fsync`: writes the dirty pages of a host-backed file back to the host
/// and waits for them (`0` at once for an in-memory file). `-EIO` if the
/// host refuses.
///
/// # Safety
///
/// `file` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_file_sync(file: *const softmm_file) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let Some(file) = (unsafe { file.as_ref() }) else { return -libc::EINVAL };
        file.inner.file.sync().map_or_else(neg, |()| 0)
    })
}
