//! `softmm replay`: runs the memory-mapping calls of a traced program against
//! one softmm address space and compares every result with the recorded one.
//!
//! Faithfulness:
//! * The heap starts at the log's first `brk` result (the initial break).
//! * Files named in the log become in-memory files covering every offset the
//!   log maps (grown if an `mremap` extends a file mapping).
//! * `--addresses recorded`: a non-fixed `mmap` that succeeded is made at the
//!   recorded address with `MAP_FIXED_NOREPLACE` (so a divergence shows up as
//!   `EEXIST`, never as a silent overwrite); a moving `mremap` gets
//!   `MREMAP_FIXED` to the recorded address.
//! * `--addresses own`: softmm chooses; later calls on the recorded addresses
//!   are translated to softmm's, and each different choice is reported.
//! * Mappings made before tracing began (the executable, the stack, the vDSO)
//!   are unknown. A call the log recorded as successful on a range that no
//!   earlier traced call touched ("pre-trace") gets an anonymous placeholder
//!   where its success proves memory by Linux's own checks and softmm has
//!   none, and nowhere else (see [`proof`]); each placeholder is reported
//!   with the line that required it.
//! * Calls of several threads whose spans overlap (`<unfinished ...>`) are
//!   replayed in the order their results were written; if one then collides
//!   with a mapping an overlapping call of another thread removed, that call
//!   is replayed first.

pub mod parse;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use softmm::uapi::{
    MAP_ANONYMOUS, MAP_FIXED, MAP_FIXED_NOREPLACE, MAP_PRIVATE, MREMAP_DONTUNMAP, MREMAP_FIXED, MREMAP_MAYMOVE,
};
use softmm::{page_align, AddressSpace, File, MmConfig, OpenFile, PhysConfig, PhysMem, PAGE_SIZE};

use parse::{errno_name, Call, Fd, Record, Ret};

/// Where non-fixed mappings go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Addresses {
    /// At the address the log recorded.
    Recorded,
    /// Wherever softmm chooses.
    Own,
}

/// Options of a replay.
#[derive(Debug, Clone)]
pub struct Options {
    /// Placement of non-fixed mappings.
    pub addresses: Addresses,
    /// Print the final mappings.
    pub maps: bool,
    /// Print every call.
    pub verbose: bool,
    /// Arena bytes (default: enough for the populating calls in the log).
    pub arena: Option<u64>,
}

/// Ranges of addresses, merged.
#[derive(Default)]
struct RangeSet {
    /// start → end
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        let overlapping: Vec<(u64, u64)> =
            self.map.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.map.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.map.insert(start, end);
    }

    /// Removes `[start, end)` from the set.
    fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let overlapping: Vec<(u64, u64)> =
            self.map.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, start);
            }
            if e > end {
                self.map.insert(end, e);
            }
        }
    }

    /// The parts of `[start, end)` not in the set.
    fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = start;
        if let Some((_, &e)) = self.map.range(..=start).next_back() {
            cur = cur.max(e);
        }
        for (&s, &e) in self.map.range(start..end) {
            if s > cur {
                out.push((cur, s));
            }
            cur = cur.max(e);
        }
        if cur < end {
            out.push((cur, end));
        }
        out
    }
}

/// Recorded-address ranges softmm placed elsewhere (`--addresses own`).
#[derive(Default)]
struct Translation {
    /// (recorded start, recorded end, softmm start − recorded start)
    ranges: Vec<(u64, u64, u64)>,
}

impl Translation {
    fn add(&mut self, rec: u64, len: u64, own: u64) {
        self.ranges.push((rec, rec.saturating_add(page_align(len).max(PAGE_SIZE)), own.wrapping_sub(rec)));
    }

    fn tr(&self, a: u64) -> u64 {
        match self.ranges.iter().rev().find(|&&(s, e, _)| s <= a && a < e) {
            Some(&(_, _, d)) => a.wrapping_add(d),
            None => a,
        }
    }
}

/// An anonymous mapping standing for memory mapped before tracing began.
struct Placeholder {
    /// softmm addresses.
    start: u64,
    end: u64,
    /// The log line whose recorded success proved the memory.
    line: usize,
    call: &'static str,
}

/// The range (recorded addresses) that a call's recorded success proves was
/// mapped before it, by the checks Linux makes before it succeeds; `None`
/// where success proves nothing (`munmap`, `mmap`, `brk`, an empty range).
///
/// * `mprotect`, `madvise`: the whole range (a hole is `ENOMEM`).
/// * `mremap` that resizes in place or moves without `MREMAP_FIXED`: a shrink
///   or a same-size call only looks up the VMA at `old` (its tail may cross
///   holes and other VMAs): one page; a growth needs `[old, old + old_len)`
///   in one VMA (`EFAULT` otherwise).
/// * `mremap` with `MREMAP_FIXED` or `MREMAP_DONTUNMAP`: `[old, old +
///   min(old_len, new_len))` in one VMA; a same-size `MREMAP_FIXED` move
///   moves every VMA in the range, holes and all, and needs only the VMA at
///   `old`: one page. (Checked on Linux 6.18.)
fn proof(call: &Call) -> Option<(u64, u64)> {
    let (start, len) = match *call {
        Call::Mprotect { addr, len, .. } | Call::Madvise { addr, len, .. } => (addr, page_align(len)),
        Call::Mremap { old, old_len, new_len, flags, .. } => {
            let (o, n) = (page_align(old_len), page_align(new_len));
            let len = if flags & MREMAP_FIXED != 0 && o == n {
                PAGE_SIZE
            } else if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 {
                o.min(n)
            } else if n <= o {
                PAGE_SIZE
            } else {
                o
            };
            (old, len.max(PAGE_SIZE))
        }
        Call::Mmap { .. } | Call::Munmap { .. } | Call::Brk { .. } => return None,
    };
    let end = start.checked_add(len)?;
    (start < end).then_some((start, end))
}

/// The replay's state.
struct Replayer {
    mm: Arc<AddressSpace>,
    phys: Arc<PhysMem>,
    opts: Options,
    files: HashMap<String, Arc<File>>,
    /// Whether the log annotates descriptors with paths (`-y`): a bare fd
    /// number is then one that was not open.
    annotated: bool,
    /// Descriptors the log shows were opened for writing.
    writable: HashSet<(i64, String)>,
    files_by_id: HashMap<u64, Arc<File>>,
    known: RangeSet,
    tr: Translation,
    mismatches: Vec<String>,
    pretrace: BTreeMap<&'static str, usize>,
    placeholders: Vec<Placeholder>,
    placed_differently: Vec<String>,
    reordered: Vec<String>,
    counts: BTreeMap<&'static str, usize>,
    out: String,
}

fn show(r: Result<u64, i32>) -> String {
    match r {
        Ok(0) => "0".to_string(),
        Ok(v) => format!("{v:#x}"),
        Err(e) => format!("-1 {}", errno_name(e)),
    }
}

fn recorded(ret: Ret) -> Result<u64, i32> {
    match ret {
        Ret::Val(v) => Ok(v),
        Ret::Err(e) => Err(e),
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
/// of it succeeded, or write permission was added to one with `mprotect`.
/// Others are taken as opened read-only (what `mmap` and `mprotect` check).
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
            _ => {}
        }
    }
    out
}

fn code(e: softmm::Errno) -> i32 {
    e.code()
}

impl Replayer {
    fn file(&mut self, fd: &Fd, sizes: &HashMap<String, u64>) -> Option<Arc<File>> {
        let key = fd.key()?;
        if let Some(f) = self.files.get(&key) {
            return Some(f.clone());
        }
        // A descriptor the log names is open whatever its size: a file too
        // large for softmm gets one page rather than turning the descriptor bad.
        let size = sizes.get(&key).copied().unwrap_or(PAGE_SIZE);
        let f = File::create(&self.phys, &key, size).or_else(|_| File::create(&self.phys, &key, PAGE_SIZE)).ok()?;
        self.files.insert(key, f.clone());
        self.files_by_id.insert(f.id(), f.clone());
        Some(f)
    }

    /// Parts of `[start, end)` (softmm addresses) with no mapping.
    fn unmapped(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut cur = start;
        let mut out = Vec::new();
        for m in self.mm.maps() {
            if m.end <= cur {
                continue;
            }
            if m.start >= end {
                break;
            }
            if m.start > cur {
                out.push((cur, m.start));
            }
            cur = cur.max(m.end);
        }
        if cur < end {
            out.push((cur, end));
        }
        out
    }

    /// Before a call recorded as successful: maps placeholders where the
    /// range its success proves (see [`proof`]) is pre-trace (no traced call
    /// touched it) and softmm has nothing, and counts the call.
    fn pretrace(&mut self, r: &Record) {
        let Some((addr, end)) = proof(&r.call) else {
            return;
        };
        let gaps = self.known.gaps(addr, end);
        if gaps.is_empty() {
            return;
        }
        *self.pretrace.entry(r.call.name()).or_default() += 1;
        for (s, e) in gaps {
            // Proven now: later calls find it in softmm or see it unmapped
            // by a traced call.
            self.known.insert(s, e);
            let (s, e) = (self.tr.tr(s), self.tr.tr(s).saturating_add(e - s));
            for (hs, he) in self.unmapped(s, e) {
                let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
                if self.mm.mmap(hs, he - hs, libc::PROT_READ | libc::PROT_WRITE, flags, None, 0).is_ok() {
                    self.placeholders.push(Placeholder { start: hs, end: he, line: r.line, call: r.call.name() });
                }
            }
        }
    }

    fn mismatch(&mut self, r: &Record, expected: Result<u64, i32>, actual: Result<u64, i32>, note: &str) {
        let pid = r.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        let mut m =
            format!("line {}{}: {} = {} recorded, softmm {}", r.line, pid, r.text, show(expected), show(actual));
        if !note.is_empty() {
            let _ = write!(m, " ({note})");
        }
        self.mismatches.push(m);
    }

    /// Whether `r` may be replayed before a call that collides with the
    /// mapping it removes or moves.
    fn frees(r: &Record) -> bool {
        matches!(r.call, Call::Munmap { .. } | Call::Mremap { .. })
            || matches!(r.call, Call::Mmap { flags, .. } if flags & MAP_FIXED != 0)
    }

    /// Replays one call; `Err(())` when a recorded-address placement collided
    /// (the caller may retry after replaying an overlapping call).
    fn step(&mut self, r: &Record, sizes: &HashMap<String, u64>, last_try: bool) -> Result<(), ()> {
        let own = self.opts.addresses == Addresses::Own;
        let exp = recorded(r.ret);
        *self.counts.entry(r.call.name()).or_default() += 1;
        let got: Result<u64, i32>;
        match r.call {
            Call::Mmap { addr, len, prot, flags, ref fd, off } => {
                let fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0;
                let file = match fd {
                    _ if flags & MAP_ANONYMOUS != 0 => None,
                    Fd::Num(_) if self.annotated => None,
                    _ => self.file(fd, sizes),
                };
                let open = file.as_ref().map(|f| {
                    if exp != Err(libc::EACCES) && self.writable.contains(&fd_mode_key(fd)) {
                        OpenFile::read_write(f)
                    } else {
                        OpenFile::read_only(f)
                    }
                });
                let (a, fl) = match (own, fixed, exp) {
                    (false, false, Ok(rec)) => (rec, flags | MAP_FIXED_NOREPLACE),
                    (true, _, _) => (self.tr.tr(addr), flags),
                    _ => (addr, flags),
                };
                got = self.mm.mmap(a, len, prot, fl, open.as_ref(), off).map_err(code);
                if !own && !fixed && exp.is_ok() && got == Err(libc::EEXIST) && !last_try {
                    *self.counts.entry("mmap").or_default() -= 1;
                    return Err(());
                }
                match (exp, got) {
                    (Ok(rec), Ok(g)) => {
                        if own && !fixed && g != rec {
                            self.tr.add(rec, len, g);
                            self.placed_differently
                                .push(format!("line {}: {} at {g:#x}, recorded {rec:#x}", r.line, r.text));
                        } else if (own && fixed && g != self.tr.tr(rec)) || (!own && g != rec) {
                            self.mismatch(r, exp, got, "");
                        }
                        self.known.insert(rec, rec.saturating_add(page_align(len)));
                    }
                    (Err(e), Err(g)) if e == g => {}
                    (Err(_), Ok(g)) => {
                        self.mismatch(r, exp, got, "undone");
                        if !fixed {
                            let _ = self.mm.munmap(g, len);
                        }
                    }
                    _ => self.mismatch(r, exp, got, ""),
                }
            }
            Call::Munmap { addr, len } => {
                // Success proves nothing: Linux unmaps holes without error.
                got = self.mm.munmap(self.tr.tr(addr), len).map(|()| 0).map_err(code);
                if got != exp {
                    self.mismatch(r, exp, got, "");
                }
                if exp.is_ok() {
                    self.known.insert(addr, addr.saturating_add(page_align(len)));
                }
            }
            Call::Mprotect { addr, len, prot } => {
                if exp.is_ok() {
                    self.pretrace(r);
                }
                got = self.mm.mprotect(self.tr.tr(addr), len, prot).map(|()| 0).map_err(code);
                if got != exp {
                    self.mismatch(r, exp, got, "");
                }
            }
            Call::Madvise { addr, len, advice } => {
                if exp.is_ok() {
                    self.pretrace(r);
                }
                got = self.mm.madvise(self.tr.tr(addr), len, advice).map(|()| 0).map_err(code);
                if got != exp {
                    self.mismatch(r, exp, got, "");
                }
            }
            Call::Mremap { old, old_len, new_len, flags, new_addr } => {
                if exp.is_ok() {
                    self.pretrace(r);
                }
                let (mut fl, mut na) = (flags, self.tr.tr(new_addr));
                if let (false, Ok(rec)) = (own, exp) {
                    if rec != old && flags & MREMAP_MAYMOVE != 0 && flags & MREMAP_FIXED == 0 {
                        fl |= MREMAP_FIXED;
                        na = rec;
                    }
                }
                got = self.mm.mremap(self.tr.tr(old), old_len, new_len, fl, na).map_err(code);
                match (exp, got) {
                    (Ok(rec), Ok(g)) => {
                        if own && g != self.tr.tr(rec) && flags & MREMAP_FIXED == 0 {
                            self.tr.add(rec, new_len, g);
                            self.placed_differently
                                .push(format!("line {}: {} at {g:#x}, recorded {rec:#x}", r.line, r.text));
                        } else if !own && g != rec {
                            self.mismatch(r, exp, got, "");
                        }
                        self.learn_mremap(old, old_len, new_len, flags, rec);
                        self.grow_file(g);
                    }
                    (Err(e), Err(g)) if e == g => {}
                    _ => self.mismatch(r, exp, got, ""),
                }
            }
            Call::Brk { addr } => {
                let g = self.mm.brk(addr);
                got = Ok(g);
                if got != exp {
                    self.mismatch(r, exp, got, "");
                }
            }
        }
        if self.opts.verbose {
            let ok = if got == exp { "" } else { "  <-- MISMATCH" };
            let _ = writeln!(self.out, "{:>6}  {} = {}{}", r.line, r.text, show(got), ok);
        }
        Ok(())
    }

    /// What a successful `mremap` (recorded addresses, result `rec`) tells
    /// about the address space: the ranges it unmapped or mapped are known
    /// from now on; a moved range is known at its destination only where it
    /// was known at its source (a pre-trace part softmm lacks stays unknown
    /// there, so a later call may still prove it).
    fn learn_mremap(&mut self, old: u64, old_len: u64, new_len: u64, flags: i32, rec: u64) {
        let (o, n) = (page_align(old_len), page_align(new_len));
        let moved = rec != old || flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0;
        if !moved {
            // In place: a shrink unmapped the tail, a growth mapped the new part.
            self.known.insert(old.saturating_add(n.min(o)), old.saturating_add(n.max(o)));
            return;
        }
        let kept = if flags & MREMAP_FIXED != 0 && o == n { o } else { o.min(n) };
        let unknown = self.known.gaps(old, old.saturating_add(kept));
        if flags & MREMAP_DONTUNMAP == 0 {
            self.known.insert(old, old.saturating_add(o));
        }
        self.known.insert(rec, rec.saturating_add(n));
        for (s, e) in unknown {
            self.known.remove(rec.wrapping_add(s - old), rec.wrapping_add(e - old));
        }
    }

    /// Makes the file behind the mapping at `addr` cover it.
    fn grow_file(&self, addr: u64) {
        if let Some(m) = self.mm.maps().into_iter().find(|m| m.start <= addr && addr < m.end) {
            if let Some(f) = self.files_by_id.get(&m.inode) {
                let need = m.offset + (m.end - m.start);
                if f.len() < need {
                    let _ = f.set_len(need);
                }
            }
        }
    }
}

fn mem_available() -> Option<u64> {
    meminfo("MemAvailable:")
}

/// A `/proc/meminfo` field in bytes.
fn meminfo(key: &str) -> Option<u64> {
    let t = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = t.lines().find(|l| l.starts_with(key))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Replays `text` (the log's contents, named `name`); returns the report
/// and whether every call matched.
pub fn replay(name: &str, text: &str, opts: &Options) -> Result<(String, bool), String> {
    let log = parse::parse(text);
    // File sizes covering every offset a successful call mapped (a failed
    // call proves nothing about the file, and its length or offset may be
    // any number); frames for populating calls.
    let mut sizes: HashMap<String, u64> = HashMap::new();
    let mut populate = 0u64;
    for r in &log.records {
        match &r.call {
            Call::Mmap { len, flags, fd, off, .. } => {
                if let (Some(k), Ret::Val(_)) = (fd.key(), r.ret) {
                    let e = sizes.entry(k).or_insert(PAGE_SIZE);
                    *e = (*e).max(off.saturating_add(page_align(*len)).min(i64::MAX as u64));
                }
                if flags & (libc::MAP_POPULATE | libc::MAP_LOCKED) != 0 {
                    populate = populate.saturating_add(*len);
                }
            }
            Call::Madvise { len, advice, .. } if matches!(*advice, 3 | 22 | 23) => {
                populate = populate.saturating_add(*len)
            }
            _ => {}
        }
    }
    let arena = opts.arena.unwrap_or_else(|| {
        let want = (64 << 20) + populate.min(8 << 30);
        mem_available().map_or(want, |a| want.min(a / 2).max(64 << 20))
    });
    let phys = PhysMem::new(PhysConfig::new(arena)).map_err(|e| format!("arena of {arena} bytes: {e}"))?;
    // The traced process was charged against a real machine's RAM, not the
    // arena's: commit accounting follows this machine's RAM and swap.
    if let Some(ram) = meminfo("MemTotal:") {
        let mut oc = softmm::Overcommit::for_ram(ram / softmm::PAGE_SIZE);
        oc.swap_pages = meminfo("SwapTotal:").unwrap_or(0) / softmm::PAGE_SIZE;
        phys.set_overcommit(oc);
    }
    let start_brk = log.records.iter().find_map(|r| match (&r.call, r.ret) {
        (Call::Brk { .. }, Ret::Val(v)) => Some(v),
        _ => None,
    });
    let mut config = MmConfig::default();
    if let Some(b) = start_brk {
        config.start_brk = b;
    }
    let mm = AddressSpace::new(&phys, config).map_err(|e| format!("address space for the recorded layout: {e}"))?;
    let mut rp = Replayer {
        mm,
        phys: phys.clone(),
        opts: opts.clone(),
        files: HashMap::new(),
        annotated: log.records.iter().any(|r| matches!(&r.call, Call::Mmap { fd: Fd::Path(..), .. })),
        writable: writable_fds(&log.records),
        files_by_id: HashMap::new(),
        known: RangeSet::default(),
        tr: Translation::default(),
        mismatches: Vec::new(),
        pretrace: BTreeMap::new(),
        placeholders: Vec::new(),
        placed_differently: Vec::new(),
        reordered: Vec::new(),
        counts: BTreeMap::new(),
        out: String::new(),
    };
    if let Some(b) = start_brk {
        rp.known.insert(b, b + PAGE_SIZE);
    }
    let recs = &log.records;
    let mut done = vec![false; recs.len()];
    for i in 0..recs.len() {
        if done[i] {
            continue;
        }
        if rp.step(&recs[i], &sizes, false).is_err() {
            // Collided: replay the calls of other threads that were in flight
            // when this one returned and remove or move mappings, then retry.
            for j in i + 1..recs.len() {
                if recs[j].line >= recs[i].end_line {
                    break;
                }
                if !done[j] && recs[j].pid != recs[i].pid && Replayer::frees(&recs[j]) {
                    let _ = rp.step(&recs[j], &sizes, true);
                    done[j] = true;
                    rp.reordered.push(format!("line {} replayed before line {}", recs[j].line, recs[i].line));
                }
            }
            let _ = rp.step(&recs[i], &sizes, true);
        }
        done[i] = true;
        // Keep the start of the heap known once the break moved.
        if let (Call::Brk { .. }, Ret::Val(v)) = (&recs[i].call, recs[i].ret) {
            if let Some(b) = start_brk {
                rp.known.insert(b, v.max(b + PAGE_SIZE));
            }
        }
    }

    let mut out = std::mem::take(&mut rp.out);
    let calls: usize = rp.counts.values().sum();
    let per: Vec<String> = rp.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        out,
        "{name}: {calls} calls replayed ({}), addresses {}",
        per.join(", "),
        match opts.addresses {
            Addresses::Recorded => "recorded",
            Addresses::Own => "own",
        }
    );
    if let Some(b) = start_brk {
        let _ = writeln!(out, "initial break {b:#x}");
    }
    if !rp.pretrace.is_empty() {
        let per: Vec<String> = rp.pretrace.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let bytes: u64 = rp.placeholders.iter().map(|p| p.end - p.start).sum();
        let _ = writeln!(
            out,
            "calls on memory mapped before tracing began: {} ({} placeholder mappings, {} KiB)",
            per.join(", "),
            rp.placeholders.len(),
            bytes >> 10
        );
        for p in &rp.placeholders {
            let _ = writeln!(out, "  placeholder {:08x}-{:08x} for line {} ({})", p.start, p.end, p.line, p.call);
        }
    }
    if !rp.reordered.is_empty() {
        let _ = writeln!(out, "overlapping calls of different threads replayed out of result order:");
        for l in &rp.reordered {
            let _ = writeln!(out, "  {l}");
        }
    }
    if !log.incomplete.is_empty() {
        let _ = writeln!(out, "calls without a result (skipped): lines {:?}", log.incomplete);
    }
    if log.other_calls > 0 {
        let _ = writeln!(out, "other syscalls ignored: {}", log.other_calls);
    }
    if !rp.placed_differently.is_empty() {
        let _ = writeln!(out, "softmm placed {} mappings differently:", rp.placed_differently.len());
        for l in &rp.placed_differently {
            let _ = writeln!(out, "  {l}");
        }
    }
    for (line, why) in &log.bad {
        let _ = writeln!(out, "line {line}: cannot parse: {why}");
    }
    for m in &rp.mismatches {
        let _ = writeln!(out, "MISMATCH {m}");
    }
    let ok = rp.mismatches.is_empty() && log.bad.is_empty();
    let _ = writeln!(
        out,
        "{}: {} mismatches, {} unparsed lines",
        if ok { "OK" } else { "FAILED" },
        rp.mismatches.len(),
        log.bad.len()
    );
    if opts.maps {
        let _ = writeln!(out, "\nfinal mappings:");
        out.push_str(&rp.mm.maps_text());
        if !rp.placeholders.is_empty() {
            let _ = writeln!(out, "(placeholders for pre-trace memory:");
            for p in &rp.placeholders {
                let _ = writeln!(out, "  {:08x}-{:08x} (line {})", p.start, p.end, p.line);
            }
            let _ = writeln!(out, ")");
        }
    }
    Ok((out, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn what_success_proves() {
        let mremap = |old_len, new_len, flags| Call::Mremap { old: 0x10000, old_len, new_len, flags, new_addr: 0 };
        let page = Some((0x10000, 0x10000 + P));
        // Shrink and same size in place: only the VMA at `old`.
        assert_eq!(proof(&mremap(8 * P, 2 * P, 0)), page);
        assert_eq!(proof(&mremap(8 * P, 8 * P, MREMAP_MAYMOVE)), page);
        // Growth: the whole old range.
        assert_eq!(proof(&mremap(3 * P, 8 * P, MREMAP_MAYMOVE)), Some((0x10000, 0x10000 + 3 * P)));
        assert_eq!(proof(&mremap(0, 8 * P, MREMAP_MAYMOVE)), page);
        // Fixed or DONTUNMAP: the part that moves; a same-size fixed move
        // takes holes along.
        assert_eq!(proof(&mremap(8 * P, 2 * P, MREMAP_MAYMOVE | MREMAP_FIXED)), Some((0x10000, 0x10000 + 2 * P)));
        assert_eq!(proof(&mremap(5 * P, 5 * P, MREMAP_MAYMOVE | MREMAP_FIXED)), page);
        assert_eq!(proof(&mremap(4 * P, 4 * P, MREMAP_MAYMOVE | MREMAP_DONTUNMAP)), Some((0x10000, 0x10000 + 4 * P)));
        assert_eq!(proof(&Call::Mprotect { addr: P, len: 3 * P - 1, prot: 0 }), Some((P, 4 * P)));
        assert_eq!(proof(&Call::Madvise { addr: P, len: 0, advice: 0 }), None);
        assert_eq!(proof(&Call::Munmap { addr: P, len: P }), None);
        // A range past 2^64 proves nothing (it cannot have succeeded).
        assert_eq!(proof(&Call::Mprotect { addr: u64::MAX - P + 1, len: 2 * P, prot: 0 }), None);
    }

    #[test]
    fn range_set_insert_remove_gaps() {
        let mut s = RangeSet::default();
        s.insert(0x1000, 0x5000);
        s.insert(0x8000, 0x9000);
        s.remove(0x2000, 0x3000);
        assert_eq!(s.gaps(0, 0xa000), vec![(0, 0x1000), (0x2000, 0x3000), (0x5000, 0x8000), (0x9000, 0xa000)]);
        s.remove(0x4000, 0x8800);
        assert_eq!(s.gaps(0x1000, 0x9000), vec![(0x2000, 0x3000), (0x4000, 0x8800)]);
        s.insert(0, 0x10000);
        assert!(s.gaps(0, 0x10000).is_empty());
    }
}
