//! `big-munmap`: seed 002's experiment. A region of `size` bytes (default
//! 8 GiB) is mapped and populated (4 KiB pages: the host region gets
//! `MADV_NOHUGEPAGE` so both sides zap the same number of entries), then
//! unmapped by one thread while `threads` other threads of the same address
//! space loop one kind of operation (the mode):
//!
//! * `fault`: write faults on fresh pages of their own 8 MiB region, which
//!   is dropped again with `MADV_DONTNEED` after each pass (the drop counts
//!   as an operation too);
//! * `mmap`: an anonymous 64 KiB `mmap`, one write, `munmap`;
//! * `maps`: a read of the maps text (`/proc/self/maps` on the host);
//! * `fault-other-mm`: `fault`'s loop in a second address space on the
//!   same `PhysMem`, which no `mmap_lock` of the unmapped one blocks: the
//!   control for the munmap's duration, the same concurrent work under
//!   every policy (under `locked` the `fault` thread sleeps on the lock for
//!   the whole munmap, so that munmap runs alone). The host has no second
//!   address space in a process: its faulter stays in the process, on its
//!   own region (Linux 6.18 faults under the VMA lock, which the munmap of
//!   another VMA does not block either);
//! * `alone`: the other thread sleeps 200 us per operation: the munmap with
//!   the second CPU idle.
//!
//! Each other thread times every operation; those that overlap the munmap
//! give the latency percentiles, those that end during it the throughput,
//! and the same threads' rate before the munmap (for `--duration`) the
//! throughput alone. The percentiles are corrected for coordinated
//! omission as HdrHistogram's `recordValueWithExpectedInterval` does, with
//! the thread's mean operation time alone as the interval `E`: an operation
//! that took `L > E` also counts the operations that would have been issued
//! meanwhile, waiting `L - E`, `L - 2E`, ... Without it, a thread blocked
//! once for the whole munmap and then running fast for the rest of the
//! window would show a tiny p99. softmm's address spaces run the unmap policy named by
//! the sample's `policy` with faults under `mmap_lock` (`mmap-lock`, the
//! fault path of 2018 that seed 002 measured: with softmm's default
//! lock-free faults, no unmap policy ever stalls a fault elsewhere).

use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use softmm::{AddressSpace, UnmapPolicy};

use super::space::{HostSpace, SoftSpace, Space};
use super::{Measured, Params, SoftEnv};
use crate::counters::FaultCounters;
use crate::report::Sample;

/// The modes: what the other threads do during the munmap.
pub use crate::workload::BIG_MUNMAP_MODES as MODES;

/// Each faulting thread's region.
const FAULT_REGION: u64 = 8 << 20;
/// Each mapping of `mmap` mode.
const SMALL: u64 = 64 << 10;

const PAGE: u64 = 4096;
const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;
const ANON: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;

/// Phases the other threads watch.
const ALONE: u8 = 0;
const DURING: u8 = 1;
const DONE: u8 = 2;

/// Extra arena the other threads need beyond the region.
pub fn arena_extra(threads: usize) -> u64 {
    threads as u64 * FAULT_REGION + (64 << 20)
}

/// What one other thread saw.
#[derive(Default)]
struct Seen {
    /// Operations and seconds before the munmap began.
    alone_ops: u64,
    alone_secs: f64,
    /// (start, end) in ns since the run's epoch of each operation that ended
    /// after the munmap began.
    ops: Vec<(u64, u64)>,
}

/// A thread's scheduler statistics (`/proc/self/task/TID/schedstat`): ns on
/// a CPU and ns runnable but waiting for one (run-queue delay).
#[derive(Debug, Default, Clone, Copy)]
struct Sched {
    cpu_ns: u64,
    runq_ns: u64,
}

impl Sched {
    /// Thread `tid`'s statistics now (zeros where the kernel has no schedstat).
    fn of(tid: i32) -> Sched {
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
        let mut f = text.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        Sched { cpu_ns: f.next().unwrap_or(0), runq_ns: f.next().unwrap_or(0) }
    }

    /// What `tids` added up to between `before` and now.
    fn since(tids: &[i32], before: &[Sched]) -> Sched {
        tids.iter().zip(before).fold(Sched::default(), |acc, (&t, b)| {
            let now = Sched::of(t);
            Sched {
                cpu_ns: acc.cpu_ns + now.cpu_ns.saturating_sub(b.cpu_ns),
                runq_ns: acc.runq_ns + now.runq_ns.saturating_sub(b.runq_ns),
            }
        })
    }
}

/// The calling thread's id.
fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// One operation of the other thread, given its state.
trait Op {
    fn run(&mut self) -> Result<(), i32>;
}

/// The loop of one other thread.
fn other(op: &mut dyn Op, phase: &AtomicU8, epoch: Instant) -> Result<Seen, i32> {
    let mut seen = Seen { ops: Vec::with_capacity(1 << 20), ..Seen::default() };
    let start = Instant::now();
    loop {
        let t0 = epoch.elapsed().as_nanos() as u64;
        op.run()?;
        let t1 = epoch.elapsed().as_nanos() as u64;
        match phase.load(Ordering::Acquire) {
            ALONE => seen.alone_ops += 1,
            DURING => seen.ops.push((t0, t1)),
            _ => {
                seen.ops.push((t0, t1));
                break;
            }
        }
        if seen.alone_secs == 0.0 && phase.load(Ordering::Relaxed) != ALONE {
            seen.alone_secs = start.elapsed().as_secs_f64();
        }
    }
    Ok(seen)
}

/// What [`measure`] returns: the munmap's duration, what the other threads
/// saw, the munmap's start and end (ns since the run's epoch), and the
/// scheduler statistics of the munmapping thread and of the others during it.
struct Run {
    munmap_ns: u64,
    seen: Vec<Seen>,
    t0: u64,
    t1: u64,
    munmapper: Sched,
    others: Sched,
    /// softmm's [`softmm::UnmapStats`] of the munmapping thread before and
    /// after the munmap: the big munmap's own (the host's are zeros).
    unmap: Option<(softmm::UnmapStats, softmm::UnmapStats)>,
}

/// The run on one space: populate, start the others, wait, unmap, collect.
fn measure<S: Space + Sync>(
    s: &S,
    other_mm: &S,
    p: &Params,
    nohuge: bool,
    maps: &(dyn Fn() -> usize + Sync),
) -> Result<Run, String> {
    fn e(what: &'static str) -> impl Fn(i32) -> String {
        move |errno| format!("{what}: errno {errno}")
    }
    let big = s.mmap(0, p.size, RW, ANON, None, 0).map_err(e("mmap of the region"))?;
    if nohuge {
        s.madvise(big, p.size, libc::MADV_NOHUGEPAGE).map_err(e("MADV_NOHUGEPAGE"))?;
    }
    s.madvise(big, p.size, libc::MADV_POPULATE_WRITE).map_err(e("MADV_POPULATE_WRITE"))?;
    let phase = AtomicU8::new(ALONE);
    let epoch = Instant::now();
    let alone = match p.limit {
        crate::args::Limit::Duration(d) => d,
        crate::args::Limit::Iterations(_) => std::time::Duration::from_millis(200),
    };
    let tids: Vec<AtomicI32> = (0..p.threads).map(|_| AtomicI32::new(0)).collect();
    std::thread::scope(|sc| {
        let hs: Vec<_> = tids
            .iter()
            .map(|tid| {
                let phase = &phase;
                sc.spawn(move || {
                    tid.store(gettid(), Ordering::Relaxed);
                    let mut op = op_for(s, other_mm, p.mode, maps)?;
                    other(op.as_mut(), phase, epoch)
                })
            })
            .collect();
        std::thread::sleep(alone);
        // Each thread stored its id before its first operation, long before.
        let tids: Vec<i32> = tids.iter().map(|t| t.load(Ordering::Relaxed)).collect();
        let me = [gettid()];
        let others_before: Vec<Sched> = tids.iter().map(|&t| Sched::of(t)).collect();
        let me_before = [Sched::of(me[0])];
        let unmap_before = softmm::UnmapStats::this_thread();
        let t0 = epoch.elapsed().as_nanos() as u64;
        phase.store(DURING, Ordering::Release);
        let r = s.munmap(big, p.size);
        let t1 = epoch.elapsed().as_nanos() as u64;
        let unmap = Some((unmap_before, softmm::UnmapStats::this_thread()));
        let munmapper = Sched::since(&me, &me_before);
        let others = Sched::since(&tids, &others_before);
        phase.store(DONE, Ordering::Release);
        let seen: Result<Vec<Seen>, String> = hs
            .into_iter()
            .map(|h| h.join().map_err(|_| "an other thread panicked".to_string())?.map_err(e("other thread")))
            .collect();
        r.map_err(e("munmap of the region"))?;
        Ok(Run { munmap_ns: t1 - t0, seen: seen?, t0, t1, munmapper, others, unmap })
    })
}

/// Latency samples `(L, E)`: an operation of `L` ns on a thread whose mean
/// operation alone took `E` ns.
struct Latencies(Vec<(u64, u64)>);

impl Latencies {
    /// Samples at or above `v` once each `(L, E)` stands for `L`, `L - E`,
    /// `L - 2E`, ... down to `E` (or just `L` when `L <= E`).
    fn at_least(&self, v: u64) -> u64 {
        self.0
            .iter()
            .map(|&(l, e)| {
                if l < v {
                    0
                } else if l <= e {
                    1
                } else {
                    // L - kE >= max(v, E), k = 0, 1, ...
                    (l - v.max(e)) / e + 1
                }
            })
            .sum()
    }

    /// The `q` quantile of the corrected samples.
    fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.at_least(0);
        if total == 0 {
            return None;
        }
        // The smallest v with at most (1 - q) of the samples above it.
        let above = ((1.0 - q) * total as f64).floor() as u64;
        let (mut lo, mut hi) = (0u64, self.0.iter().map(|&(l, _)| l).max().unwrap_or(0));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.at_least(mid + 1) <= above {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }
}

/// The sample from what the threads saw.
fn summarize(run: &Run, mut counters: FaultCounters) -> Measured {
    let Run { munmap_ns, ref seen, t0, t1, munmapper, others, .. } = *run;
    counters.munmap_cpu_ns = Some(munmapper.cpu_ns);
    counters.munmap_runq_ns = Some(munmapper.runq_ns);
    counters.other_cpu_ns = Some(others.cpu_ns);
    counters.other_runq_ns = Some(others.runq_ns);
    let lat = Latencies(
        seen.iter()
            .flat_map(|s| {
                let e = if s.alone_ops > 0 { (s.alone_secs * 1e9 / s.alone_ops as f64).max(1.0) as u64 } else { 1 };
                s.ops.iter().filter(move |&&(a, b)| a < t1 && b > t0).map(move |&(a, b)| (b - a, e))
            })
            .collect(),
    );
    let ended: u64 = seen.iter().flat_map(|s| &s.ops).filter(|&&(_, b)| b > t0 && b <= t1).count() as u64;
    let pct = |q: f64| lat.quantile(q);
    let secs = munmap_ns as f64 / 1e9;
    let rate = if secs > 0.0 { ended as f64 / secs } else { 0.0 };
    let alone: f64 =
        seen.iter().map(|s| if s.alone_secs > 0.0 { s.alone_ops as f64 / s.alone_secs } else { 0.0 }).sum();
    counters.munmap_ns = Some(munmap_ns);
    counters.p50_ns = pct(0.5);
    counters.p99_ns = pct(0.99);
    counters.max_ns = lat.0.iter().map(|&(l, _)| l).max();
    counters.ops_per_sec = Some(rate as u64);
    counters.alone_ops_per_sec = Some(alone as u64);
    Measured { ops: ended, seconds: secs, cpu_seconds: 0.0, counters }
}

/// `fault` mode: write faults over a region, dropped after each pass.
struct Faults<'a, S: Space> {
    s: &'a S,
    cpu: S::Cpu,
    base: u64,
    next: u64,
}

impl<S: Space> Drop for Faults<'_, S> {
    fn drop(&mut self) {
        let _ = self.s.munmap(self.base, FAULT_REGION);
    }
}

impl<S: Space> Op for Faults<'_, S> {
    fn run(&mut self) -> Result<(), i32> {
        if self.next == FAULT_REGION {
            self.next = 0;
            return self.s.madvise(self.base, FAULT_REGION, libc::MADV_DONTNEED);
        }
        S::write(&mut self.cpu, self.base + self.next, 1)?;
        self.next += PAGE;
        Ok(())
    }
}

/// `mmap` mode: map, touch, unmap.
struct Maps<'a, S: Space> {
    s: &'a S,
    cpu: S::Cpu,
}

impl<S: Space> Op for Maps<'_, S> {
    fn run(&mut self) -> Result<(), i32> {
        let a = self.s.mmap(0, SMALL, RW, ANON, None, 0)?;
        S::write(&mut self.cpu, a, 1)?;
        self.s.munmap(a, SMALL)
    }
}

/// `maps` mode: read the maps text.
struct ReadMaps<'a>(&'a (dyn Fn() -> usize + Sync));

impl Op for ReadMaps<'_> {
    fn run(&mut self) -> Result<(), i32> {
        std::hint::black_box((self.0)());
        Ok(())
    }
}

/// `alone` mode: the other thread's CPU stays idle.
struct Idle;

impl Op for Idle {
    fn run(&mut self) -> Result<(), i32> {
        std::thread::sleep(std::time::Duration::from_micros(200));
        Ok(())
    }
}

fn op_for<'a, S: Space>(
    s: &'a S,
    other_mm: &'a S,
    mode: &str,
    maps: &'a (dyn Fn() -> usize + Sync),
) -> Result<Box<dyn Op + 'a>, i32> {
    Ok(match mode {
        "fault" | "fault-other-mm" => {
            let s = if mode == "fault" { s } else { other_mm };
            let base = s.mmap(0, FAULT_REGION, RW, ANON, None, 0)?;
            Box::new(Faults { s, cpu: s.cpu(), base, next: 0 })
        }
        "alone" => Box::new(Idle),
        "mmap" => Box::new(Maps { s, cpu: s.cpu() }),
        _ => Box::new(ReadMaps(maps)),
    })
}

/// Runs one sample: softmm with `env`'s configuration (its unmap policy,
/// faults under `mmap-lock`: [`super::Backend::configure`]) when `env` is
/// given, else the host.
pub fn run(env: Option<&SoftEnv>, p: &Params) -> Result<Measured, String> {
    match env {
        Some(env) => {
            let config = env.config.clone().time_unmaps(true);
            let new = || AddressSpace::new(&env.phys, config.clone()).map_err(|e| e.to_string());
            let s = SoftSpace { mm: new()? };
            let other_mm = SoftSpace { mm: new()? };
            let mm: Arc<AddressSpace> = s.mm.clone();
            let maps = move || mm.maps_text().len();
            let run = measure(&s, &other_mm, p, false, &maps)?;
            let st = s.mm.stats();
            // The munmapping thread's sums around the big munmap: that call
            // alone, not the other threads' small unmaps in `mmap` mode.
            let (before, u) = run.unmap.unwrap_or_default();
            let d = |f: fn(&softmm::UnmapStats) -> u64| Some(f(&u) - f(&before));
            let counters = FaultCounters {
                mmap_lock_acquisitions: Some(st.mmap_lock_write + st.mmap_lock_read),
                flush_requests: Some(st.tlb.flush_requests),
                flush_wait_ns: Some(st.tlb.flush_wait_ns),
                munmap_write_hold_ns: d(|u| u.write_hold_ns),
                munmap_read_hold_ns: d(|u| u.read_hold_ns),
                munmap_lock_wait_ns: d(|u| u.lock_wait_ns),
                munmap_zap_ns: d(|u| u.zap_ns),
                munmap_flushes: d(|u| u.flushes),
                munmap_flush_ns: d(|u| u.flush_ns),
                munmap_flush_wait_ns: d(|u| u.flush_wait_ns),
                munmap_free_ns: d(|u| u.free_ns),
                munmap_pgtable_ns: d(|u| u.pgtable_ns),
                munmap_table_free_ns: d(|u| u.table_free_ns),
                munmap_tables_deferred: d(|u| u.tables_deferred),
                munmap_barriers: d(|u| u.barriers),
                munmap_batches: d(|u| u.batches),
                // The munmapping thread's, during the munmap.
                shared_writes: cfg!(feature = "shared-write-stats").then_some(d(|u| u.shared_writes)).flatten(),
                ..FaultCounters::default()
            };
            Ok(summarize(&run, counters))
        }
        None => {
            let s = HostSpace;
            let maps = || std::fs::read_to_string("/proc/self/maps").map_or(0, |t| t.len());
            let run = measure(&s, &s, p, true, &maps)?;
            Ok(summarize(&run, FaultCounters::default()))
        }
    }
}

/// The big-munmap table: a heading per mode, a row per policy, with the
/// munmap's duration and its `mmap_lock` write hold, the other threads'
/// latency and throughput during it, then what explains them: the
/// munmapping thread's CPU time and run-queue delay during the munmap, the
/// other threads' run-queue delay, the munmap's wait for TLB flush
/// acknowledgements and its flushes that forced a barrier on the running
/// threads (medians over repeats of each figure), or `None` without
/// big-munmap samples.
pub fn table(samples: &[Sample<FaultCounters>]) -> Option<String> {
    let ours: Vec<&Sample<FaultCounters>> = samples.iter().filter(|s| s.workload == "big-munmap").collect();
    if ours.is_empty() {
        return None;
    }
    let mut t = crate::table::Table::new();
    t.column("policy", true, 0, None)
        .column("thr", false, 0, Some("other threads"))
        .column("munmap ms", false, 0, Some("the large munmap's duration"))
        .column("wlock ms", false, 0, Some("how long it held mmap_lock for write"))
        .column("p50 us", false, 3, Some("median latency of the other threads' operations overlapping it"))
        .column("p99 us", false, 0, Some("their 99th percentile (corrected for coordinated omission)"))
        .column("max us", false, 4, Some("their maximum"))
        .column("ops/s during", false, 0, Some("their operations per second during the munmap"))
        .column("ops/s alone", false, 2, Some("and before it"))
        .column("cpu ms", false, 5, Some("the munmapping thread's CPU time during it"))
        .column("runq ms", false, 6, Some("its run-queue delay (runnable, not running)"))
        .column("other runq ms", false, 7, Some("the other threads' run-queue delay"))
        .column("fwait ms", false, 8, Some("the munmap's wait for TLB flush acknowledgements"))
        .column("barriers", false, 1, Some("its flushes that forced a barrier on the running threads"));
    t.legend("Medians over the repeats of each figure; `-`: the host has no such counter.");
    let mut keys: Vec<(&str, &str, usize)> = Vec::new();
    for s in &ours {
        let k = (s.mode.as_str(), s.policy.as_str(), s.threads);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    // By mode, then the unmap policies in the library's order, the host last.
    let rank = |mode: &str, policy: &str| {
        let m = MODES.iter().position(|x| *x == mode).unwrap_or(usize::MAX);
        let p = UnmapPolicy::ALL.iter().position(|x| x.name() == policy).unwrap_or(usize::MAX);
        (m, p)
    };
    keys.sort_by_key(|&(mode, policy, threads)| (rank(mode, policy), threads));
    let mut last = "";
    let mut policies: Vec<&str> = Vec::new();
    for (mode, policy, threads) in keys {
        if mode != last {
            t.heading(&format!("big-munmap {mode}: the munmap, and the other threads' operations overlapping it"));
            last = mode;
        }
        if !policies.contains(&policy) {
            policies.push(policy);
        }
        let of = |f: fn(&FaultCounters) -> Option<u64>| {
            let mut v: Vec<u64> = ours
                .iter()
                .filter(|s| s.mode == mode && s.policy == policy && s.threads == threads)
                .filter_map(|s| f(&s.counters))
                .collect();
            v.sort_unstable();
            v.get(v.len() / 2).copied()
        };
        let us = |v: Option<u64>| v.map_or("-".to_string(), |ns| format!("{:.1}", ns as f64 / 1e3));
        let n = |v: Option<u64>| v.map_or("-".to_string(), |x| crate::stats::si(x as f64));
        let ms = |v: Option<u64>| v.map_or("-".to_string(), |ns| format!("{:.1}", ns as f64 / 1e6));
        let ms3 = |v: Option<u64>| v.map_or("-".to_string(), |ns| crate::stats::fig(ns as f64 / 1e6));
        t.row(vec![
            policy.to_string(),
            threads.to_string(),
            ms(of(|c| c.munmap_ns)),
            ms3(of(|c| c.munmap_write_hold_ns)),
            us(of(|c| c.p50_ns)),
            us(of(|c| c.p99_ns)),
            us(of(|c| c.max_ns)),
            n(of(|c| c.ops_per_sec)),
            n(of(|c| c.alone_ops_per_sec)),
            ms(of(|c| c.munmap_cpu_ns)),
            ms(of(|c| c.munmap_runq_ns)),
            ms(of(|c| c.other_runq_ns)),
            ms(of(|c| c.munmap_flush_wait_ns)),
            of(|c| c.munmap_barriers).map_or("-".to_string(), |b| b.to_string()),
        ]);
    }
    let mut out = t.render();
    out.push_str("Policies (faults under mmap-lock):\n");
    out.push_str(&crate::seeds::legend("unmap", &policies));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_the_operations_it_held_up() {
        // 99 fast operations and one stalled for 100 intervals: the stall
        // stands for 100 samples, 100, 99, ..., 1 intervals long.
        let mut v = vec![(10, 10); 99];
        v.push((1000, 10));
        let l = Latencies(v);
        assert_eq!(l.at_least(0), 199);
        assert_eq!(l.quantile(0.5), Some(10), "100 of 199 samples are one interval");
        assert!(l.quantile(0.99).unwrap() >= 970, "{:?}", l.quantile(0.99));
        assert_eq!(l.quantile(1.0), Some(1000));
        assert_eq!(Latencies(vec![]).quantile(0.5), None);
        assert_eq!(Latencies(vec![(5, 10), (7, 10)]).quantile(0.5), Some(5));
    }
}
