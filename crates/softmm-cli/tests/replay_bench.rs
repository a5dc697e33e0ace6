//! `softmm replay --bench`: a recorded program as a workload under every
//! fault policy, each thread on a thread of its own, with every result
//! checked against the replay's (and so the log's).

use std::path::{Path, PathBuf};
use std::process::Command;

fn logs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs")
}

fn softmm(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_softmm")).args(args).current_dir(logs()).output().expect("run softmm");
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// The names `--policy all` runs: every fault, unmap, shootdown-target,
/// `madvise`, writer, atomic-alignment and host-file coherence policy of
/// the library.
fn every_policy() -> Vec<String> {
    let mut names: Vec<String> = softmm::FaultPolicy::ALL.iter().map(|p| p.name().to_string()).collect();
    names.extend(softmm::UnmapPolicy::ALL.iter().map(|p| p.name().to_string()));
    names.extend(softmm::ShootdownTargets::ALL.iter().map(|p| p.name().to_string()));
    names.extend(softmm::MadvisePolicy::ALL.iter().map(|p| format!("madvise-{}", p.name())));
    names.extend(softmm::WriterPolicy::ALL.iter().map(|p| p.name().to_string()));
    names.extend(softmm::AtomicAlignment::ALL.iter().map(|p| format!("atomics-{}", p.name())));
    names.extend(softmm::HostFileCoherence::ALL.iter().map(|p| format!("host-file-{}", p.name())));
    names
}

/// The Node log (eight threads) and the recorded C program with its page
/// faults, under every policy: every op as in the replay, the JSON has one
/// run per policy and repeat with its counters.
#[test]
fn every_policy_runs_the_log_with_the_recorded_results() {
    let json = std::env::temp_dir().join(format!("softmm-replay-bench-{}.json", std::process::id()));
    let (code, out) =
        softmm(&["replay", "node-workers.log", "--bench", "--repeat", "2", "--json", json.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("program pid 14801: 8 threads, 1541 calls"), "{out}");
    let runs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(runs["machine"]["cores"], std::thread::available_parallelism().unwrap().get(), "{runs}");
    let runs = runs["runs"].as_array().unwrap();
    let policies = every_policy();
    assert_eq!(runs.len(), 2 * policies.len());
    for p in &policies {
        let row = out.lines().find(|l| l.starts_with(&format!("{p} "))).unwrap_or_else(|| panic!("{p}: {out}"));
        assert!(row.trim_end().ends_with(" 0"), "no op differs: {row}");
        let run = runs.iter().find(|r| r["policy"] == p.as_str()).unwrap();
        assert_eq!(run["differed"], 0);
        assert_eq!(run["calls"], 1541);
        assert!(run["counters"]["mmap_lock_acquisitions"].as_u64().unwrap() > 0, "{run}");
        assert_eq!(run["thread_seconds"].as_array().unwrap().len(), 8);
    }
    let _ = std::fs::remove_file(&json);
    // With faults: they are replayed, and counted by the CPUs.
    let (code, out) = softmm(&[
        "replay",
        "inference.log",
        "--faults",
        "inference.faults",
        "--bench",
        "--policy",
        "mmap-lock,per-vma",
        "--repeat",
        "1",
    ]);
    assert_eq!(code, Some(0), "{out}");
    // Calls the replay answers itself (ENODEV for a pipe) are no softmm
    // calls: 19 of the 29.
    assert!(out.contains("`./inference /tmp/rp/inference.maps`: 1 threads, 19 calls, 38 faults"), "{out}");
    assert!(out.contains("`./inference`: 1 threads, 19 calls, 33 faults"), "{out}");
    let bad = softmm(&["replay", "inference.log", "--bench", "--policy", "nope"]);
    assert_eq!(bad.0, Some(2), "{}", bad.1);
    assert!(bad.1.contains("unknown policy `nope`: the policies are mmap-lock,"), "{}", bad.1);
    // An unmap and a shootdown-target policy each run beside a fault policy.
    let (code, out) =
        softmm(&["replay", "node-workers.log", "--bench", "--policy", "lock-free,broadcast,per-vma", "--repeat", "1"]);
    assert_eq!(code, Some(0), "{out}");
    for p in ["lock-free ", "broadcast ", "per-vma "] {
        assert!(out.lines().any(|l| l.starts_with(p) && l.trim_end().ends_with(" 0")), "{p}: {out}");
    }
}

/// `--plot` draws a bar per policy; with `--run`, a host row times the
/// command itself, untraced, and the JSON marks it as the whole program's.
#[test]
fn the_bench_plots_and_times_the_recorded_command_on_the_host() {
    let svg = std::env::temp_dir().join(format!("softmm-replay-bench-{}.svg", std::process::id()));
    let (code, out) = softmm(&[
        "replay",
        "node-workers.log",
        "--bench",
        "--policy",
        "mmap-lock,lock-free",
        "--repeat",
        "1",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    // The background and a bar per policy, each in its kind's colour
    // (fault policies blue, unmap policies orange).
    assert_eq!(drawn.matches("<rect").count(), 3, "{drawn}");
    assert!(drawn.contains(r##"fill="#0072B2""##) && drawn.contains(r##"fill="#E69F00""##), "{drawn}");
    let _ = std::fs::remove_file(&svg);
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("skipped the host row: strace is not installed");
        return;
    }
    let json = std::env::temp_dir().join(format!("softmm-replay-bench-host-{}.json", std::process::id()));
    let (code, out) = softmm(&[
        "replay",
        "--run",
        "--bench",
        "--policy",
        "default",
        "--repeat",
        "2",
        "--json",
        json.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "seq 1000 | sort -n | tail -1",
    ]);
    if out.contains("may not be allowed to trace here") {
        eprintln!("skipped the host row: ptrace refused");
        return;
    }
    assert_eq!(code, Some(0), "{out}");
    let host =
        out.lines().find(|l| l.starts_with("host: `sh -c seq 1000 | sort -n | tail -1` itself, untraced, 2 runs"));
    assert!(host.is_some_and(|l| l.contains("ms CPU")), "{out}");
    let runs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let hosts: Vec<_> = runs["runs"].as_array().unwrap().iter().filter(|r| r["policy"] == "host").collect();
    assert_eq!(hosts.len(), 2, "{runs}");
    for h in hosts {
        assert_eq!(h["whole_program"], true);
        assert!(h["seconds"].as_f64().unwrap() > 0.0 && h["cpu_seconds"].as_f64().unwrap() >= 0.0, "{h}");
    }
    let _ = std::fs::remove_file(&json);
}

/// `--processes` runs every process of a multi-process log at once: the
/// fork child's ops too, on the copy its parent's fork made, with every
/// result the replay's.
#[test]
fn every_process_runs_at_once_and_a_fork_child_on_its_parents_copy() {
    let (code, out) = softmm(&["replay", "fork-exec.log", "--bench", "--policy", "default", "--repeat", "1"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("bench: 2 ops of forked children not run"), "{out}");
    let json = std::env::temp_dir().join(format!("softmm-replay-bench-procs-{}.json", std::process::id()));
    let (code, out) = softmm(&[
        "replay",
        "fork-exec.log",
        "--bench",
        "--processes",
        "--policy",
        "mmap-lock,per-vma-seq",
        "--repeat",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("not run"), "{out}");
    // The parent's 28 ops and two threads, the fork child's 2 ops, the
    // exec'd `true`'s 15.
    assert!(out.contains("3 processes at once: 4 threads, 40 calls, 0 faults, 45 ops in all"), "{out}");
    let runs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = runs["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        assert_eq!((r["processes"].as_u64(), r["differed"].as_u64()), (Some(3), Some(0)), "{r}");
    }
    let _ = std::fs::remove_file(&json);
}
