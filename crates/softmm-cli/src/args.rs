//! `softmm bench`'s arguments and their parsers: sizes, thread counts,
//! the policy lists every softmm address space of a run takes, and how long
//! a sample runs.
//!
//! A leaf: it imports nothing else of the lab (the experiments read these
//! arguments; `main.rs` adds the help's seed list).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use softmm::PlacementPolicy;

/// How long each task of a sample runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// Until this much time has passed (the current iteration completes).
    Duration(Duration),
    /// This many loop iterations per task.
    Iterations(u64),
}

impl Limit {
    /// The duration of a run that must be timed: the limit's, or 500 ms
    /// for an iteration count.
    pub fn duration_or_default(self) -> Duration {
        match self {
            Limit::Duration(d) => d,
            Limit::Iterations(_) => Duration::from_millis(500),
        }
    }
}

/// `softmm bench` options.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench")]
pub struct BenchArgs {
    /// Workloads, comma-separated or repeated: pft, page-fault1, page-fault2,
    /// page-fault3, mmap1, mmap2, tlb-flush, interference, cortenmm,
    /// madvise-flags and mremap-move (a split and a merge per operation, by
    /// `madvise` flags or an `mremap` move: the writer policies' range
    /// paths), big-munmap (seed 002), or all; or alone, each with its own sweep:
    /// pin (seed 004), migrate (seed 003), or hugetlb-fault, hugetlb-fork
    /// and hugetlb-fork-fault (seed 000; --threads counts instances; the
    /// host rows grow the host's huge-page pool for the run, as root).
    /// None: the headline experiment (pft and interference for every fault
    /// policy and the host, plotted to softmm-results.svg, then one row per
    /// seed).
    #[arg(value_delimiter = ',')]
    pub workloads: Vec<String>,

    /// Policies: names (comma-separated), `all`, or `default` (the library's
    /// default, recorded under its real name); `host` alone runs only the
    /// host. Each workload takes its own kind of policy (listed below).
    #[arg(long, default_value = "all")]
    pub policy: String,

    /// Thread counts, e.g. `1,2,4` or `1-8` [default: 1 to the number of
    /// CPUs; migrate: one accessor per CPU but one].
    #[arg(long)]
    pub threads: Option<String>,

    /// Seconds per sample.
    #[arg(long, default_value_t = 0.5)]
    pub duration: f64,

    /// Loop iterations per task instead of a duration (one map/touch/unmap
    /// cycle, one pass over a slice, one page, or one 16 KiB region operation).
    #[arg(long)]
    pub iterations: Option<u64>,

    /// Samples per configuration, the policies taking turns (the tables
    /// show the median and the min-max).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,

    /// Modes, comma-separated: `threads`/`processes` for page-fault1-3,
    /// mmap1-2 and tlb-flush; CortenMM operations (`mmap-low`, `pf-high`, ...)
    /// for cortenmm; `fault`, `mmap`, `maps`, `fault-other-mm`, `alone` for
    /// big-munmap; `alone`, `interfered` for pin. Workloads run in their
    /// default modes where none applies.
    #[arg(long, value_delimiter = ',')]
    pub mode: Vec<String>,

    /// Region size: per mapping for page-fault1-3, mmap1-2 and the mmap
    /// thread of interference; per thread for pft and interference's faulters;
    /// per task (at most 1 MiB) for tlb-flush; the region unmapped by
    /// big-munmap, pinned by pin, migrated by migrate; the shared file of the
    /// hugetlb workloads. Suffixes K, M, G [default: 128M; 8G for big-munmap
    /// and pin, 64M for migrate, 1G for hugetlb-*].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,

    /// Write every sample and the machine description as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Plot throughput against threads (.svg or .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,

    /// Leave out the host rows.
    #[arg(long)]
    pub no_host: bool,

    /// Print every column of the tables, however wide (by default they fit
    /// 100 columns and say which columns they leave out).
    #[arg(long)]
    pub wide: bool,

    /// Try speculative faults even with one CPU attached (MmConfig::force_speculative).
    #[arg(long)]
    pub force_speculative: bool,

    /// Which CPUs a TLB shootdown waits for, in every softmm address space
    /// of the run: `access-sections` (default: only CPUs inside an access)
    /// or `next-access` (softmm's first protocol: every attached CPU of
    /// another thread, until its next access).
    #[arg(long, default_value = "access-sections", value_parser = parse_shootdown)]
    pub shootdown: softmm::ShootdownPolicy,

    /// How each node's free frames are kept, in every softmm arena of the
    /// sweep: `node` (default: one list and lock per node, which every
    /// thread cache refills from) or `striped` (one list per CPU slot,
    /// each thread refilling from its own first).
    #[arg(long, default_value = "node", value_parser = parse_free_lists)]
    pub free_lists: softmm::FreeLists,

    /// Where non-fixed mmaps go, comma-separated, a sweep dimension of the
    /// softmm rows of the fault-policy workloads: `linux` (default: as
    /// Linux, top-down), `arenas` (the calling thread's 1 GiB arena first;
    /// its rows are named `policy+arenas`), or `all`.
    #[arg(long, default_value = "linux", value_parser = parse_placements)]
    pub placement: Placements,
    /// How TLB shootdowns post their requests, in every softmm address
    /// space: posting policy names (comma-separated), `all`, or `default`.
    /// With several, each softmm policy runs under each, the rows named
    /// `<policy>+<posting>`, taking turns as the policies do.
    #[arg(long, default_value = "default")]
    pub posting: String,
    /// tlb-flush: softmm's rows are one per `madvise` policy named here
    /// (comma-separated: mmap-lock, per-vma; or all, default) instead of one
    /// per fault policy, faults under the default fault policy; the rows are
    /// named `madvise-<policy>`. E.g. `softmm bench tlb-flush --madvise all`
    /// shows `MADV_DONTNEED` under `mmap_lock` against per-VMA.
    #[arg(long, value_delimiter = ',')]
    pub madvise: Vec<String>,
    /// hugetlb-fork and hugetlb-fork-fault: microseconds each forker spins
    /// after its child exits, before it unmaps the area, on the host and on
    /// softmm alike, as a slower fork would keep its mapping: how often a
    /// faulter finds a populated shared table depends on how much of the
    /// time forkers hold one (docs/architecture.md, "hugetlb").
    #[arg(long, default_value_t = 0)]
    pub fork_hold: u64,
}

/// The `--placement` values, in the library's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placements(pub Vec<PlacementPolicy>);

/// A `--placement` value: `PlacementPolicy` names, `all` or `default`.
pub fn parse_placements(s: &str) -> Result<Placements, String> {
    let mut named = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "all" => named.extend_from_slice(PlacementPolicy::ALL),
            "default" => named.push(PlacementPolicy::default()),
            _ => named.push(PlacementPolicy::from_name(name).ok_or_else(|| {
                let names: Vec<_> = PlacementPolicy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown placement {name:?} (one of: {}; or all, default)", names.join(", "))
            })?),
        }
    }
    let out: Vec<_> = PlacementPolicy::ALL.iter().copied().filter(|p| named.contains(p)).collect();
    if out.is_empty() {
        return Err("no placement".into());
    }
    Ok(Placements(out))
}

/// The `--posting` values: names, `all` or `default`.
pub fn parse_postings(s: &str) -> Result<Vec<softmm::PostingPolicy>, String> {
    use softmm::PostingPolicy;
    let out = parse_policy_list(
        s.split(','),
        PostingPolicy::ALL,
        PostingPolicy::default(),
        |name| PostingPolicy::from_name(name).map(|p| vec![p]),
        |name| {
            let names: Vec<_> = PostingPolicy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown posting policy {name:?} (one of: {}; or all, default)", names.join(", "))
        },
    )?;
    if out.is_empty() {
        return Err("no posting policy".into());
    }
    Ok(out)
}

/// A list of policies of one kind, as every `--policy`-like option takes
/// it: each item (trimmed; empty ones skipped) is `all` (every one of
/// `all`), `default`, or a name `by_name` knows (which may stand for
/// several policies, or none); each policy comes once, in the order named.
/// An item `by_name` does not know is an error worded by `unknown`: each
/// option names its own kind of policy (and its messages are pinned by the
/// CLI tests).
pub fn parse_policy_list<P: Clone + PartialEq>(
    items: impl IntoIterator<Item = impl AsRef<str>>,
    all: &[P],
    default: P,
    by_name: impl Fn(&str) -> Option<Vec<P>>,
    unknown: impl Fn(&str) -> String,
) -> Result<Vec<P>, String> {
    let mut out: Vec<P> = Vec::new();
    for item in items {
        let name = item.as_ref().trim();
        let add = match name {
            "" => continue,
            "all" => all.to_vec(),
            "default" => vec![default.clone()],
            _ => by_name(name).ok_or_else(|| unknown(name))?,
        };
        for p in add {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// A `--shootdown` value: a `ShootdownPolicy` name.
pub fn parse_shootdown(s: &str) -> Result<softmm::ShootdownPolicy, String> {
    softmm::ShootdownPolicy::from_name(s).ok_or_else(|| {
        let names: Vec<_> = softmm::ShootdownPolicy::ALL.iter().map(|p| p.name()).collect();
        format!("unknown shootdown policy {s:?} (one of: {})", names.join(", "))
    })
}

/// A `--free-lists` value: a `FreeLists` name.
pub fn parse_free_lists(s: &str) -> Result<softmm::FreeLists, String> {
    softmm::FreeLists::from_name(s).ok_or_else(|| {
        let names: Vec<_> = softmm::FreeLists::ALL.iter().map(|p| p.name()).collect();
        format!("unknown free-list policy {s:?} (one of: {})", names.join(", "))
    })
}

/// `4096`, `16K`, `128M`, `1G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix in `{s}` (K, M or G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let v: u64 = num.trim().parse().map_err(|_| format!("not a size: `{s}`"))?;
    if v == 0 {
        return Err("the size must not be zero".into());
    }
    Ok(v * mult)
}

/// `1,2,4`, `1-8`: thread counts, each at least 1.
pub fn parse_threads(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("bad thread count `{part}`");
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
            if a == 0 || b < a {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            let n: usize = part.parse().map_err(|_| bad())?;
            if n == 0 {
                return Err(bad());
            }
            out.push(n);
        }
    }
    if out.is_empty() {
        return Err("no thread counts".into());
    }
    out.dedup();
    Ok(out)
}

impl BenchArgs {
    /// The thread counts `--threads` names, or `default`.
    pub fn thread_counts(&self, default: impl FnOnce() -> Vec<usize>) -> Result<Vec<usize>, String> {
        match &self.threads {
            Some(s) => parse_threads(s),
            None => Ok(default()),
        }
    }

    /// `--repeat`, refused if zero.
    pub fn repeats(&self) -> Result<usize, String> {
        match self.repeat {
            0 => Err("--repeat must be at least 1".into()),
            n => Ok(n),
        }
    }

    /// How long a sample runs: `--iterations`, else `--duration` (each
    /// refused if not positive).
    pub fn limit(&self) -> Result<Limit, String> {
        if !(self.duration > 0.0 && self.duration.is_finite()) {
            return Err("--duration must be positive".into());
        }
        match self.iterations {
            Some(0) => Err("--iterations must be at least 1".into()),
            Some(n) => Ok(Limit::Iterations(n)),
            None => Ok(Limit::Duration(Duration::from_secs_f64(self.duration))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `all`, `default` and names, each policy once in the order named,
    /// empty items skipped, a name standing for none, and the caller's
    /// wording for an unknown name.
    #[test]
    fn a_policy_list_takes_all_default_and_names_once() {
        let parse = |s: &str| {
            parse_policy_list(
                s.split(','),
                &[1, 2, 3],
                2,
                |n| match n {
                    "one" => Some(vec![1]),
                    "three" => Some(vec![3]),
                    "host" => Some(vec![]),
                    _ => None,
                },
                |n| format!("no {n}"),
            )
        };
        assert_eq!(parse("three, default,,three"), Ok(vec![3, 2]));
        assert_eq!(parse("one,all"), Ok(vec![1, 2, 3]));
        assert_eq!(parse("host"), Ok(vec![]));
        assert_eq!(parse("one,four"), Err("no four".to_string()));
    }

    #[test]
    fn sizes_threads_placements() {
        assert_eq!(parse_size("128M"), Ok(128 << 20));
        assert_eq!(parse_size("16k"), Ok(16 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert_eq!(parse_threads("1,2,4"), Ok(vec![1, 2, 4]));
        assert_eq!(parse_threads("1-3,8"), Ok(vec![1, 2, 3, 8]));
        assert!(parse_threads("0").is_err());
        let both = Placements(vec![PlacementPolicy::Linux, PlacementPolicy::Arenas]);
        assert_eq!(parse_placements("arenas,linux"), Ok(both.clone()));
        assert_eq!(parse_placements("all"), Ok(both));
        assert_eq!(parse_placements("default"), Ok(Placements(vec![PlacementPolicy::Linux])));
        assert!(parse_placements("nope").unwrap_err().contains("arenas"));
    }

    #[test]
    fn repeats_and_limits_refuse_zero() {
        let args = |a: &[&str]| BenchArgs::try_parse_from([&["bench"], a].concat()).expect("parses");
        assert_eq!(args(&[]).repeats(), Ok(3));
        assert!(args(&["--repeat", "0"]).repeats().is_err());
        assert_eq!(args(&["--iterations", "4"]).limit(), Ok(Limit::Iterations(4)));
        assert_eq!(args(&["--duration", "0.25"]).limit(), Ok(Limit::Duration(Duration::from_millis(250))));
        assert!(args(&["--iterations", "0"]).limit().is_err());
        assert!(args(&["--duration", "0"]).limit().is_err());
        assert_eq!(args(&["--threads", "2-3"]).thread_counts(|| vec![1]), Ok(vec![2, 3]));
        assert_eq!(args(&[]).thread_counts(|| vec![1]), Ok(vec![1]));
    }
}
