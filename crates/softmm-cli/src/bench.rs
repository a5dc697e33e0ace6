//! `softmm bench`: the sweep over workloads, policies (plus the host),
//! thread counts and repeats, with progress, table, JSON and plot.

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use softmm::{FaultPolicy, MadvisePolicy, PlacementPolicy, ShootdownTargets, UnmapPolicy, WriterPolicy};

use crate::args::{parse_postings, BenchArgs};
use crate::machine::{cores, Machine};
use crate::report::{self, Sample};
use crate::summary;
use crate::workload::Workload;
use crate::workloads::{self, Arena, Backend, Params};

/// Where the headline plot goes.
pub const HEADLINE_PLOT: &str = "softmm-results.svg";

/// tlb-flush's backends under `--madvise`: the `madvise` policies named
/// (`all`, `default`, names), and the host unless `no_host`; empty if
/// `--madvise` was not given.
fn parse_madvise_backends(names: &[String], no_host: bool) -> Result<Vec<Backend>, String> {
    let mut out: Vec<Backend> = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let add: Vec<MadvisePolicy> = match name {
            "all" => MadvisePolicy::ALL.to_vec(),
            "default" => vec![MadvisePolicy::default()],
            _ => vec![MadvisePolicy::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = MadvisePolicy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown --madvise policy `{name}`: the madvise policies are {}; or all, default",
                    names.join(", ")
                )
            })?],
        };
        for b in add.into_iter().map(Backend::Madvise) {
            if !out.contains(&b) {
                out.push(b);
            }
        }
    }
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
            _ => vec![Backend::Soft(FaultPolicy::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = FaultPolicy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown policy `{name}` for {workloads}: its fault policies are {}, its writer policies {}; or \
                     the shootdown targets {}; or all, default, host",
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
    let mut out: Vec<Backend> = Vec::new();
    for name in s.split(',').map(str::trim) {
        let add: Vec<UnmapPolicy> = match name {
            "all" => UnmapPolicy::ALL.to_vec(),
            "default" => vec![UnmapPolicy::default()],
            "host" => vec![],
            _ if FaultPolicy::from_name(name).is_some() => vec![],
            _ => vec![UnmapPolicy::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = UnmapPolicy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown policy `{name}` for big-munmap: its unmap policies are {}; or all, default, host",
                    names.join(", ")
                )
            })?],
        };
        out.extend(add.into_iter().map(Backend::Unmap).filter(|b| !out.contains(b)).collect::<Vec<_>>());
    }
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

/// The workloads that run alone, each with a sweep of its own.
pub const ALONE: &[&str] = &["pin", "migrate", "hugetlb-fault", "hugetlb-fork", "hugetlb-fork-fault"];

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
                if ALONE.contains(&n) {
                    format!("`{n}` runs alone: give it as the only workload")
                } else {
                    format!(
                        "unknown workload `{n}`: the workloads are {}, or all; and, each alone, {}",
                        names.join(", "),
                        ALONE.join(", ")
                    )
                }
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

/// Runs `softmm bench`; returns the exit status.
pub fn run(args: &BenchArgs) -> Result<i32, String> {
    workloads::set_shootdown_policy(args.shootdown);
    let postings = parse_postings(&args.posting)?;
    workloads::set_posting_policy(postings[0]);
    workloads::set_postings_label(&postings);
    if args.workloads.iter().any(|w| w == "pin") {
        return workloads::pin::bench(args); // seed 004's experiment has its own sweep
    }
    if args.workloads.iter().any(|w| workloads::hugetlb::WORKLOADS.contains(&w.as_str())) {
        return workloads::hugetlb::bench(args); // seed 000's experiment has its own sweep too
    }
    if args.workloads.iter().any(|w| w == "migrate") {
        return workloads::migrate::bench(args); // seed 003's experiment has its own sweep
    }
    crate::table::set_wide(args.wide);
    let headline = args.workloads.is_empty();
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
                            // Placement is a dimension of the fault-policy rows only.
                            let placements = match b {
                                Backend::Soft(_) => &args.placement.0[..],
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
    let mut arena = Arena::default();
    let mut samples: Vec<Sample> = Vec::new();
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
                        eprintln!("[{}/{}] {label}: {} ops/s{note}", i + 1, jobs.len(), crate::stats::si(ops_per_sec))
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
    print!("{}", report::table(&samples));
    print!("{}", report::cpu_warnings(&samples));
    if let Some(t) = workloads::big_munmap::table(&samples) {
        println!("\n{t}");
    }
    if headline {
        eprintln!("softmm: the per-seed experiments ({} repeats each)", args.repeat);
        let d = limit.duration_or_default();
        let mut seeds = vec![summary::seed_000(limit, args.repeat)];
        seeds.extend(summary::seed_001(&samples, FaultPolicy::default().name()));
        let s002 = summary::seed_002_samples(limit, &mut arena, args.repeat);
        seeds.extend(summary::seed_002(&s002));
        seeds.extend(summary::seed_003(d, args.repeat));
        seeds.extend(summary::seed_004(args.repeat));
        println!("\n{}", summary::table(&seeds, args.repeat));
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
