//! The last table of the headline run: one row per seed (see `seeds.rs`),
//! the design before the series against softmm's default design for it and,
//! where the host has the same figure, the host kernel, so that a reader
//! sees each seed's result in one line.
//!
//! Each row measures the seed's effect in a setting where it shows on two
//! CPUs as on sixteen: throughput where the mechanism decides it with one
//! thread beside the one that interferes (seed 001), and otherwise what the
//! mechanism changes, whatever the machine's other work: the time a munmap
//! holds `mmap_lock` for write (002), TLB flush requests per page migrated
//! (003), and shared-lock acquisitions per fault or per 512 pages pinned
//! (000, 004), whose throughput gains need more CPUs (the 16-CPU results).
//! Every figure is the median of `--repeat` samples, the designs taking
//! turns; a note says where the repeats disagree on which design wins.

use std::time::Duration;

use softmm::{HugetlbPolicy, UnmapPolicy};

use crate::args::Limit;
use crate::machine::cores;
use crate::report::Sample;
use crate::seeds::{self, Seed};
use crate::stats::{fig, Figure};
use crate::table::{wrap, Table};
use crate::workload::Workload;
use crate::workloads::{self, Arena, Backend, Params};

/// Where the per-seed rows at 16 CPUs are.
pub const SIXTEEN_CPUS: &str = "docs/results/16cpu/README.md";

/// One seed's result in one figure of merit.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRow {
    /// The seed.
    pub seed: &'static str,
    /// What the figures measure, with the setting they were taken at.
    pub metric: String,
    /// Whether a smaller figure is better.
    pub lower_is_better: bool,
    /// The design before the seed.
    pub old: Figure,
    /// softmm's default design.
    pub new: Figure,
    /// The host kernel's figure, where it has the same one.
    pub host: Option<Figure>,
    /// What else the row needs said (where the effect needs more CPUs).
    pub notes: Vec<String>,
}

impl SeedRow {
    /// How many times better the new design's median is than the old's:
    /// new/old where higher is better, old/new where lower is.
    pub fn gain(&self) -> Option<f64> {
        let (o, n) = (self.old.median()?, self.new.median()?);
        let g = if self.lower_is_better { o / n } else { n / o };
        g.is_finite().then_some(g)
    }

    /// Repeats where the old design won, as `(repeat, old, new)`.
    fn old_wins(&self) -> Vec<(usize, f64, f64)> {
        self.old
            .values
            .iter()
            .filter_map(|&(r, o)| {
                let &(_, n) = self.new.values.iter().find(|x| x.0 == r)?;
                let old_better = if self.lower_is_better { o < n } else { o > n };
                old_better.then_some((r, o, n))
            })
            .collect()
    }
}

fn gain_cell(g: Option<f64>) -> String {
    match g {
        None => "-".into(),
        Some(g) if g >= 1000.0 => ">1000x".into(),
        Some(g) if g >= 100.0 => format!("{g:.0}x"),
        Some(g) if g >= 10.0 => format!("{g:.1}x"),
        Some(g) => format!("{g:.2}x"),
    }
}

/// The figure of `policy` over `samples`, one value per repeat.
fn figure(samples: &[Sample], policy: &str, value: impl Fn(&Sample) -> Option<f64>) -> Figure {
    Figure {
        policy: policy.to_string(),
        values: samples.iter().filter(|s| s.policy == policy).filter_map(|s| Some((s.repeat, value(s)?))).collect(),
    }
}

/// A sample of a seed's short run.
fn sample(workload: &str, mode: &str, policy: &str, threads: usize, repeat: usize, m: &workloads::Measured) -> Sample {
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

/// `2 CPUs`: this machine's.
fn cpus_phrase() -> String {
    match cores() {
        1 => "1 CPU".into(),
        n => format!("{n} CPUs"),
    }
}

/// Faulting threads beside one mapping thread: one per CPU but the
/// mapper's, so that no thread waits for a CPU on an idle machine.
pub fn beside_one() -> usize {
    cores().saturating_sub(1).max(1)
}

/// Seed 001 from the headline samples: page faults per second of
/// [`beside_one`] faulting threads while another thread maps and unmaps
/// (interference, interfered), or of the nearest thread count measured;
/// `mmap-lock` against the default policy, and the host.
pub fn seed_001(samples: &[Sample], default_policy: &str) -> Option<SeedRow> {
    let measured: Vec<usize> =
        samples.iter().filter(|s| s.workload == "interference" && s.mode == "interfered").map(|s| s.threads).collect();
    let want = beside_one();
    let threads = measured.iter().copied().filter(|&t| t <= want).max().or_else(|| measured.iter().copied().min())?;
    let of: Vec<Sample> = samples
        .iter()
        .filter(|s| s.workload == "interference" && s.mode == "interfered" && s.threads == threads)
        .cloned()
        .collect();
    let rate = |s: &Sample| Some(s.ops_per_sec);
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
pub fn seed_002_samples(limit: Limit, arena: &mut Arena, repeats: usize) -> Vec<Sample> {
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
pub fn seed_002(samples: &[Sample]) -> Option<SeedRow> {
    let ours: Vec<Sample> = samples.iter().filter(|s| s.workload == "big-munmap").cloned().collect();
    if ours.is_empty() {
        return None;
    }
    let hold = |s: &Sample| s.counters.munmap_write_hold_ns.map(|ns| ns as f64 / 1e6);
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
    let samples = crate::workloads::migrate::short_run(duration, accessors, repeats).ok()?;
    let flushes = |s: &Sample| Some(s.counters.flush_requests? as f64 / s.counters.pages_migrated? as f64);
    let cpu = |s: &Sample| Some(s.counters.migrator_cpu_ns? as f64 / 1e3 / s.counters.pages_migrated? as f64);
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

/// Seed 004 from a short run of its own experiment (`softmm bench pin`):
/// `mmap_lock` acquisitions per 512 pages pinned (`FOLL_WRITE |
/// FOLL_LONGTERM`, 256 MiB faulted in by the pin) by [`beside_one`] workers
/// beside a thread looping mmap/munmap, `repeats` times in turns;
/// `per-page` (before the seed) against the default pin policy. `None` if
/// the arena cannot be made.
pub fn seed_004(repeats: usize) -> Option<SeedRow> {
    let workers = beside_one();
    let samples = crate::workloads::pin::short_run(256 << 20, workers, repeats).ok()?;
    let per512 = |s: &Sample| Some(s.counters.mmap_lock_acquisitions? as f64 * 512.0 / s.counters.pages? as f64);
    Some(SeedRow {
        seed: "004",
        metric: format!(
            "mmap_lock acquisitions per 512 pages pinned by {workers} worker{} beside a thread looping \
             mmap/munmap (256 MiB), lower is better",
            if workers == 1 { "" } else { "s" }
        ),
        lower_is_better: true,
        old: figure(&samples, "per-page", per512),
        new: figure(&samples, softmm::PinPolicy::default().name(), per512),
        host: None,
        notes: vec![format!(
            "its pages/s gain comes from many CPUs pinning at once, more than {} can show: see the 16-CPU \
             results, {SIXTEEN_CPUS}",
            cpus_phrase()
        )],
    })
}

/// Seed 000 from a short run of its own experiment (`softmm bench
/// hugetlb-fault`): the files' `i_mmap` lock acquisitions (read and write)
/// per 2 MiB page faulted by one address space writing a shared 1 GiB
/// hugetlbfs file, for `limit` (a duration; 0.5 s for iterations) per
/// sample, `repeats` times in turns; `i-mmap-rwsem` (before the seed,
/// Linux 5.7-6.0) against softmm's default hugetlb policy.
pub fn seed_000(limit: Limit, repeats: usize) -> SeedRow {
    let d = limit.duration_or_default();
    let (old, new) = (HugetlbPolicy::IMmapRwsem, HugetlbPolicy::default());
    let samples = crate::workloads::hugetlb::short_run(d, &[old, new], repeats);
    let per_fault = |s: &Sample| {
        let c = &s.counters;
        Some((c.i_mmap_read? + c.i_mmap_write?) as f64 / s.ops.max(1) as f64)
    };
    SeedRow {
        seed: "000",
        metric: "acquisitions of the file-wide i_mmap lock per 2 MiB page faulted, one address space writing \
                 a shared 1 GiB hugetlbfs file, lower is better"
            .into(),
        lower_is_better: true,
        old: figure(&samples, old.name(), per_fault),
        new: figure(&samples, new.name(), per_fault),
        host: None,
        notes: vec![format!(
            "its faults/s gain comes from many processes faulting the file at once, more than {} can \
             show: see the 16-CPU results, {SIXTEEN_CPUS}",
            cpus_phrase()
        )],
    }
}

/// The table: per seed the old and new design's median (min-max), the
/// host's, the gain, and notes: what the figures measure, the policies,
/// where the repeats disagree.
pub fn table(rows: &[SeedRow], repeats: usize) -> String {
    let mut out = wrap(
        &format!(
            "Per seed (Linux mm patch series; softmm bench --help cites them): the design before the \
             series (old) against softmm's default (new), median of {repeats} repeats (min-max) taken in \
             turns.",
        ),
        "",
    );
    let mut t = Table::new();
    t.column("seed", true, 0, None)
        .column("old", false, 0, None)
        .column("new", false, 0, None)
        .column("host", false, 0, Some("the running kernel's same figure, `-` where it has none"))
        .column(
            "gain",
            false,
            0,
            Some("how many times better new is than old (new/old, or old/new where lower is better)"),
        );
    for r in rows {
        let s: &Seed = seeds::seed(r.seed);
        t.row(vec![
            format!("{} {}", s.number, s.name),
            r.old.cell(),
            r.new.cell(),
            r.host.as_ref().map_or("-".into(), |h| h.median().map_or("-".into(), fig)),
            gain_cell(r.gain()),
        ]);
        t.note(&format!("{}; old {}, new {}", r.metric, r.old.policy, r.new.policy));
        for n in &r.notes {
            t.note(n);
        }
        let lost = r.old_wins();
        if !lost.is_empty() {
            let which: Vec<String> =
                lost.iter().map(|(i, o, n)| format!("repeat {i}: old {}, new {}", fig(*o), fig(*n))).collect();
            t.note(&format!(
                "note: the repeats disagree on which design wins: old won {} of {} ({})",
                lost.len(),
                r.old.values.len(),
                which.join("; ")
            ));
        }
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Counters;

    fn sample(mode: &str, policy: &str, threads: usize, repeat: usize, ops_per_sec: f64) -> Sample {
        Sample {
            workload: "interference".into(),
            mode: mode.into(),
            policy: policy.into(),
            threads,
            repeat,
            ops: 1,
            seconds: 1.0,
            ops_per_sec,
            counters: Counters::default(),
            cpu_seconds: 1.0,
            cpu: None,
        }
    }

    #[test]
    fn seed_002_takes_the_write_hold_and_prints_lower_is_better_as_a_gain() {
        let hold = |policy: &str, repeat: usize, ns: u64| Sample {
            workload: "big-munmap".into(),
            mode: "fault".into(),
            counters: Counters { munmap_write_hold_ns: Some(ns), ..Counters::default() },
            ..sample("fault", policy, 1, repeat, 1.0)
        };
        let d = UnmapPolicy::default().name();
        let s = vec![hold("locked", 0, 40_000_000), hold(d, 0, 20_000), hold("locked", 1, 10_000), hold(d, 1, 20_000)];
        let r = seed_002(&s).unwrap();
        assert_eq!(r.old.values, vec![(0, 40.0), (1, 0.01)]);
        assert_eq!(r.new.median(), Some(0.02));
        let t = table(&[r], 2);
        assert!(t.contains(">1000x"), "{t}");
        let flat = t.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("old won 1 of 2") && flat.contains("repeat 1: old 0.0100, new 0.0200"), "{t}");
        assert_eq!(seed_002(&[]), None);
    }

    #[test]
    fn seed_001_takes_the_interfered_rates_beside_one_mapper() {
        let t = beside_one();
        let s = vec![
            sample("interfered", "mmap-lock", t, 0, 10.0),
            sample("interfered", "mmap-lock", t, 1, 30.0),
            sample("interfered", "mmap-lock", t, 2, 20.0),
            sample("interfered", "mmap-lock", t + 1, 0, 99.0),
            sample("alone", "per-vma-seq", t, 0, 999.0),
            sample("interfered", "per-vma-seq", t, 0, 100.0),
            sample("interfered", "per-vma-seq", t, 1, 90.0),
            sample("interfered", "per-vma-seq", t, 2, 110.0),
        ];
        let r = seed_001(&s, "per-vma-seq").unwrap();
        assert_eq!(r.old.median(), Some(20.0));
        assert_eq!(r.new.median(), Some(100.0));
        assert_eq!(r.host, None);
        assert_eq!(r.gain(), Some(5.0));
        let text = table(&[r], 3);
        assert!(text.contains("5.00x") && text.contains("20.0 (10.0-30.0)") && !text.contains("disagree"), "{text}");
        for l in text.lines() {
            assert!(l.chars().count() <= 100, "{l}");
        }
    }
}
