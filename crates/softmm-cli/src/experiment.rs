//! What every experiment of the lab provides, so that `softmm bench`
//! finds each in one registry (`registry.rs`) instead of matching names in
//! several places: the workload names it answers to, its sweep (which
//! prints its tables and writes its JSON and plot), and its seed's row of
//! the headline's per-seed table.

use crate::arena::Arena;
use crate::args::{BenchArgs, Limit};
use crate::counters::FaultCounters;
use crate::report::Sample;
use crate::summary::SeedRow;

/// One experiment of the lab: one or more workloads with a sweep of their
/// own (or the shared thread sweep), and at most one seed's headline row.
pub trait Experiment: Sync {
    /// The workload names it answers to on the command line (`softmm
    /// bench NAME`), in the order its help and tables list them.
    fn names(&self) -> &'static [&'static str];

    /// Whether its workloads must be the only ones of a run (its sweep is
    /// its own); otherwise they share the thread sweep with the other
    /// experiments that are not alone.
    fn alone(&self) -> bool;

    /// `softmm bench` for `args.workloads` (all of them its own unless it
    /// runs with others): the sweep, its tables, `--json` and `--plot`;
    /// returns the exit status (1 if a sample failed).
    fn bench(&self, args: &BenchArgs) -> Result<i32, String>;

    /// Its seed's row of the headline's per-seed table (see `summary.rs`),
    /// from a short run of its own or from the headline's samples; `None`
    /// if it measures no seed or its run could not be made.
    fn seed_row(&self, headline: &mut Headline<'_>) -> Option<SeedRow>;
}

/// What the headline run gives the experiments' seed rows.
pub struct Headline<'a> {
    /// The headline's `--duration` or `--iterations`.
    pub limit: Limit,
    /// Samples per design (`--repeat`), the designs taking turns.
    pub repeats: usize,
    /// The headline sweep's samples (pft and interference).
    pub samples: &'a [Sample<FaultCounters>],
    /// The headline sweep's arena, for short runs that fit it.
    pub arena: &'a mut Arena,
}
