//! The thread sweep: the fault-policy workloads (pft, will-it-scale,
//! tlb-flush, interference, cortenmm) and big-munmap over workloads,
//! policies (plus the host), thread counts and repeats, with progress,
//! table, JSON and plot; and the seed rows of its two experiments (001
//! from the headline's interference samples, 002 from a short big-munmap).

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use softmm::{FaultPolicy, MadvisePolicy, PlacementPolicy, ShootdownTargets, UnmapPolicy, WriterPolicy};

use crate::arena::Arena;
use crate::args::{parse_postings, BenchArgs, Limit};
use crate::counters::FaultCounters;
use crate::experiment::{Experiment, Headline};
use crate::machine::{cores, Machine};
use crate::report::{self, cpus_cell, Sample, CPUS_GLOSS};
use crate::seeds;
use crate::stats::{per_op, si};
use crate::summary::{beside_one, figure, SeedRow};
use crate::table::Table;
use crate::workload::Workload;
use crate::workloads::{self, Backend, Params};

/// Where the headline plot goes.
pub const HEADLINE_PLOT: &str = "softmm-results.svg";

/// tlb-flush's backends under `--madvise`: the `madvise` policies named
/// (`all`, `default`, names), and the host unless `no_host`; empty if
/// `--madvise` was not given.
fn parse_madvise_backends(names: &[String], no_host: bool) -> Result<Vec<Backend>, String> {
    let mut out: Vec<Backend> = crate::args::parse_policy_list(
        names,
        MadvisePolicy::ALL,
        MadvisePolicy::default(),
        |name| MadvisePolicy::from_name(name).map(|p| vec![p]),
        |name| {
            let names: Vec<&str> = MadvisePolicy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown --madvise policy `{name}`: the madvise policies are {}; or all, default", names.join(", "))
        },
    )?
    .into_iter()
    .map(Backend::Madvise)
    .collect();
    if !out.is_empty() && !no_host {
        out.push(Backend::Host);
    }
    Ok(out)
}

/// The fault-policy backends `--policy` names for `workloads` (named in
/// the error).
/// the error); with `big_munmap` in the run, unmap policy names are its
/// and select every fault policy where no fault policy is named.
fn parse_backends(s: &str, no_host: bool, workloads: &str, big_munmap: bool) -> Result<Vec<Backend>, String> {
    let mut out: Vec<Backend> = Vec::new();
    let mut host = !no_host;
    let mut only_host = true;
    let mut skipped = false;
    for name in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if big_munmap && UnmapPolicy::from_name(name).is_some() && FaultPolicy::from_name(name).is_none() {
            skipped = true;
            continue;
        }
        if let Some(w) = WriterPolicy::from_name(name) {
            only_host = false;
            if !out.contains(&Backend::Writers(w)) {
                out.push(Backend::Writers(w));
            }
            continue;
        }
        let add: Vec<Backend> = match name {
            "all" => FaultPolicy::ALL.iter().map(|&p| Backend::Soft(p)).collect(),
            "default" => vec![Backend::Soft(FaultPolicy::default())],
            "host" => {
                host = true;
                continue;
            }
            // A shootdown-target policy, under the default fault policy.
            _ if ShootdownTargets::from_name(name).is_some() => {
                vec![Backend::Targets(ShootdownTargets::from_name(name).expect("matched"))]
            }
            // An atomic-alignment policy (`atomics-strict`, `atomics-split`),
            // under the default fault policy.
            _ if name.starts_with("atomics-") && Backend::from_name(name).is_some() => {
                vec![Backend::from_name(name).expect("matched")]
            }
            // A host-file coherence policy (`host-file-cache`,
            // `host-file-shared`), under the default fault policy.
            _ if name.starts_with("host-file-") && Backend::from_name(name).is_some() => {
                vec![Backend::from_name(name).expect("matched")]
            }
            _ => vec![Backend::Soft(FaultPolicy::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = FaultPolicy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown policy `{name}` for {workloads}: its fault policies are {}, its writer policies {}; or \
                     the shootdown targets {}; or atomics-strict, atomics-split; or host-file-cache, \
                     host-file-shared; or all, default, host",
                    names.join(", "),
                    WriterPolicy::ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
                    ShootdownTargets::ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
                )
            })?)],
        };
        only_host = false;
        for b in add {
            if !out.contains(&b) {
                out.push(b);
            }
        }
    }
    if skipped && out.is_empty() {
        only_host = false;
        out = FaultPolicy::ALL.iter().map(|&p| Backend::Soft(p)).collect();
    }
    if only_host && !no_host {
        return Ok(vec![Backend::Host]);
    }
    if host {
        out.push(Backend::Host);
    }
    if out.is_empty() {
        return Err("no policy to run".into());
    }
    Ok(out)
}

/// big-munmap's backends: the unmap policies named in `--policy` (`all`,
/// `default`, names; fault policy names, meant for the other workloads of
/// the run, select every unmap policy), and the host.
fn parse_unmap_backends(s: &str, no_host: bool) -> Result<Vec<Backend>, String> {
    let mut out: Vec<Backend> = crate::args::parse_policy_list(
        s.split(','),
        UnmapPolicy::ALL,
        UnmapPolicy::default(),
        // The host, and the fault policies meant for the other workloads,
        // are no unmap policy.
        |name| match name {
            "host" => Some(vec![]),
            _ if FaultPolicy::from_name(name).is_some() => Some(vec![]),
            _ => UnmapPolicy::from_name(name).map(|p| vec![p]),
        },
        |name| {
            let names: Vec<&str> = UnmapPolicy::ALL.iter().map(|p| p.name()).collect();
            format!(
                "unknown policy `{name}` for big-munmap: its unmap policies are {}; or all, default, host",
                names.join(", ")
            )
        },
    )?
    .into_iter()
    .map(Backend::Unmap)
    .collect();
    if s.split(',').all(|n| FaultPolicy::from_name(n.trim()).is_some()) {
        // Only fault policies named: every unmap policy.
        out = UnmapPolicy::ALL.iter().map(|&p| Backend::Unmap(p)).collect();
    }
    if s.trim() == "host" {
        out.clear();
    }
    if !no_host {
        out.push(Backend::Host);
    }
    Ok(out)
}

/// The region size of `w`: `--size`, or its own default.
fn size_of(args: &BenchArgs, w: Workload) -> u64 {
    args.size.unwrap_or(if w == Workload::BigMunmap { 8 << 30 } else { 128 << 20 })
}

fn parse_workloads(names: &[String]) -> Result<Vec<Workload>, String> {
    let mut out = Vec::new();
    for n in names.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let add: Vec<Workload> = if n == "all" {
            Workload::ALL.to_vec()
        } else {
            vec![Workload::from_name(n).ok_or_else(|| {
                let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                format!("unknown workload `{n}` for the thread sweep: its workloads are {}, or all", names.join(", "))
            })?]
        };
        for w in add {
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    Ok(out)
}

/// One planned sample.
struct Job {
    workload: Workload,
    backend: Backend,
    placement: PlacementPolicy,
    /// The shootdown posting of its softmm address spaces.
    posting: softmm::PostingPolicy,
    mode: &'static str,
    threads: usize,
    repeat: usize,
}

fn mem_available() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = t.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The terminal table of the thread sweeps (pft, will-it-scale, interference,
/// cortenmm, big-munmap's counters): a heading per workload and mode, a row
/// per policy and thread count.
pub fn table(samples: &[Sample<FaultCounters>]) -> String {
    let rows = report::rows(samples);
    let shared = samples.iter().any(|s| s.counters.shared_writes.is_some());
    let waits = samples.iter().any(|s| s.counters.flush_wait_ns.is_some());
    let targets = samples.iter().any(|s| s.counters.shootdowns.is_some());
    let barriers = samples.iter().any(|s| s.workload == "tlb-flush" && s.counters.barriers.is_some());
    let flush_shared = samples.iter().any(|s| s.counters.flush_shared_writes.is_some());
    let interfered = samples.iter().any(|s| s.mode == "interfered");
    let ranged = samples.iter().any(|s| s.counters.range_writes.is_some_and(|n| n > 0));
    let mut t = Table::new();
    t.column("policy", true, 0, None)
        .column("thr", false, 0, Some("threads (tasks)"))
        .column("ops/s", false, 0, Some("operations per second, median of the repeats"))
        .column("min-max", false, 0, Some("the lowest and highest of the repeats"))
        .column("cpus", false, 0, Some(CPUS_GLOSS));
    if interfered {
        t.column("vs alone", false, 0, Some("the interfered median over the alone one"));
    }
    t.column("ops/cpu-s", false, 2, Some("operations per CPU second of the tasks"))
        .column("faults/op", false, 5, Some("page faults (host: the tasks' minor faults)"))
        .column("lock/op", false, 0, Some("mmap_lock acquisitions (by faults and the address space's own calls)"))
        .column("wlock/op", false, 0, Some("the part of lock/op taken for write"))
        .column("flush/op", false, 0, Some("TLB flush requests to other CPUs"));
    if ranged {
        t.column("range/op", false, 3, Some("calls range-parallel writers made without mmap_lock (--policy range)"))
            .column(
                "range-conflicts",
                false,
                3,
                Some("per op: range writers refused by an mmap_lock holder, or finding their window's lock held"),
            );
    }
    if waits {
        t.column("fwait ns/op", false, 4, Some("ns the flushes waited for CPUs inside an access"));
    }
    if targets {
        t.column("local", false, 2, Some("share of the shootdowns that asked no CPU of another thread"));
    }
    if barriers || targets {
        t.column("bar/op", false, 2, Some("process-wide barriers (membarrier) the shootdowns issued")).column(
            "join/op",
            false,
            2,
            Some("shootdowns covered by a barrier another shootdown issued"),
        );
    }
    if flush_shared {
        t.column("fshw/op", false, 1, Some("writes the shootdowns made to shared cache lines"));
    }
    t.column("spec/op", false, 3, Some("lock-free fault attempts"))
        .column("aborts/op", false, 0, Some("lock-free attempts aborted"))
        .column("fallbk/op", false, 3, Some("lock-free attempts that fell back to mmap_lock"));
    if shared {
        t.column("shared/op", false, 1, Some("writes to shared cache lines (by the tasks' faults and calls)"));
    }
    t.legend(
        "Per-op counters are totals over the repeats divided by the operations; `-`: the counter does not \
         apply (the host counts only its minor faults; mmap-lock makes no lock-free attempt).",
    );
    let mut last = String::new();
    let mut policies: Vec<&str> = Vec::new();
    for row in &rows {
        let s = row.first();
        let c = row.counters();
        let ops = row.ops();
        let group = format!("{}/{}", s.workload, s.mode);
        if group != last {
            let unit = Workload::from_name(&s.workload).map_or("operation", |w| w.op_unit());
            t.heading(&format!("{} {}: one op = one {unit}", s.workload, s.mode));
            last = group;
        }
        if !policies.contains(&s.policy.as_str()) {
            policies.push(&s.policy);
        }
        let mut line =
            vec![s.policy.clone(), s.threads.to_string(), si(row.median()), row.min_max(), cpus_cell(&row.samples)];
        if interfered {
            let vs_alone = if s.mode == "interfered" {
                rows.iter()
                    .find(|r| {
                        let a = r.first();
                        a.workload == s.workload && a.mode == "alone" && a.policy == s.policy && a.threads == s.threads
                    })
                    .map(|a| format!("{:.2}x", row.median() / a.median()))
                    .unwrap_or_else(|| "-".to_string())
            } else {
                "-".to_string()
            };
            line.push(vs_alone);
        }
        line.extend([
            row.per_cpu_second().map_or("-".to_string(), si),
            per_op(c.faults, ops),
            per_op(c.mmap_lock_acquisitions, ops),
            per_op(c.mmap_lock_writes, ops),
            per_op(c.flush_requests, ops),
        ]);
        if ranged {
            line.extend([per_op(c.range_writes, ops), per_op(c.range_conflicts, ops)]);
        }
        if waits {
            line.push(per_op(c.flush_wait_ns, ops));
        }
        if targets {
            line.push(match (c.local_shootdowns, c.shootdowns) {
                (Some(l), Some(n)) if n > 0 => format!("{:.0}%", 100.0 * l as f64 / n as f64),
                _ => "-".to_string(),
            });
        }
        if barriers || targets {
            line.extend([per_op(c.barriers, ops), per_op(c.barriers_joined, ops)]);
        }
        if flush_shared {
            line.push(per_op(c.flush_shared_writes, ops));
        }
        line.extend([per_op(c.spec_attempts, ops), per_op(c.spec_aborts, ops), per_op(c.fallbacks, ops)]);
        if shared {
            line.push(per_op(c.shared_writes, ops));
        }
        t.row(line);
    }
    let kind = if samples.iter().all(|s| s.workload == "big-munmap") { "unmap" } else { "fault" };
    let mut out = t.render();
    if !policies.is_empty() && kind == "fault" {
        let base: Vec<&str> = policies.iter().map(|p| p.split('+').next().unwrap_or(p)).collect();
        // `policy+placement+posting`: each suffix names a placement or a
        // shootdown posting policy.
        let suffixes: Vec<&str> = policies.iter().flat_map(|p| p.split('+').skip(1)).collect();
        out.push_str("Policies:\n");
        out.push_str(&crate::seeds::legend(kind, &base));
        // The host's line is the fault legend's.
        let soft: Vec<&str> = base.iter().copied().filter(|p| *p != "host").collect();
        out.push_str(&crate::seeds::legend("targets", &soft));
        let placed = crate::seeds::legend("placement", &suffixes);
        if !placed.is_empty() {
            out.push_str("Placements (`+name`; rows without one place as Linux):\n");
            out.push_str(&placed);
        }
        let posted = crate::seeds::legend("posting", &suffixes);
        if !posted.is_empty() {
            out.push_str("Shootdown posting (`+name`):\n");
            out.push_str(&posted);
        }
        // tlb-flush --madvise's rows (the host's line is the fault legend's).
        let madvise: Vec<&str> = policies.iter().copied().filter(|p| p.starts_with("madvise-")).collect();
        out.push_str(&crate::seeds::legend("madvise", &madvise));
        out.push_str(&crate::seeds::legend("writers", &soft));
        out.push_str(&crate::seeds::legend("atomics", &soft));
    }
    out
}

/// What the headline adds after the sweep's tables: the text printed
/// before the machine's footer, from the sweep's samples and arena.
pub type HeadlineRows<'a> = &'a mut dyn FnMut(&[Sample<FaultCounters>], &mut Arena, Limit) -> String;

/// Runs the thread sweep over `args.workloads` (pft and interference with
/// `headline`, whose text follows the tables); returns the exit status.
pub fn run(args: &BenchArgs, headline_rows: Option<HeadlineRows<'_>>) -> Result<i32, String> {
    let postings = parse_postings(&args.posting)?;
    crate::table::set_wide(args.wide);
    let headline = headline_rows.is_some();
    let workloads =
        if headline { vec![Workload::Pft, Workload::Interference] } else { parse_workloads(&args.workloads)? };
    let only_big_munmap = !workloads.is_empty() && workloads.iter().all(|&w| w == Workload::BigMunmap);
    let has_big_munmap = workloads.contains(&Workload::BigMunmap);
    let unmap_backends = if has_big_munmap { parse_unmap_backends(&args.policy, args.no_host)? } else { Vec::new() };
    let names: Vec<&str> = workloads.iter().filter(|&&w| w != Workload::BigMunmap).map(|w| w.name()).collect();
    let backends = if only_big_munmap {
        unmap_backends.clone()
    } else {
        parse_backends(&args.policy, args.no_host, &names.join(", "), has_big_munmap)?
    };
    let madvise_backends = parse_madvise_backends(&args.madvise, args.no_host)?;
    let backends_of = |w: Workload| match w {
        Workload::BigMunmap => unmap_backends.clone(),
        Workload::TlbFlush if !madvise_backends.is_empty() => madvise_backends.clone(),
        _ => backends.clone(),
    };
    let threads = args.thread_counts(|| (1..=cores()).collect())?;
    args.repeats()?;
    let limit = args.limit()?;
    for m in &args.mode {
        if !workloads.iter().any(|w| w.modes().contains(&m.as_str())) {
            let valid: Vec<String> =
                workloads.iter().map(|w| format!("{}: {}", w.name(), w.modes().join(", "))).collect();
            return Err(format!("mode `{m}` applies to none of the workloads ({})", valid.join("; ")));
        }
    }
    if let Some(p) = &args.plot {
        let ext = p.extension().map(|x| x.to_string_lossy().to_ascii_lowercase());
        if !matches!(ext.as_deref(), Some("svg" | "png")) {
            return Err(format!("{}: the plot file must end in .svg or .png", p.display()));
        }
    }
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    if let Some(avail) = mem_available() {
        for &w in &workloads {
            let need = workloads::arena_bytes(w, max_threads, size_of(args, w));
            if backends_of(w).iter().any(|b| b.is_soft()) && need > avail / 10 * 9 {
                return Err(format!(
                    "{} at {max_threads} threads needs a {} MiB softmm arena, more than the {} MiB available: use a smaller --size",
                    w.name(),
                    need >> 20,
                    avail >> 20
                ));
            }
        }
    }

    let mut jobs = Vec::new();
    for &w in &workloads {
        let mut modes: Vec<&'static str> =
            w.modes().iter().copied().filter(|m| args.mode.iter().any(|a| a == m)).collect();
        if modes.is_empty() {
            modes = w.default_modes().to_vec();
        }
        // The softmm policies take turns within each repeat, so that drift
        // in the machine (other tenants, the host's memory state) spreads
        // over all of them instead of favouring whichever runs first; the
        // host runs after them (its processes must not inherit the arena).
        let (soft, host): (Vec<Backend>, Vec<Backend>) = backends_of(w).iter().copied().partition(|b| b.is_soft());
        for group in [soft, host] {
            for &mode in &modes {
                for &t in &threads {
                    for r in 0..args.repeat {
                        for &b in &group {
                            // Placement is a dimension of the fault-policy and
                            // writer-policy rows only (range writers' non-fixed
                            // mmaps need arenas).
                            let placements = match b {
                                Backend::Soft(_) | Backend::Writers(_) => &args.placement.0[..],
                                _ => &[PlacementPolicy::Linux][..],
                            };
                            let postings = if b.is_soft() { &postings[..] } else { &postings[..1] };
                            for &placement in placements {
                                for &posting in postings {
                                    jobs.push(Job {
                                        workload: w,
                                        backend: b,
                                        placement,
                                        posting,
                                        mode,
                                        threads: t,
                                        repeat: r,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    let mut machine = Machine::detect();
    let what = if headline { "headline".to_string() } else { format!("bench {}", args.workloads.join(",")) };
    print!("{}", machine.header(&what));
    let tty = std::io::stdout().is_terminal();
    let bar = if tty {
        let bar = ProgressBar::with_draw_target(Some(jobs.len() as u64), ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} [{elapsed_precise}, eta {eta}] {msg}")
                .expect("valid template"),
        );
        Some(bar)
    } else {
        None
    };
    eprintln!("softmm: {} samples of {} s each, {} repeats", jobs.len(), args.duration, args.repeat);
    let mut arena = Arena::with_free_lists(args.free_lists);
    let mut samples: Vec<Sample<FaultCounters>> = Vec::new();
    let mut failures = 0;
    let mut last_backend = None;
    for (i, job) in jobs.iter().enumerate() {
        if job.backend == Backend::Host && last_backend != Some(Backend::Host) {
            // Forked host processes should not inherit a large arena.
            arena.release();
        }
        last_backend = Some(job.backend);
        workloads::set_posting_policy(job.posting);
        if job.backend.is_soft() {
            // One arena for the whole sweep of a workload, sized for its most
            // threads up front: every sample hands out frames of the same
            // host memory (a larger arena made midway would be backed
            // differently, by huge pages or not).
            arena.get(workloads::arena_bytes(job.workload, max_threads, size_of(args, job.workload)))?;
        }
        let mut policy = workloads::policy_label(job.backend, job.placement);
        if job.backend.is_soft() && postings.len() > 1 {
            policy = format!("{policy}+{}", job.posting.name());
        }
        let label =
            format!("{} {} {} threads={} repeat={}", job.workload.name(), job.mode, policy, job.threads, job.repeat);
        if let Some(bar) = &bar {
            bar.set_message(label.clone());
        }
        let params = Params {
            threads: job.threads,
            mode: job.mode,
            limit,
            size: size_of(args, job.workload),
            force_speculative: args.force_speculative,
            placement: job.placement,
        };
        let tasks = job.workload.tasks(job.mode, job.threads);
        let (got, cpu) =
            crate::machine::measured(tasks, || workloads::run(job.workload, job.backend, &params, &mut arena));
        match got {
            Ok(m) => {
                let ops_per_sec = if m.seconds > 0.0 { m.ops as f64 / m.seconds } else { 0.0 };
                let note = report::cpu_note(cpu);
                match &bar {
                    None => {
                        eprintln!("[{}/{}] {label}: {} ops/s{note}", i + 1, jobs.len(), si(ops_per_sec))
                    }
                    Some(bar) if !note.is_empty() => bar.suspend(|| eprintln!("{label}:{note}")),
                    Some(_) => {}
                }
                samples.push(Sample {
                    workload: job.workload.name().to_string(),
                    mode: job.mode.to_string(),
                    policy: policy.clone(),
                    threads: job.threads,
                    repeat: job.repeat,
                    ops: m.ops,
                    seconds: m.seconds,
                    ops_per_sec,
                    counters: m.counters,
                    cpu_seconds: m.cpu_seconds,
                    cpu,
                });
            }
            Err(e) => {
                failures += 1;
                let msg = format!("softmm: {label}: {e}");
                match &bar {
                    Some(bar) => bar.suspend(|| eprintln!("{msg}")),
                    None => eprintln!("{msg}"),
                }
            }
        }
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    println!();
    print!("{}", table(&samples));
    print!("{}", report::cpu_warnings(&samples));
    if let Some(t) = workloads::big_munmap::table(&samples) {
        println!("\n{t}");
    }
    if let Some(seed_rows) = headline_rows {
        println!("\n{}", seed_rows(&samples, &mut arena, limit));
    }
    machine.finish();
    print!("{}", machine.footer());
    let results = workloads::results(machine, samples);
    report::save_json(args.json.as_deref(), &results)?;
    let plot = args.plot.clone().or_else(|| headline.then(|| PathBuf::from(HEADLINE_PLOT)));
    if let Some(path) = plot {
        if results.samples.is_empty() {
            eprintln!("softmm: no samples: {} not written", path.display());
        } else {
            crate::plot::plot(&path, &results)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(if failures > 0 { 1 } else { 0 })
}

/// The thread sweep's workloads (pft, will-it-scale, tlb-flush,
/// interference, cortenmm) over the fault policies; seed 001's experiment.
pub struct FaultSweep;

/// The sweep's names: every [`Workload`] but big-munmap, and `all`.
const FAULT_SWEEP: &[&str] = &[
    "pft",
    "page-fault1",
    "page-fault2",
    "page-fault3",
    "mmap1",
    "mmap2",
    "tlb-flush",
    "interference",
    "cortenmm",
    "madvise-flags",
    "mremap-move",
    "all",
];

impl Experiment for FaultSweep {
    fn names(&self) -> &'static [&'static str] {
        FAULT_SWEEP
    }

    fn alone(&self) -> bool {
        false
    }

    fn bench(&self, args: &BenchArgs) -> Result<i32, String> {
        run(args, None)
    }

    fn seed_row(&self, h: &mut Headline<'_>) -> Option<SeedRow> {
        seed_001(h.samples, FaultPolicy::default().name())
    }
}

/// big-munmap over the unmap policies (seed 002), in the thread sweep.
pub struct BigMunmap;

impl Experiment for BigMunmap {
    fn names(&self) -> &'static [&'static str] {
        &["big-munmap"]
    }

    fn alone(&self) -> bool {
        false
    }

    fn bench(&self, args: &BenchArgs) -> Result<i32, String> {
        run(args, None)
    }

    fn seed_row(&self, h: &mut Headline<'_>) -> Option<SeedRow> {
        seed_002(&seed_002_samples(h.limit, h.arena, h.repeats))
    }
}

/// A sample of a seed's short run.
fn sample(
    workload: &str,
    mode: &str,
    policy: &str,
    threads: usize,
    repeat: usize,
    m: &workloads::Measured,
) -> Sample<FaultCounters> {
    Sample {
        workload: workload.into(),
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

/// Seed 001 from the headline samples: page faults per second of
/// [`beside_one`] faulting threads while another thread maps and unmaps
/// (interference, interfered), or of the nearest thread count measured;
/// `mmap-lock` against the default policy, and the host.
pub fn seed_001(samples: &[Sample<FaultCounters>], default_policy: &str) -> Option<SeedRow> {
    let measured: Vec<usize> =
        samples.iter().filter(|s| s.workload == "interference" && s.mode == "interfered").map(|s| s.threads).collect();
    let want = beside_one();
    let threads = measured.iter().copied().filter(|&t| t <= want).max().or_else(|| measured.iter().copied().min())?;
    let of: Vec<Sample<FaultCounters>> = samples
        .iter()
        .filter(|s| s.workload == "interference" && s.mode == "interfered" && s.threads == threads)
        .cloned()
        .collect();
    let rate = |s: &Sample<FaultCounters>| Some(s.ops_per_sec);
    let old = seeds::seed("001").old_new.0;
    Some(SeedRow {
        seed: "001",
        metric: format!(
            "page faults/s of {threads} thread{} beside one thread looping mmap/munmap elsewhere \
             (interference), higher is better",
            if threads == 1 { "" } else { "s" }
        ),
        lower_is_better: false,
        old: figure(&of, old, rate),
        new: figure(&of, default_policy, rate),
        host: Some(figure(&of, "host", rate)).filter(|f| !f.values.is_empty()),
        notes: Vec::new(),
    })
}

/// Seed 002's short run: a 256 MiB populated region unmapped beside one
/// faulting thread (`fault` mode, faults under `mmap_lock` as in 2018),
/// under `locked` and the default unmap policy in turns, `repeats` times;
/// the faulting thread runs alone for `limit` (a duration) first.
pub fn seed_002_samples(limit: Limit, arena: &mut Arena, repeats: usize) -> Vec<Sample<FaultCounters>> {
    let params = Params {
        threads: 1,
        mode: "fault",
        limit,
        size: 256 << 20,
        force_speculative: false,
        placement: Default::default(),
    };
    let mut out = Vec::new();
    for r in 0..repeats {
        for p in [UnmapPolicy::Locked, UnmapPolicy::default()] {
            let b = Backend::Unmap(p);
            let (got, cpu) = crate::machine::measured(2, || workloads::run(Workload::BigMunmap, b, &params, arena));
            match got {
                Ok(m) => out.push(Sample { cpu, ..sample("big-munmap", "fault", b.name(), 1, r, &m) }),
                Err(e) => eprintln!("softmm: seed 002 {}: {e}", b.name()),
            }
        }
    }
    out
}

/// Seed 002 from [`seed_002_samples`]: how long the munmap held
/// `mmap_lock` for write, the longest any fault of the other thread could
/// wait for it (ms, lower is better); `locked` against the default.
pub fn seed_002(samples: &[Sample<FaultCounters>]) -> Option<SeedRow> {
    let ours: Vec<Sample<FaultCounters>> = samples.iter().filter(|s| s.workload == "big-munmap").cloned().collect();
    if ours.is_empty() {
        return None;
    }
    let hold = |s: &Sample<FaultCounters>| s.counters.munmap_write_hold_ns.map(|ns| ns as f64 / 1e6);
    Some(SeedRow {
        seed: "002",
        metric: "ms a 256 MiB munmap holds mmap_lock for write, during which a fault of the other thread \
                 waits (faults under mmap_lock, as in 2018), lower is better"
            .into(),
        lower_is_better: true,
        old: figure(&ours, UnmapPolicy::Locked.name(), hold),
        new: figure(&ours, UnmapPolicy::default().name(), hold),
        host: None,
        notes: vec!["the faults' p99 latency during the munmap: softmm bench big-munmap".into()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary;

    #[test]
    fn policies() {
        let all = parse_backends("all", false, "pft", false).unwrap();
        assert_eq!(all.len(), FaultPolicy::ALL.len() + 1);
        assert_eq!(all.last(), Some(&Backend::Host));
        assert_eq!(parse_backends("default", true, "pft", false).unwrap(), vec![Backend::Soft(FaultPolicy::default())]);
        assert_eq!(parse_backends("host", false, "pft", false).unwrap(), vec![Backend::Host]);
        assert_eq!(
            parse_backends("mmap-lock,per-vma", false, "pft", false).unwrap(),
            vec![Backend::Soft(FaultPolicy::MmapLock), Backend::Soft(FaultPolicy::PerVma), Backend::Host]
        );
        let e = parse_backends("nope", false, "pft", false).unwrap_err();
        assert!(e.contains("for pft") && e.contains("per-vma-seq") && !e.contains("lock-free"), "{e}");
        assert!(parse_backends("locked", false, "pft", false).is_err());
        assert_eq!(parse_backends("locked", true, "pft", true).unwrap().len(), FaultPolicy::ALL.len());
        let unmap = parse_unmap_backends("all", false).unwrap();
        assert_eq!(unmap.len(), UnmapPolicy::ALL.len() + 1);
        assert_eq!(parse_unmap_backends("mmap-lock", true).unwrap().len(), UnmapPolicy::ALL.len());
        assert_eq!(
            parse_unmap_backends("locked,lock-free", true).unwrap(),
            vec![Backend::Unmap(UnmapPolicy::Locked), Backend::Unmap(UnmapPolicy::LockFree)]
        );
        assert_eq!(parse_unmap_backends("host", false).unwrap(), vec![Backend::Host]);
        assert!(parse_unmap_backends("nope", false).is_err());
        let soft = Backend::Soft(FaultPolicy::PerVmaSeq);
        assert_eq!(workloads::policy_label(soft, PlacementPolicy::Linux), "per-vma-seq");
        assert_eq!(workloads::policy_label(soft, PlacementPolicy::Arenas), "per-vma-seq+arenas");
        assert_eq!(workloads::policy_label(Backend::Host, PlacementPolicy::Arenas), "host");
        // Shootdown targets, old against new in one sweep.
        assert_eq!(
            parse_backends("broadcast,fill-owners", true, "tlb-flush", false).unwrap(),
            vec![Backend::Targets(ShootdownTargets::Broadcast), Backend::Targets(ShootdownTargets::FillOwners)]
        );
        assert!(e.contains("fill-owners"), "{e}");
        // Atomic alignment, old against new in one sweep, each configuring
        // its address spaces.
        let both = parse_backends("atomics-strict,atomics-split", true, "pft", false).unwrap();
        assert_eq!(
            both,
            vec![Backend::Atomics(softmm::AtomicAlignment::Strict), Backend::Atomics(softmm::AtomicAlignment::Split)]
        );
        assert_eq!(both[1].configure(softmm::MmConfig::default()).atomic_alignment, softmm::AtomicAlignment::Split);
        // Host-file coherence, the old policy against the default.
        let files = parse_backends("host-file-cache,host-file-shared", true, "pft", false).unwrap();
        assert_eq!(
            files[0].configure(softmm::MmConfig::default()).host_file_coherence,
            softmm::HostFileCoherence::Cache
        );
        assert_eq!(files[1].name(), "host-file-shared");
        assert!(e.contains("atomics-split"), "{e}");
    }

    #[test]
    fn madvise_backends() {
        let names = |s: &str| s.split(',').map(String::from).collect::<Vec<_>>();
        assert_eq!(parse_madvise_backends(&[], false), Ok(vec![]), "without --madvise: the fault policies' rows");
        let all = parse_madvise_backends(&names("all"), false).unwrap();
        assert_eq!(all.len(), MadvisePolicy::ALL.len() + 1);
        assert_eq!(all.last(), Some(&Backend::Host));
        assert_eq!(
            parse_madvise_backends(&names("mmap-lock,default,per-vma"), true).unwrap(),
            vec![Backend::Madvise(MadvisePolicy::MmapLock), Backend::Madvise(MadvisePolicy::PerVma)]
        );
        let e = parse_madvise_backends(&names("per-vma-seq"), true).unwrap_err();
        assert!(e.contains("mmap-lock, per-vma"), "{e}");
        // Each row is named apart from the fault policies.
        for &p in MadvisePolicy::ALL {
            let row = Backend::Madvise(p).name();
            assert!(row.ends_with(p.name()) && FaultPolicy::from_name(row).is_none(), "{row}");
        }
    }

    fn rate_sample(mode: &str, policy: &str, threads: usize, repeat: usize, ops_per_sec: f64) -> Sample<FaultCounters> {
        Sample {
            workload: "interference".into(),
            mode: mode.into(),
            policy: policy.into(),
            threads,
            repeat,
            ops: 1,
            seconds: 1.0,
            ops_per_sec,
            counters: FaultCounters::default(),
            cpu_seconds: 1.0,
            cpu: None,
        }
    }

    #[test]
    fn seed_002_takes_the_write_hold_and_prints_lower_is_better_as_a_gain() {
        let hold = |policy: &str, repeat: usize, ns: u64| Sample {
            workload: "big-munmap".into(),
            mode: "fault".into(),
            counters: FaultCounters { munmap_write_hold_ns: Some(ns), ..FaultCounters::default() },
            ..rate_sample("fault", policy, 1, repeat, 1.0)
        };
        let d = UnmapPolicy::default().name();
        let s = vec![hold("locked", 0, 40_000_000), hold(d, 0, 20_000), hold("locked", 1, 10_000), hold(d, 1, 20_000)];
        let r = seed_002(&s).unwrap();
        assert_eq!(r.old.values, vec![(0, 40.0), (1, 0.01)]);
        assert_eq!(r.new.median(), Some(0.02));
        let t = summary::table(&[r], 2);
        assert!(t.contains(">1000x"), "{t}");
        let flat = t.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("old won 1 of 2") && flat.contains("repeat 1: old 0.0100, new 0.0200"), "{t}");
        assert_eq!(seed_002(&[]), None);
    }

    #[test]
    fn seed_001_takes_the_interfered_rates_beside_one_mapper() {
        let t = beside_one();
        let s = vec![
            rate_sample("interfered", "mmap-lock", t, 0, 10.0),
            rate_sample("interfered", "mmap-lock", t, 1, 30.0),
            rate_sample("interfered", "mmap-lock", t, 2, 20.0),
            rate_sample("interfered", "mmap-lock", t + 1, 0, 99.0),
            rate_sample("alone", "per-vma-seq", t, 0, 999.0),
            rate_sample("interfered", "per-vma-seq", t, 0, 100.0),
            rate_sample("interfered", "per-vma-seq", t, 1, 90.0),
            rate_sample("interfered", "per-vma-seq", t, 2, 110.0),
        ];
        let r = seed_001(&s, "per-vma-seq").unwrap();
        assert_eq!(r.old.median(), Some(20.0));
        assert_eq!(r.new.median(), Some(100.0));
        assert_eq!(r.host, None);
        assert_eq!(r.gain(), Some(5.0));
        let text = summary::table(&[r], 3);
        assert!(text.contains("5.00x") && text.contains("20.0 (10.0-30.0)") && !text.contains("disagree"), "{text}");
        for l in text.lines() {
            assert!(l.chars().count() <= 100, "{l}");
        }
    }
}
