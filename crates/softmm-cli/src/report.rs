//! Samples, the terminal table and the JSON file.
//!
//! JSON shape: `{"machine": {"cores", "model", "kernel", "softmm_commit",
//! "load_start", "load_end"}, "shootdown", "posting", "samples": [{"workload", "mode",
//! "policy", "threads", "repeat", "ops", "seconds", "ops_per_sec",
//! "counters": {...}, "cpu": {"cores", "others", "used", "tasks"}}]}`;
//! `shootdown` is the `--shootdown` policy every softmm address space of the
//! run used, `posting` its `--posting` policies (comma-separated; with
//! several, a softmm sample's `policy` is `<policy>+<posting>`); counters are totals for the sample and absent where they do
//! not apply; `cpu` is the sample's [`CpuShare`].
//!
//! Every table is a [`Table`]: at most 100 columns unless `--wide`, its
//! legend built from the columns it shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::counters::Counters;
use crate::machine::{CpuShare, Machine};
use crate::stats::{self, si};
use crate::table::wrap;
use crate::workload::Workload;

/// One measurement, with its experiment's counters `C`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample<C> {
    /// Workload name.
    pub workload: String,
    /// Mode (`threads`, `processes`, `alone`, `interfered`, a CortenMM operation).
    pub mode: String,
    /// A fault policy's name, or `host`.
    pub policy: String,
    /// Tasks.
    pub threads: usize,
    /// Repetition index.
    pub repeat: usize,
    /// Operations.
    pub ops: u64,
    /// Seconds.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_sec: f64,
    /// Totals, the experiment's own.
    pub counters: C,
    /// CPU seconds of the tasks (table only).
    #[serde(skip)]
    pub cpu_seconds: f64,
    /// The CPUs the sample had (what other processes left it), where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuShare>,
}

/// Everything a run wrote.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results<C> {
    /// Where it ran.
    pub machine: Machine,
    /// Every sample.
    pub samples: Vec<Sample<C>>,
    /// The `--shootdown` policy every softmm address space of the run used
    /// (absent from files written before it was recorded).
    #[serde(default)]
    pub shootdown: String,
    /// The run's `--posting` policies, comma-separated.
    #[serde(default)]
    pub posting: String,
}

/// The samples of one table row (same workload, mode, policy, threads).
pub struct Row<'a, C> {
    /// The samples, one per repeat.
    pub samples: Vec<&'a Sample<C>>,
}

impl<C> Row<'_, C> {
    /// The first sample (every one has the row's workload, mode, policy
    /// and threads).
    pub fn first(&self) -> &Sample<C> {
        self.samples[0]
    }

    fn rates(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().map(|s| s.ops_per_sec)
    }

    /// Median throughput.
    pub fn median(&self) -> f64 {
        stats::median(self.rates()).expect("non-empty row")
    }

    /// `min-max` of the rates.
    pub fn min_max(&self) -> String {
        let (lo, hi) = stats::range(self.rates()).expect("non-empty row");
        format!("{}-{}", si(lo), si(hi))
    }

    /// The operations of every repeat.
    pub fn ops(&self) -> u64 {
        self.samples.iter().map(|s| s.ops).sum()
    }

    /// The counters of every repeat, added up.
    pub fn counters(&self) -> C
    where
        C: Counters,
    {
        let mut c = C::default();
        for s in &self.samples {
            c.add(&s.counters);
        }
        c
    }

    /// Operations per CPU second of the tasks.
    pub fn per_cpu_second(&self) -> Option<f64> {
        let cpu: f64 = self.samples.iter().map(|s| s.cpu_seconds).sum();
        (cpu > 0.0).then(|| self.ops() as f64 / cpu)
    }
}

/// The kind of policy a workload's rows name (see `seeds::POLICIES`).
pub fn policy_kind(workload: &str) -> &'static str {
    match workload {
        "big-munmap" => "unmap",
        "pin" => "pin",
        "migrate" => "migrate",
        w if w.starts_with("hugetlb-") => "hugetlb",
        _ => "fault",
    }
}

/// A row's place among its workload's policies: the library's order, the
/// host last.
/// A `+placement` row (see `workloads::policy_label`) comes right after its
/// policy's.
fn policy_rank(workload: &str, p: &str) -> usize {
    // tlb-flush --madvise's rows, in the library's order after the fault
    // policies'; a placed row right after its Linux-placed one.
    let (base, placed) = p.split_once('+').map_or((p, false), |(base, _)| (base, true));
    let kind = if base.starts_with("madvise-") { "madvise" } else { policy_kind(workload) };
    let offset = if kind == "madvise" { 2 * crate::seeds::POLICIES.len() } else { 0 };
    crate::seeds::names(kind)
        .iter()
        .position(|q| *q == base)
        .map_or(usize::MAX - 1, |i| offset + 2 * i + usize::from(placed))
}

fn workload_rank(w: &str) -> usize {
    Workload::ALL.iter().position(|q| q.name() == w).unwrap_or(usize::MAX)
}

fn mode_rank(w: &str, m: &str) -> usize {
    Workload::from_name(w).and_then(|w| w.modes().iter().position(|q| *q == m)).unwrap_or(usize::MAX)
}

/// Groups samples into rows, in workload, mode, policy (host last), threads order.
pub fn rows<C>(samples: &[Sample<C>]) -> Vec<Row<'_, C>> {
    type Key = (usize, String, usize, String, usize, String, usize);
    let mut map: BTreeMap<Key, Vec<&Sample<C>>> = BTreeMap::new();
    for s in samples {
        let key = (
            workload_rank(&s.workload),
            s.workload.clone(),
            mode_rank(&s.workload, &s.mode),
            s.mode.clone(),
            policy_rank(&s.workload, &s.policy),
            s.policy.clone(),
            s.threads,
        );
        map.entry(key).or_default().push(s);
    }
    map.into_values().map(|samples| Row { samples }).collect()
}

/// The median of the samples of `workload`/`mode`/`policy` at `threads`.
pub fn median<C>(samples: &[Sample<C>], workload: &str, mode: &str, policy: &str, threads: usize) -> Option<f64> {
    rows(samples)
        .into_iter()
        .find(|r| {
            let s = r.samples[0];
            s.workload == workload && s.mode == mode && s.policy == policy && s.threads == threads
        })
        .map(|r| r.median())
}

/// The CPUs free for the row's samples (median), `!` where one was short.
pub fn cpus_cell<C>(samples: &[&Sample<C>]) -> String {
    let mut free: Vec<f64> = samples.iter().filter_map(|s| s.cpu.map(|c| c.free())).collect();
    if free.is_empty() {
        return "-".into();
    }
    free.sort_by(f64::total_cmp);
    let short = samples.iter().any(|s| s.cpu.is_some_and(|c| c.short()));
    format!("{:.2}{}", free[free.len() / 2], if short { "!" } else { "" })
}

/// The gloss of the `cpus` column every sweep table shows.
pub const CPUS_GLOSS: &str = "CPUs free for the samples (the CPUs this process may use less the time other \
                              processes and the hypervisor took on them meanwhile; median of the repeats), `!` \
                              where a sample had well under a CPU per thread (see the warnings)";

/// Warnings for the samples that had well under a CPU per thread, one line
/// per table row naming each short sample's free CPUs (empty if none).
pub fn cpu_warnings<C>(samples: &[Sample<C>]) -> String {
    let short = samples.iter().filter(|s| s.cpu.is_some_and(|c| c.short())).count();
    if short == 0 {
        return String::new();
    }
    let mut out = wrap(
        &format!(
            "warning: {short} of {} samples had well under a CPU per task: other processes used the CPUs, \
             so their rates measure the machine's load too (rerun on an idle machine). CPUs free for \
             each such sample (#repeat), of {}:",
            samples.len(),
            samples.iter().find_map(|s| s.cpu.map(|c| c.cores)).unwrap_or(0)
        ),
        "  ",
    );
    for row in rows(samples) {
        let s = row.first();
        let bad: Vec<String> = row
            .samples
            .iter()
            .filter_map(|x| x.cpu.filter(|c| c.short()).map(|c| format!("#{} {:.2}", x.repeat, c.free())))
            .collect();
        if let (false, Some(c)) = (bad.is_empty(), s.cpu) {
            out.push_str(&wrap(
                &format!(
                    "  {} {} {}, {} thr, {} task{}: {}",
                    s.workload,
                    s.mode,
                    s.policy,
                    s.threads,
                    c.tasks,
                    if c.tasks == 1 { "" } else { "s" },
                    bad.join(", ")
                ),
                "    ",
            ));
        }
    }
    out
}

/// The stderr note of one sample whose CPUs fell short.
pub fn cpu_note(cpu: Option<CpuShare>) -> String {
    match cpu {
        Some(c) if c.short() => format!(
            " (warning: {:.2} of {} CPUs free for {} tasks: others used {:.2})",
            c.free(),
            c.cores,
            c.tasks,
            c.others
        ),
        _ => String::new(),
    }
}

/// Writes `results` as JSON to `path`, if one was given (`--json`), and
/// says so.
pub fn save_json<C: Serialize>(path: Option<&std::path::Path>, results: &Results<C>) -> Result<(), String> {
    if let Some(path) = path {
        write_json(path, results)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Writes `results` as JSON, with the run's `--shootdown` and `--posting` policies.
pub fn write_json<C: Serialize>(path: &std::path::Path, results: &Results<C>) -> Result<(), String> {
    // Through a `Value`, whose keys are sorted, as they always were.
    let v = serde_json::to_value(results).map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}
