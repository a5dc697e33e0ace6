//! `softmm`: the softmm lab.
//!
//! * `softmm` (or `softmm bench` with no workload): the headline experiment —
//!   pft and interference for every fault policy and the host at 1..=nproc
//!   threads; prints the table and writes `softmm-results.svg`.
//! * `softmm bench WORKLOAD...`: the fault-scalability workloads side by side
//!   with the host kernel (table, `--json`, `--plot`).
//! * `softmm replay LOG`: replays an strace log of real programs against
//!   softmm address spaces (one per process) and compares every result;
//!   `softmm replay --run -- CMD ARGS...` records CMD with strace first.

mod arena;
mod args;
mod bench;
mod counters;
mod experiment;
mod machine;
mod plot;
mod registry;
mod replay;
mod report;
mod seeds;
mod stats;
mod summary;
mod sweep;
mod table;
mod workload;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// softmm's VMA trees and VMAs live on the heap, and with several address
/// spaces their memory is often freed by a thread other than the one that
/// allocated it (epoch-deferred frees run wherever the collector runs).
/// glibc's malloc then contends on the owning arena's lock; mimalloc frees
/// remotely without a lock, like the kernel's per-CPU slab caches that the
/// host rows get. See docs/architecture.md for the measurement.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "softmm",
    version,
    about = "The softmm lab: fault-scalability workloads against the host kernel, and strace log replay",
    after_help = "With no command, runs the headline experiment (`softmm bench`): pft and interference for \
                  every fault policy and the host, then one row per seed, the five Linux mm patch series whose \
                  designs the lab compares (`softmm bench --help` cites them and names every policy)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run workloads for fault policies and the host; print a table, write JSON and plots.
    #[command(after_help = seeds::bench_help())]
    Bench(args::BenchArgs),
    /// Replay an `strace -f -y` log of the memory, process and descriptor calls (or of the memory
    /// calls only), or record a command with `--run -- CMD ARGS...` and replay it.
    #[command(after_help = replay_help())]
    Replay(ReplayArgs),
    /// Plot the samples of a `bench --json` file again (.svg or .png).
    Plot {
        /// A file written by `softmm bench --json`.
        json: PathBuf,
        /// The plot to write.
        out: PathBuf,
    },
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The log (`-` for standard input).
    #[arg(required_unless_present = "run", conflicts_with = "run")]
    log: Option<PathBuf>,
    /// Record the command after `--` with `strace -f -y -e TRACE` and replay its log (TRACE below).
    #[arg(long, requires = "cmd")]
    run: bool,
    /// With `--run`: keep the recorded log here.
    #[arg(long, requires = "run", value_name = "LOG")]
    save: Option<PathBuf>,
    /// With `--run`: the command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    cmd: Vec<String>,
    /// Where non-fixed mmap/mremap calls place their mappings.
    #[arg(long, value_enum, default_value = "recorded")]
    addresses: replay::Addresses,
    /// Print the final mappings in /proc/pid/maps format.
    #[arg(long)]
    maps: bool,
    /// With `--maps`: follow each mapping with its /proc/pid/smaps `VmFlags:` line (`lo` locked,
    /// `lf` lock on fault, `sl` sealed, ...).
    #[arg(long, requires = "maps")]
    vm_flags: bool,
    /// Print every call with softmm's result.
    #[arg(long, short)]
    verbose: bool,
    /// softmm arena size (default: enough for the log's populating calls).
    #[arg(long, value_parser = args::parse_size)]
    arena: Option<u64>,
    /// The recording's page faults, replayed as accesses of their kind at their address on the
    /// faulting thread's CPU, in order with that thread's calls: a `perf.data` file or `perf
    /// script` output of `perf record` with the events FAULT_EVENTS below, run around the strace
    /// line. `--run` records them itself when perf can trace (with `--save LOG`, kept in
    /// LOG's name with the extension `.perf.data`).
    #[arg(long, value_name = "PERF_DATA_OR_SCRIPT", conflicts_with = "run")]
    faults: Option<PathBuf>,
    /// After the replay, run the log as a workload: each recorded thread's calls and faults on a
    /// thread of its own, on a fresh address space per policy, as fast as possible, ordered across
    /// threads only where the log orders them on the same memory. Prints per program and policy
    /// the total and per-thread times, calls and faults per second and the lab's counters; every
    /// result must be the replay's (the log's), else the replay fails. Needs `--addresses
    /// recorded`; with `--faults` (or `--run` with perf) the faults are part of the workload. With
    /// `--run`, a host row: the command run again untraced, its whole time marked as such.
    #[arg(long)]
    bench: bool,
    /// With `--bench`: policies, comma-separated, as the lab's `--policy` names them (fault, unmap,
    /// shootdown-target, madvise, writer and atomic-alignment policies, each with the others at their defaults), or
    /// `all` (every one) or `default`.
    #[arg(long, requires = "bench", default_value = "all", value_name = "POLICIES")]
    policy: String,
    /// With `--bench`: runs per policy (the table gives the median run and the range).
    #[arg(long, requires = "bench", default_value_t = 3)]
    repeat: usize,
    /// With `--bench`: write the machine and every run (times, rates, counters) to this JSON file; with `--run`,
    /// the host's untraced runs of the command too (`"policy": "host"`, `"whole_program": true`).
    #[arg(long, requires = "bench", value_name = "FILE")]
    json: Option<PathBuf>,
    /// With `--bench`: run every process of the log at once, each on its own address space, a fork
    /// child on its parent's copy from the parent's fork, instead of one program after another from
    /// its start (which runs no fork child).
    #[arg(long, requires = "bench")]
    processes: bool,
    /// With `--bench`: draw each program's calls and faults per second under each policy (median,
    /// and the range of the runs) to this `.svg` or `.png` file.
    #[arg(long, requires = "bench", value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Huge pages (2 MiB) in the replay's hugetlb pool (default: as many as the log's successful
    /// hugetlb mappings take at once, or, where an anonymous `MAP_HUGETLB` mapping failed with
    /// ENOMEM, the most its anonymous ones held at once; give the recording host's
    /// `vm.nr_hugepages` where the log shows the pool running out otherwise).
    #[arg(long, value_name = "N")]
    hugepages: Option<u64>,
    /// Compare the final mappings of the log's first pid (its last program; else the last program
    /// with memory calls) with this real
    /// `/proc/PID/maps`, where traced calls made them; each difference is a mismatch.
    #[arg(long, value_name = "MAPS")]
    compare_maps: Option<PathBuf>,
}

/// `softmm replay --help`'s closing text: what to record with.
fn replay_help() -> String {
    format!(
        "TRACE, what --run records, and what to record a log with yourself:\n  \
         strace -f -y -e {} -o LOG CMD\n\n\
         FAULT_EVENTS, what --run records with perf where it can, around that strace line:\n  \
         {}\n\
         (the sys_enter events place each fault among its thread's calls: the two tools' clocks differ)",
        replay::record::TRACE_SET,
        replay::faults::perf_line()
    )
}

fn run_replay(a: &ReplayArgs) -> Result<i32, String> {
    let mut faults = match &a.faults {
        Some(p) => Some(replay::faults::read(p)?),
        None => None,
    };
    let (name, text) = match &a.log {
        None => {
            let rec = replay::record::record(&a.cmd, a.save.as_deref())?;
            println!("recorded `{}` ({})", a.cmd.join(" "), rec.status);
            let name = a.save.as_ref().map_or_else(|| "the recorded log".to_string(), |p| p.display().to_string());
            match rec.faults {
                Ok(f) => faults = Some(f),
                Err(why) => println!("no page faults recorded: {why}"),
            }
            (name, rec.text)
        }
        Some(log) if log.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| format!("stdin: {e}"))?;
            ("-".to_string(), s)
        }
        Some(log) => {
            let bytes = std::fs::read(log).map_err(|e| format!("{}: {e}", log.display()))?;
            (log.display().to_string(), String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let compare_maps = match &a.compare_maps {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?.into()),
        None => None,
    };
    let bench = if a.bench {
        if a.addresses != replay::Addresses::Recorded {
            return Err("--bench needs --addresses recorded".into());
        }
        let policies = replay::bench::parse_policies(&a.policy)?;
        Some(replay::bench::BenchOptions {
            policies,
            repeat: a.repeat,
            json: a.json.clone(),
            plot: a.plot.clone(),
            host: a.run.then(|| a.cmd.clone()),
            processes: a.processes,
        })
    } else {
        None
    };
    let opts = replay::Options {
        addresses: a.addresses,
        maps: a.maps,
        vm_flags: a.vm_flags,
        verbose: a.verbose,
        arena: a.arena,
        faults: faults.map(Into::into),
        compare_maps,
        hugepages: a.hugepages,
        bench,
    };
    let (out, ok) = replay::replay(&name, &text, &opts)?;
    print!("{out}");
    Ok(if ok { 0 } else { 1 })
}

fn replot(json: &std::path::Path, out: &std::path::Path) -> Result<i32, String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    // The plot reads no counters: any experiment's file plots.
    let results: report::Results<serde::de::IgnoredAny> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    plot::plot(out, &results)?;
    println!("wrote {}", out.display());
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        None => args::BenchArgs::try_parse_from(["bench"]).map_err(|e| e.to_string()).and_then(|a| bench::run(&a)),
        Some(Cmd::Bench(a)) => bench::run(a),
        Some(Cmd::Replay(a)) => run_replay(a),
        Some(Cmd::Plot { json, out }) => replot(json, out),
    };
    match r {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("softmm: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_replay_help_names_the_calls_run_records() {
        let mut cmd = super::Cli::command();
        let help = cmd.find_subcommand_mut("replay").expect("replay").render_long_help().to_string();
        let set = crate::replay::record::TRACE_SET;
        assert!(help.contains(set), "{set} missing in\n{help}");
    }
}
