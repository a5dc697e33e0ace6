//! Descriptor tables, from a log's `open`/`openat`/`creat`/`close`/`dup*`/
//! `memfd_create` lines: which file each descriptor names and its open mode,
//! so that `mmap` and `mprotect` check what Linux checked (`EACCES` for a
//! shared writable mapping of a read-only descriptor, for any mapping of a
//! write-only one, `EBADF` for an `O_PATH` one).

use std::collections::HashMap;

/// An open descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Desc {
    /// The file's path as `-y` writes it (the key of its softmm file).
    pub path: String,
    /// Opened for reading (`O_RDONLY`, `O_RDWR`).
    pub readable: bool,
    /// Opened for writing (`O_WRONLY`, `O_RDWR`).
    pub writable: bool,
    /// `O_PATH`: no file operations at all (`mmap` is `EBADF`).
    pub path_only: bool,
    /// Closed by a successful `execve`.
    pub cloexec: bool,
    /// The open file description: `dup` and `fork` copy it, `open` makes a
    /// new one (VMAs of two opens of one file never merge).
    pub open: u64,
    /// Opened with `O_DIRECTORY`: a directory, which has no `mmap`.
    pub directory: bool,
    /// A `memfd_create` descriptor: its file is its own, whatever its name
    /// (two memfds of one name are two files).
    pub memfd: bool,
    /// On hugetlbfs (`memfd_create(MFD_HUGETLB)`).
    pub hugetlb: bool,
}

/// The next open file description's number.
static NEXT_OPEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Desc {
    /// The descriptor `open(path, flags)` returns.
    pub(super) fn opened(path: String, flags: i32) -> Desc {
        let acc = flags & libc::O_ACCMODE;
        Desc {
            path,
            readable: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            writable: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            path_only: flags & libc::O_PATH != 0,
            cloexec: flags & libc::O_CLOEXEC != 0,
            open: NEXT_OPEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            directory: flags & libc::O_DIRECTORY != 0,
            memfd: false,
            hugetlb: false,
        }
    }
}

/// One descriptor table (shared by threads and `CLONE_FILES` children,
/// copied by `fork`).
#[derive(Clone, Default, Debug)]
pub(super) struct FdTable {
    fds: HashMap<i64, Desc>,
}

impl FdTable {
    /// The descriptor `fd`, if the log showed it opened.
    pub(super) fn get(&self, fd: i64) -> Option<&Desc> {
        self.fds.get(&fd)
    }

    /// `fd` now names `d` (an open, or the target of a `dup2`).
    pub(super) fn install(&mut self, fd: i64, d: Desc) {
        self.fds.insert(fd, d);
    }

    pub(super) fn close(&mut self, fd: i64) {
        self.fds.remove(&fd);
    }

    /// `dup*(old) = new`: `new` names what `old` named, with its own
    /// close-on-exec flag. Unknown if `old` was (opened before tracing, or
    /// by a call the log does not show).
    pub(super) fn dup(&mut self, old: i64, new: i64, cloexec: bool) {
        match self.fds.get(&old).cloned() {
            Some(d) => {
                self.fds.insert(new, Desc { cloexec, ..d });
            }
            None => {
                self.fds.remove(&new);
            }
        }
    }

    /// The table after a successful `execve`: close-on-exec descriptors closed.
    pub(super) fn after_exec(&self) -> FdTable {
        FdTable { fds: self.fds.iter().filter(|(_, d)| !d.cloexec).map(|(&n, d)| (n, d.clone())).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_dup_and_exec() {
        let mut t = FdTable::default();
        t.install(3, Desc::opened("/a".into(), libc::O_RDONLY | libc::O_CLOEXEC));
        t.install(4, Desc::opened("/b".into(), libc::O_WRONLY));
        t.install(5, Desc::opened("/c".into(), libc::O_PATH));
        let a = t.get(3).unwrap();
        assert!(a.readable && !a.writable && a.cloexec);
        let b = t.get(4).unwrap();
        assert!(!b.readable && b.writable && !b.cloexec);
        assert!(t.get(5).unwrap().path_only);
        t.dup(3, 7, false);
        assert_eq!(t.get(7).map(|d| (d.path.as_str(), d.cloexec)), Some(("/a", false)));
        t.dup(9, 7, false);
        assert!(t.get(7).is_none(), "a dup of an unknown descriptor leaves the target unknown");
        t.dup(3, 8, false);
        let e = t.after_exec();
        assert!(e.get(3).is_none() && e.get(4).is_some() && e.get(8).is_some());
        t.close(4);
        assert!(t.get(4).is_none());
    }
}
