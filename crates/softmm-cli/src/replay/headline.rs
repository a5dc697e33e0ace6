//! The headline's replay row: a real program recorded with its page faults
//! (`tests/logs/fault-threads.log` and `.faults`, from
//! `tests/logs/programs/fault_threads.c`: four threads each mapping 128 KiB,
//! writing every page and unmapping it, 48 times), run as a workload by
//! `softmm replay --bench` under the fault policy before per-VMA locking
//! and under softmm's default.
//!
//! The figure is what the design changes whatever the machine: `mmap_lock`
//! acquisitions per page fault replayed (each thread's faults beside the
//! other threads' `mmap` and `munmap`). The calls and faults per second go
//! in a note: a run takes milliseconds, and on a loaded machine with few
//! CPUs its rate varies more than the designs' differ.

use crate::stats::Figure;
use crate::summary::SeedRow;

use super::bench::{parse_policies, BenchOptions};
use super::{Addresses, Options};

/// The log's name in the report.
const NAME: &str = "tests/logs/fault-threads.log";
/// The recorded calls (strace, `softmm replay --run`'s trace set).
const LOG: &str = include_str!("../../tests/logs/fault-threads.log");
/// Its page faults (`perf script -F tid,time,event,trace` of the log's
/// threads).
const FAULTS: &str = include_str!("../../tests/logs/fault-threads.faults");
/// The row's label in the per-seed table (it is no seed's).
pub const LABEL: &str = "replay of a recorded program";
/// The design before per-VMA locking.
const OLD: &str = "mmap-lock";

/// The row: the log replayed with its faults (every call as recorded),
/// then benched `repeats` times per policy, the policies taking turns.
/// An error if a call or a bench op differed from the recording.
pub fn row(repeats: usize) -> Result<SeedRow, String> {
    let new = softmm::FaultPolicy::default().name();
    let json = std::env::temp_dir().join(format!("softmm-headline-replay-{}.json", std::process::id()));
    let opts = Options {
        addresses: Addresses::Recorded,
        maps: false,
        vm_flags: false,
        verbose: false,
        arena: None,
        faults: Some(FAULTS.into()),
        bench: Some(BenchOptions {
            policies: parse_policies(&format!("{OLD},{new}"))?,
            repeat: repeats.max(1),
            json: Some(json.clone()),
            processes: false,
            plot: None,
            host: None,
        }),
        hugepages: None,
        compare_maps: None,
    };
    let replayed = super::replay(NAME, LOG, &opts);
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    let (out, ok) = replayed?;
    if !ok {
        return Err(format!("the replay of {NAME} differs from its recording:\n{out}"));
    }
    let text = text.map_err(|e| format!("{}: {e}", json.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    let runs = v["runs"].as_array().ok_or("the bench wrote no runs")?;
    // Per policy, in run order: (lock acquisitions per fault, calls and
    // faults per second, calls, faults, threads).
    let per = |policy: &str| -> Vec<(f64, f64, u64, u64, u64)> {
        runs.iter()
            .filter(|r| r["policy"] == policy)
            .filter_map(|r| {
                let (calls, faults) = (r["calls"].as_u64()?, r["faults"].as_u64()?);
                let acq = r["counters"]["mmap_lock_acquisitions"].as_u64()?;
                let secs = r["seconds"].as_f64()?;
                Some((
                    acq as f64 / faults as f64,
                    (calls + faults) as f64 / secs,
                    calls,
                    faults,
                    r["threads"].as_u64()?,
                ))
            })
            .collect()
    };
    let (o, n) = (per(OLD), per(new));
    let &(_, _, calls, faults, threads) = o.first().ok_or("no run of the old policy")?;
    let figure = |policy: &str, runs: &[(f64, f64, u64, u64, u64)], pick: fn(&(f64, f64, u64, u64, u64)) -> f64| {
        Figure { policy: policy.to_string(), values: runs.iter().enumerate().map(|(i, r)| (i + 1, pick(r))).collect() }
    };
    let rate = |runs: &[(f64, f64, u64, u64, u64)], policy: &str| figure(policy, runs, |r| r.1).cell();
    Ok(SeedRow {
        seed: LABEL,
        metric: format!(
            "mmap_lock acquisitions per page fault replayed: {NAME} (a C program, {threads} threads, {calls} calls, \
             {faults} faults, recorded with strace and perf) run by softmm replay --bench, each thread on its own, \
             lower is better"
        ),
        lower_is_better: true,
        old: figure(OLD, &o, |r| r.0),
        new: figure(new, &n, |r| r.0),
        host: None,
        notes: vec![format!(
            "calls and faults per second: old {}, new {}; every call and fault returned its recorded result \
             under both",
            rate(&o, OLD),
            rate(&n, new)
        )],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed log replays with its faults and benches with every
    /// result as recorded; the default policy takes `mmap_lock` for fewer
    /// faults than the old one, which takes it for every one.
    #[test]
    fn the_replay_row_replays_its_log_and_shows_the_lock_counts() {
        let r = row(1).expect("the replay row");
        assert_eq!(r.seed, LABEL);
        let (old, new) = (r.old.median().expect("old"), r.new.median().expect("new"));
        assert!(old >= 1.0, "the old design takes mmap_lock for every fault: {old}");
        assert!(new < old, "the default takes it for fewer faults: {new} against {old}");
        // The per-seed table takes it under its own label.
        let table = crate::summary::table(&[r], 1);
        eprintln!("{table}");
        assert!(table.contains(LABEL), "{table}");
    }
}
