//! The host's PMD sharing, measured as softmm's counters will be: how many
//! minor faults a `fork`ed child takes to touch every page of a 1 GiB
//! hugetlbfs window that its parent has already faulted in.
//!
//! Linux shares the PMD table of a PUD-aligned 1 GiB window between
//! `VM_MAYSHARE` mappings of the same file at the same offset
//! (`want_pmd_share`, `huge_pmd_share` in `mm/hugetlb.c`), and `fork` copies
//! no page tables of a VMA without an `anon_vma` (`vma_needs_copy`). So a
//! child of a shared, aligned mapping finds an empty PUD entry, faults once,
//! links the parent's PMD table, and sees all 512 pages: one minor fault. A
//! window that is not PUD-aligned cannot share (no PUD range lies wholly in
//! the VMA), and a private mapping never shares: 512 faults, one per page.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use crate::{HostError, HUGE_PAGE_SIZE};

/// The size and alignment of the window one PMD table maps: x86-64's PUD size.
pub const PUD_SIZE: u64 = 1 << 30;

/// Pages in one PUD window.
pub const PAGES_PER_PUD: u64 = PUD_SIZE / HUGE_PAGE_SIZE;

/// Where and how the probe maps its 1 GiB hugetlbfs file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `MAP_SHARED` at a 1 GiB-aligned address: the window can share its
    /// PMD table. The parent write-faults every page.
    SharedPudAligned,
    /// `MAP_SHARED` at a 1 GiB-aligned address plus 2 MiB: the mapping
    /// straddles two PUD windows and covers neither, so nothing shares. The
    /// parent write-faults every page.
    SharedMisaligned,
    /// `MAP_PRIVATE | MAP_NORESERVE` at a 1 GiB-aligned address: private
    /// mappings never share. The parent *read*-faults every page, which maps
    /// the page-cache pages without an `anon_vma`, so fork copies no page
    /// tables either (after a write, fork would copy them and the child
    /// would take none; the write would also need a second 1 GiB of pages).
    Private,
}

/// What the probe measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareProbe {
    /// Pages the child touched (one read per 2 MiB page): [`PAGES_PER_PUD`].
    pub pages: u64,
    /// The parent's minor faults (`RUSAGE_THREAD`) while it faulted the
    /// window in.
    pub parent_minflt: u64,
    /// The child's minor faults (`RUSAGE_SELF`) while it touched every page
    /// once after the fork.
    pub child_minflt: u64,
}

fn last_err(what: &str) -> HostError {
    HostError::io(what.to_string(), io::Error::last_os_error())
}

/// A mapping unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr+len` is a mapping this process made and that
        // nothing refers to once the probe returns.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// Minor faults of `who` so far.
fn minflt(who: libc::c_int) -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(who, &mut ru) };
    ru.ru_minflt as u64
}

/// Reads (or writes) one byte of each of `pages` pages `stride` bytes apart.
///
/// # Safety
///
/// `base + i * stride` for `i < pages` must be mapped readable (writable
/// for `write`).
#[inline(never)]
unsafe fn touch(base: *mut u8, pages: u64, stride: u64, write: bool) {
    for i in 0..pages {
        // SAFETY: in the mapping, by the caller's contract.
        let p = unsafe { base.add((i * stride) as usize) };
        if write {
            // SAFETY: as above, and writable.
            unsafe { ptr::write_volatile(p, 1) };
        } else {
            // SAFETY: as above.
            unsafe { ptr::read_volatile(p) };
        }
    }
}

/// Minor faults of this process while it reads `pages` pages of `base`.
///
/// # Safety
///
/// As [`touch`], reading.
#[inline(never)]
unsafe fn faults_reading(base: *mut u8, pages: u64, stride: u64) -> u64 {
    let before = minflt(libc::RUSAGE_SELF);
    // SAFETY: the caller's contract.
    unsafe { touch(base, pages, stride, false) };
    minflt(libc::RUSAGE_SELF) - before
}

/// Measures, on the host, the minor faults a `fork`ed child takes to read
/// every 2 MiB page of a 1 GiB hugetlbfs file its parent (this thread)
/// mapped with `placement` and faulted in. `dir` must be a hugetlbfs mount
/// with 512 free pages for the file (a [`crate::HugePages`] of at least
/// [`PAGES_PER_PUD`] pages with a mount); the file is removed again.
///
/// The host answers 1 for [`Placement::SharedPudAligned`] (the child links
/// the parent's PMD table) and 512 for the others. The child runs only
/// async-signal-safe calls, so the caller may have other threads.
pub fn probe_pmd_share(dir: &Path, placement: Placement) -> Result<ShareProbe, HostError> {
    let path = dir.join(format!("pmd-share-probe.{}", std::process::id()));
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| HostError::io(path.display().to_string(), io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: `cpath` is NUL-terminated and lives across the call.
    let fd =
        unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(last_err(&format!("creating {}", path.display())));
    }
    let r = probe_file(fd, placement);
    // SAFETY: `fd` is ours; `cpath` as above. The file's pages go back to
    // the pool once the mappings (gone by now) and the name are.
    unsafe {
        libc::close(fd);
        libc::unlink(cpath.as_ptr());
    }
    r
}

fn probe_file(fd: libc::c_int, placement: Placement) -> Result<ShareProbe, HostError> {
    let len = PUD_SIZE as usize;
    // Every page in the page cache first, so that no variant allocates in a
    // fault (a private read fault then maps the cached page without an
    // `anon_vma`).
    // SAFETY: `fallocate` on our own descriptor; no memory of ours involved.
    if unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) } != 0 {
        return Err(last_err("fallocate of the 1 GiB probe file (free huge pages short?)"));
    }
    // Room for a 1 GiB window at a 1 GiB-aligned address plus 2 MiB.
    let room = 3 * len;
    // SAFETY: a fresh inaccessible anonymous reservation at an address the
    // kernel picks; nothing is read or written through it.
    let res = unsafe {
        libc::mmap(
            ptr::null_mut(),
            room,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if res == libc::MAP_FAILED {
        return Err(last_err("reserving 3 GiB of address space"));
    }
    let _room = Mapping { addr: res, len: room };
    let aligned = (res as u64).next_multiple_of(PUD_SIZE);
    let (addr, flags, write) = match placement {
        Placement::SharedPudAligned => (aligned, libc::MAP_SHARED, true),
        Placement::SharedMisaligned => (aligned + HUGE_PAGE_SIZE, libc::MAP_SHARED, true),
        Placement::Private => (aligned, libc::MAP_PRIVATE | libc::MAP_NORESERVE, false),
    };
    // SAFETY: `addr..addr+len` lies inside the reservation above, which is
    // ours and unused, so MAP_FIXED replaces nothing anyone else uses.
    let p =
        unsafe { libc::mmap(addr as *mut _, len, libc::PROT_READ | libc::PROT_WRITE, flags | libc::MAP_FIXED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(last_err("mmap of the 1 GiB probe file"));
    }
    let base = p.cast::<u8>();
    let before = minflt(libc::RUSAGE_THREAD);
    // SAFETY: `base` maps 1 GiB readable and writable, PAGES_PER_PUD pages
    // of HUGE_PAGE_SIZE.
    unsafe { touch(base, PAGES_PER_PUD, HUGE_PAGE_SIZE, write) };
    let parent_minflt = minflt(libc::RUSAGE_THREAD) - before;

    // The child's answer comes back through a shared anonymous page.
    // SAFETY: a fresh shared anonymous page at an address the kernel picks.
    let shared = unsafe {
        libc::mmap(
            ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if shared == libc::MAP_FAILED {
        return Err(last_err("mmap of the result page"));
    }
    let _shared = Mapping { addr: shared, len: 4096 };
    let slot = shared.cast::<u64>();
    // SAFETY: `slot` is the start of the page mapped above.
    unsafe { ptr::write_volatile(slot, u64::MAX) };

    // SAFETY: the child calls only async-signal-safe functions (getrusage,
    // _exit) and touches memory that exists in it (its copy of the mappings
    // above), then ends with `_exit`, running no destructor.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(last_err("fork"));
    }
    if pid == 0 {
        // A dry run over the result page first: it faults in the code and
        // stack pages of the measurement (text pages are not copied at fork
        // either), so the real run counts only the window's faults.
        // SAFETY: the result page is mapped readable in the child; `base`
        // maps the window, as in the parent.
        unsafe {
            faults_reading(shared.cast(), 1, 0);
            let n = faults_reading(base, PAGES_PER_PUD, HUGE_PAGE_SIZE);
            ptr::write_volatile(slot, n);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child, writing only `status`.
    let w = unsafe { libc::waitpid(pid, &mut status, 0) };
    if w != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(HostError::io(
            "the probe's child",
            io::Error::other(format!("did not exit cleanly (status {status:#x})")),
        ));
    }
    // SAFETY: the page is still mapped; the child wrote it before exiting.
    let child_minflt = unsafe { ptr::read_volatile(slot) };
    Ok(ShareProbe { pages: PAGES_PER_PUD, parent_minflt, child_minflt })
}
