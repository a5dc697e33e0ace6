//! The files a log maps, as in-memory softmm files shared by every process
//! of the replay (a file mapped shared by two processes is one page cache),
//! and the open mode of each descriptor an `mmap` names: from the log's
//! descriptor lines when it has them ([`super::fds`]), else inferred from
//! the whole log ([`writable_fds`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use softmm::uapi::{MAP_ANONYMOUS, MAP_HUGETLB};
use softmm::{page_align, AddressSpace, File, OpenFile, PhysMem, PAGE_SIZE};

use super::fds::Desc;
use super::parse::{Call, Fd, Record, Ret};

/// The largest file size (Linux's `MAX_LFS_FILESIZE`).
const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// The log's files.
pub(super) struct Files {
    phys: Arc<PhysMem>,
    by_key: HashMap<String, Arc<File>>,
    by_id: HashMap<u64, Arc<File>>,
    /// One softmm open per open file description of the log: by the
    /// descriptor line's description, or, without descriptor lines, by the
    /// descriptor (number and path) and the mode inferred for it.
    opens: HashMap<(u64, (i64, String), bool, bool), OpenFile>,
    /// Sizes covering every offset a successful call mapped.
    sizes: HashMap<String, u64>,
    /// Whether the log annotates descriptors with paths (`-y`): a bare fd
    /// number is then one that was not open.
    annotated: bool,
    /// Descriptors the log shows were opened for writing (inferred from the
    /// memory calls, see [`writable_fds`]).
    writable: HashSet<(i64, String)>,
    /// Paths whose file was unlinked by the end of the log (see
    /// [`deleted_paths`]): their mappings are named `PATH (deleted)`.
    deleted: HashSet<String>,
    /// Paths of `memfd_create(MFD_HUGETLB)` files, for logs without a
    /// descriptor table to say which descriptor is one.
    hugetlb: HashSet<String>,
}

/// The size of a huge page (the pool's pages).
pub(super) const HPAGE_SIZE: u64 = 2 << 20;

/// The descriptor names `-y` gives files without an `mmap` operation:
/// pipes, sockets (every protocol but packet and TCP zero-copy receive,
/// which programs map on purpose and this does not model), these anonymous
/// inodes and `/dev/null`. `mmap` of one fails with `ENODEV`.
const NO_MMAP_PREFIXES: &[&str] = &["pipe:[", "socket:["];
const NO_MMAP_NAMES: &[&str] = &[
    "/dev/null",
    "anon_inode:[eventfd]",
    "anon_inode:[signalfd]",
    "anon_inode:[timerfd]",
    "anon_inode:[eventpoll]",
    "anon_inode:[pidfd]",
    "anon_inode:[userfaultfd]",
    "anon_inode:inotify",
    "anon_inode:[fanotify]",
];

/// Whether the file behind `fd` has no `mmap` operation (Linux's `mmap`
/// then fails with `ENODEV`): a pipe, a socket, an eventfd (and the other
/// anonymous inodes of [`NO_MMAP_NAMES`]), `/dev/null`, or a directory (one
/// opened with `O_DIRECTORY`, or an absolute path that is a directory here).
pub(super) fn no_mmap(fd: &Fd, desc: Option<&Desc>) -> bool {
    let path = match (fd, desc) {
        (Fd::Path(_, p), _) => p.as_str(),
        (Fd::Num(_), Some(d)) => d.path.as_str(),
        _ => return false,
    };
    NO_MMAP_PREFIXES.iter().any(|p| path.starts_with(p))
        || NO_MMAP_NAMES.contains(&path)
        || desc.is_some_and(|d| d.directory && d.path == path)
        || (path.starts_with('/') && std::fs::metadata(path).is_ok_and(|m| m.is_dir()))
}

/// The paths whose file the log shows unlinked at its end: the last line
/// naming the path is an `unlink` of it or an `mmap` whose descriptor `-y`
/// marks `(deleted)` (always so for a memfd).
fn deleted_paths(records: &[Record]) -> HashSet<String> {
    let mut last: HashMap<String, bool> = HashMap::new();
    for r in records {
        match (&r.call, r.ret) {
            (Call::Mmap { fd: Fd::Path(_, p), .. }, _) => {
                last.insert(p.clone(), r.text.contains(&format!("<{p}>(deleted)")));
            }
            (Call::Unlink { path }, Ret::Val(_)) => {
                last.insert(path.clone(), true);
            }
            (Call::Open { .. }, Ret::Val(_)) => {
                if let Some(p) = &r.ret_path {
                    last.insert(p.clone(), false);
                }
            }
            (Call::MemfdCreate { .. }, Ret::Val(_)) => {
                if let Some(p) = &r.ret_path {
                    last.insert(p.clone(), true);
                }
            }
            _ => {}
        }
    }
    last.into_iter().filter(|&(_, d)| d).map(|(p, _)| p).collect()
}

impl Files {
    /// The files of `records`, created on first use.
    pub(super) fn new(phys: &Arc<PhysMem>, records: &[Record]) -> Files {
        // A failed call proves nothing about the file, and its length or
        // offset may be any number.
        let mut sizes: HashMap<String, u64> = HashMap::new();
        for r in records {
            if let (Call::Mmap { len, fd, off, .. }, Ret::Val(_)) = (&r.call, r.ret) {
                if let Some(k) = fd.key() {
                    let e = sizes.entry(k).or_insert(PAGE_SIZE);
                    *e = (*e).max(off.saturating_add(page_align(*len)).min(MAX_FILE_SIZE));
                }
            }
        }
        Files {
            phys: phys.clone(),
            by_key: HashMap::new(),
            by_id: HashMap::new(),
            opens: HashMap::new(),
            sizes,
            annotated: records.iter().any(|r| matches!(&r.call, Call::Mmap { fd: Fd::Path(..), .. })),
            writable: writable_fds(records),
            deleted: deleted_paths(records),
            hugetlb: records
                .iter()
                .filter(|r| matches!(r.call, Call::MemfdCreate { hugetlb: true, .. }))
                .filter_map(|r| r.ret_path.clone())
                .collect(),
        }
    }

    /// Huge pages the log's successful hugetlb mappings take, all at once
    /// (an upper bound of what the recorded program had in use): the pool
    /// the replay gets by default.
    ///
    /// Where an anonymous `MAP_HUGETLB` mapping failed with `ENOMEM`, the
    /// recording host's pool ran out, and the upper bound would let it
    /// succeed: the anonymous part is then the most pages the log's
    /// anonymous hugetlb mappings held at once (each freed by the `munmap`
    /// that covers it), as `hugetlb_madv_vs_map` shows with a pool of one
    /// page. hugetlbfs files keep their pages after `munmap`, so each of
    /// their mappings counts in full either way.
    pub(super) fn hugepages_needed(records: &[Record]) -> u64 {
        let hugetlb: HashSet<String> = records
            .iter()
            .filter(|r| matches!(r.call, Call::MemfdCreate { hugetlb: true, .. }))
            .filter_map(|r| r.ret_path.clone())
            .collect();
        let (mut files, mut anon, mut live, mut peak, mut ran_out) = (0u64, 0u64, 0u64, 0u64, false);
        // Live anonymous hugetlb mappings: start -> end (recorded addresses).
        let mut mapped = std::collections::BTreeMap::<u64, u64>::new();
        for r in records {
            match (&r.call, r.ret) {
                (Call::Mmap { len, flags, fd, .. }, Ret::Val(addr)) => {
                    let pages = len.div_ceil(HPAGE_SIZE);
                    if flags & MAP_ANONYMOUS == 0 {
                        if matches!(fd, Fd::Path(_, p) if hugetlb.contains(p)) {
                            files = files.saturating_add(pages);
                        }
                    } else if flags & MAP_HUGETLB != 0 {
                        anon = anon.saturating_add(pages);
                        let end = addr.saturating_add(pages * HPAGE_SIZE);
                        // MAP_FIXED over a live one replaces it.
                        live = live.saturating_sub(Self::unmap_hugetlb(&mut mapped, addr, end));
                        mapped.insert(addr, end);
                        live += pages;
                        peak = peak.max(live);
                    }
                }
                (Call::Mmap { flags, .. }, Ret::Err(libc::ENOMEM))
                    if flags & MAP_ANONYMOUS != 0 && flags & MAP_HUGETLB != 0 =>
                {
                    ran_out = true
                }
                (Call::Munmap { addr, len }, Ret::Val(_)) => {
                    live = live.saturating_sub(Self::unmap_hugetlb(
                        &mut mapped,
                        *addr,
                        addr.saturating_add(page_align(*len)),
                    ));
                }
                _ => {}
            }
        }
        files.saturating_add(if ran_out { peak } else { anon })
    }

    /// Forgets the live anonymous hugetlb mappings that `[start, end)` covers
    /// (or overlaps: a hugetlb VMA is unmapped only in whole huge pages),
    /// returning their huge pages.
    fn unmap_hugetlb(mapped: &mut std::collections::BTreeMap<u64, u64>, start: u64, end: u64) -> u64 {
        let gone: Vec<(u64, u64)> = mapped.range(..end).filter(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        gone.iter()
            .map(|&(s, e)| {
                mapped.remove(&s);
                // The huge pages of [s, e) the unmap covers; the rest stays.
                let (cut_s, cut_e) = (s.max(start), e.min(end));
                if cut_s > s {
                    mapped.insert(s, cut_s);
                }
                if cut_e < e {
                    mapped.insert(cut_e, e);
                }
                (cut_e - cut_s).div_ceil(HPAGE_SIZE)
            })
            .sum()
    }

    /// The file at `path`, or for a memfd the descriptor's own (`desc`). A
    /// descriptor the log names is open whatever its size: a file too large
    /// for softmm gets one page rather than turning the descriptor bad.
    fn file(&mut self, path: &str, desc: Option<&Desc>) -> Option<Arc<File>> {
        let memfd = desc.filter(|d| d.memfd);
        let key = match memfd {
            Some(d) => format!("{path}\0{}", d.open),
            None => path.to_string(),
        };
        if let Some(f) = self.by_key.get(&key) {
            return Some(f.clone());
        }
        let name = if self.deleted.contains(path) { format!("{path} (deleted)") } else { path.to_string() };
        let size = self.sizes.get(path).copied().unwrap_or(PAGE_SIZE);
        let hugetlb = memfd.map_or_else(|| self.hugetlb.contains(path), |d| d.hugetlb);
        let f = if hugetlb {
            File::create_hugetlbfs(&self.phys, &name, size.div_ceil(HPAGE_SIZE).max(1) * HPAGE_SIZE)
        } else {
            File::create(&self.phys, &name, size).or_else(|_| File::create(&self.phys, &name, PAGE_SIZE))
        }
        .ok()?;
        self.by_key.insert(key, f.clone());
        self.by_id.insert(f.id(), f.clone());
        Some(f)
    }

    /// The open file an `mmap` with `prot` and `flags` of `fd` gets, `None`
    /// for an anonymous mapping or a descriptor that was not open (or is
    /// `O_PATH`). `desc` is what the log's descriptor lines say `fd` is;
    /// without it the mode is inferred: writable if the log shows it (see
    /// [`writable_fds`]) and the call did not fail with `EACCES`, which a
    /// shared writable mapping gets for a read-only descriptor and any other
    /// mapping for a write-only one.
    pub(super) fn for_mmap(
        &mut self,
        fd: &Fd,
        prot: i32,
        flags: i32,
        expected: Result<u64, i32>,
        desc: Option<&Desc>,
    ) -> Option<OpenFile> {
        if flags & MAP_ANONYMOUS != 0 || (self.annotated && matches!(fd, Fd::Num(_))) {
            return None;
        }
        let key = fd.key()?;
        // The table's entry if it names this file (a path `-y` could not
        // resolve the same way is not trusted).
        if let Some(d) = desc.filter(|d| matches!(fd, Fd::Num(_)) || d.path == key) {
            if d.path_only {
                return None;
            }
            let file = self.file(&key, Some(d))?;
            return Some(self.open(&file, (d.open, (-1, String::new())), d.readable, d.writable));
        }
        let file = self.file(&key, None)?;
        let shared_write = is_shared(flags) && prot & libc::PROT_WRITE != 0;
        let (readable, writable) = match expected {
            Err(libc::EACCES) if !shared_write => (false, true),
            Err(libc::EACCES) => (true, false),
            _ => (true, self.writable.contains(&fd_mode_key(fd))),
        };
        Some(self.open(&file, (0, fd_mode_key(fd)), readable, writable))
    }

    /// The softmm open of `file` for the description `key` with this mode,
    /// made on first use.
    fn open(&mut self, file: &Arc<File>, key: (u64, (i64, String)), readable: bool, writable: bool) -> OpenFile {
        self.opens
            .entry((key.0, key.1, readable, writable))
            .or_insert_with(|| OpenFile::new(file, readable, writable))
            .clone()
    }

    /// Drops every file (after the address spaces that mapped them).
    pub(super) fn clear(&mut self) {
        self.opens.clear();
        self.by_key.clear();
        self.by_id.clear();
    }

    /// Makes the file behind the mapping at `addr` of `mm` cover it (an
    /// `mremap` grew a file mapping).
    pub(super) fn grow(&self, mm: &AddressSpace, addr: u64) {
        if let Some(m) = mm.maps().into_iter().find(|m| m.start <= addr && addr < m.end) {
            if let Some(f) = self.by_id.get(&m.inode) {
                let need = m.offset + (m.end - m.start);
                if f.len() < need {
                    let _ = f.set_len(need);
                }
            }
        }
    }
}

fn fd_mode_key(fd: &Fd) -> (i64, String) {
    match fd {
        Fd::None => (-1, String::new()),
        Fd::Num(n) => (*n, String::new()),
        Fd::Path(n, p) => (*n, p.clone()),
    }
}

fn is_shared(flags: i32) -> bool {
    matches!(flags & softmm::uapi::MAP_TYPE, softmm::uapi::MAP_SHARED | softmm::uapi::MAP_SHARED_VALIDATE)
}

/// The descriptors the log shows were writable: a shared writable mapping
/// of it succeeded, or write permission was added to one with `mprotect`
/// (which succeeded, or failed with `ENOMEM` for a hole further on: Linux
/// checks the VMAs in order and refuses a read-only shared one with `EACCES`
/// before it meets the hole; the mapping at `addr` passed). Others are taken
/// as opened read-only (what `mmap` and `mprotect` check).
fn writable_fds(records: &[Record]) -> HashSet<(i64, String)> {
    let mut out = HashSet::new();
    let mut shared: Vec<(u64, u64, (i64, String))> = Vec::new();
    for r in records {
        match (&r.call, r.ret) {
            (Call::Mmap { len, prot, flags, fd, .. }, Ret::Val(a)) if is_shared(*flags) && fd.key().is_some() => {
                if prot & libc::PROT_WRITE != 0 {
                    out.insert(fd_mode_key(fd));
                }
                shared.push((a, a.saturating_add(page_align(*len)), fd_mode_key(fd)));
            }
            (Call::Mprotect { addr, len, prot }, Ret::Val(0)) if prot & libc::PROT_WRITE != 0 => {
                let end = addr.saturating_add(page_align(*len));
                for (s, e, k) in &shared {
                    if *s < end && *addr < *e {
                        out.insert(k.clone());
                    }
                }
            }
            (Call::Mprotect { addr, prot, .. }, Ret::Err(libc::ENOMEM)) if prot & libc::PROT_WRITE != 0 => {
                // The latest shared mapping containing `addr`.
                if let Some((_, _, k)) = shared.iter().rev().find(|(s, e, _)| s <= addr && addr < e) {
                    out.insert(k.clone());
                }
            }
            _ => {}
        }
    }
    out
}
