//! The last table of the headline run: one row per seed mechanism, its old
//! design against softmm's default design for it and the host kernel doing
//! the same work, so a reader sees each seed's result in one line.
//!
//! A seed adds its row with a function that turns samples (from the headline
//! run, or from a short run of its own experiment) into a [`SeedRow`].

use softmm::{HugetlbPolicy, UnmapPolicy};

use crate::report::{rows, si, Sample};
use crate::workloads::{self, Arena, Backend, Limit, Params, Workload};

/// One seed's result in one figure of merit.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRow {
    /// The seed and its mechanism, e.g. `001 speculative faults`.
    pub seed: &'static str,
    /// What the figures measure, with the setting they were taken at.
    pub metric: String,
    /// The design before the seed: its policy name and figure.
    pub old: (String, Option<f64>),
    /// softmm's default design: its policy name and figure.
    pub new: (String, Option<f64>),
    /// The host kernel's figure, where it can run the experiment.
    pub host: Option<f64>,
}

/// The median of the samples of `workload`/`mode`/`policy` at `threads`.
pub fn median(samples: &[Sample], workload: &str, mode: &str, policy: &str, threads: usize) -> Option<f64> {
    rows(samples)
        .into_iter()
        .find(|r| {
            let s = r.samples[0];
            s.workload == workload && s.mode == mode && s.policy == policy && s.threads == threads
        })
        .map(|r| r.median())
}

/// Seed 001 from the headline samples: page faults per second while another
/// thread maps and unmaps (interference, interfered), at the
/// largest thread count measured; `mmap-lock` against the default policy.
pub fn seed_001(samples: &[Sample], default_policy: &str) -> Option<SeedRow> {
    let threads = samples.iter().filter(|s| s.workload == "interference").map(|s| s.threads).max()?;
    let get = |p: &str| median(samples, "interference", "interfered", p, threads);
    Some(SeedRow {
        seed: "001 speculative faults",
        metric: format!("faults/s beside an mmap/munmap loop, {threads} threads"),
        old: ("mmap-lock".into(), get("mmap-lock")),
        new: (default_policy.into(), get(default_policy)),
        host: get("host"),
    })
}

/// Seed 002's short run for the headline: a 256 MiB munmap beside one
/// faulting thread (`fault` mode; faults under `mmap_lock`, as in 2018),
/// under `locked`, the default unmap policy, and on the host; the faulting
/// thread runs alone for `limit` (a duration) before the munmap.
pub fn seed_002_samples(limit: Limit, arena: &mut Arena) -> Vec<Sample> {
    let params = Params { threads: 1, mode: "fault", limit, size: 256 << 20, force_speculative: false };
    let backends = [Backend::Unmap(UnmapPolicy::Locked), Backend::Unmap(UnmapPolicy::default()), Backend::Host];
    let mut out = Vec::new();
    for b in backends {
        if b == Backend::Host {
            arena.release();
        }
        match workloads::run(Workload::BigMunmap, b, &params, arena) {
            Ok(m) => out.push(Sample {
                workload: Workload::BigMunmap.name().into(),
                mode: params.mode.into(),
                policy: b.name().into(),
                threads: 1,
                repeat: 0,
                ops: m.ops,
                seconds: m.seconds,
                ops_per_sec: if m.seconds > 0.0 { m.ops as f64 / m.seconds } else { 0.0 },
                counters: m.counters,
                cpu_seconds: m.cpu_seconds,
            }),
            Err(e) => eprintln!("softmm: seed 002 {}: {e}", b.name()),
        }
    }
    out
}

/// Seed 002 from [`seed_002_samples`]: the p99 latency (µs) of the other
/// thread's faults during the munmap, `locked` against the default unmap
/// policy (lower is better).
pub fn seed_002(samples: &[Sample]) -> Option<SeedRow> {
    let p99 = |policy: &str| {
        samples
            .iter()
            .find(|s| s.workload == "big-munmap" && s.mode == "fault" && s.policy == policy)
            .and_then(|s| s.counters.p99_ns)
            .map(|ns| ns as f64 / 1e3)
    };
    let default = UnmapPolicy::default().name();
    samples.iter().any(|s| s.workload == "big-munmap").then(|| SeedRow {
        seed: "002 big munmap",
        metric: "p99 fault latency (us) during a 256 MiB munmap, lower is better".into(),
        old: ("locked".into(), p99("locked")),
        new: (default.into(), p99(default)),
        host: p99("host"),
    })
}

/// Seed 003 from a short run of its own experiment (`softmm bench migrate`):
/// pages migrated per second while one accessor thread reads and writes a
/// 16 MiB working set that a migrator moves between node 0 and node 1 and
/// back for 0.5 s per policy; `one-by-one` (before the seed) against
/// `batched`. No host figure: the host here has one NUMA node (the metric
/// says so where that holds). `None` if the arena cannot be made.
pub fn seed_003() -> Option<SeedRow> {
    let (old, new) = crate::workloads::migrate::short_run(std::time::Duration::from_millis(500)).ok()?;
    let one_node = crate::workloads::migrate::host_nodes() < 2;
    Some(SeedRow {
        seed: "003 batched migration",
        metric: format!(
            "pages migrated/s, 16 MiB moved 0<->1 beside 1 accessor{}",
            if one_node { " (host: one NUMA node)" } else { "" }
        ),
        old: (softmm::MigratePolicy::OneByOne.name().into(), Some(old)),
        new: (softmm::MigratePolicy::Batched.name().into(), Some(new)),
        host: None,
    })
}

/// Seed 004 from a short run of its own experiment (`softmm bench pin`):
/// pages pinned per second (`FOLL_WRITE | FOLL_LONGTERM`, a 256 MiB region
/// faulted in by the pin) with two workers (one on a single CPU), the
/// median of three samples; `per-page` (`mmap_lock` around every page,
/// before the seed) against the default pin policy, and the host pinning
/// through io_uring's buffer registration (one sample). `None` if the arena
/// cannot be made.
pub fn seed_004() -> Option<SeedRow> {
    let threads = crate::machine::cores().min(2);
    let r = crate::workloads::pin::short_run(256 << 20, threads).ok()?;
    Some(SeedRow {
        seed: "004 page pinning",
        metric: format!("pages pinned/s, 256 MiB faulted in, {threads} threads"),
        old: ("per-page".into(), r.old),
        new: (softmm::PinPolicy::default().name().into(), r.new),
        host: r.host,
    })
}

/// Seed 000 from a short run of its own experiment (`softmm bench
/// hugetlb-fork-fault`): 2 MiB pages faulted per second beside a fork loop,
/// one fault and one fork instance sharing a 1 GiB hugetlbfs file, for
/// `limit` (a duration; 0.5 s for iterations) per row: softmm under
/// `i-mmap-rwsem` (the design before the seed, Linux 5.7-6.0) against
/// softmm's default hugetlb policy, and the host. The metric also gives
/// each row's forks/s, the other side of the seed's trade-off.
pub fn seed_000(limit: Limit) -> SeedRow {
    let d = match limit {
        Limit::Duration(d) => d,
        Limit::Iterations(_) => std::time::Duration::from_millis(500),
    };
    let (old, new) = (HugetlbPolicy::IMmapRwsem, HugetlbPolicy::default());
    let policies: &[HugetlbPolicy] = if old == new { &[old] } else { &[old, new] };
    let r = crate::workloads::hugetlb::short_run(d, policies);
    let of = |p: HugetlbPolicy| r.soft.iter().find(|(q, _)| *q == p).and_then(|(_, x)| *x);
    let forks = |x: Option<(f64, f64)>| cell(x.map(|(_, forks)| forks));
    SeedRow {
        seed: "000 hugetlb PMD sharing",
        metric: format!(
            "faults/s beside a fork loop, 1 GiB shared hugetlbfs, 1+1 processes (forks/s: {} old, {} new, {} host)",
            forks(of(old)),
            forks(of(new)),
            forks(r.host)
        ),
        old: (old.name().into(), of(old).map(|(faults, _)| faults)),
        new: (new.name().into(), of(new).map(|(faults, _)| faults)),
        host: r.host.map(|(faults, _)| faults),
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), si)
}

/// The table: seed, metric, old and new design with their names, host, and
/// new over old.
pub fn table(rows: &[SeedRow]) -> String {
    let mut lines = vec![[
        "seed".to_string(),
        "metric".into(),
        "old design".into(),
        "new design".into(),
        "host".into(),
        "new/old".into(),
    ]];
    for r in rows {
        let ratio = match (r.old.1, r.new.1) {
            (Some(o), Some(n)) if o > 0.0 => format!("{:.2}x", n / o),
            _ => "-".into(),
        };
        lines.push([
            r.seed.to_string(),
            r.metric.clone(),
            format!("{} {}", cell(r.old.1), r.old.0),
            format!("{} {}", cell(r.new.1), r.new.0),
            cell(r.host),
            ratio,
        ]);
    }
    let widths: Vec<usize> = (0..6).map(|c| lines.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::from("Per seed: the old design, softmm's default, and the host.\n");
    for l in &lines {
        let cells: Vec<String> = l.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Counters;

    fn sample(mode: &str, policy: &str, threads: usize, ops_per_sec: f64) -> Sample {
        Sample {
            workload: "interference".into(),
            mode: mode.into(),
            policy: policy.into(),
            threads,
            repeat: 0,
            ops: 1,
            seconds: 1.0,
            ops_per_sec,
            counters: Counters::default(),
            cpu_seconds: 1.0,
        }
    }

    #[test]
    fn seed_002_takes_the_p99_fault_latency_of_locked_the_default_and_the_host() {
        let p99 = |policy: &str, ns: u64| Sample {
            workload: "big-munmap".into(),
            mode: "fault".into(),
            counters: Counters { p99_ns: Some(ns), ..Counters::default() },
            ..sample("fault", policy, 1, 1.0)
        };
        let s = vec![p99("locked", 40_000_000), p99(UnmapPolicy::default().name(), 20_000), p99("host", 3_000)];
        let r = seed_002(&s).unwrap();
        assert_eq!(r.old, ("locked".into(), Some(40_000.0)));
        assert_eq!(r.new, (UnmapPolicy::default().name().into(), Some(20.0)));
        assert_eq!(r.host, Some(3.0));
        assert!(table(&[r]).contains("0.00x"));
        assert_eq!(seed_002(&[]), None);
    }

    #[test]
    fn seed_001_takes_the_interfered_medians_at_the_most_threads() {
        let s = vec![
            sample("interfered", "mmap-lock", 2, 10.0),
            sample("interfered", "mmap-lock", 2, 30.0),
            sample("interfered", "mmap-lock", 2, 20.0),
            sample("interfered", "mmap-lock", 1, 99.0),
            sample("alone", "per-vma-seq", 2, 999.0),
            sample("interfered", "per-vma-seq", 2, 100.0),
        ];
        let r = seed_001(&s, "per-vma-seq").unwrap();
        assert_eq!(r.old, ("mmap-lock".into(), Some(20.0)));
        assert_eq!(r.new, ("per-vma-seq".into(), Some(100.0)));
        assert_eq!(r.host, None);
        let t = table(&[r]);
        assert!(t.contains("5.00x") && t.contains("2 threads"), "{t}");
    }
}
