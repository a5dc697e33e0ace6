//! The lab's experiments, one entry each, in the order of the seeds they
//! measure: `softmm bench` finds an experiment here by the workload names
//! it answers to, and the headline asks each for its seed's row.

use crate::experiment::Experiment;
use crate::sweep::{BigMunmap, FaultSweep};
use crate::workloads::hugetlb::Hugetlb;
use crate::workloads::migrate::Migrate;
use crate::workloads::pin::Pin;

/// Every experiment, in seed order (000 to 004), which is the order of the
/// headline's per-seed rows.
pub static EXPERIMENTS: &[&dyn Experiment] = &[&Hugetlb, &FaultSweep, &BigMunmap, &Migrate, &Pin];

/// The experiment that answers to the workload `name`.
pub fn find(name: &str) -> Option<&'static dyn Experiment> {
    EXPERIMENTS.iter().copied().find(|e| e.names().contains(&name))
}

/// The workload names of the experiments that share the thread sweep
/// (`all` left out) or, with `alone`, of those with a sweep of their own.
pub fn names(alone: bool) -> Vec<&'static str> {
    EXPERIMENTS
        .iter()
        .filter(|e| e.alone() == alone)
        .flat_map(|e| e.names().iter().copied())
        .filter(|n| *n != "all")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_finds_one_experiment() {
        let mut seen = Vec::new();
        for e in EXPERIMENTS {
            for n in e.names() {
                assert!(!seen.contains(n), "`{n}` answers to two experiments");
                seen.push(n);
                assert_eq!(find(n).map(|f| f.names()), Some(e.names()), "{n}");
            }
        }
        assert!(find("nope").is_none());
        // The thread sweep's names are the sweep's workloads, in their order.
        let sweep: Vec<&str> = crate::workload::Workload::ALL.iter().map(|w| w.name()).collect();
        assert_eq!(names(false), sweep);
        assert_eq!(names(true), ["hugetlb-fault", "hugetlb-fork", "hugetlb-fork-fault", "migrate", "pin"]);
    }

    #[test]
    fn bench_help_names_every_experiments_workloads() {
        use clap::CommandFactory;
        let help = crate::args::BenchArgs::command().render_long_help().to_string();
        for e in EXPERIMENTS {
            for n in e.names() {
                assert!(help.contains(n), "`{n}` missing in bench --help:\n{help}");
            }
        }
    }
}
