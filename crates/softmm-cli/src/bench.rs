//! `softmm bench`: finds the experiments the workloads name in the
//! registry and runs them, or with no workload the headline: the thread
//! sweep of pft and interference, then every experiment's seed row and the
//! replay of a recorded program.

use crate::arena::Arena;
use crate::args::{parse_postings, BenchArgs, Limit};
use crate::counters::FaultCounters;
use crate::experiment::Headline;
use crate::registry::{self, EXPERIMENTS};
use crate::report::Sample;
use crate::{summary, sweep, workloads};

/// Runs `softmm bench`; returns the exit status.
pub fn run(args: &BenchArgs) -> Result<i32, String> {
    workloads::set_shootdown_policy(args.shootdown);
    let postings = parse_postings(&args.posting)?;
    workloads::set_posting_policy(postings[0]);
    workloads::set_postings_label(&postings);
    let names: Vec<&str> = args.workloads.iter().map(|n| n.trim()).filter(|n| !n.is_empty()).collect();
    if args.workloads.is_empty() {
        return sweep::run(
            args,
            Some(&mut |samples: &[Sample<FaultCounters>], arena: &mut Arena, limit: Limit| {
                headline_rows(args, samples, arena, limit)
            }),
        );
    }
    for &n in &names {
        registry::find(n).ok_or_else(|| {
            format!(
                "unknown workload `{n}`: the workloads are {}, or all; and, each alone, {}",
                registry::names(false).join(", "),
                registry::names(true).join(", ")
            )
        })?;
    }
    // An experiment with a sweep of its own runs (and refuses the others'
    // workloads); otherwise the named ones share the thread sweep.
    match EXPERIMENTS.iter().find(|e| e.alone() && names.iter().any(|n| e.names().contains(n))) {
        Some(e) => e.bench(args),
        None => sweep::run(args, None),
    }
}

/// The headline's per-seed table: every experiment's seed row, from the
/// headline sweep's `samples` or a short run of its own.
fn headline_rows(args: &BenchArgs, samples: &[Sample<FaultCounters>], arena: &mut Arena, limit: Limit) -> String {
    eprintln!("softmm: the per-seed experiments ({} repeats each)", args.repeat);
    let mut h = Headline { limit, repeats: args.repeat, samples, arena };
    let mut rows: Vec<_> = EXPERIMENTS.iter().filter_map(|e| e.seed_row(&mut h)).collect();
    // A real program as a workload: a recorded log replayed with its page
    // faults (milliseconds per run).
    eprintln!("softmm: the replay of a recorded program with its page faults");
    match crate::replay::headline::row(args.repeat) {
        Ok(row) => rows.push(row),
        Err(e) => eprintln!("softmm: no replay row: {e}"),
    }
    summary::table(&rows, args.repeat)
}
