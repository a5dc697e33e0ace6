//! One huge page reservation at a time: within this process (tests run in
//! parallel threads) through a mutex-and-condvar flag, across processes
//! through `flock` on a lock file.
//!
//! The pool size is one global number of the host, so two reservations that
//! read it, add to it and later write back what they read would undo each
//! other. Holding this lock for a reservation's whole life serializes the
//! users of this crate. Anything else that writes `nr_hugepages` meanwhile
//! (a shell, another tool) is not covered and can still race.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crate::HostError;

/// How long a reservation waits for another one to end.
const WAIT: Duration = Duration::from_secs(300);
/// How often the cross-process lock is retried while another process holds it.
const RETRY: Duration = Duration::from_millis(20);

/// The process and thread that hold the reservation, if any. The process id
/// makes a `fork`ed child, whose copy of this flag names a thread it does not
/// have, see the flag as free.
static HOLDER: Mutex<Option<(u32, ThreadId)>> = Mutex::new(None);
static RELEASED: Condvar = Condvar::new();

/// The directory of the lock and state files: `/run` (root's tmpfs, cleared
/// at boot like the pool itself) where it exists, else `/tmp`.
pub(crate) fn lock_dir() -> PathBuf {
    if Path::new("/run").is_dir() {
        PathBuf::from("/run")
    } else {
        PathBuf::from("/tmp")
    }
}

fn holder() -> MutexGuard<'static, Option<(u32, ThreadId)>> {
    // A panic while the flag's mutex is held leaves a consistent `Option`:
    // the flag is only ever assigned whole.
    HOLDER.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reservation lock, held by one reservation at a time; released on drop.
pub(crate) struct ReservationLock {
    /// The open lock file, `flock`ed exclusively; closing it releases the
    /// lock (a `fork`ed child keeps the open file description, and so the
    /// lock, until it exits).
    _file: File,
}

impl ReservationLock {
    /// Waits up to [`WAIT`] for the other users in this process and in other
    /// processes to finish. Fails at once if this thread already holds it,
    /// which would otherwise wait for itself.
    pub(crate) fn acquire() -> Result<Self, HostError> {
        let me = thread::current().id();
        let pid = std::process::id();
        let deadline = Instant::now() + WAIT;
        {
            let mut h = holder();
            loop {
                match *h {
                    None => break,
                    Some((p, _)) if p != pid => break,
                    Some((_, t)) if t == me => return Err(HostError::Busy { holder: "this same thread" }),
                    Some(_) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(HostError::Busy { holder: "another thread of this process" });
                        }
                        h = RELEASED.wait_timeout(h, left).unwrap_or_else(|e| e.into_inner()).0;
                    }
                }
            }
            *h = Some((pid, me));
        }
        match Self::flock(deadline) {
            Ok(file) => Ok(ReservationLock { _file: file }),
            Err(e) => {
                release_in_process();
                Err(e)
            }
        }
    }

    fn flock(deadline: Instant) -> Result<File, HostError> {
        let path = lock_dir().join("softmm-hostsys-hugepages.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| HostError::io(format!("opening {}", path.display()), e))?;
        loop {
            // SAFETY: `flock` on a descriptor that `file` owns and keeps open
            // for the call; it touches no memory of ours.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 {
                return Ok(file);
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) && err.raw_os_error() != Some(libc::EINTR) {
                return Err(HostError::io(format!("flock {}", path.display()), err));
            }
            if Instant::now() >= deadline {
                return Err(HostError::Busy { holder: "another process (a test or lab run using this crate)" });
            }
            thread::sleep(RETRY);
        }
    }
}

fn release_in_process() {
    *holder() = None;
    RELEASED.notify_all();
}

impl Drop for ReservationLock {
    fn drop(&mut self) {
        // The file lock goes when `_file` closes, right after this body.
        release_in_process();
    }
}
