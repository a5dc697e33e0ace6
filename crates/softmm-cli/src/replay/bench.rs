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
//! it); program order does the rest. Ops on disjoint memory run
//! concurrently. Every op's result must be the sequential replay's, and so
//! the log's for its calls: the bench checks each and fails loudly
//! otherwise.
//!
//! Programs run one after another (per process); the rows give per policy
//! the wall time, the threads' times, calls and faults per second and the
//! lab's counters.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use softmm::{AddressSpace, Cpu, FaultPolicy, FaultStats, PhysMem};

use super::ops::{Op, Planned};
use super::process::Process;
use crate::counters::FaultCounters;
use crate::workloads::{soft_counters, Backend};

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
    let mut out: Vec<Backend> = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let add = match name {
            "all" => Backend::all_soft(),
            "default" => vec![Backend::Soft(FaultPolicy::default())],
            _ => vec![Backend::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = Backend::all_soft().into_iter().map(Backend::name).collect();
                format!("unknown policy `{name}`: the policies are {}; or all, default", names.join(", "))
            })?],
        };
        for b in add {
            if !out.contains(&b) {
                out.push(b);
            }
        }
    }
    if out.is_empty() {
        return Err("no policy to run".into());
    }
    Ok(out)
}

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
        let (s, e) = p.op.range().unwrap_or((0, u64::MAX));
        let me = (t, threads[t].ops.len() + 1);
        let mut waits: BTreeMap<usize, usize> = BTreeMap::new();
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
        threads[t].ops.push((p.op.clone(), p.result, waits.into_iter().collect()));
    }
    threads
}

/// One run of one program under one policy.
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

/// Runs `threads` once on a new address space made with `config`.
fn run_once(
    phys: &Arc<PhysMem>,
    config: softmm::MmConfig,
    threads: &[ThreadOps],
    calls: usize,
) -> Result<Sample, String> {
    let policy = config.policy;
    let mm = AddressSpace::new(phys, config).map_err(|e| format!("bench address space: {e}"))?;
    let progress: Vec<AtomicUsize> = threads.iter().map(|_| AtomicUsize::new(0)).collect();
    let start = Barrier::new(threads.len() + 1);
    let faults = threads.iter().map(|t| t.ops.iter().filter(|o| matches!(o.0, Op::Fault { .. })).count()).sum();
    let (seconds, outs) = std::thread::scope(|s| {
        let handles: Vec<_> = threads
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (mm, progress, start) = (&mm, &progress, &start);
                s.spawn(move || {
                    let mut cpu = Cpu::attached(mm);
                    let mut differed = Vec::new();
                    let mut count = 0usize;
                    start.wait();
                    let t0 = Instant::now();
                    for (n, (op, expected, waits)) in t.ops.iter().enumerate() {
                        for &(other, done) in waits {
                            // The other thread runs ops without locks of
                            // ours: it reaches `done` in bounded time.
                            while progress[other].load(Ordering::Acquire) < done {
                                std::thread::yield_now();
                            }
                        }
                        let got = op.run(mm, Some(&mut cpu));
                        if got != *expected {
                            count += 1;
                            if differed.len() < 5 {
                                differed.push(format!(
                                    "thread {} op {} ({}): {:?}, the replay had {:?}",
                                    t.tid,
                                    n + 1,
                                    op.name(),
                                    got,
                                    expected
                                ));
                            }
                        }
                        progress[i].store(n + 1, Ordering::Release);
                    }
                    let end = Instant::now();
                    (t0, end, cpu.stats().fault, differed, count)
                })
            })
            .collect();
        start.wait();
        let outs: Vec<_> = handles.into_iter().map(|h| h.join().expect("bench thread")).collect();
        // From the first thread's start to the last one's end (this thread
        // may run after they all finished).
        let first = outs.iter().map(|o| o.0).min().expect("a thread");
        let last = outs.iter().map(|o| o.1).max().expect("a thread");
        (last.duration_since(first).as_secs_f64(), outs)
    });
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
    let st = mm.stats();
    let lock = st.mmap_lock_write + st.mmap_lock_read;
    let counters = FaultCounters {
        barriers: Some(st.tlb.barriers),
        shootdowns: Some(st.tlb.flushes),
        mmap_lock_writes: Some(st.mmap_lock_write),
        flush_shared_writes: cfg!(feature = "shared-write-stats").then_some(st.tlb.shared_writes),
        ..soft_counters(policy, &fault, lock, st.tlb.flush_requests)
    };
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
    let forked: usize = procs.iter().filter(|p| p.forked).map(|p| p.plan.as_ref().map_or(0, Vec::len)).sum();
    if forked > 0 {
        let _ = writeln!(out, "bench: {forked} ops of forked children not run (a program is run from its start)");
    }
    let mut ok = true;
    let mut json = Vec::new();
    let mut panels = Vec::new();
    for p in procs.iter().filter(|p| !p.forked) {
        let Some(plan) = p.plan.as_ref().filter(|v| !v.is_empty()) else { continue };
        let threads = schedule(plan);
        let calls = plan.iter().filter(|o| o.call).count();
        let waits: usize = threads.iter().flat_map(|t| t.ops.iter()).filter(|o| !o.2.is_empty()).count();
        let prog = p.program.as_deref().map(|s| format!(" `{s}`")).unwrap_or_default();
        let _ = writeln!(
            out,
            "\nprogram pid {}{prog}: {} threads, {calls} calls, {} faults, {} ops in all, {waits} wait for another thread",
            super::fmt_pid(p.pid),
            threads.len(),
            plan.iter().filter(|o| matches!(o.op, Op::Fault { .. })).count(),
            plan.len()
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
            for (i, &policy) in b.policies.iter().enumerate() {
                let config = policy.configure(p.config.clone());
                match run_once(phys, config, &threads, calls) {
                    Ok(s) => by_policy[i].push(s),
                    Err(e) => {
                        let _ = writeln!(out, "{:<18} {e}", policy.name());
                        ok = false;
                    }
                }
            }
        }
        let mut panel = crate::plot::BarPanel {
            title: format!("pid {}{prog}, {} threads", super::fmt_pid(p.pid), threads.len()),
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
                    "pid": p.pid,
                    "program": p.program,
                    "policy": policy.name(),
                    "threads": threads.len(),
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
        Planned { tid, op, result: Ok(0), call: true }
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
        let s = run_once(&phys, softmm::MmConfig::default(), &threads, 1).unwrap();
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
}
