//! One traced process of a replay: its softmm address space, what the
//! replay knows of it, and the replay of its memory calls.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use softmm::uapi::{
    MAP_ANONYMOUS, MAP_FIXED, MAP_FIXED_NOREPLACE, MAP_PRIVATE, MAP_SHARED_VALIDATE, MAP_TYPE, MREMAP_DONTUNMAP,
    MREMAP_FIXED, MREMAP_MAYMOVE,
};
use softmm::{page_align, AddressSpace, PhysMem, PAGE_SIZE};

use super::fds::FdTable;
use super::ops::{Op, Planned};
use super::parse::{errno_name, Call, Fd, Record, Ret};
use super::ranges::{proof, Placeholder, RangeSet, Translation};
use super::{Addresses, Shared};

/// A process of the log (its threads share it).
pub(super) struct Process {
    /// The pid that started it (its leader), if the log names pids.
    pub pid: Option<u64>,
    /// The program (`sort -n`), when an `execve` line named it.
    pub program: Option<String>,
    /// How it began (`execve at line 12`, `fork of pid 7 at line 9`, ...).
    pub origin: String,
    /// Its address space, until it exits or execs.
    mm: Option<Arc<AddressSpace>>,
    /// The initial break, from its first `brk` result.
    pub start_brk: Option<u64>,
    /// Recorded ranges traced calls touched.
    known: RangeSet,
    tr: Translation,
    /// Calls on pre-trace memory, per call.
    pub pretrace: BTreeMap<&'static str, usize>,
    pub placeholders: Vec<Placeholder>,
    pub placed_differently: Vec<String>,
    pub reordered: Vec<String>,
    /// Memory calls replayed, per call.
    pub counts: BTreeMap<&'static str, usize>,
    pub mismatches: usize,
    /// Its mappings at its end (exit or execve).
    pub final_maps: Option<Vec<softmm::MapEntry>>,
    /// How it ended (`exit_group at line 40`), if it did.
    pub ended: Option<String>,
    /// What became of the recorded page faults replayed into it.
    pub faults: FaultCounts,
    /// Starts (recorded addresses) of the `MAP_GROWSDOWN` mappings traced
    /// calls made: a fault below one may grow it.
    growsdown: Vec<u64>,
    /// For `--bench`: every softmm call made into it, in order.
    pub plan: Option<Vec<Planned>>,
    /// The configuration its address space was made with.
    pub config: softmm::MmConfig,
    /// Whether it began as a fork (the bench runs programs from their
    /// start only).
    pub forked: bool,
}

/// The resource limits of a pid that softmm models (`MmConfig`), where the
/// log set them.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct Limits {
    /// `RLIMIT_STACK`.
    pub stack: Option<u64>,
    /// `RLIMIT_MEMLOCK`.
    pub memlock: Option<u64>,
    /// Inferred from the log: it locked past the limit.
    pub cap_ipc_lock: bool,
}

/// The recorded page faults of a process, by what the replay did with them.
#[derive(Default, Clone)]
pub(super) struct FaultCounts {
    /// Replayed, by access: read, write, fetch.
    pub replayed: [u64; 3],
    /// On memory no traced call touched (mapped before tracing began: the
    /// executable, the interpreter, the stack): skipped.
    pub pretrace: u64,
    /// Replayed, and softmm raised a signal (a `SIGSEGV` the program may
    /// have taken on purpose, as a JVM does, or a divergence): the count and
    /// the first few.
    pub signalled: u64,
    pub signalled_first: Vec<String>,
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

impl Process {
    /// A process with a new, empty address space whose heap starts at
    /// `start_brk` (the recorded initial break).
    pub(super) fn new(
        phys: &Arc<PhysMem>,
        pid: Option<u64>,
        origin: String,
        start_brk: Option<u64>,
        limits: Limits,
        caps: super::caps::Caps,
    ) -> Result<Process, String> {
        let mut config = caps.apply(crate::workloads::mm_config());
        if let Some(b) = start_brk {
            config.start_brk = b;
        }
        if let Some(l) = limits.stack {
            config.stack_limit = l;
        }
        if let Some(l) = limits.memlock {
            config.memlock_limit = l;
        }
        config.cap_ipc_lock |= limits.cap_ipc_lock;
        let mm = AddressSpace::new(phys, config).map_err(|e| format!("address space for the recorded layout: {e}"))?;
        let mut known = RangeSet::default();
        if let Some(b) = start_brk {
            known.insert(b, b + PAGE_SIZE);
        }
        Ok(Process::begin(pid, origin, mm, start_brk, known, Translation::default()))
    }

    /// A child of `fork()`: a copy-on-write copy of this address space
    /// ([`AddressSpace::fork`]) and of what the replay knows of it.
    /// `tid`: the parent's thread that forked; `index`: the child's among
    /// the replay's processes.
    pub(super) fn fork(
        &mut self,
        tid: Option<u64>,
        pid: Option<u64>,
        origin: String,
        index: usize,
    ) -> Result<Process, String> {
        let mm = self.mm().fork().map_err(|e| format!("fork for {origin}: {e}"))?;
        if let Some(plan) = &mut self.plan {
            let op = Op::Fork { child: index };
            plan.push(Planned { tid: tid.unwrap_or(0), op, result: Ok(0), call: false, pool: false });
        }
        let child = Process::begin(pid, origin, mm, self.start_brk, self.known.clone(), self.tr.clone());
        let plan = self.plan.as_ref().map(|_| Vec::new());
        Ok(Process { program: self.program.clone(), growsdown: self.growsdown.clone(), plan, forked: true, ..child })
    }

    /// A process that begins with `mm`, knowing `known` and `tr` of it, with
    /// nothing replayed yet.
    fn begin(
        pid: Option<u64>,
        origin: String,
        mm: Arc<AddressSpace>,
        start_brk: Option<u64>,
        known: RangeSet,
        tr: Translation,
    ) -> Process {
        let config = mm.config().clone();
        Process {
            pid,
            program: None,
            origin,
            mm: Some(mm),
            start_brk,
            known,
            tr,
            pretrace: BTreeMap::new(),
            placeholders: Vec::new(),
            placed_differently: Vec::new(),
            reordered: Vec::new(),
            counts: BTreeMap::new(),
            mismatches: 0,
            final_maps: None,
            ended: None,
            faults: FaultCounts::default(),
            growsdown: Vec::new(),
            plan: None,
            config,
            forked: false,
        }
    }

    /// Whether it still has its address space.
    pub(super) fn alive(&self) -> bool {
        self.mm.is_some()
    }

    /// Its address space (it is alive).
    fn mm(&self) -> &Arc<AddressSpace> {
        self.mm.as_ref().expect("calls are replayed only into live processes")
    }

    /// Ends it (exit or execve): keeps its final maps, frees its address space.
    pub(super) fn end(&mut self, why: String) {
        if let Some(mm) = self.mm.take() {
            self.final_maps = Some(mm.maps());
        }
        self.ended = Some(why);
    }

    /// The MDWE bits a program it runs with `execve` starts with: Linux's
    /// `mm_init` copies them into the new `mm` unless
    /// `PR_MDWE_NO_INHERIT` (`mmf_init_flags`).
    pub(super) fn mdwe_for_exec(&self) -> u64 {
        let bits = self.mm.as_ref().and_then(|mm| mm.prctl_get_mdwe(0, 0, 0, 0).ok()).unwrap_or(0);
        if bits & softmm::uapi::PR_MDWE_NO_INHERIT != 0 {
            0
        } else {
            bits
        }
    }

    /// Gives a program that `execve` started (on thread `tid`) the MDWE
    /// bits it inherited, as an op of its plan that is not one of the
    /// log's calls, so that `--bench` starts it so too.
    pub(super) fn inherit_mdwe(&mut self, tid: Option<u64>, bits: u64) {
        if bits == 0 {
            return;
        }
        let op = Op::Mdwe { get: false, args: [bits, 0, 0, 0] };
        let result = op.run(self.mm(), None);
        debug_assert_eq!(result, Ok(0), "a fresh address space takes any valid MDWE bits");
        if let Some(plan) = &mut self.plan {
            plan.push(Planned { tid: tid.unwrap_or(0), op, result, call: false, pool: false });
        }
    }

    /// Frees its address space at the end of the log, keeping its maps.
    pub(super) fn release(&mut self) {
        if let Some(mm) = self.mm.take() {
            self.final_maps = Some(mm.maps());
        }
    }

    /// Its maps now, or at its end, in `/proc/pid/maps` format; with
    /// `vm_flags`, each line followed by its smaps `VmFlags:` line (locks
    /// and seals show there only).
    pub(super) fn maps_text(&self, vm_flags: bool) -> String {
        let now;
        let entries = match &self.mm {
            Some(mm) => {
                now = mm.maps();
                &now
            }
            None => self.final_maps.as_deref().unwrap_or_default(),
        };
        let mut out = String::new();
        for e in entries {
            out += &e.to_line();
            out.push('\n');
            if vm_flags {
                out += &format!("VmFlags: {}\n", e.vm_flags);
            }
        }
        out
    }

    /// Replays a recorded page fault of one of its threads on that thread's
    /// `cpu`: an access of the fault's kind at its address (softmm's
    /// addresses), without changing the memory's contents
    /// ([`softmm::Cpu::translate`]). A fault on memory no traced call
    /// touched is skipped.
    pub(super) fn fault(&mut self, cpu: &mut softmm::Cpu, cpu_tid: u64, pf: super::faults::PageFault) {
        let page = pf.addr & !(PAGE_SIZE - 1);
        // Below a traced growsdown mapping (within 128 MiB, Linux's
        // largest stack gap at mmap_base): softmm decides whether it grows.
        let below_growsdown = self.growsdown.iter().any(|&s| s > page && s - page <= 128 << 20);
        if !below_growsdown && self.known.gaps(page, page + PAGE_SIZE) == [(page, page + PAGE_SIZE)] {
            self.faults.pretrace += 1;
            return;
        }
        let mm = self.mm();
        if !cpu.mm().is_some_and(|m| Arc::ptr_eq(m, mm)) {
            cpu.attach(mm);
        }
        let addr = self.tr.tr(pf.addr);
        let op = Op::Fault { addr, access: pf.access };
        let pool = self.plan.is_some() && op.uses_hugetlb_pool(mm);
        let k = match pf.access {
            softmm::Access::Write => 1,
            softmm::Access::Execute => 2,
            _ => 0,
        };
        self.faults.replayed[k] += 1;
        let r = cpu.translate(addr, pf.access).map(|_| ());
        if let Some(plan) = &mut self.plan {
            plan.push(Planned { tid: cpu_tid, op, result: r.map(|()| 0).map_err(|_| 1), call: false, pool });
        }
        if let Err(f) = r {
            self.faults.signalled += 1;
            if self.faults.signalled_first.len() < 5 {
                self.faults.signalled_first.push(format!("{:?} at {addr:#x}: {f}", pf.access));
            }
        }
    }

    /// The recorded ranges traced calls made or changed, without the
    /// placeholders for pre-trace memory.
    pub(super) fn traced_region(&self) -> RangeSet {
        let mut r = self.known.clone();
        for ph in &self.placeholders {
            r.remove(ph.start, ph.end);
        }
        r
    }

    /// After a successful `brk`: the heap from the initial break is known.
    pub(super) fn learn_brk(&mut self, v: u64) {
        if let Some(b) = self.start_brk {
            self.known.insert(b, v.max(b + PAGE_SIZE));
        }
    }

    /// Parts of `[start, end)` (softmm addresses) with no mapping.
    fn unmapped(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut cur = start;
        let mut out = Vec::new();
        for m in self.mm().maps() {
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
                let op = Op::Mmap {
                    addr: hs,
                    len: he - hs,
                    prot: libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    file: None,
                    off: 0,
                };
                if self.op(r, op, false).is_ok() {
                    self.placeholders.push(Placeholder { start: hs, end: he, line: r.line, call: r.call.name() });
                }
            }
        }
    }

    fn mismatch(
        &mut self,
        sh: &mut Shared,
        r: &Record,
        expected: Result<u64, i32>,
        actual: Result<u64, i32>,
        note: &str,
    ) {
        let pid = r.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        let mut m =
            format!("line {}{}: {} = {} recorded, softmm {}", r.line, pid, r.text, show(expected), show(actual));
        if !note.is_empty() {
            let _ = write!(m, " ({note})");
        }
        sh.mismatches.push(m);
        self.mismatches += 1;
    }

    /// Whether `r` may be replayed before a call that collides with the
    /// mapping it removes or moves.
    pub(super) fn frees(r: &Record) -> bool {
        matches!(r.call, Call::Munmap { .. } | Call::Mremap { .. })
            || matches!(r.call, Call::Mmap { flags, .. } if flags & MAP_FIXED != 0)
    }

    /// Replays one call; `Err(())` when a recorded-address placement collided
    /// (the caller may retry after replaying an overlapping call).
    pub(super) fn step(
        &mut self,
        sh: &mut Shared,
        r: &Record,
        fds: Option<&FdTable>,
        last_try: bool,
    ) -> Result<(), ()> {
        let own = sh.opts.addresses == Addresses::Own;
        if !r.call.is_memory() {
            return Ok(());
        }
        let mm = self.mm().clone();
        let exp = recorded(r.ret);
        *self.counts.entry(r.call.name()).or_default() += 1;
        let got: Result<u64, i32>;
        match r.call {
            Call::Mmap { addr, len, prot, flags, ref fd, off } => {
                let fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0;
                let desc = match fd {
                    Fd::Num(n) | Fd::Path(n, _) => fds.and_then(|t| t.get(*n)),
                    Fd::None => None,
                };
                if super::files::no_mmap(fd, desc) && flags & MAP_ANONYMOUS == 0 {
                    // A file without `mmap`: Linux's checks before it looks
                    // for one, then `ENODEV`; softmm has no such file.
                    got = self.checks_before_f_op_mmap(addr, len, prot, flags, off, desc, exp);
                    if got != exp {
                        self.mismatch(sh, r, exp, got, "a file without mmap");
                    }
                    self.verbose(sh, r, got, exp);
                    return Ok(());
                }
                let open = sh.files.for_mmap(fd, prot, flags, exp, desc);
                let (a, fl) = match (own, fixed, exp) {
                    // MAP_SHARED_VALIDATE refuses MAP_FIXED_NOREPLACE (not in
                    // LEGACY_MAP_MASK, EOPNOTSUPP on Linux too): check the
                    // range is free here and place it with MAP_FIXED.
                    (false, false, Ok(rec)) if flags & MAP_TYPE == MAP_SHARED_VALIDATE => (rec, flags | MAP_FIXED),
                    (false, false, Ok(rec)) => (rec, flags | MAP_FIXED_NOREPLACE),
                    (true, _, _) => (self.tr.tr(addr), flags),
                    _ => (addr, flags),
                };
                let occupied = fl & MAP_FIXED != 0
                    && !fixed
                    && self.unmapped(a, a.saturating_add(page_align(len))) != [(a, a.saturating_add(page_align(len)))];
                got = if occupied {
                    Err(libc::EEXIST)
                } else {
                    self.op(r, Op::Mmap { addr: a, len, prot, flags: fl, file: open.clone(), off }, true)
                };
                if !own && !fixed && exp.is_ok() && got == Err(libc::EEXIST) && !last_try {
                    *self.counts.entry("mmap").or_default() -= 1;
                    // Retried: the attempt changed nothing and is no op.
                    if !occupied {
                        if let Some(plan) = &mut self.plan {
                            plan.pop();
                        }
                    }
                    return Err(());
                }
                match (exp, got) {
                    (Ok(rec), Ok(g)) => {
                        if own && !fixed && g != rec {
                            self.tr.add(rec, len, g);
                            self.placed_differently
                                .push(format!("line {}: {} at {g:#x}, recorded {rec:#x}", r.line, r.text));
                        } else if (own && fixed && g != self.tr.tr(rec)) || (!own && g != rec) {
                            self.mismatch(sh, r, exp, got, "");
                        }
                        self.known.insert(rec, rec.saturating_add(page_align(len)));
                        if flags & softmm::uapi::MAP_GROWSDOWN != 0 {
                            self.growsdown.push(rec);
                        }
                    }
                    (Err(e), Err(g)) if e == g => {}
                    (Err(_), Ok(g)) => {
                        self.mismatch(sh, r, exp, got, "undone");
                        if !fixed {
                            let _ = self.op(r, Op::Munmap { addr: g, len }, false);
                        }
                    }
                    _ => self.mismatch(sh, r, exp, got, ""),
                }
            }
            Call::Munmap { addr, len } => {
                // Success proves nothing: Linux unmaps holes without error.
                got = self.op(r, Op::Munmap { addr: self.tr.tr(addr), len }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
                if exp.is_ok() {
                    self.known.insert(addr, addr.saturating_add(page_align(len)));
                }
            }
            Call::Mprotect { addr, len, prot } => {
                if exp.is_ok() {
                    self.pretrace(r);
                }
                got = self.op(r, Op::Mprotect { addr: self.tr.tr(addr), len, prot }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Madvise { addr, len, advice } => {
                if exp.is_ok() {
                    self.pretrace(r);
                }
                got = self.op(r, Op::Madvise { addr: self.tr.tr(addr), len, advice }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Mlock { addr, len, flags } => {
                got = self.op(r, Op::Mlock { addr: self.tr.tr(addr), len, flags }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Munlock { addr, len } => {
                got = self.op(r, Op::Munlock { addr: self.tr.tr(addr), len }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Mlockall { flags } => {
                got = self.op(r, Op::Mlockall { flags }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Munlockall => {
                got = self.op(r, Op::Munlockall, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Mdwe { get, args } => {
                got = self.op(r, Op::Mdwe { get, args }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
            }
            Call::Mseal { addr, len, flags } => {
                if exp.is_ok() {
                    self.pretrace(r);
                }
                got = self.op(r, Op::Mseal { addr: self.tr.tr(addr), len, flags }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
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
                // strace prints the fifth argument only with MREMAP_FIXED,
                // but MREMAP_DONTUNMAP uses it as a hint, and Linux refuses
                // a hint overlapping the source with EINVAL before it looks
                // at any VMA. A recorded EINVAL with the hint missing gets
                // the one hint that surely overlaps: `old` itself.
                if flags & (MREMAP_DONTUNMAP | MREMAP_FIXED) == MREMAP_DONTUNMAP
                    && new_addr == 0
                    && exp == Err(libc::EINVAL)
                {
                    na = self.tr.tr(old);
                }
                let op = Op::Mremap { old: self.tr.tr(old), old_len, new_len, flags: fl, new_addr: na };
                got = self.op(r, op, true);
                match (exp, got) {
                    (Ok(rec), Ok(g)) => {
                        if own && g != self.tr.tr(rec) && flags & MREMAP_FIXED == 0 {
                            self.tr.add(rec, new_len, g);
                            self.placed_differently
                                .push(format!("line {}: {} at {g:#x}, recorded {rec:#x}", r.line, r.text));
                        } else if !own && g != rec {
                            self.mismatch(sh, r, exp, got, "");
                        }
                        self.learn_mremap(old, old_len, new_len, flags, rec);
                        sh.files.grow(&mm, g);
                    }
                    (Err(e), Err(g)) if e == g => {}
                    _ => self.mismatch(sh, r, exp, got, ""),
                }
            }
            Call::Brk { addr } => {
                got = self.op(r, Op::Brk { addr }, true);
                if got != exp {
                    self.mismatch(sh, r, exp, got, "");
                }
                if let Ok(v) = exp {
                    self.learn_brk(v);
                }
            }
            _ => return Ok(()),
        }
        self.verbose(sh, r, got, exp);
        Ok(())
    }

    /// Runs `op` (for record `r`; `call`: one of the log's calls) and, for
    /// `--bench`, keeps it in the plan.
    fn op(&mut self, r: &Record, op: Op, call: bool) -> Result<u64, i32> {
        let pool = self.plan.is_some() && op.uses_hugetlb_pool(self.mm());
        let result = op.run(self.mm(), None);
        if let Some(plan) = &mut self.plan {
            plan.push(Planned { tid: r.pid.unwrap_or(0), op, result, call, pool });
        }
        result
    }

    /// With `--verbose`, prints the call and softmm's result.
    fn verbose(&self, sh: &mut Shared, r: &Record, got: Result<u64, i32>, exp: Result<u64, i32>) {
        if sh.opts.verbose {
            let ok = if got == exp { "" } else { "  <-- MISMATCH" };
            let pid = r.pid.map(|p| format!("{p} ")).unwrap_or_default();
            let _ = writeln!(sh.out, "{:>6}  {pid}{} = {}{}", r.line, r.text, show(got), ok);
        }
    }

    /// The result of an `mmap` of a file without an `mmap` operation (a
    /// pipe, a socket, `/dev/null`): the errors Linux finds before it looks
    /// for one (`ksys_mmap_pgoff`, `do_mmap`, in that order), else `ENODEV`.
    /// The descriptor's mode is the table's, else taken as readable and
    /// writable unless the recorded result was `EACCES`.
    #[allow(clippy::too_many_arguments)]
    fn checks_before_f_op_mmap(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        off: u64,
        desc: Option<&super::fds::Desc>,
        exp: Result<u64, i32>,
    ) -> Result<u64, i32> {
        let task_size = self.mm().config().task_size;
        if off % PAGE_SIZE != 0 || flags & softmm::uapi::MAP_HUGETLB != 0 {
            return Err(libc::EINVAL);
        }
        if !matches!(flags & MAP_TYPE, MAP_PRIVATE | softmm::uapi::MAP_SHARED | MAP_SHARED_VALIDATE) || len == 0 {
            return Err(libc::EINVAL);
        }
        let alen = page_align(len);
        if alen == 0 || alen > task_size {
            return Err(libc::ENOMEM);
        }
        if (off >> softmm::PAGE_SHIFT).checked_add(alen >> softmm::PAGE_SHIFT).is_none() {
            return Err(libc::EOVERFLOW);
        }
        if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0 {
            if addr % PAGE_SIZE != 0 {
                return Err(libc::EINVAL);
            }
            if addr.checked_add(alen).is_none_or(|e| e > task_size) {
                return Err(libc::ENOMEM);
            }
            let a = self.tr.tr(addr);
            if flags & MAP_FIXED == 0 && self.unmapped(a, a + alen) != [(a, a + alen)] {
                return Err(libc::EEXIST);
            }
        }
        let (readable, writable) = match desc {
            Some(d) => (d.readable, d.writable),
            None => (exp != Err(libc::EACCES), exp != Err(libc::EACCES)),
        };
        let shared = matches!(flags & MAP_TYPE, softmm::uapi::MAP_SHARED | MAP_SHARED_VALIDATE);
        if (shared && prot & libc::PROT_WRITE != 0 && !writable) || !readable {
            return Err(libc::EACCES);
        }
        Err(libc::ENODEV)
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
}
