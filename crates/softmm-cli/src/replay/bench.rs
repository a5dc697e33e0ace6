//! `softmm replay --bench`: a recorded program as a workload. After the
//! sequential replay (which checks every call against the log), each
//! program's softmm calls and faults ([`Planned`]) run again on a fresh
//! address space per policy, each recorded thread on a thread of its own
//! with its own `Cpu`, as fast as it can.
//!
//! Threads are ordered only where the log orders them on the same memory:
//! an op waits for the latest earlier op of each other thread whose range
//! (see [`Op::range`]) overlaps its own (a `brk`, a `fork` or a moving
//! `mremap` waits for everything before it, and everything after waits for
//! it); program order does the rest. The hugetlb pool counts as memory every
//! op that uses it shares ([`Planned::pool`]): a `munmap` that gives the
//! pool's last page back and another thread's `mmap` that the log saw fail
//! for want of it run in the log's order. Ops on disjoint memory run
//! concurrently. Every op's result must be the sequential replay's, and so
//! the log's for its calls: the bench checks each and fails loudly
//! otherwise.
//!
//! Programs run one after another (per process); the rows give per policy
//! the wall time, the threads' times, calls and faults per second and the
//! lab's counters.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::Instant;

use softmm::{AddressSpace, Cpu, FaultPolicy, FaultStats, PhysMem};

use super::ops::{Op, Planned};
use super::process::Process;
use crate::counters::FaultCounters;
use crate::workloads::{space_counters, Backend};

/// What `--bench` runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The softmm configurations, in order: each a fault, unmap,
    /// shootdown-target, `madvise` or writer policy, the others at their
    /// defaults (as the lab's `--policy` names them).
    pub policies: Vec<Backend>,
    /// Runs per policy (the table gives the median, and min-max).
    pub repeat: usize,
    /// Where to write every run as JSON.
    pub json: Option<std::path::PathBuf>,
    /// Every process at once, each fork child on its parent's copy from
    /// the parent's fork op, instead of one program after another from its
    /// start.
    pub processes: bool,
    /// Where to draw each program's ops per second under each policy
    /// (`.svg` or `.png`).
    pub plot: Option<std::path::PathBuf>,
    /// The recorded command (`--run`), run again untraced `repeat` times
    /// for the host row: the program's own time, computation included.
    pub host: Option<Vec<String>>,
}

/// The backends `--policy` names: `all` (every softmm backend,
/// [`Backend::all_soft`]), `default`, or names, comma-separated.
pub fn parse_policies(s: &str) -> Result<Vec<Backend>, String> {
    let out = crate::args::parse_policy_list(
        s.split(','),
        &Backend::all_soft(),
        Backend::Soft(FaultPolicy::default()),
        |name| Backend::from_name(name).map(|b| vec![b]),
        |name| {
            let names: Vec<&str> = Backend::all_soft().into_iter().map(Backend::name).collect();
            format!("unknown policy `{name}`: the policies are {}; or all, default", names.join(", "))
        },
    )?;
    if out.is_empty() {
        return Err("no policy to run".into());
    }
    Ok(out)
}

/// The hugetlb pool, as a range of its own in [`schedule`]'s map, above
/// every address: the ops that use it ([`Planned::pool`]) are ordered by
/// the log among themselves, and against the ops without a range, which
/// cover it.
const POOL: (u64, u64) = (u64::MAX - 1, u64::MAX);

/// The waits of an op: `(thread index, ops that thread must have done)`.
type Waits = Vec<(usize, usize)>;

/// One thread's ops, each with the replay's result and its waits.
struct ThreadOps {
    tid: u64,
    ops: Vec<(Op, Result<u64, i32>, Waits)>,
}

/// Splits a plan into its threads' ops with their waits (see the module
/// doc).
fn schedule(plan: &[Planned]) -> Vec<ThreadOps> {
    let mut threads: Vec<ThreadOps> = Vec::new();
    let mut index: BTreeMap<u64, usize> = BTreeMap::new();
    // The last op to touch each address: start → (end, thread, ops done
    // by that thread once it ran). Disjoint segments.
    let mut last: BTreeMap<u64, (u64, usize, usize)> = BTreeMap::new();
    for p in plan {
        let t = *index.entry(p.tid).or_insert_with(|| {
            threads.push(ThreadOps { tid: p.tid, ops: Vec::new() });
            threads.len() - 1
        });
        let me = (t, threads[t].ops.len() + 1);
        let mut waits: BTreeMap<usize, usize> = BTreeMap::new();
        let range = p.op.range().unwrap_or((0, u64::MAX));
        for (s, e) in std::iter::once(range).chain(p.pool.then_some(POOL)) {
            let mut overlapping: Vec<u64> = Vec::new();
            if let Some((&k, &(end, _, _))) = last.range(..s).next_back() {
                if end > s {
                    overlapping.push(k);
                }
            }
            overlapping.extend(last.range(s..e).map(|(&k, _)| k));
            for k in overlapping {
                let Some((end, ot, done)) = last.remove(&k) else { continue };
                if ot != t {
                    let w = waits.entry(ot).or_default();
                    *w = (*w).max(done);
                }
                if k < s {
                    last.insert(k, (s, ot, done));
                }
                if end > e {
                    last.insert(e, (end, ot, done));
                }
            }
            last.insert(s, (e, me.0, me.1));
        }
        threads[t].ops.push((p.op.clone(), p.result, waits.into_iter().collect()));
    }
    threads
}

/// One run of one program (or of every process at once) under one policy.
struct Sample {
    seconds: f64,
    thread_seconds: Vec<f64>,
    calls: usize,
    faults: usize,
    counters: FaultCounters,
    /// Ops whose result differed from the replay's: the first few.
    differed: Vec<String>,
    differed_count: usize,
}

/// One process of a run: its threads' ops, and where its address space
/// comes from.
struct Job<'a> {
    threads: &'a [ThreadOps],
    /// A fresh address space made with this configuration (the recorded
    /// process's, under the run's policy); else the copy its parent's fork
    /// op makes.
    fresh: Option<softmm::MmConfig>,
}

/// What one bench thread did: its start and end, its CPU's fault counts,
/// and the ops whose result was not the replay's (the first few, and how
/// many).
type ThreadOut = (Instant, Instant, FaultStats, Vec<String>, usize);

/// Runs `jobs` once, all at once, each fresh one on a new address space,
/// each forked one on the copy made by the fork op whose child index
/// `job_of` maps to it (a fork op of a child not in `job_of` drops its
/// copy). `policy`: the fault policy, for the counters.
fn run_once(
    phys: &Arc<PhysMem>,
    policy: FaultPolicy,
    jobs: &[Job],
    job_of: &HashMap<usize, usize>,
    calls: usize,
) -> Result<Sample, String> {
    // Each job's address space: set before the start for a fresh one, by
    // its parent's fork op for a forked one (`None` where that fork failed).
    let spaces: Vec<OnceLock<Option<Arc<AddressSpace>>>> = jobs.iter().map(|_| OnceLock::new()).collect();
    for (space, job) in spaces.iter().zip(jobs) {
        if let Some(config) = &job.fresh {
            let mm = AddressSpace::new(phys, config.clone()).map_err(|e| format!("bench address space: {e}"))?;
            let _ = space.set(Some(mm));
        }
    }
    let progress: Vec<Vec<AtomicUsize>> =
        jobs.iter().map(|j| j.threads.iter().map(|_| AtomicUsize::new(0)).collect()).collect();
    let n: usize = jobs.iter().map(|j| j.threads.len()).sum();
    let start = Barrier::new(n + 1);
    let faults = jobs
        .iter()
        .flat_map(|j| j.threads.iter())
        .map(|t| t.ops.iter().filter(|o| matches!(o.0, Op::Fault { .. })).count())
        .sum();
    let outs: Vec<ThreadOut> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(n);
        for (j, job) in jobs.iter().enumerate() {
            for (i, t) in job.threads.iter().enumerate() {
                let (spaces, progress, start) = (&spaces, &progress[j], &start);
                handles.push(s.spawn(move || {
                    start.wait();
                    // A forked job's parent runs its ops without locks of
                    // ours: it reaches its fork in bounded time.
                    let space = loop {
                        match spaces[j].get() {
                            Some(space) => break space.clone(),
                            None => std::thread::yield_now(),
                        }
                    };
                    let t0 = Instant::now();
                    let Some(mm) = space else {
                        let why = format!("thread {}: its process's fork failed", t.tid);
                        return (t0, Instant::now(), FaultStats::default(), vec![why], t.ops.len());
                    };
                    let mut cpu = Cpu::attached(&mm);
                    let mut differed = Vec::new();
                    let mut count = 0usize;
                    for (k, (op, expected, waits)) in t.ops.iter().enumerate() {
                        for &(other, done) in waits {
                            // The other thread runs ops without locks of
                            // ours: it reaches `done` in bounded time.
                            while progress[other].load(Ordering::Acquire) < done {
                                std::thread::yield_now();
                            }
                        }
                        let got = match *op {
                            Op::Fork { child } => {
                                let copy = mm.fork();
                                if let Some(&c) = job_of.get(&child) {
                                    let _ = spaces[c].set(copy.as_ref().ok().cloned());
                                }
                                copy.map(|_| 0).map_err(|e| e.code())
                            }
                            _ => op.run(&mm, Some(&mut cpu)),
                        };
                        if got != *expected {
                            count += 1;
                            if differed.len() < 5 {
                                differed.push(format!(
                                    "thread {} op {} ({}): {:?}, the replay had {:?}",
                                    t.tid,
                                    k + 1,
                                    op.name(),
                                    got,
                                    expected
                                ));
                            }
                        }
                        progress[i].store(k + 1, Ordering::Release);
                    }
                    (t0, Instant::now(), cpu.stats().fault, differed, count)
                }));
            }
        }
        start.wait();
        handles.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    // From the first thread's start to the last one's end (this thread
    // may run after they all finished).
    let first = outs.iter().map(|o| o.0).min().ok_or("no thread to run")?;
    let last = outs.iter().map(|o| o.1).max().ok_or("no thread to run")?;
    let seconds = last.duration_since(first).as_secs_f64();
    let mut fault = FaultStats::default();
    let mut differed = Vec::new();
    let mut differed_count = 0;
    let mut thread_seconds = Vec::new();
    for (t0, end, f, d, c) in outs {
        fault.add(&f);
        thread_seconds.push(end.duration_since(t0).as_secs_f64());
        differed.extend(d);
        differed_count += c;
    }
    let spaces: Vec<Arc<AddressSpace>> = spaces.iter().filter_map(|s| s.get().cloned().flatten()).collect();
    let counters = space_counters(policy, &fault, spaces.iter().map(|mm| &**mm));
    Ok(Sample { seconds, thread_seconds, calls, faults, counters, differed, differed_count })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Benchmarks every program of `procs` that began with a new address space
/// (not a fork's copy) and has a plan, under each policy of `b`; writes the
/// tables to `out`. `mismatches`: the sequential replay's, which must be
/// none for the results to be the log's. Returns whether every op of every
/// run returned the replay's result.
pub(super) fn run(
    phys: &Arc<PhysMem>,
    procs: &[&Process],
    b: &BenchOptions,
    mismatches: usize,
    out: &mut String,
) -> bool {
    let mut machine = crate::machine::Machine::detect();
    let _ = write!(out, "\n{}", machine.header("replay, bench"));
    let _ = writeln!(out, "bench: each recorded thread on a thread of its own, as fast as possible");
    if mismatches > 0 {
        let _ = writeln!(
            out,
            "bench: the replay had {mismatches} mismatches with the log (below): the bench's results are checked \
             against the replay's, not the log's"
        );
    }
    // What runs together: one program at a time from its start, or (with
    // `processes`) every process at once, each fork child from its
    // parent's fork.
    let units: Vec<Vec<usize>> = if b.processes {
        vec![(0..procs.len()).filter(|&i| procs[i].plan.as_ref().is_some_and(|v| !v.is_empty())).collect()]
    } else {
        let forked: usize = procs.iter().filter(|p| p.forked).map(|p| p.plan.as_ref().map_or(0, Vec::len)).sum();
        if forked > 0 {
            let _ = writeln!(
                out,
                "bench: {forked} ops of forked children not run (a program is run from its start; --processes \
                 runs them)"
            );
        }
        (0..procs.len())
            .filter(|&i| !procs[i].forked && procs[i].plan.as_ref().is_some_and(|v| !v.is_empty()))
            .map(|i| vec![i])
            .collect()
    };
    let mut ok = true;
    let mut json = Vec::new();
    let mut panels = Vec::new();
    for unit in units.iter().filter(|u| !u.is_empty()) {
        let plans: Vec<&[Planned]> = unit.iter().map(|&i| procs[i].plan.as_deref().unwrap_or_default()).collect();
        let threads: Vec<Vec<ThreadOps>> = plans.iter().map(|plan| schedule(plan)).collect();
        let job_of: HashMap<usize, usize> = unit.iter().enumerate().map(|(j, &i)| (i, j)).collect();
        let all = || plans.iter().flat_map(|plan| plan.iter());
        let calls = all().filter(|o| o.call).count();
        let faults = all().filter(|o| matches!(o.op, Op::Fault { .. })).count();
        let nthreads: usize = threads.iter().map(Vec::len).sum();
        let waits: usize = threads.iter().flatten().flat_map(|t| t.ops.iter()).filter(|o| !o.2.is_empty()).count();
        let (title, pid, program) = match unit[..] {
            [i] => {
                let p = procs[i];
                let prog = p.program.as_deref().map(|s| format!(" `{s}`")).unwrap_or_default();
                (format!("program pid {}{prog}", super::fmt_pid(p.pid)), p.pid, p.program.clone())
            }
            _ => (format!("{} processes at once", unit.len()), None, None),
        };
        let _ = writeln!(
            out,
            "\n{title}: {nthreads} threads, {calls} calls, {faults} faults, {} ops in all, {waits} wait for another \
             thread",
            all().count()
        );
        let _ = writeln!(
            out,
            "{:<18} {:>10} {:>19} {:>11} {:>11} {:>9} {:>9} {:>8} {:>7} {:>6}",
            "policy",
            "total ms",
            "threads ms",
            "calls/s",
            "faults/s",
            "lock acq",
            "flush rq",
            "barriers",
            "aborts",
            "differ"
        );
        // The policies take turns, as in the lab's sweeps.
        let mut by_policy: Vec<Vec<Sample>> = b.policies.iter().map(|_| Vec::new()).collect();
        for _ in 0..b.repeat.max(1) {
            for (k, &policy) in b.policies.iter().enumerate() {
                let jobs: Vec<Job> = unit
                    .iter()
                    .zip(&threads)
                    .map(|(&i, t)| Job {
                        threads: t,
                        fresh: (!b.processes || !procs[i].forked).then(|| policy.configure(procs[i].config.clone())),
                    })
                    .collect();
                let fault_policy = policy.configure(softmm::MmConfig::default()).policy;
                match run_once(phys, fault_policy, &jobs, &job_of, calls) {
                    Ok(s) => by_policy[k].push(s),
                    Err(e) => {
                        let _ = writeln!(out, "{:<18} {e}", policy.name());
                        ok = false;
                    }
                }
            }
        }
        let mut panel = crate::plot::BarPanel {
            title: format!("{title}, {nthreads} threads"),
            unit: "calls and faults per second".into(),
            rows: Vec::new(),
        };
        for (&policy, samples) in b.policies.iter().zip(by_policy) {
            if samples.is_empty() {
                continue;
            }
            let rates: Vec<f64> = samples.iter().map(|s| (s.calls + s.faults) as f64 / s.seconds).collect();
            let (rlo, rhi) = rates.iter().fold((f64::INFINITY, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
            let mut secs: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
            let med = median(&mut secs);
            let (lo, hi) = (secs[0], secs[secs.len() - 1]);
            let m = samples.iter().min_by(|a, b| (a.seconds - med).abs().total_cmp(&(b.seconds - med).abs())).unwrap();
            let tmin = m.thread_seconds.iter().copied().fold(f64::INFINITY, f64::min);
            let tmax = m.thread_seconds.iter().copied().fold(0.0, f64::max);
            let c = &m.counters;
            panel.rows.push(crate::plot::Bar {
                label: policy.name().to_string(),
                group: policy.kind(),
                median: (m.calls + m.faults) as f64 / med,
                min: rlo,
                max: rhi,
            });
            let differ: usize = samples.iter().map(|s| s.differed_count).sum();
            let _ = writeln!(
                out,
                "{:<18} {:>10} {:>19} {:>11.0} {:>11.0} {:>9} {:>9} {:>8} {:>7} {:>6}",
                policy.name(),
                format!("{:.3}", med * 1e3),
                format!("{:.3}-{:.3}", tmin * 1e3, tmax * 1e3),
                m.calls as f64 / med,
                m.faults as f64 / med,
                c.mmap_lock_acquisitions.unwrap_or(0),
                c.flush_requests.unwrap_or(0),
                c.barriers.unwrap_or(0),
                c.spec_aborts.map_or("-".to_string(), |a| a.to_string()),
                differ
            );
            if b.repeat > 1 {
                let _ =
                    writeln!(out, "{:<18} (total ms over {} runs: {:.3}-{:.3})", "", samples.len(), lo * 1e3, hi * 1e3);
            }
            for s in &samples {
                for d in &s.differed {
                    let _ = writeln!(out, "  DIFFERS under {}: {d}", policy.name());
                }
                ok &= s.differed_count == 0;
                json.push(serde_json::json!({
                    "pid": pid,
                    "program": program,
                    "processes": unit.len(),
                    "policy": policy.name(),
                    "threads": nthreads,
                    "calls": s.calls,
                    "faults": s.faults,
                    "seconds": s.seconds,
                    "thread_seconds": s.thread_seconds,
                    "calls_per_second": s.calls as f64 / s.seconds,
                    "faults_per_second": s.faults as f64 / s.seconds,
                    "differed": s.differed_count,
                    "counters": s.counters,
                }));
            }
        }
        panels.push(panel);
    }
    if let Some(cmd) = &b.host {
        ok &= host_row(cmd, b.repeat, out, &mut json);
    }
    let _ = writeln!(
        out,
        "(threads ms: the fastest and slowest thread of the median run; lock acq: mmap_lock acquisitions; flush rq: \
         TLB flush requests to other CPUs; aborts: lock-free fault attempts aborted; differ: ops whose result was \
         not the replay's, over every run)"
    );
    if let Some(path) = &b.plot {
        let caption = format!(
            "softmm replay --bench: median of {} runs per policy, bar from the slowest to the fastest",
            b.repeat.max(1)
        );
        match crate::plot::bars(path, &panels, &caption) {
            Ok(()) => {
                let _ = writeln!(out, "wrote {}", path.display());
            }
            Err(e) => {
                let _ = writeln!(out, "bench: cannot plot {}: {e}", path.display());
                ok = false;
            }
        }
    }
    machine.finish();
    out.push_str(&machine.footer());
    if let Some(path) = &b.json {
        let json = serde_json::json!({ "machine": machine, "runs": json });
        match serde_json::to_string_pretty(&json)
            .map_err(|e| e.to_string())
            .and_then(|t| std::fs::write(path, t).map_err(|e| e.to_string()))
        {
            Ok(()) => {
                let _ = writeln!(out, "wrote {}", path.display());
            }
            Err(e) => {
                let _ = writeln!(out, "bench: cannot write {}: {e}", path.display());
                ok = false;
            }
        }
    }
    ok
}

/// The host row: `cmd` run `repeat` times untraced ([`super::record::run_untraced`]),
/// its median wall time and CPU time, marked as the whole program's; added
/// to `json` with `"policy": "host"`. False if it could not run.
fn host_row(cmd: &[String], repeat: usize, out: &mut String, json: &mut Vec<serde_json::Value>) -> bool {
    let mut runs = Vec::new();
    for _ in 0..repeat.max(1) {
        match super::record::run_untraced(cmd) {
            Ok(r) => runs.push(r),
            Err(e) => {
                let _ = writeln!(out, "host: `{}` did not run untraced: {e}", cmd.join(" "));
                return false;
            }
        }
    }
    let mut secs: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
    let med = median(&mut secs);
    let m = runs.iter().min_by(|a, b| (a.seconds - med).abs().total_cmp(&(b.seconds - med).abs())).expect("a run");
    let _ = writeln!(
        out,
        "\nhost: `{}` itself, untraced, {} runs: {:.3} ms wall (median; {:.3}-{:.3}), {:.3} ms CPU. The whole \
         program's time, its own computation and every process included: beside the rows above, not op for op",
        cmd.join(" "),
        runs.len(),
        med * 1e3,
        secs[0] * 1e3,
        secs[secs.len() - 1] * 1e3,
        m.cpu_seconds * 1e3
    );
    for r in &runs {
        json.push(serde_json::json!({
            "policy": "host",
            "whole_program": true,
            "command": cmd,
            "seconds": r.seconds,
            "cpu_seconds": r.cpu_seconds,
        }));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use softmm::Access;

    fn planned(tid: u64, op: Op) -> Planned {
        Planned { tid, op, result: Ok(0), call: true, pool: false }
    }

    /// An op whose result is not the replay's is counted and named.
    #[test]
    fn a_result_other_than_the_replays_is_reported() {
        let phys = PhysMem::new(softmm::PhysConfig::new(8 << 20)).unwrap();
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
        let mmap = Op::Mmap { addr: 0x10000000, len: 0x2000, prot: 3, flags: anon, file: None, off: 0 };
        let fault = Op::Fault { addr: 0x10001000, access: Access::Write };
        let threads = vec![ThreadOps {
            tid: 7,
            ops: vec![(mmap, Ok(0x10000000), vec![]), (fault.clone(), Ok(0), vec![]), (fault, Err(1), vec![])],
        }];
        let jobs = [Job { threads: &threads, fresh: Some(softmm::MmConfig::default()) }];
        let s = run_once(&phys, FaultPolicy::default(), &jobs, &HashMap::new(), 1).unwrap();
        assert_eq!((s.calls, s.faults, s.differed_count), (1, 2, 1));
        assert!(s.differed[0].contains("thread 7 op 3 (fault): Ok(0), the replay had Err(1)"), "{:?}", s.differed);
        assert_eq!(s.counters.faults, Some(1), "the second access hits the TLB");
    }

    /// Waits only where ranges overlap another thread's earlier op; a
    /// range-less op orders against everything.
    #[test]
    fn threads_wait_only_for_overlapping_ops_of_others() {
        let fault = |addr| Op::Fault { addr, access: Access::Write };
        let plan = vec![
            planned(1, Op::Munmap { addr: 0x10000, len: 0x4000 }),
            planned(2, fault(0x20000)),
            planned(2, fault(0x12000)),
            planned(1, Op::Mprotect { addr: 0x20000, len: 0x1000, prot: 1 }),
            planned(2, fault(0x30000)),
            planned(1, Op::Brk { addr: 0 }),
            planned(2, fault(0x40000)),
        ];
        let t = schedule(&plan);
        assert_eq!(t.len(), 2);
        let waits = |th: usize| t[th].ops.iter().map(|o| o.2.clone()).collect::<Vec<_>>();
        // Thread 2's fault at 0x12000 waits for thread 1's munmap; its last
        // waits for the brk.
        assert_eq!(waits(1), vec![vec![], vec![(0, 1)], vec![], vec![(0, 3)]]);
        // Thread 1's mprotect waits for thread 2's first fault; its brk for
        // thread 2's third op.
        assert_eq!(waits(0), vec![vec![], vec![(1, 1)], vec![(1, 3)]]);
    }

    /// Ops on the hugetlb pool run in the log's order whatever their
    /// ranges: hugetlb_madv_vs_map's main thread unmaps the pool's only
    /// page and maps it again while a mapper thread's `mmap` of it fails
    /// with `ENOMEM`. Unordered, that `mmap` could run once the page is
    /// free, succeed, and leave the main thread's `mmap` the `ENOMEM`
    /// (seen in 3 of 300 replays under `short-own-rcu`, more rarely under
    /// `short`).
    #[test]
    fn ops_on_the_hugetlb_pool_keep_the_logs_order() {
        let huge = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB;
        let mmap = |addr| Op::Mmap { addr, len: 2 << 20, prot: 3, flags: huge, file: None, off: 0 };
        let pool = |tid, op| Planned { pool: true, ..planned(tid, op) };
        let plan = vec![
            pool(1, mmap(0x4000_0000)),
            // The mapper's attempt: its range is its hint's, disjoint.
            Planned { result: Err(libc::ENOMEM), ..pool(2, mmap(0)) },
            pool(1, Op::Munmap { addr: 0x4000_0000, len: 2 << 20 }),
            pool(1, mmap(0x4020_0000)),
            // Not on the pool: orders only by its range.
            planned(2, Op::Fault { addr: 0x1000, access: Access::Write }),
        ];
        let t = schedule(&plan);
        let waits = |th: usize| t[th].ops.iter().map(|o| o.2.clone()).collect::<Vec<_>>();
        // The failing mmap waits for the first mapping; the munmap for the
        // failing mmap.
        assert_eq!(waits(1), vec![vec![(0, 1)], vec![]]);
        assert_eq!(waits(0), vec![vec![], vec![(1, 1)], vec![]]);
    }
}
