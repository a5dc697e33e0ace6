//! [`HugePages`]: a reservation of 2 MiB huge pages on the host, with an
//! optional hugetlbfs mount, undone on drop.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::lock::{lock_dir, ReservationLock};
use crate::HostError;

/// The size of the huge pages this crate reserves: x86-64's PMD size.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;

/// The most pages one reservation may ask for: 1280 pages, 2.5 GiB. The
/// machines softmm is developed on are shared, and a pool page is memory
/// nobody else can use until it is released.
pub const MAX_PAGES: usize = 1280;

/// The sysfs directory of the 2 MiB pool. `/proc/sys/vm/nr_hugepages` is the
/// pool of the *default* huge page size; this one is 2 MiB whatever the
/// default.
const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// Where a reservation records what it must restore, so that the next one
/// can undo a holder that died without unwinding (killed, or `abort`).
const STATE: &str = "softmm-hostsys-hugepages.state";

/// The 2 MiB pool's counters as the kernel shows them (`HugePages_Total`,
/// `_Free`, `_Rsvd`, `_Surp` of `/proc/meminfo`, read from sysfs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolCounters {
    /// Pages in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages neither allocated nor reserved-and-allocated (`free_hugepages`).
    pub free: u64,
    /// Pages reserved by mappings but not yet faulted (`resv_hugepages`).
    pub rsvd: u64,
    /// Surplus pages beyond `nr_hugepages` (`surplus_hugepages`).
    pub surp: u64,
}

fn read_u64(path: &Path) -> Result<u64, HostError> {
    let s = fs::read_to_string(path).map_err(|e| HostError::io(format!("reading {}", path.display()), e))?;
    s.trim().parse().map_err(|_| {
        HostError::io(
            format!("parsing {}", path.display()),
            io::Error::new(io::ErrorKind::InvalidData, format!("not a number: {s:?}")),
        )
    })
}

fn write_u64(path: &Path, v: u64) -> Result<(), HostError> {
    fs::write(path, format!("{v}\n")).map_err(|e| HostError::io(format!("writing {v} to {}", path.display()), e))
}

/// Reads the 2 MiB pool's counters; any user may call it (the files are
/// world-readable). Fails with [`HostError::NoHugetlb`] on a kernel without
/// the pool.
pub fn pool_counters() -> Result<PoolCounters, HostError> {
    let dir = Path::new(POOL);
    if !dir.is_dir() {
        return Err(HostError::NoHugetlb);
    }
    Ok(PoolCounters {
        total: read_u64(&dir.join("nr_hugepages"))?,
        free: read_u64(&dir.join("free_hugepages"))?,
        rsvd: read_u64(&dir.join("resv_hugepages"))?,
        surp: read_u64(&dir.join("surplus_hugepages"))?,
    })
}

/// A reservation of 2 MiB huge pages on the host, and optionally a fresh
/// hugetlbfs mount: while it lives, the host's 2 MiB pool has `pages()` more
/// pages than before; when it is dropped (also during a panic's unwind) the
/// mount is removed and the pool is set back to its size from before.
///
/// Only one reservation exists at a time: within a process, a second one
/// waits for the first (tests run in parallel threads); across processes,
/// users of this crate serialize on an `flock`ed lock file under `/run` (or
/// `/tmp`). Two processes that change `nr_hugepages` at once without that
/// lock (a shell, another tool) can still race, and the later restore wins.
///
/// A holder that dies without unwinding (killed, `abort`, `panic = "abort"`)
/// leaves a state file beside the lock; the next reservation reads it and
/// restores the pool and the mount first. A `fork`ed child that drops its
/// copy of the guard does nothing: only the process that made the
/// reservation undoes it (children should `_exit` anyway).
#[derive(Debug)]
pub struct HugePages {
    pages: usize,
    total_before: u64,
    mount: Option<PathBuf>,
    owner: libc::pid_t,
    _lock: LockHandle,
}

/// Keeps the reservation lock alive inside [`HugePages`]; opaque so that the
/// guard's `Debug` stays simple.
struct LockHandle(#[allow(dead_code)] ReservationLock);

impl std::fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReservationLock")
    }
}

impl HugePages {
    /// Grows the host's 2 MiB pool by `pages` pages, or fails with the reason
    /// and leaves the host as it was: [`HostError::NotRoot`],
    /// [`HostError::NoHugetlb`], [`HostError::TooMany`] above [`MAX_PAGES`],
    /// [`HostError::Fewer`] when the kernel added fewer pages than asked
    /// (the pool is shrunk back), [`HostError::Busy`] when another
    /// reservation lasted the whole wait (five minutes), or [`HostError::Io`].
    pub fn reserve(pages: usize) -> Result<Self, HostError> {
        Self::new(pages, false)
    }

    /// As [`HugePages::reserve`], and mounts hugetlbfs (`pagesize=2M`) on a
    /// new directory under the temporary directory, named by
    /// [`HugePages::mount_dir`]; it is unmounted and removed on drop.
    pub fn reserve_with_mount(pages: usize) -> Result<Self, HostError> {
        Self::new(pages, true)
    }

    fn new(pages: usize, mount: bool) -> Result<Self, HostError> {
        if pages > MAX_PAGES {
            return Err(HostError::TooMany { asked: pages });
        }
        // SAFETY: `geteuid` reads a process attribute; it cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(HostError::NotRoot);
        }
        if !Path::new(POOL).is_dir() {
            return Err(HostError::NoHugetlb);
        }
        let lock = ReservationLock::acquire()?;
        recover_stale();
        let nr = Path::new(POOL).join("nr_hugepages");
        let total_before = read_u64(&nr)?;
        let mut guard = HugePages {
            pages,
            total_before,
            mount: None,
            // SAFETY: `getpid` cannot fail.
            owner: unsafe { libc::getpid() },
            _lock: LockHandle(lock),
        };
        // From here on, an early return drops `guard`, which restores the
        // pool to `total_before`; the state file covers a death in between.
        guard.save_state()?;
        if pages > 0 {
            write_u64(&nr, total_before + pages as u64)?;
            let got = read_u64(&nr)?.saturating_sub(total_before) as usize;
            if got < pages {
                return Err(HostError::Fewer { asked: pages, got });
            }
        }
        if mount {
            let dir = make_dir()?;
            guard.mount = Some(dir.clone());
            // The mount is recorded first, so that a death after `mount`
            // still finds it in the state file.
            guard.save_state()?;
            if let Err(e) = mount_hugetlbfs(&dir) {
                let _ = fs::remove_dir(&dir);
                guard.mount = None;
                return Err(e);
            }
        }
        Ok(guard)
    }

    /// The pages this reservation added to the pool (exactly as many as
    /// asked: fewer is an error).
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// The pool's size before the reservation, which drop restores.
    pub fn total_before(&self) -> u64 {
        self.total_before
    }

    /// The hugetlbfs mount point, if the reservation made one
    /// ([`HugePages::reserve_with_mount`]). Files created there use the
    /// pool's 2 MiB pages.
    pub fn mount_dir(&self) -> Option<&Path> {
        self.mount.as_deref()
    }

    fn save_state(&self) -> Result<(), HostError> {
        let mut s = format!("total_before {}\n", self.total_before);
        if let Some(m) = &self.mount {
            s.push_str(&format!("mount {}\n", m.display()));
        }
        let path = lock_dir().join(STATE);
        fs::write(&path, s).map_err(|e| HostError::io(format!("writing {}", path.display()), e))
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        // SAFETY: `getpid` cannot fail.
        if unsafe { libc::getpid() } != self.owner {
            return;
        }
        // Unmount first: the files on the mount hold pool pages, which a
        // smaller pool can only give back once the files are gone.
        if let Some(dir) = self.mount.take() {
            unmount(&dir);
        }
        let _ = write_u64(&Path::new(POOL).join("nr_hugepages"), self.total_before);
        let _ = fs::remove_file(lock_dir().join(STATE));
    }
}

/// Undoes a reservation whose holder died without dropping it (see
/// [`HugePages`]); called with the reservation lock held, so the state file
/// is not anyone's live state.
fn recover_stale() {
    let path = lock_dir().join(STATE);
    let Ok(s) = fs::read_to_string(&path) else { return };
    for line in s.lines() {
        if let Some(dir) = line.strip_prefix("mount ") {
            unmount(Path::new(dir));
        }
    }
    for line in s.lines() {
        if let Some(n) = line.strip_prefix("total_before ").and_then(|n| n.trim().parse::<u64>().ok()) {
            let _ = write_u64(&Path::new(POOL).join("nr_hugepages"), n);
        }
    }
    let _ = fs::remove_file(&path);
}

/// A new, empty directory for the mount under the temporary directory.
fn make_dir() -> Result<PathBuf, HostError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    // SAFETY: `getpid` cannot fail.
    let pid = unsafe { libc::getpid() };
    loop {
        let dir = base.join(format!("softmm-hugetlbfs.{pid}.{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(HostError::io(format!("creating {}", dir.display()), e)),
        }
    }
}

fn cstring(p: &Path) -> Result<CString, HostError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| HostError::io(format!("{}", p.display()), io::Error::from(io::ErrorKind::InvalidInput)))
}

fn mount_hugetlbfs(dir: &Path) -> Result<(), HostError> {
    let target = cstring(dir)?;
    // SAFETY: every pointer is to a NUL-terminated string that lives across
    // the call (`target` above, the literals here); `mount` only reads them.
    let r = unsafe {
        libc::mount(c"none".as_ptr(), target.as_ptr(), c"hugetlbfs".as_ptr(), 0, c"pagesize=2M".as_ptr().cast())
    };
    if r != 0 {
        return Err(HostError::io(format!("mount -t hugetlbfs on {}", dir.display()), io::Error::last_os_error()));
    }
    Ok(())
}

/// Unmounts `dir` and removes it. A mount still busy (a process keeps a
/// file of it open or mapped) is detached instead: it disappears from the
/// tree now, and its pages return to the pool when the last user lets go.
fn unmount(dir: &Path) {
    if let Ok(target) = cstring(dir) {
        // SAFETY: `target` is NUL-terminated and lives across both calls.
        unsafe {
            if libc::umount2(target.as_ptr(), 0) != 0 {
                libc::umount2(target.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
