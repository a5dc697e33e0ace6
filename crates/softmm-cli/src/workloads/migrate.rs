//! `migrate`: seed 003's experiment ("migrate_pages(): batch TLB flushing",
//! Huang Ying, Linux 6.3: pmbench running while `migratepages` moves its
//! pages between node 0 and node 1 and back). A working set (default 64 MiB,
//! `--size`) of private anonymous memory in a two-node arena is accessed by
//! `--threads` accessor threads, each a pmbench-like loop of random 8-byte
//! reads and writes (half each) over the whole set through its own `Cpu`,
//! while one migrator thread calls `migrate_pages(2)` (old nodes {0}, new
//! nodes {1}, then back) for `--duration` seconds, under each
//! `MigratePolicy` (`one-by-one`: unmap, flush, copy, remap per page, as
//! before the seed; `batched`: the seed, up to 512 pages per flush).
//!
//! Per policy two samples: mode `migrate` (one operation is one page
//! migrated: `ops_per_sec` is pages migrated per second; counters
//! `pages_migrated` and `flush_requests`, the shootdown requests the
//! migrations sent to the accessors' CPUs, the IPIs the seed counts, and
//! `migrator_cpu_ns`, the migrator thread's CPU time: its cost per page
//! with the time it waited for a CPU left out, and `ptl_locks`, the PTE
//! locks its isolation, unmap and remap walks took), and
//! mode `accessors` (one operation is one access: accesses per second over
//! the same window; counters `faults` and the latencies of every 64th
//! access, `p50_ns`, `p99_ns` and `max_ns`, which show the waits on
//! migration entries).
//!
//! The host cannot run it on a machine with one NUMA node (the only node
//! `migrate_pages(2)` could move to is the one the pages are on): the bench
//! says so and shows no host row.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use softmm::{AddressSpace, Cpu, MigratePolicy, PhysConfig, PhysMem, PAGE_SIZE};

use super::Measured;
use crate::args::BenchArgs;
use crate::experiment::{Experiment, Headline};
use crate::machine::{cores, Machine};
use crate::report::{self, Sample};
use crate::stats::fig;
use crate::summary::{beside_one, figure, SeedRow};

crate::counters::counters! {
    /// `migrate`'s counters.
    pub struct MigrateCounters {
        /// Page faults (softmm: handled by its CPUs; host: minor faults of the tasks).
        sum faults,
        /// TLB flush requests sent to other CPUs.
        sum flush_requests,
        /// Nanoseconds the flushes spent waiting for CPUs inside an access
        /// (softmm's `TlbStats::flush_wait_ns`).
        sum flush_wait_ns,
        /// Pages migrated (`migrate`).
        sum pages_migrated,
        /// big-munmap: median latency of the other threads' operations that
        /// overlapped the munmap, in ns.
        max p50_ns,
        /// big-munmap: their 99th percentile, in ns.
        max p99_ns,
        /// big-munmap: their maximum, in ns.
        max max_ns,
        /// migrate: CPU time of the migrator thread over the sample, in ns
        /// (its cost per page, which preemption by other tasks does not inflate).
        sum migrator_cpu_ns,
        /// migrate: PTE locks the migrations' unmap and remap walks took.
        sum ptl_locks,
    }
}

/// The default working set: pmbench's default is 256 MiB; 64 MiB keeps a
/// one-by-one pass well under a second.
pub const DEFAULT_SIZE: u64 = 64 << 20;

/// One access in this many is timed (an `Instant` pair costs about as much
/// as the access itself).
const TIMED_EVERY: u64 = 64;

/// Bytes of the two-node softmm arena for a `size`-byte working set: the set
/// fits on either node with its page tables, and the frames threads cache.
pub fn arena_bytes(size: u64) -> u64 {
    2 * (size + size / 256 + (8 << 20) + cores() as u64 * (2 << 20))
}

/// The host's online NUMA nodes, from sysfs (`0`, `0-1`, `0,2`): their count.
pub fn host_nodes() -> usize {
    let Ok(s) = std::fs::read_to_string("/sys/devices/system/node/online") else { return 1 };
    s.trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<usize>().ok()?.saturating_sub(a.parse().ok()?) + 1),
            None => r.parse::<usize>().ok().map(|_| 1),
        })
        .sum::<usize>()
        .max(1)
}

/// One run's two measurements.
pub struct Run {
    /// The migrator: pages migrated, with `pages_migrated` and `flush_requests`.
    pub migrate: Measured<MigrateCounters>,
    /// The accessors: accesses, with their sampled latencies.
    pub accessors: Measured<MigrateCounters>,
}

/// A small xorshift generator: the accessors' random addresses.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// What one accessor did.
struct Accessed {
    accesses: u64,
    seconds: f64,
    faults: u64,
    latencies_ns: Vec<u64>,
}

/// One accessor: random reads and writes of 8 bytes over `npages` pages at
/// `a` until `stop`; every [`TIMED_EVERY`]th access timed.
fn accessor(mm: &Arc<AddressSpace>, a: u64, npages: u64, seed: u64, start: &Barrier, stop: &AtomicBool) -> Accessed {
    let mut cpu = Cpu::attached(mm);
    let mut rng = Rng(seed | 1);
    let mut latencies_ns = Vec::new();
    let mut accesses = 0u64;
    cpu.park();
    start.wait();
    cpu.resume();
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..TIMED_EVERY {
            let r = rng.next();
            let addr = a + (r % npages) * PAGE_SIZE + ((r >> 40) % (PAGE_SIZE / 8)) * 8;
            let timed = accesses % TIMED_EVERY == 0;
            let t = timed.then(Instant::now);
            if r & (1 << 63) != 0 {
                cpu.write_u64(addr, r).expect("the working set stays mapped");
            } else {
                std::hint::black_box(cpu.read_u64(addr).expect("the working set stays mapped"));
            }
            if let Some(t) = t {
                latencies_ns.push(t.elapsed().as_nanos() as u64);
            }
            accesses += 1;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    Accessed { accesses, seconds, faults: cpu.stats().fault.faults, latencies_ns }
}

/// The `q`-quantile of sorted `v`.
fn quantile(v: &[u64], q: f64) -> Option<u64> {
    (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize])
}

/// One softmm run: the working set mapped and written (untimed), the
/// accessors started, then the migrator moves it 0→1→0… for `duration`
/// (at least one pass), and the accessors stop.
pub fn soft(
    phys: &Arc<PhysMem>,
    policy: MigratePolicy,
    threads: usize,
    size: u64,
    duration: Duration,
) -> Result<Run, String> {
    let config = super::mm_config().migrate_policy(policy).cap_sys_nice(true);
    let mm = AddressSpace::new(phys, config).map_err(|e| format!("address space: {e}"))?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let a = mm
        .mmap(0, size, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None, 0)
        .map_err(|e| format!("mmap of {} MiB: {e}", size >> 20))?;
    let npages = size / PAGE_SIZE;
    {
        let mut cpu = Cpu::attached(&mm);
        for p in 0..npages {
            cpu.write_u64(a + p * PAGE_SIZE, p).map_err(|e| format!("populate: {e:?}"))?;
        }
    }
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let moved = AtomicU64::new(0);
    let (accessed, migrator) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (mm, start, stop) = (&mm, &start, &stop);
                s.spawn(move || accessor(mm, a, npages, 0x9e37_79b9_7f4a_7c15 * (i as u64 + 1), start, stop))
            })
            .collect();
        start.wait();
        let before = mm.stats();
        let (c0, t0) = (super::space::process_cpu_ns() as f64 * 1e-9, Instant::now());
        let own0 = super::space::thread_cpu_ns();
        let mut to = 1u64;
        let mut failed = Ok(());
        loop {
            let (old, new) = ([1u64 << (1 - to)], [1u64 << to]);
            match mm.migrate_pages(3, Some(&old), Some(&new)) {
                Ok(left) => {
                    moved.fetch_add(npages.saturating_sub(left), Ordering::Relaxed);
                }
                Err(e) => {
                    failed = Err(format!("migrate_pages: {e}"));
                    break;
                }
            }
            to = 1 - to;
            if t0.elapsed() >= duration {
                break;
            }
        }
        let (seconds, cpu) = (t0.elapsed().as_secs_f64(), super::space::process_cpu_ns() as f64 * 1e-9 - c0);
        let own = super::space::thread_cpu_ns() - own0;
        let after = mm.stats();
        stop.store(true, Ordering::Relaxed);
        let accessed: Vec<Accessed> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect();
        (accessed, failed.map(|()| (before, after, seconds, cpu, own)))
    });
    let (before, after, seconds, cpu_seconds, migrator_cpu_ns) = migrator?;
    let pages = after.pages_migrated - before.pages_migrated;
    let migrate = Measured {
        ops: pages,
        seconds,
        cpu_seconds,
        counters: MigrateCounters {
            pages_migrated: Some(pages),
            flush_requests: Some(after.tlb.flush_requests - before.tlb.flush_requests),
            migrator_cpu_ns: Some(migrator_cpu_ns),
            ptl_locks: Some(after.migrate_ptl_locks - before.migrate_ptl_locks),
            flush_wait_ns: Some(after.tlb.flush_wait_ns - before.tlb.flush_wait_ns),
            ..MigrateCounters::default()
        },
    };
    let mut lat: Vec<u64> = accessed.iter().flat_map(|x| x.latencies_ns.iter().copied()).collect();
    lat.sort_unstable();
    let accesses = accessed.iter().map(|x| x.accesses).sum();
    let window = accessed.iter().map(|x| x.seconds).fold(0.0, f64::max);
    let accessors = Measured {
        ops: accesses,
        seconds: window,
        cpu_seconds,
        counters: MigrateCounters {
            faults: Some(accessed.iter().map(|x| x.faults).sum()),
            p50_ns: quantile(&lat, 0.5),
            p99_ns: quantile(&lat, 0.99),
            max_ns: lat.last().copied(),
            ..MigrateCounters::default()
        },
    };
    drop(mm);
    Ok(Run { migrate, accessors })
}

/// A sample record.
fn sample(
    mode: &str,
    policy: &str,
    threads: usize,
    repeat: usize,
    m: &Measured<MigrateCounters>,
) -> Sample<MigrateCounters> {
    Sample {
        workload: "migrate".into(),
        mode: mode.into(),
        policy: policy.into(),
        threads,
        repeat,
        ops: m.ops,
        seconds: m.seconds,
        ops_per_sec: if m.seconds > 0.0 { m.ops as f64 / m.seconds } else { 0.0 },
        counters: m.counters.clone(),
        cpu_seconds: m.cpu_seconds,
        cpu: None,
    }
}

/// The migrate policies `--policy` names: `all`, `default`, names; `host`
/// is accepted and has no row.
fn parse_policies(s: &str) -> Result<Vec<MigratePolicy>, String> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let add: Vec<MigratePolicy> = match name {
            "all" => MigratePolicy::ALL.to_vec(),
            "default" => vec![MigratePolicy::default()],
            "host" => continue,
            _ => vec![MigratePolicy::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = MigratePolicy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown migrate policy `{name}` (known: {}, all, default, host)", names.join(", "))
            })?],
        };
        for p in add {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// `softmm bench migrate`: every policy (in turns, `--repeat` times), the
/// table, the comparison with the seed's figures, `--json`.
pub fn bench(args: &BenchArgs) -> Result<i32, String> {
    if args.workloads.iter().any(|w| w != "migrate") {
        return Err("`migrate` runs alone: give it as the only workload".into());
    }
    let size = args.size.unwrap_or(DEFAULT_SIZE);
    if size % PAGE_SIZE != 0 || size == 0 {
        return Err("--size must be a non-zero multiple of 4K for migrate".into());
    }
    if !args.mode.is_empty() {
        return Err("migrate has no modes: it reports `migrate` and `accessors` for each run".into());
    }
    if args.iterations.is_some() {
        return Err("migrate runs for --duration, not --iterations".into());
    }
    if !(args.duration > 0.0 && args.duration.is_finite()) {
        return Err("--duration must be positive".into());
    }
    args.repeats()?;
    let policies = parse_policies(&args.policy)?;
    let threads = args.thread_counts(|| vec![cores().saturating_sub(1).max(1)])?;
    crate::table::set_wide(args.wide);
    let mut machine = Machine::detect();
    print!("{}", machine.header("bench migrate"));
    println!("{} MiB working set moved node 0 <-> node 1, {} repeats", size >> 20, args.repeat);
    let nodes = host_nodes();
    if nodes < 2 {
        println!("host: one NUMA node on this machine: migrate_pages(2) has no other node to move to, so no host row");
    } else {
        println!("host: {nodes} NUMA nodes, but the host row is not built yet: softmm rows only");
    }
    let mut samples = Vec::new();
    let mut failures = 0;
    if !policies.is_empty() {
        let phys = PhysMem::new(PhysConfig::new(arena_bytes(size)).nodes(2)).map_err(|e| {
            format!("cannot make a {} MiB softmm arena: {e}: use a smaller --size", arena_bytes(size) >> 20)
        })?;
        let duration = Duration::from_secs_f64(args.duration);
        for &t in &threads {
            for r in 0..args.repeat {
                for &p in &policies {
                    let (got, cpu) = crate::machine::measured(t + 1, || soft(&phys, p, t, size, duration));
                    match got {
                        Ok(run) => {
                            let m = Sample { cpu, ..sample("migrate", p.name(), t, r, &run.migrate) };
                            let x = Sample { cpu, ..sample("accessors", p.name(), t, r, &run.accessors) };
                            eprintln!(
                                "migrate {} threads={t}: {} pages/s, accessors {} accesses/s{}",
                                p.name(),
                                crate::stats::si(m.ops_per_sec),
                                crate::stats::si(x.ops_per_sec),
                                report::cpu_note(cpu)
                            );
                            samples.push(m);
                            samples.push(x);
                        }
                        Err(e) => {
                            failures += 1;
                            eprintln!("softmm: migrate {} threads={t}: {e}", p.name());
                        }
                    }
                }
            }
        }
    }
    println!();
    print!("{}", table(&samples));
    let migrations: Vec<Sample<MigrateCounters>> = samples.iter().filter(|s| s.mode == "migrate").cloned().collect();
    print!("{}", report::cpu_warnings(&migrations));
    if let Some(c) = comparison(&samples) {
        print!("{}", crate::table::wrap(&c, "  "));
    }
    machine.finish();
    print!("{}", machine.footer());
    report::save_json(args.json.as_deref(), &super::results(machine, samples))?;
    Ok(if failures > 0 { 1 } else { 0 })
}

/// The median of `mode`/`policy` at `threads` (pages/s or accesses/s).
fn median(samples: &[Sample<MigrateCounters>], mode: &str, policy: &str, threads: usize) -> Option<f64> {
    crate::report::median(samples, "migrate", mode, policy, threads)
}

/// The migrator's CPU time per migrated page in µs over every `migrate`
/// sample of `policy` at `threads`: what a page costs the migrator itself,
/// which the machine's load changes far less than pages per second.
fn cpu_us_per_page(samples: &[Sample<MigrateCounters>], policy: &str, threads: usize) -> Option<f64> {
    let of = || samples.iter().filter(|s| s.mode == "migrate" && s.policy == policy && s.threads == threads);
    let pages: u64 = of().filter_map(|s| s.counters.pages_migrated).sum();
    let ns: u64 = of().filter_map(|s| s.counters.migrator_cpu_ns).sum();
    (pages > 0 && ns > 0).then(|| ns as f64 / 1000.0 / pages as f64)
}

/// Flush requests per migrated page over every `migrate` sample of `policy`
/// at `threads`.
fn flushes_per_page(samples: &[Sample<MigrateCounters>], policy: &str, threads: usize) -> Option<f64> {
    per_page(samples, policy, threads, |c| c.flush_requests)
}

/// A counter per migrated page over every `migrate` sample of `policy` at
/// `threads`.
fn per_page(
    samples: &[Sample<MigrateCounters>],
    policy: &str,
    threads: usize,
    counter: fn(&MigrateCounters) -> Option<u64>,
) -> Option<f64> {
    let of = || samples.iter().filter(|s| s.mode == "migrate" && s.policy == policy && s.threads == threads);
    let pages: u64 = of().filter_map(|s| s.counters.pages_migrated).sum();
    let n: u64 = of().filter_map(|s| counter(&s.counters)).sum();
    (pages > 0 && of().any(|s| counter(&s.counters).is_some())).then(|| n as f64 / pages as f64)
}

/// The table: per policy and accessor count, pages migrated/s (median and
/// min-max), the CPUs free, flush requests and PTE locks per migrated page,
/// the migrator's CPU time per page, the accessors' accesses/s and their
/// sampled latencies.
pub fn table(samples: &[Sample<MigrateCounters>]) -> String {
    let mut t = crate::table::Table::new();
    t.column("policy", true, 0, None)
        .column("acc", false, 0, Some("accessor threads (beside the migrator)"))
        .column("pages/s", false, 0, Some("pages migrated per second by migrate_pages(2) 0->1, 1->0, ..., median"))
        .column("min-max", false, 0, Some("the lowest and highest of the repeats"))
        .column("cpus", false, 0, Some(report::CPUS_GLOSS))
        .column(
            "flush/page",
            false,
            0,
            Some("shootdown requests to the accessors' CPUs per migrated page (Linux's TLB-flush IPIs)"),
        )
        .column("ptl/page", false, 2, Some("PTE locks taken by the isolation, unmap and remap walks per page"))
        .column("cpu us/page", false, 0, Some("the migrator thread's CPU time per migrated page"))
        .column("accesses/s", false, 0, Some("the accessors' reads and writes per second, same window"))
        .column("p50 ns", false, 3, Some("median access latency"))
        .column("p99 ns", false, 0, Some("99th percentile access latency"))
        .column("max ns", false, 1, Some("slowest access"));
    t.legend(&format!(
        "Latencies: every {TIMED_EVERY}th access timed, the maximum over the repeats; the other figures \
         medians of the repeats."
    ));
    let mut policies: Vec<&str> = Vec::new();
    for row in report::rows(samples) {
        let s = row.samples[0];
        if s.mode != "migrate" {
            continue;
        }
        let (p, th) = (s.policy.as_str(), s.threads);
        if !policies.contains(&p) {
            policies.push(p);
        }
        let acc = report::rows(samples)
            .into_iter()
            .find(|r| r.samples[0].mode == "accessors" && r.samples[0].policy == p && r.samples[0].threads == th);
        let lat = |f: fn(&MigrateCounters) -> Option<u64>| {
            acc.as_ref()
                .and_then(|r| r.samples.iter().filter_map(|x| f(&x.counters)).max())
                .map_or("-".into(), |v| v.to_string())
        };
        t.row(vec![
            p.to_string(),
            th.to_string(),
            crate::stats::si(row.median()),
            row.min_max(),
            report::cpus_cell(&row.samples),
            flushes_per_page(samples, p, th).map_or("-".into(), |f| format!("{f:.4}")),
            per_page(samples, p, th, |c| c.ptl_locks).map_or("-".into(), |l| format!("{l:.4}")),
            cpu_us_per_page(samples, p, th).map_or("-".into(), |c| format!("{c:.3}")),
            acc.as_ref().map_or("-".into(), |r| crate::stats::si(r.median())),
            lat(|c| c.p50_ns),
            lat(|c| c.p99_ns),
            lat(|c| c.max_ns),
        ]);
    }
    let mut out = t.render();
    out.push_str("Policies:\n");
    out.push_str(&crate::seeds::legend("migrate", &policies));
    out
}

/// `batched` against `one-by-one` at the most accessors measured, beside
/// the seed's figures (flush IPIs −99.1%, pages migrated/s +291.7%).
pub fn comparison(samples: &[Sample<MigrateCounters>]) -> Option<String> {
    let t = samples.iter().filter(|s| s.workload == "migrate").map(|s| s.threads).max()?;
    let (old, new) = (MigratePolicy::OneByOne.name(), MigratePolicy::Batched.name());
    let rate = median(samples, "migrate", new, t)? / median(samples, "migrate", old, t)?;
    let flushes = flushes_per_page(samples, new, t)? / flushes_per_page(samples, old, t)?;
    let cpu = match (cpu_us_per_page(samples, new, t), cpu_us_per_page(samples, old, t)) {
        (Some(n), Some(o)) => format!(", migrator CPU per page {:+.1}%", (n / o - 1.0) * 100.0),
        _ => String::new(),
    };
    let acc = median(samples, "accessors", new, t)? / median(samples, "accessors", old, t)?;
    Some(format!(
        "batched vs one-by-one, {t} accessor thread{}: flush requests per migrated page {:+.1}% (seed: -99.1%), \
         pages migrated/s {:+.1}% (seed: +291.7%), accessors' accesses/s {:+.1}%{cpu}",
        if t == 1 { "" } else { "s" },
        (flushes - 1.0) * 100.0,
        (rate - 1.0) * 100.0,
        (acc - 1.0) * 100.0
    ))
}

/// Seed 003's short run for the headline summary: a 16 MiB working set,
/// `accessors` accessor threads, each policy migrating for `duration`,
/// `one-by-one` and `batched` in turns, `repeats` times; the `migrate`
/// samples, with their CPU shares.
pub fn short_run(duration: Duration, accessors: usize, repeats: usize) -> Result<Vec<Sample<MigrateCounters>>, String> {
    let size = 16 << 20;
    let phys = PhysMem::new(PhysConfig::new(arena_bytes(size)).nodes(2)).map_err(|e| format!("arena: {e}"))?;
    let mut out = Vec::new();
    for r in 0..repeats {
        for policy in [MigratePolicy::OneByOne, MigratePolicy::Batched] {
            let (run, cpu) = crate::machine::measured(accessors + 1, || soft(&phys, policy, accessors, size, duration));
            match run {
                Ok(run) => out.push(Sample { cpu, ..sample("migrate", policy.name(), accessors, r, &run.migrate) }),
                Err(e) => eprintln!("softmm: seed 003 {}: {e}", policy.name()),
            }
        }
    }
    Ok(out)
}

/// Seed 003's experiment: `migrate` over the migrate policies.
pub struct Migrate;

impl Experiment for Migrate {
    fn names(&self) -> &'static [&'static str] {
        &["migrate"]
    }

    fn alone(&self) -> bool {
        true
    }

    fn bench(&self, args: &BenchArgs) -> Result<i32, String> {
        bench(args)
    }

    fn seed_row(&self, h: &mut Headline<'_>) -> Option<SeedRow> {
        seed_003(h.limit.duration_or_default(), h.repeats)
    }
}

/// Seed 003 from a short run of its own experiment (`softmm bench migrate`):
/// TLB flush requests (Linux's TLB-flush IPIs, the seed's figure) per page
/// migrated (lower is better) while [`beside_one`] accessor threads read
/// and write a 16 MiB working set that a migrator moves between node 0 and
/// node 1 and back, for `duration` per sample, `repeats` times in turns;
/// `one-by-one` against `batched`, with the migrator's CPU time per page
/// in a note. No host figure: the host would need two NUMA nodes. `None`
/// if the arena cannot be made.
pub fn seed_003(duration: Duration, repeats: usize) -> Option<SeedRow> {
    let accessors = beside_one();
    let samples = short_run(duration, accessors, repeats).ok()?;
    let flushes =
        |s: &Sample<MigrateCounters>| Some(s.counters.flush_requests? as f64 / s.counters.pages_migrated? as f64);
    let cpu = |s: &Sample<MigrateCounters>| {
        Some(s.counters.migrator_cpu_ns? as f64 / 1e3 / s.counters.pages_migrated? as f64)
    };
    let (old, new) = (softmm::MigratePolicy::OneByOne.name(), softmm::MigratePolicy::Batched.name());
    let mut notes = Vec::new();
    if let (Some(o), Some(n)) = (figure(&samples, old, cpu).median(), figure(&samples, new, cpu).median()) {
        notes.push(format!(
            "the migrator's CPU us per page: {} old, {} new (the old design's includes spinning for the \
             accessors' acknowledgements, which a busy machine lengthens)",
            fig(o),
            fig(n)
        ));
    }
    Some(SeedRow {
        seed: "003",
        metric: format!(
            "TLB flush requests (IPIs) per page moved between two nodes beside {accessors} accessor \
             thread{} (16 MiB), lower is better",
            if accessors == 1 { "" } else { "s" }
        ),
        lower_is_better: true,
        old: figure(&samples, old, flushes),
        new: figure(&samples, new, flushes),
        host: None,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(mode: &str, policy: &str, ops: u64, pages: Option<u64>, flushes: Option<u64>) -> Sample<MigrateCounters> {
        Sample {
            workload: "migrate".into(),
            mode: mode.into(),
            policy: policy.into(),
            threads: 1,
            repeat: 0,
            ops,
            seconds: 1.0,
            ops_per_sec: ops as f64,
            counters: MigrateCounters {
                pages_migrated: pages,
                flush_requests: flushes,
                migrator_cpu_ns: pages.map(|p| p * 2000),
                ptl_locks: pages.map(|p| p / 4),
                ..MigrateCounters::default()
            },
            cpu_seconds: 1.0,
            cpu: None,
        }
    }

    #[test]
    fn comparison_and_table_take_rates_and_flushes_per_page() {
        let s = vec![
            sample("migrate", "one-by-one", 1000, Some(1000), Some(1000)),
            sample("accessors", "one-by-one", 200, None, None),
            sample("migrate", "batched", 4000, Some(4000), Some(8)),
            sample("accessors", "batched", 100, None, None),
        ];
        let c = comparison(&s).unwrap();
        assert!(c.contains("-99.8%") && c.contains("+300.0%") && c.contains("-50.0%"), "{c}");
        let t = crate::table::with_wide(true, || table(&s));
        assert!(
            t.contains("0.0020")
                && t.contains("1.0000")
                && t.contains("4.00k")
                && t.contains("2.000")
                && t.contains("0.2500"),
            "{t}"
        );
        assert!(c.contains("migrator CPU per page +0.0%"), "{c}");
        assert_eq!(comparison(&s[..2]), None);
    }

    #[test]
    fn host_nodes_is_at_least_one() {
        assert!(host_nodes() >= 1);
    }
}
