//! `softmm replay`: runs the memory-mapping calls of a traced program against
//! softmm address spaces, one per process of the log, and compares every
//! result with the recorded one.
//!
//! Faithfulness:
//! * Processes: with process lines (`strace -f -e trace=memory,process`), a
//!   successful `execve` gives its process a new address space, a `clone`,
//!   `clone3` or `fork` without `CLONE_VM` forks the parent's address space
//!   copy-on-write ([`softmm::AddressSpace::fork`]) so the child replays
//!   against its parent's state, one with `CLONE_VM` (a thread, `vfork`)
//!   shares it, and `exit_group` ends the process. A child whose lines come
//!   before its fork's result (it ran first, as it may under load) is set up
//!   at the first of them that changes anything (a memory, descriptor or
//!   process call), so that they apply to its own copy. Without process
//!   lines, a pid whose first call is `brk(NULL)` (the first call of a new
//!   program) starts a new address space, and the report says so; any other
//!   new pid is a thread of the process started last.
//! * The heap of each process starts at its first `brk` result (the initial
//!   break).
//! * Files named in the log become in-memory files covering every offset a
//!   successful call maps (grown if an `mremap` extends a file mapping),
//!   shared by all processes. With descriptor lines (`open`, `openat`,
//!   `close`, `dup*`, `memfd_create`), each process's descriptor table is
//!   followed (copied by `fork`, shared with `CLONE_FILES`, close-on-exec
//!   descriptors closed by `execve`) and gives each descriptor's open mode
//!   exactly; a descriptor the log never showed opened gets the mode
//!   inferred from the whole log. A call that names a descriptor and fails
//!   never makes it bad for later calls.
//! * Locks, seals and MDWE (`mlock*`, `munlock*`, `mseal`, which strace 6.1
//!   prints `syscall_0x1ce`, `prctl(PR_SET_MDWE/PR_GET_MDWE)`; other
//!   `prctl`s are not memory calls) are replayed; privileges strace does
//!   not print are inferred from the log (`caps.rs`: `CAP_SYS_RAWIO` from
//!   a fixed mapping below `mmap_min_addr` that succeeded, `CAP_IPC_LOCK`
//!   from a lock longer than the memlock limit that succeeded).
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
//!   none, and nowhere else (see [`ranges::proof`]); each placeholder is
//!   reported with the line that required it.
//! * Calls of several threads whose spans overlap (`<unfinished ...>`) are
//!   replayed in the order their results were written; if one then collides
//!   with a mapping an overlapping call of another thread of the same process
//!   removed, that call is replayed first.

pub mod bench;
mod caps;
pub mod faults;
mod fds;
mod files;
pub mod headline;
mod maps;
mod ops;
pub mod parse;
mod process;
mod ranges;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use softmm::{PhysConfig, PhysMem};

use fds::{Desc, FdTable};
use files::Files;
use parse::{Call, Record, Ret, CLONE_FILES, CLONE_THREAD, CLONE_VM};
use process::{Limits, Process};

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
    /// With `maps`: each mapping's smaps `VmFlags:` line after it.
    pub vm_flags: bool,
    /// Print every call.
    pub verbose: bool,
    /// Arena bytes (default: enough for the populating calls in the log).
    pub arena: Option<u64>,
    /// The recording's page faults: `perf script` text (see [`faults`]).
    pub faults: Option<Arc<str>>,
    /// `--bench`: after the replay, run its calls and faults again as fast
    /// as possible, each thread on a thread of its own, under these
    /// policies ([`bench`]).
    pub bench: Option<bench::BenchOptions>,
    /// Huge pages in the replay's hugetlb pool (default: what the log's
    /// successful hugetlb mappings take, all at once; where an anonymous
    /// `MAP_HUGETLB` mapping failed with `ENOMEM`, the most its anonymous
    /// ones held at once).
    pub hugepages: Option<u64>,
    /// The real `/proc/PID/maps` of the log's first pid's last program (or,
    /// where that made no memory call, the last program that did) at its
    /// end, to compare the replay's final mappings with ([`maps`]).
    pub compare_maps: Option<Arc<str>>,
}

/// What every process of a replay shares.
pub(crate) struct Shared {
    opts: Options,
    files: Files,
    /// Every mismatch, in log order.
    mismatches: Vec<String>,
    /// `--verbose` lines.
    out: String,
    /// The recorded faults, once replayed.
    faults: Option<faults::Faults>,
    /// Huge pages in the pool.
    hugepages: u64,
    /// `--bench`'s tables.
    bench_out: String,
}

/// A pid's relation to the process it runs in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The pid that started the process, or a thread of it.
    Member,
    /// A `vfork` (or `CLONE_VM` without `CLONE_THREAD`) child: it borrows
    /// the parent's address space until it execs or exits, which ends only
    /// the child.
    Borrower,
}

/// The processes of a log and which pid runs in which.
struct Tracker<'a> {
    recs: &'a [Record],
    phys: Arc<PhysMem>,
    procs: Vec<Process>,
    by_pid: HashMap<Option<u64>, (usize, Role)>,
    /// Child pid → the index of the `clone`/`fork`/`vfork` record that
    /// created it (its result), for children whose first call comes first.
    clones: HashMap<u64, usize>,
    /// The `clone`/`fork`/`vfork` records whose child is set up (a child
    /// that ran and exited before its parent's call returned in the log
    /// must not be set up again at that result).
    spawned: std::collections::HashSet<usize>,
    /// Whether the log has process lines (`execve`, `clone`, `fork`, ...).
    process_lines: bool,
    /// Descriptor tables, and which one each pid uses.
    fdts: Vec<FdTable>,
    fdt_of: HashMap<Option<u64>, usize>,
    /// Whether the log has descriptor lines (`openat`, `close`, `dup*`, ...).
    fd_lines: bool,
    /// What the replay assumed about pids, for the report.
    notes: Vec<String>,
    /// Each pid's resource limits that softmm models, set by the log's
    /// `setrlimit`/`prlimit64` (inherited by children, kept by `execve`).
    limits: HashMap<Option<u64>, Limits>,
    /// Whether processes keep the plan of their calls (`--bench`).
    plan: bool,
    /// The privileges the log implies (`caps.rs`).
    caps: caps::Caps,
}

impl Tracker<'_> {
    /// The first `brk` result of `pid` from record `from` on, before it runs
    /// another program (a successful `execve` after `from`).
    fn first_brk(&self, from: usize, pid: Option<u64>) -> Option<u64> {
        for (j, r) in self.recs.iter().enumerate().skip(from).filter(|(_, r)| r.pid == pid) {
            match (&r.call, r.ret) {
                (Call::Brk { .. }, Ret::Val(v)) => return Some(v),
                (Call::Execve { .. }, Ret::Val(_)) if j > from => return None,
                _ => {}
            }
        }
        None
    }

    /// Whether the program `pid` runs from record `from` on (until its next
    /// `execve`) locks more than its `RLIMIT_MEMLOCK` with `MAP_LOCKED`
    /// mmaps that succeeded, and none failed with `EAGAIN`: then it could
    /// lock without limit (`CAP_IPC_LOCK`), and the line that shows it.
    fn locks_past_the_limit(&self, from: usize, pid: Option<u64>, limits: Limits) -> Option<String> {
        let limit = limits.memlock.unwrap_or(crate::workloads::mm_config().memlock_limit);
        let mut locked = 0u64;
        let mut past = None;
        for (j, r) in self.recs.iter().enumerate().skip(from).filter(|(_, r)| r.pid == pid) {
            match (&r.call, r.ret) {
                (Call::Execve { .. }, Ret::Val(_)) if j > from => break,
                (Call::Mmap { len, flags, .. }, ret) if flags & libc::MAP_LOCKED != 0 => match ret {
                    Ret::Err(libc::EAGAIN) => return None,
                    Ret::Err(_) => {}
                    Ret::Val(_) => {
                        locked = locked.saturating_add(softmm::page_align(*len));
                        if locked > limit && past.is_none() {
                            past = Some(format!(
                                "MAP_LOCKED mappings of {locked} bytes succeeded by line {}, past RLIMIT_MEMLOCK {limit}",
                                r.line
                            ));
                        }
                    }
                },
                _ => {}
            }
        }
        past
    }

    /// The descriptor table of `pid` (a new, empty one for a pid the log
    /// never showed created).
    fn fdt(&mut self, pid: Option<u64>) -> usize {
        if let Some(&t) = self.fdt_of.get(&pid) {
            return t;
        }
        self.fdts.push(FdTable::default());
        self.fdt_of.insert(pid, self.fdts.len() - 1);
        self.fdts.len() - 1
    }

    /// Applies a descriptor call (`openat`, `close`, `dup*`, `memfd_create`)
    /// recorded at `i` to its pid's table.
    fn fd_call(&mut self, i: usize) -> Result<(), String> {
        let r = &self.recs[i];
        let Ret::Val(v) = r.ret else { return Ok(()) };
        // Changes the child's copy of its parent's table, which setting the
        // child up later would replace.
        self.set_up_early_child(i)?;
        let t = self.fdt(r.pid);
        let table = &mut self.fdts[t];
        let fd = v as i64;
        match &r.call {
            Call::Open { path, flags } => {
                table.install(fd, Desc::opened(r.ret_path.clone().unwrap_or_else(|| path.clone()), *flags))
            }
            Call::Close { fd } => table.close(*fd),
            Call::Dup { old, cloexec } => table.dup(*old, fd, *cloexec),
            Call::MemfdCreate { name, cloexec, hugetlb } => {
                let path = r.ret_path.clone().unwrap_or_else(|| format!("/memfd:{name}"));
                let flags = libc::O_RDWR | if *cloexec { libc::O_CLOEXEC } else { 0 };
                table.install(fd, Desc { memfd: true, hugetlb: *hugetlb, ..Desc::opened(path, flags) });
            }
            _ => {}
        }
        Ok(())
    }

    /// Applies a successful `setrlimit`/`prlimit64` recorded at `i` to its
    /// pid's limits. softmm fixes an address space's limits when it makes
    /// it, so a limit applies to the address spaces the pid's `execve`s (and
    /// its children's) make from then on; the report says so, and names the
    /// limits softmm does not model.
    fn rlimit(&mut self, i: usize) {
        let r = &self.recs[i];
        let (Call::Rlimit { resource, cur }, Ret::Val(_)) = (&r.call, r.ret) else { return };
        if resource.is_empty() {
            return;
        }
        let l = self.limits.entry(r.pid).or_default();
        let what = match resource.as_str() {
            "RLIMIT_STACK" => {
                l.stack = Some(*cur);
                "MmConfig::stack_limit, for address spaces made after it"
            }
            "RLIMIT_MEMLOCK" => {
                l.memlock = Some(*cur);
                "MmConfig::memlock_limit, for address spaces made after it"
            }
            "RLIMIT_AS" | "RLIMIT_DATA" => "not modelled by softmm: ignored",
            _ => return,
        };
        let v = if *cur == u64::MAX { "unlimited".to_string() } else { cur.to_string() };
        self.notes.push(format!("pid {}: {resource} = {v} at line {}: {what}", fmt_pid(r.pid), r.line));
    }

    /// Sets up the child whose line `i` comes before its fork's result:
    /// strace writes the result when the parent returns, which under load
    /// can be many child lines later. A memory call sets its child up
    /// anyway ([`Tracker::process_of`]); a descriptor call or an exit must
    /// too, or the child's table would start empty and be replaced by its
    /// parent's at the result, and an exited child be set up again there.
    fn set_up_early_child(&mut self, i: usize) -> Result<(), String> {
        let r = &self.recs[i];
        if r.pid.and_then(|pid| self.clones.get(&pid)).is_some_and(|&c| c > i && !self.spawned.contains(&c)) {
            self.process_of(i)?;
        }
        Ok(())
    }

    fn add(&mut self, p: Process, pid: Option<u64>) -> usize {
        self.procs.push(p);
        let i = self.procs.len() - 1;
        self.by_pid.insert(pid, (i, Role::Member));
        i
    }

    /// A new process for `pid` with a fresh address space.
    fn start(&mut self, i: usize, pid: Option<u64>, origin: String) -> Result<usize, String> {
        let mut limits = self.limits.get(&pid).copied().unwrap_or_default();
        if let Some(why) = self.locks_past_the_limit(i, pid, limits) {
            self.notes.push(format!("pid {}: {why}: taken for CAP_IPC_LOCK (root)", fmt_pid(pid)));
            limits.cap_ipc_lock = true;
        }
        let mut p = Process::new(&self.phys, pid, origin, self.first_brk(i, pid), limits, self.caps)?;
        if self.plan {
            p.plan = Some(Vec::new());
        }
        Ok(self.add(p, pid))
    }

    /// Sets up the child `child` of the clone record `c` in its parent's
    /// process: shared (`CLONE_VM`) or forked.
    fn spawn(&mut self, c: usize, child: u64) -> Result<usize, String> {
        let r = &self.recs[c];
        let Call::Clone { flags } = r.call else { unreachable!("clones holds clone records") };
        let (parent, _) = self.process_of(c)?;
        self.spawned.insert(c);
        let parent_fds = self.fdt(r.pid);
        let fds = if flags & CLONE_FILES != 0 {
            parent_fds
        } else {
            self.fdts.push(self.fdts[parent_fds].clone());
            self.fdts.len() - 1
        };
        self.fdt_of.insert(Some(child), fds);
        if let Some(&l) = self.limits.get(&r.pid) {
            self.limits.insert(Some(child), l);
        }
        if flags & CLONE_VM != 0 {
            let role = if flags & CLONE_THREAD != 0 { Role::Member } else { Role::Borrower };
            self.by_pid.insert(Some(child), (parent, role));
            return Ok(parent);
        }
        let origin = format!("fork of pid {} at line {}", fmt_pid(r.pid), r.line);
        let index = self.procs.len();
        let p = self.procs[parent].fork(r.pid, Some(child), origin, index)?;
        Ok(self.add(p, Some(child)))
    }

    /// The process record `i` runs in, set up when its pid is new.
    fn process_of(&mut self, i: usize) -> Result<(usize, Role), String> {
        let r = &self.recs[i];
        if let Some(&(p, role)) = self.by_pid.get(&r.pid) {
            if self.procs[p].alive() {
                return Ok((p, role));
            }
        }
        if let Some(&c) = r.pid.and_then(|pid| self.clones.get(&pid)) {
            if c != i && self.recs[c].pid != r.pid {
                let p = self.spawn(c, r.pid.expect("clones are keyed by pid"))?;
                return Ok(self.by_pid.get(&r.pid).copied().unwrap_or((p, Role::Member)));
            }
        }
        let first = self.procs.is_empty();
        if first || (!self.process_lines && matches!(r.call, Call::Brk { addr: 0 })) {
            let origin = if first {
                "the log's first process".to_string()
            } else {
                let origin = format!("first call brk(NULL) at line {}: a new program", r.line);
                self.notes.push(format!("pid {}: {origin}, a new address space", fmt_pid(r.pid)));
                origin
            };
            let p = self.start(i, r.pid, origin)?;
            return Ok((p, Role::Member));
        }
        // A pid the log never showed being created: a thread of the process
        // started last (still alive).
        let p = (0..self.procs.len()).rev().find(|&p| self.procs[p].alive()).unwrap_or(0);
        if !self.procs[p].alive() {
            let p = self.start(i, r.pid, format!("first call at line {}", r.line))?;
            return Ok((p, Role::Member));
        }
        self.notes.push(format!(
            "pid {}: no line creates it; taken for a thread of pid {} (line {})",
            fmt_pid(r.pid),
            fmt_pid(self.procs[p].pid),
            r.line
        ));
        self.by_pid.insert(r.pid, (p, Role::Member));
        let fds = self.fdt(self.procs[p].pid);
        self.fdt_of.insert(r.pid, fds);
        Ok((p, Role::Member))
    }

    /// Applies a process call (`execve`, `clone`, `exit`) recorded at `i`.
    fn process_call(&mut self, i: usize) -> Result<(), String> {
        let r = &self.recs[i];
        // A child whose first line is an execve (vfork + exec) gets its
        // parent's address space and descriptors first: a failed execve
        // leaves it there, a successful one keeps its descriptors.
        if matches!(r.call, Call::Execve { .. }) && r.pid.is_some_and(|p| self.clones.contains_key(&p)) {
            self.process_of(i)?;
        }
        if matches!(r.call, Call::Exit { .. }) {
            self.set_up_early_child(i)?;
        }
        match (&r.call, r.ret) {
            (Call::Execve { path, argv }, Ret::Val(_)) => {
                let mut mdwe = 0;
                if let Some(&(p, role)) = self.by_pid.get(&r.pid) {
                    // The mm the exec leaves (a vfork child's is its
                    // parent's) passes its MDWE on.
                    mdwe = self.procs[p].mdwe_for_exec();
                    // A borrowing vfork child leaves its parent's address
                    // space as it was; a member's exec replaces its process.
                    if role == Role::Member && self.procs[p].alive() {
                        self.procs[p].end(format!("execve at line {}", r.line));
                    }
                }
                let fds = self.fdt(r.pid);
                self.fdts.push(self.fdts[fds].after_exec());
                self.fdt_of.insert(r.pid, self.fdts.len() - 1);
                let program = short(&if argv.is_empty() { path.clone() } else { argv.join(" ") });
                let p = self.start(i, r.pid, format!("execve at line {}", r.line))?;
                self.procs[p].program = Some(program);
                self.procs[p].inherit_mdwe(r.pid, mdwe);
            }
            (Call::Clone { .. }, Ret::Val(child)) => {
                self.process_of(i)?;
                if !self.spawned.contains(&i)
                    && !self.by_pid.get(&Some(child)).is_some_and(|&(p, _)| self.procs[p].alive())
                {
                    self.spawn(i, child)?;
                }
            }
            (Call::Exit { group }, _) => {
                self.fdt_of.remove(&r.pid);
                if let Some((p, role)) = self.by_pid.remove(&r.pid) {
                    if *group && role == Role::Member && self.procs[p].alive() {
                        self.procs[p].end(format!("exit_group at line {}", r.line));
                        let gone: Vec<Option<u64>> =
                            self.by_pid.iter().filter(|(_, &(q, _))| q == p).map(|(&pid, _)| pid).collect();
                        for pid in gone {
                            self.by_pid.remove(&pid);
                            self.fdt_of.remove(&pid);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The recorded faults during a replay: which comes next for each thread,
/// and each thread's CPU.
struct FaultReplay {
    faults: faults::Faults,
    /// Per tid: the index of its next anchor call, and how many faults
    /// before it are replayed.
    next: HashMap<u64, (usize, usize)>,
    cpus: HashMap<u64, softmm::Cpu>,
}

impl FaultReplay {
    /// The thread record `r` ran on, as the fault stream names it.
    fn tid(&self, r: &Record) -> Option<u64> {
        r.pid.or(self.faults.pidless_tid)
    }

    /// Before record `r` (one of [`faults::ANCHORS`]): the faults other
    /// threads took before it entered the kernel (perf's clock), then the
    /// rest of the faults its thread took before it, each in the process
    /// its thread runs in now, if any.
    fn before(&mut self, tr: &mut Tracker, r: &Record) {
        let Some(tid) = self.tid(r) else { return };
        if faults::anchor_name(r).is_none() {
            return;
        }
        let (slot, _) = self.next.get(&tid).copied().unwrap_or_default();
        let entered = self.faults.enters.get(&tid).and_then(|v| v.get(slot)).copied();
        if let Some(t) = entered {
            let others: Vec<u64> = self.faults.by_tid.keys().copied().filter(|&u| u != tid).collect();
            for u in others {
                self.replay(tr, u, t);
            }
        }
        self.replay(tr, tid, f64::INFINITY);
        let n = self.next.entry(tid).or_default();
        *n = (n.0 + 1, 0);
    }

    /// Replays the faults of `tid` before its next anchor call that perf
    /// saw before `until`, in the process it runs in.
    fn replay(&mut self, tr: &mut Tracker, tid: u64, until: f64) {
        let pid = if self.faults.pidless_tid == Some(tid) { None } else { Some(tid) };
        let Some(&(p, _)) = tr.by_pid.get(&pid) else { return };
        if !tr.procs[p].alive() {
            return;
        }
        let (slot, done) = self.next.get(&tid).copied().unwrap_or_default();
        let (Some(list), Some(times)) = (self.faults.by_tid.get(&tid), self.faults.times.get(&tid)) else { return };
        let (Some(list), Some(times)) = (list.get(slot), times.get(slot)) else { return };
        let cpu = self.cpus.entry(tid).or_default();
        let mut n = done;
        while n < list.len() && times[n] < until {
            tr.procs[p].fault(cpu, tid, list[n]);
            n += 1;
        }
        self.next.insert(tid, (slot, n));
    }

    /// Replays the faults each thread took after its last anchor call.
    fn rest(&mut self, tr: &mut Tracker) {
        let tids: Vec<u64> = self.faults.by_tid.keys().copied().collect();
        for tid in tids {
            self.replay(tr, tid, f64::INFINITY);
        }
    }
}

/// `s`, cut to 60 characters.
fn short(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn fmt_pid(pid: Option<u64>) -> String {
    pid.map_or_else(|| "-".to_string(), |p| p.to_string())
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
    // Frames for the populating calls that succeeded.
    let mut populate = 0u64;
    for r in log.records.iter().filter(|r| matches!(r.ret, Ret::Val(_))) {
        match &r.call {
            Call::Mmap { len, flags, .. } if flags & (libc::MAP_POPULATE | libc::MAP_LOCKED) != 0 => {
                populate = populate.saturating_add(*len)
            }
            Call::Madvise { len, advice, .. } if matches!(*advice, 3 | 22 | 23) => {
                populate = populate.saturating_add(*len)
            }
            _ => {}
        }
    }
    // The recorded faults, placed among their threads' calls: each may map
    // a page, and every one of them stays mapped in the worst case (a
    // program that never unmaps), so the arena has a frame for each.
    let placed = opts.faults.as_ref().map(|script| faults::place(script, &log.records));
    let fault_pages = placed.as_ref().map_or(0, |f| (f.total - f.other_threads) as u64);
    let arena = opts.arena.unwrap_or_else(|| {
        let faulted = fault_pages.saturating_mul(softmm::PAGE_SIZE);
        // Page tables: at most one per 512 faults and one per populated
        // 2 MiB, with the 64 MiB base for the rest.
        let want = (64 << 20) + (populate.saturating_add(faulted)).min(8 << 30) * 513 / 512;
        mem_available().map_or(want, |a| want.min(a / 2).max(64 << 20))
    });
    // The hugetlb pool, taken from the arena.
    let hugepages = opts.hugepages.unwrap_or_else(|| Files::hugepages_needed(&log.records));
    let arena = arena.saturating_add(hugepages.saturating_mul(files::HPAGE_SIZE));
    let phys = PhysMem::new(PhysConfig::new(arena).hugepages(hugepages))
        .map_err(|e| format!("arena of {arena} bytes with {hugepages} huge pages: {e}"))?;
    // The traced process was charged against a real machine's RAM, not the
    // arena's: commit accounting follows this machine's RAM and swap.
    if let Some(ram) = meminfo("MemTotal:") {
        let mut oc = softmm::Overcommit::for_ram(ram / softmm::PAGE_SIZE);
        oc.swap_pages = meminfo("SwapTotal:").unwrap_or(0) / softmm::PAGE_SIZE;
        phys.set_overcommit(oc);
    }
    let recs = &log.records;
    let mut sh = Shared {
        opts: opts.clone(),
        files: Files::new(&phys, recs),
        mismatches: Vec::new(),
        out: String::new(),
        faults: None,
        hugepages,
        bench_out: String::new(),
    };
    let mut tr = Tracker {
        recs,
        phys: phys.clone(),
        procs: Vec::new(),
        by_pid: HashMap::new(),
        spawned: Default::default(),
        clones: recs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match (&r.call, r.ret) {
                (Call::Clone { .. }, Ret::Val(child)) => Some((child, i)),
                _ => None,
            })
            .collect(),
        process_lines: recs.iter().any(|r| r.call.is_process() && !matches!(r.call, Call::Exit { .. })),
        notes: Vec::new(),
        limits: HashMap::new(),
        plan: opts.bench.is_some(),
        caps: caps::Caps::infer(recs, &crate::workloads::mm_config()),
        fdts: Vec::new(),
        fdt_of: HashMap::new(),
        fd_lines: recs.iter().any(|r| {
            matches!(r.call, Call::Open { .. } | Call::Close { .. } | Call::Dup { .. } | Call::MemfdCreate { .. })
        }),
    };
    let mut process_calls: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut fd_calls: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut fr = placed.map(|faults| FaultReplay { faults, next: HashMap::new(), cpus: HashMap::new() });
    let mut done = vec![false; recs.len()];
    for i in 0..recs.len() {
        if done[i] {
            continue;
        }
        done[i] = true;
        let r = &recs[i];
        if let Some(fr) = &mut fr {
            fr.before(&mut tr, r);
        }
        match r.call {
            Call::Rlimit { .. } => {
                tr.rlimit(i);
                continue;
            }
            // Read by `Files` for the names of unlinked files.
            Call::Unlink { .. } => continue,
            _ => {}
        }
        if r.call.is_process() {
            *process_calls.entry(r.call.name()).or_default() += 1;
            tr.process_call(i)?;
            continue;
        }
        if !r.call.is_memory() {
            *fd_calls.entry(r.call.name()).or_default() += 1;
            tr.fd_call(i)?;
            continue;
        }
        let (p, _) = tr.process_of(i)?;
        let fds = if tr.fd_lines { tr.fdt_of.get(&r.pid).map(|&t| &tr.fdts[t]) } else { None };
        if tr.procs[p].step(&mut sh, r, fds, false).is_err() {
            // Collided: replay the calls of other threads of this process
            // that were in flight when this one returned and remove or move
            // mappings, then retry.
            for j in i + 1..recs.len() {
                if recs[j].line >= r.end_line {
                    break;
                }
                let same = tr.by_pid.get(&recs[j].pid).is_some_and(|&(q, _)| q == p);
                if !done[j] && recs[j].pid != r.pid && same && Process::frees(&recs[j]) {
                    if let Some(fr) = &mut fr {
                        fr.before(&mut tr, &recs[j]);
                    }
                    let fds = if tr.fd_lines { tr.fdt_of.get(&recs[j].pid).map(|&t| &tr.fdts[t]) } else { None };
                    let _ = tr.procs[p].step(&mut sh, &recs[j], fds, true);
                    done[j] = true;
                    tr.procs[p].reordered.push(format!("line {} replayed before line {}", recs[j].line, r.line));
                }
            }
            let fds = if tr.fd_lines { tr.fdt_of.get(&r.pid).map(|&t| &tr.fdts[t]) } else { None };
            let _ = tr.procs[p].step(&mut sh, r, fds, true);
        }
    }
    if let Some(fr) = &mut fr {
        fr.rest(&mut tr);
    }
    // The CPUs hold their address spaces: they go first.
    let faults = fr.map(|fr| fr.faults);
    if let Some(real) = &opts.compare_maps {
        compare_maps(&mut sh, &tr, real);
    }
    // Every address space and file dies: softmm must be back to nothing.
    for p in &mut tr.procs {
        p.release();
    }
    if let Some(b) = &opts.bench {
        let procs: Vec<&Process> = tr.procs.iter().collect();
        let ok = bench::run(&phys, &procs, b, sh.mismatches.len(), &mut sh.bench_out);
        if !ok {
            sh.mismatches.push("--bench: a call's result differed from the replay's (see above)".into());
        }
        // The plans hold the files' opens.
        for p in &mut tr.procs {
            p.plan = None;
        }
    }
    sh.files.clear();
    let left = phys.quiesce();
    let leak = (left.frames_used, left.page_tables, left.vmas, left.rmap_entries) != (0, 0, 0, 0);
    if leak {
        sh.mismatches.push(format!(
            "softmm kept {} frames, {} page tables, {} VMAs, {} rmap entries after every address space and file died",
            left.frames_used, left.page_tables, left.vmas, left.rmap_entries
        ));
    }
    sh.faults = faults;
    report(name, opts, &log, &tr, &sh, &process_calls, &fd_calls)
}

/// Compares the final mappings of the log's first pid's last program with
/// `real` (see [`maps`]); each difference is a mismatch.
fn compare_maps(sh: &mut Shared, tr: &Tracker, real: &str) {
    // The log's first pid's last program, else the last program that made
    // memory calls (a shell's child that ran the program).
    let first = tr.recs.first().map(|r| r.pid);
    let with_calls = || tr.procs.iter().rev().filter(|p| !p.counts.is_empty());
    let Some(p) = with_calls().find(|p| Some(p.pid) == first).or_else(|| with_calls().next()) else {
        sh.mismatches.push("--compare-maps: the log has no process with memory calls".into());
        return;
    };
    if sh.opts.addresses != Addresses::Recorded {
        sh.mismatches.push("--compare-maps needs --addresses recorded".into());
        return;
    }
    let diffs = maps::compare(&maps::parse(real), &maps::parse(&p.maps_text(false)), &p.traced_region());
    let n = maps::parse(real).len();
    let _ = writeln!(
        sh.out,
        "final mappings of pid {} compared with the real maps ({n} lines) where traced calls made them: {} differences",
        fmt_pid(p.pid),
        diffs.len()
    );
    for d in diffs {
        sh.mismatches.push(format!("final maps: {d}"));
    }
}

/// `name 3, other 1`.
fn per_call(counts: &BTreeMap<&'static str, usize>) -> String {
    counts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

fn report(
    name: &str,
    opts: &Options,
    log: &parse::Log,
    tr: &Tracker,
    sh: &Shared,
    process_calls: &BTreeMap<&'static str, usize>,
    fd_calls: &BTreeMap<&'static str, usize>,
) -> Result<(String, bool), String> {
    let faults = sh.faults.as_ref();
    let mut out = sh.out.clone();
    let mut total: BTreeMap<&'static str, usize> = BTreeMap::new();
    for p in &tr.procs {
        for (k, v) in &p.counts {
            *total.entry(k).or_default() += v;
        }
    }
    let calls: usize = total.values().sum();
    let _ = writeln!(
        out,
        "{name}: {calls} calls replayed ({}), addresses {}",
        per_call(&total),
        match opts.addresses {
            Addresses::Recorded => "recorded",
            Addresses::Own => "own",
        }
    );
    // Processes that made no memory call (a vfork child that only exec'd,
    // a fork that only waited) are counted, not listed.
    let shown: Vec<&Process> = tr.procs.iter().filter(|p| !p.counts.is_empty()).collect();
    let several = tr.procs.len() > 1;
    if several || tr.process_lines {
        let how = if tr.process_lines {
            format!("from the log's process lines ({})", per_call(process_calls))
        } else {
            "no process lines in the log: a pid whose first call is brk(NULL) starts a new address space".to_string()
        };
        let _ = writeln!(out, "{} processes, {} with memory calls ({how})", tr.procs.len(), shown.len());
    }
    if tr.fd_lines {
        let _ = writeln!(out, "open modes from the log's descriptor lines ({})", per_call(fd_calls));
    } else if shown.iter().any(|p| p.counts.contains_key("mmap")) {
        let _ = writeln!(out, "no descriptor lines in the log: open modes inferred from the memory calls");
    }
    for n in &tr.notes {
        let _ = writeln!(out, "  {n}");
    }
    if sh.hugepages > 0 {
        let _ = writeln!(out, "hugetlb pool: {} huge pages of 2 MiB", sh.hugepages);
    }
    if let Some(f) = faults {
        let _ = writeln!(
            out,
            "page faults: {} recorded, {} of threads the log does not show (the tracer's)",
            f.total, f.other_threads
        );
        for d in &f.disagreements {
            let _ = writeln!(out, "  {d}");
        }
    }
    for p in &shown {
        let indent = if several {
            let prog = p.program.as_deref().map(|s| format!(" `{s}`")).unwrap_or_default();
            let ended = p.ended.as_deref().map(|s| format!(", ended by {s}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "process pid {}{prog} ({}{ended}): {} calls ({}), {} mismatches",
                fmt_pid(p.pid),
                p.origin,
                p.counts.values().sum::<usize>(),
                per_call(&p.counts),
                p.mismatches
            );
            "  "
        } else {
            ""
        };
        if let Some(b) = p.start_brk {
            let _ = writeln!(out, "{indent}initial break {b:#x}");
        }
        if faults.is_some() {
            let f = &p.faults;
            let _ = writeln!(
                out,
                "{indent}page faults: {} replayed ({} read, {} write, {} fetch), {} on pre-trace memory skipped, \
                 {} raised a signal in softmm",
                f.replayed.iter().sum::<u64>(),
                f.replayed[0],
                f.replayed[1],
                f.replayed[2],
                f.pretrace,
                f.signalled
            );
            for s in &f.signalled_first {
                let _ = writeln!(out, "{indent}  {s}");
            }
        }
        if !p.pretrace.is_empty() {
            let bytes: u64 = p.placeholders.iter().map(|p| p.end - p.start).sum();
            let _ = writeln!(
                out,
                "{indent}calls on memory mapped before tracing began: {} ({} placeholder mappings, {} KiB)",
                per_call(&p.pretrace),
                p.placeholders.len(),
                bytes >> 10
            );
            for ph in &p.placeholders {
                let _ = writeln!(
                    out,
                    "{indent}  placeholder {:08x}-{:08x} for line {} ({})",
                    ph.start, ph.end, ph.line, ph.call
                );
            }
        }
        if !p.reordered.is_empty() {
            let _ = writeln!(out, "{indent}overlapping calls of different threads replayed out of result order:");
            for l in &p.reordered {
                let _ = writeln!(out, "{indent}  {l}");
            }
        }
        if !p.placed_differently.is_empty() {
            let _ = writeln!(out, "{indent}softmm placed {} mappings differently:", p.placed_differently.len());
            for l in &p.placed_differently {
                let _ = writeln!(out, "{indent}  {l}");
            }
        }
    }
    if !log.incomplete.is_empty() {
        let _ = writeln!(out, "calls without a result (skipped): lines {:?}", log.incomplete);
    }
    if log.other_calls > 0 {
        let _ = writeln!(out, "other syscalls ignored: {}", log.other_calls);
    }
    for (line, why) in &log.bad {
        let _ = writeln!(out, "line {line}: cannot parse: {why}");
    }
    out.push_str(&sh.bench_out);
    for m in &sh.mismatches {
        let _ = writeln!(out, "MISMATCH {m}");
    }
    if !sh.mismatches.is_empty() && several && !tr.process_lines {
        let _ = writeln!(
            out,
            "hint: the log has several processes but no process lines; record with \
             `strace -f -y -e {}` (or use `softmm replay --run -- CMD`) so that each process gets its \
             own address space",
            record::TRACE_SET
        );
    }
    let ok = sh.mismatches.is_empty() && log.bad.is_empty();
    let _ = writeln!(
        out,
        "{}: {} mismatches, {} unparsed lines",
        if ok { "OK" } else { "FAILED" },
        sh.mismatches.len(),
        log.bad.len()
    );
    if opts.maps {
        // Every address space, except a fork's copy that made no call before
        // its child ran another program (its maps are its parent's).
        let exec_only =
            |p: &Process| p.counts.is_empty() && p.ended.as_deref().is_some_and(|e| e.starts_with("execve"));
        for p in tr.procs.iter().filter(|p| !exec_only(p)) {
            if several {
                let prog = p.program.as_deref().map(|s| format!(" `{s}`")).unwrap_or_default();
                let when = if p.ended.is_none() { "at the end of the log" } else { "at its end" };
                let _ = writeln!(out, "\nfinal mappings of pid {}{prog} ({when}):", fmt_pid(p.pid));
            } else {
                let _ = writeln!(out, "\nfinal mappings:");
            }
            out.push_str(&p.maps_text(opts.vm_flags));
            if !p.placeholders.is_empty() {
                let _ = writeln!(out, "(placeholders for pre-trace memory:");
                for ph in &p.placeholders {
                    let _ = writeln!(out, "  {:08x}-{:08x} (line {})", ph.start, ph.end, ph.line);
                }
                let _ = writeln!(out, ")");
            }
        }
    }
    Ok((out, ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            addresses: Addresses::Recorded,
            maps: true,
            vm_flags: false,
            verbose: false,
            arena: Some(64 << 20),
            faults: None,
            compare_maps: None,
            hugepages: None,
            bench: None,
        }
    }

    /// A log where pid 10 maps 8 KiB at 0x300000000 and forks pid 11, which
    /// runs first: `child` (its lines) and its exit come before the fork's
    /// result; then pid 10 exits.
    fn child_first(child: &str) -> String {
        format!(
            "10 mmap(0x300000000, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x300000000\n\
             10 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD <unfinished ...>\n\
             {child}\
             11 exit_group(0) = ?\n\
             11 +++ exited with 0 +++\n\
             10 <... clone resumed>, child_tidptr=0x7f6b411c2990) = 11\n\
             10 exit_group(0) = ?\n"
        )
    }

    /// The selftests' calls: locks, a seal (strace 6.1's `syscall_0x1ce`)
    /// and MDWE replay with every result as recorded, and a fixed mapping
    /// at 0 implies `CAP_SYS_RAWIO`.
    #[test]
    fn locks_seals_mdwe_and_a_low_fixed_mapping_replay_as_recorded() {
        let log = "10 mmap(NULL, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0\n\
                   10 mmap(0x300000000, 16384, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x300000000\n\
                   10 mlock2(0x300000000, 4096, MLOCK_ONFAULT) = 0\n\
                   10 mlockall(MCL_ONFAULT) = -1 EINVAL (Invalid argument)\n\
                   10 syscall_0x1ce(0x300002000, 0x2000, 0, 0, 0, 0) = 0\n\
                   10 munmap(0x300000000, 16384) = -1 EPERM (Operation not permitted)\n\
                   10 prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) = 0\n\
                   10 mprotect(0x300000000, 4096, PROT_READ|PROT_EXEC) = -1 EACCES (Permission denied)\n\
                   10 prctl(PR_GET_MDWE, 0, 0, 0, 0) = 0x1\n\
                   10 munlockall() = 0\n";
        let (out, ok) = replay("t", log, &opts()).expect("replay");
        assert!(ok, "{out}");
        assert!(out.contains("OK: 0 mismatches"), "{out}");
        let maps = &out[out.find("final mappings").expect("maps")..];
        assert!(maps.lines().nth(1).is_some_and(|l| l.starts_with("00000000-00001000")), "{out}");
    }

    /// MDWE outlives `execve` (Linux's `mm_init` copies `MMF_HAS_MDWE`
    /// into the new program's `mm` unless `PR_MDWE_NO_INHERIT`); found by
    /// `tests/replay_random` with MDWE: the exec'd program's `PR_GET_MDWE`
    /// returned 0 in the replay and setting other bits succeeded. With
    /// `--bench`, the new program starts with the bits set too.
    #[test]
    fn mdwe_outlives_execve_unless_no_inherit() {
        let log = |bits: &str, after: &str| {
            format!(
                "10 prctl(PR_SET_MDWE, {bits}, 0, 0, 0) = 0\n\
                 10 execve(\"/bin/true\", [\"true\"], 0x7ffd /* 1 var */) = 0\n\
                 10 mmap(0x300000000, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x300000000\n\
                 {after}"
            )
        };
        let kept = log(
            "PR_MDWE_REFUSE_EXEC_GAIN",
            "10 prctl(PR_GET_MDWE, 0, 0, 0, 0) = 0x1\n\
             10 mprotect(0x300000000, 4096, PROT_READ|PROT_EXEC) = -1 EACCES (Permission denied)\n\
             10 prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN|PR_MDWE_NO_INHERIT, 0, 0, 0) = -1 EPERM (Operation not permitted)\n",
        );
        let dropped = log(
            "PR_MDWE_REFUSE_EXEC_GAIN|PR_MDWE_NO_INHERIT",
            "10 prctl(PR_GET_MDWE, 0, 0, 0, 0) = 0\n\
             10 mprotect(0x300000000, 4096, PROT_READ|PROT_EXEC) = 0\n",
        );
        for log in [kept, dropped] {
            let mut o = opts();
            o.bench = Some(bench::BenchOptions {
                policies: bench::parse_policies("default").expect("policies"),
                repeat: 1,
                json: None,
                processes: false,
                plot: None,
                host: None,
            });
            let (out, ok) = replay("t", &log, &o).expect("replay");
            assert!(ok && out.contains("OK: 0 mismatches"), "{log}\n{out}");
        }
    }

    /// strace writes a `fork`'s result after the child's own lines when the
    /// child runs first: a child that exited before then is one process, not
    /// set up again at the result (found by `tests/replay_random.rs` once
    /// its generated programs exec'd and forked from a thread).
    #[test]
    fn a_child_that_exits_before_its_fork_returns_is_one_process() {
        let log = child_first("11 munmap(0x300000000, 4096) = 0\n");
        let (out, ok) = replay("t", &log, &opts()).expect("replay");
        assert!(ok, "{out}");
        assert!(out.contains("2 processes"), "{out}");
        assert_eq!(out.matches("final mappings of pid 11 ").count(), 1, "{out}");
        // The child's munmap happened in its copy only.
        let parent = &out[out.find("final mappings of pid 10 ").expect("parent maps")..];
        assert!(parent.lines().nth(1).is_some_and(|l| l.starts_with("300000000-300002000")), "{out}");
    }

    /// A child that exits before its fork's result, with no other line, is
    /// one process that ended there, not one set up at the result and alive
    /// at the end of the log.
    #[test]
    fn a_child_whose_only_line_is_its_exit_ends_there() {
        let log = child_first("");
        let (out, ok) = replay("t", &log, &opts()).expect("replay");
        assert!(ok, "{out}");
        assert_eq!(out.matches("final mappings of pid 11 (at its end)").count(), 1, "{out}");
        assert!(!out.contains("at the end of the log"), "{out}");
    }

    /// A child that runs first changes its descriptors before its fork's
    /// result is written: those are its own table's (a copy of its
    /// parent's), kept when the child is set up, not replaced by a new copy
    /// of the parent's. Lines of `tests/replay_random.rs` seed 590 (pids
    /// 6611/6616 of its batch's log, two mappings added before the exec),
    /// which failed on a loaded machine: the
    /// parent's descriptor 8 was write-only, the child reopened it
    /// read-write, and the replay refused the child's (and its new
    /// program's) shared read mappings of it with `EACCES`.
    #[test]
    fn descriptors_a_child_opens_before_its_fork_returns_are_its_own() {
        let log = "6611  openat(AT_FDCWD</w>, \"/tmp/r/file0\", O_WRONLY) = 8</tmp/r/file0>\n\
                   6611  mmap(0x3000d2000, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0x3000d2000\n\
                   6611  clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD <unfinished ...>\n\
                   6616  close(8</tmp/r/file0>) = 0\n\
                   6616  openat(AT_FDCWD</w>, \"/tmp/r/file0\", O_RDWR) = 8</tmp/r/file0>\n\
                   6616  munmap(0x3000d2000, 4096)         = 0\n\
                   6616  mmap(0x300010000, 8192, PROT_READ, MAP_SHARED|MAP_FIXED, 8</tmp/r/file0>, 0) = 0x300010000\n\
                   6616  openat(AT_FDCWD</w>, \"/proc/self/maps\", O_RDONLY) = 9</proc/6616/maps>\n\
                   6611  <... clone resumed>, child_tidptr=0x7f27f9dae990) = 6616\n\
                   6616  close(9</proc/6616/maps>)         = 0\n\
                   6616  mmap(0x300020000, 8192, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_FIXED, 8</tmp/r/file0>, 0) = 0x300020000\n\
                   6616  execve(\"/bin/t\", [\"/bin/t\"], 0x7f27f9dad228 /* 2 vars */) = 0\n\
                   6616  brk(NULL)                         = 0x556fe2ea8000\n\
                   6616  mmap(0x30000d000, 32768, PROT_READ, MAP_SHARED, 8</tmp/r/file0>, 0x2000) = 0x30000d000\n\
                   6616  exit_group(0)                     = ?\n\
                   6616  +++ exited with 0 +++\n\
                   6611  mmap(0x300030000, 4096, PROT_READ, MAP_SHARED|MAP_FIXED, 8</tmp/r/file0>, 0) = -1 EACCES (Permission denied)\n\
                   6611  exit_group(0) = ?\n";
        let (out, ok) = replay("t", log, &opts()).expect("replay");
        assert!(ok, "{out}");
        // The child's munmap happened in its copy only, once.
        let parent = &out[out.find("final mappings of pid 6611 ").expect("parent maps")..];
        assert!(parent.lines().nth(1).is_some_and(|l| l.starts_with("3000d2000-3000d3000")), "{out}");
    }
}
