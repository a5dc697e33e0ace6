//! The last table of the headline run: one row per seed (see `seeds.rs`;
//! each experiment makes its seed's row, `Experiment::seed_row`),
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

use crate::machine::cores;
use crate::report::Sample;
use crate::seeds::{self, Seed};
use crate::stats::{fig, Figure};
use crate::table::{wrap, Table};

/// Where the per-seed rows at 16 CPUs are.
pub const SIXTEEN_CPUS: &str = "docs/results/16cpu/README.md";

/// One seed's result in one figure of merit.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRow {
    /// The seed's number, or the row's own label where it is no seed's
    /// (the replay of a recorded program).
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
pub fn figure<C>(samples: &[Sample<C>], policy: &str, value: impl Fn(&Sample<C>) -> Option<f64>) -> Figure {
    Figure {
        policy: policy.to_string(),
        values: samples.iter().filter(|s| s.policy == policy).filter_map(|s| Some((s.repeat, value(s)?))).collect(),
    }
}

/// `2 CPUs`: this machine's.
pub fn cpus_phrase() -> String {
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

/// The table: per seed the old and new design's median (min-max), the
/// host's, the gain, and notes: what the figures measure, the policies,
/// where the repeats disagree.
pub fn table(rows: &[SeedRow], repeats: usize) -> String {
    let mut out = wrap(
        &format!(
            "Per seed (Linux mm patch series; softmm bench --help cites them), and for a recorded \
             program replayed as a workload: the design before the series (old) against softmm's default \
             (new), median of {repeats} repeats (min-max) taken in turns.",
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
        let label = match seeds::SEEDS.iter().find(|s: &&Seed| s.number == r.seed) {
            Some(s) => format!("{} {}", s.number, s.name),
            None => r.seed.to_string(),
        };
        t.row(vec![
            label,
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
