//! Host-backed files: a [`File`](crate::File) whose pages come from a real
//! host file, so that an embedder can map an ELF binary or a data file.
//!
//! The page cache is softmm's own (`crate::file`); this module is its
//! `address_space_operations` on the host file: `read_folio` (a page-cache
//! miss reads the page from the host, zeros past the host's end of file)
//! and `writepages` (dirty pages written back with `pwrite`, then
//! `fdatasync`), plus the host side of `ftruncate` and `fallocate`'s hole
//! punch, which are applied to the host file at once so that a page read
//! again later never brings back bytes the file no longer has.
//!
//! Dirty tracking is the page's `PG_DIRTY`, set by a shared write fault
//! (after it makes the entry writable), the write-protect fault of a shared
//! mapping (`wp_page_shared`), `File::write_at`, forced writes and the
//! unpin of a write pin (a device's writes reach no page table), each
//! after the store is possible or done. Writeback clears it under the
//! page-cache lock, then write-protects every shared mapping of the page
//! through the file's reverse map and waits for the TLB shootdown
//! (`page_mkclean`, `AddressSpace::page_mkclean` in `sys/msync.rs`), then
//! copies the page: so only pages written since the last writeback are
//! written again, and a store racing the writeback either lands before the
//! copy or faults after the write-protect and leaves the page dirty (the
//! argument is at `Inode::writeback`). `File::pages_written_back` counts
//! the pages written.
//!
//! When writeback happens, as Linux allows it: on `msync(MS_SYNC)` of a
//! shared mapping, on `File::sync` (`fsync`), and when the file goes (its
//! last handle dropped and its last mapping unmapped, whichever comes last,
//! in that call: Linux writes back at some time after the last close, never
//! later than that here). A private mapping's writes are copies (COW) and
//! never reach the file.

use std::os::unix::fs::FileExt;

#[cfg(all(test, loom))]
mod loom_tests;

use crate::error::{Errno, Result};
use crate::PAGE_SIZE;

/// Where a host-backed file's pages are read from and written to.
enum Io {
    /// The host file.
    Host(std::fs::File),
    /// Bytes in memory, for the loom model of writeback (`loom_tests.rs`):
    /// loom runs the model thousands of times and has no host I/O to run.
    #[cfg(all(test, loom))]
    Memory(crate::sync::Mutex<Vec<u8>>),
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Io::Host(file) => file.fmt(f),
            #[cfg(all(test, loom))]
            Io::Memory(_) => f.write_str("Memory"),
        }
    }
}

/// The host file behind a [`File`](crate::File), with its access mode.
#[derive(Debug)]
pub(crate) struct HostBacking {
    file: Io,
    /// Opened for reading (the host descriptor's `O_RDONLY`/`O_RDWR`).
    pub(crate) readable: bool,
    /// Opened for writing: writeback, truncate and hole punch allowed.
    pub(crate) writable: bool,
}

impl HostBacking {
    /// Takes `file`, which must be a regular host file (`ENODEV`
    /// otherwise, as `mmap` of something else fails), and reads its access
    /// mode and size.
    pub(crate) fn new(file: std::fs::File) -> Result<(HostBacking, u64)> {
        let meta = file.metadata().map_err(|_| Errno::Io)?;
        if !meta.file_type().is_file() {
            return Err(Errno::NoDev);
        }
        // SAFETY: `F_GETFL` on a descriptor `file` owns; no memory is passed.
        let mode = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_GETFL) };
        if mode < 0 {
            return Err(Errno::BadF);
        }
        let acc = mode & libc::O_ACCMODE;
        let readable = acc == libc::O_RDONLY || acc == libc::O_RDWR;
        let writable = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        Ok((HostBacking { file: Io::Host(file), readable, writable }, meta.len()))
    }

    /// A readable and writable backing of `size` zero bytes in memory.
    #[cfg(all(test, loom))]
    pub(crate) fn memory(size: u64) -> HostBacking {
        let bytes = crate::sync::Mutex::new(vec![0; size as usize]);
        HostBacking { file: Io::Memory(bytes), readable: true, writable: true }
    }

    /// The bytes at `offset` of the in-memory backing, as written back.
    #[cfg(all(test, loom))]
    pub(crate) fn memory_bytes(&self, offset: u64, buf: &mut [u8]) {
        let Io::Memory(bytes) = &self.file else { panic!("not an in-memory backing") };
        let bytes = bytes.lock();
        buf.copy_from_slice(&bytes[offset as usize..offset as usize + buf.len()]);
    }

    /// The host file (each caller has handled an in-memory backing).
    #[inline]
    fn host(&self) -> &std::fs::File {
        match &self.file {
            Io::Host(f) => f,
            #[cfg(all(test, loom))]
            Io::Memory(_) => unreachable!("the in-memory backing is handled by each caller"),
        }
    }

    /// `read_folio`: fills `buf` (a page, or its part below the file's
    /// end) from the host at `offset`; what the host file does not have
    /// past its end reads as zeros. `EIO` if the host read fails.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        #[cfg(all(test, loom))]
        if let Io::Memory(bytes) = &self.file {
            let bytes = bytes.lock();
            let from = (offset as usize).min(bytes.len());
            let n = (bytes.len() - from).min(buf.len());
            buf[..n].copy_from_slice(&bytes[from..from + n]);
            buf[n..].fill(0);
            return Ok(());
        }
        let mut done = 0;
        while done < buf.len() {
            match self.host().read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Errno::Io),
            }
        }
        buf[done..].fill(0);
        Ok(())
    }

    /// Writes `buf` at `offset` to the host (a dirty page's bytes below
    /// the file's end). `EIO` if the host refuses.
    pub(crate) fn write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        #[cfg(all(test, loom))]
        if let Io::Memory(bytes) = &self.file {
            let mut bytes = bytes.lock();
            let end = offset as usize + buf.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[offset as usize..end].copy_from_slice(buf);
            return Ok(());
        }
        self.host().write_all_at(buf, offset).map_err(|_| Errno::Io)
    }

    /// `fdatasync` after a writeback, as `msync(MS_SYNC)` waits for.
    pub(crate) fn sync_data(&self) -> Result<()> {
        #[cfg(all(test, loom))]
        if let Io::Memory(_) = &self.file {
            return Ok(());
        }
        self.host().sync_data().map_err(|_| Errno::Io)
    }

    /// The host side of `ftruncate`: `EINVAL` on a file not opened for
    /// writing (Linux's `do_ftruncate`), `EIO` if the host refuses.
    pub(crate) fn set_len(&self, size: u64) -> Result<()> {
        if !self.writable {
            return Err(Errno::Inval);
        }
        #[cfg(all(test, loom))]
        if let Io::Memory(bytes) = &self.file {
            bytes.lock().resize(size as usize, 0);
            return Ok(());
        }
        self.host().set_len(size).map_err(|_| Errno::Io)
    }

    /// The host side of a hole punch over whole pages `[first, last)`:
    /// `EBADF` on a file not opened for writing (`vfs_fallocate`), `EIO` if
    /// the host refuses.
    pub(crate) fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        if !self.writable {
            return Err(Errno::BadF);
        }
        #[cfg(all(test, loom))]
        if let Io::Memory(bytes) = &self.file {
            let mut bytes = bytes.lock();
            let end = (offset + len).min(bytes.len() as u64) as usize;
            bytes[(offset as usize).min(end)..end].fill(0);
            return Ok(());
        }
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.host());
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: `fallocate` on a descriptor `self.file` owns; no memory is passed.
        let r = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) };
        if r != 0 {
            return Err(Errno::Io);
        }
        Ok(())
    }
}

impl HostBacking {
    /// The host file's size now (`fstat`), `0` if it cannot be read (an
    /// access then finds the page past the end: `SIGBUS`, never the host's).
    pub(crate) fn host_size(&self) -> u64 {
        #[cfg(all(test, loom))]
        if let Io::Memory(bytes) = &self.file {
            return bytes.lock().len() as u64;
        }
        self.host().metadata().map_or(0, |m| m.len())
    }

    /// The host's own `MAP_SHARED` mapping of `len` bytes of the file at
    /// `offset` (page aligned), readable, and writable if the file was
    /// opened for writing: what a coherent shared mapping's pages are
    /// (`HostFileCoherence::Shared`). The host's errno as softmm's
    /// (`EACCES`, `ENOMEM`, else `ENODEV`).
    pub(crate) fn map_shared(&self, offset: u64, len: u64) -> Result<HostMapping> {
        let prot = libc::PROT_READ | if self.writable { libc::PROT_WRITE } else { 0 };
        let fd = std::os::fd::AsRawFd::as_raw_fd(self.host());
        let (Ok(len_), Ok(off)) = (usize::try_from(len), libc::off_t::try_from(offset)) else {
            return Err(Errno::Overflow);
        };
        // SAFETY: a new mapping the kernel places (no fixed address), of a
        // descriptor `self.file` owns; no memory of ours is passed.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len_, prot, libc::MAP_SHARED, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EACCES) => Errno::Acces,
                Some(libc::ENOMEM) => Errno::NoMem,
                _ => Errno::NoDev,
            });
        }
        Ok(HostMapping { addr: p as usize, len: len_ })
    }
}

/// A host `MAP_SHARED` mapping of a host file ([`HostBacking::map_shared`]),
/// unmapped when dropped.
#[derive(Debug)]
pub(crate) struct HostMapping {
    addr: usize,
    len: usize,
}

impl HostMapping {
    /// Its first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `map_shared` made, unmapped once; whoever
        // handed out pointers into it drops it only once none is in use
        // (`crate::host_mem`'s release).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// The bytes of page `index` that lie below a file end of `size`.
pub(crate) fn page_bytes(index: u64, size: u64) -> usize {
    size.saturating_sub(index.saturating_mul(PAGE_SIZE)).min(PAGE_SIZE) as usize
}
