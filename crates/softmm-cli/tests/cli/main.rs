//! The `softmm` command: every bench workload for 1-2 threads with tiny
//! sizes (JSON in the documented shape), the plots, the headline, and the
//! replay of recorded strace logs.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const POLICIES: &[&str] = &["mmap-lock", "speculative", "per-vma", "per-vma-seq"];
/// The writer policies, which the fault-policy workloads also take.
const WRITER_POLICIES: &[&str] = &["reserve", "short", "short-spin", "short-collect", "short-own-rcu"];

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `softmm args` in `dir`, killing it after `limit`.
fn softmm_in(dir: &Path, args: &[&str], limit: Duration) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_softmm"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn softmm");
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = Out {
        code: status.and_then(|s| s.code()),
        stdout: t_out.join().expect("stdout reader"),
        stderr: t_err.join().expect("stderr reader"),
    };
    assert!(status.is_some(), "softmm {args:?} ran past {limit:?}\nstdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    out
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softmm-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Checks the JSON shape and returns the samples.
fn check_json(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("json written");
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(keys(&v), set(&["machine", "shootdown", "posting", "samples"]));
    for p in v["posting"].as_str().expect("the posting policies").split(',') {
        assert!(softmm::PostingPolicy::from_name(p).is_some(), "{}", v["posting"]);
    }
    assert!(
        v["shootdown"].as_str().is_some_and(|p| softmm::ShootdownPolicy::from_name(p).is_some()),
        "{}",
        v["shootdown"]
    );
    let m = &v["machine"];
    let machine_keys = keys(m);
    assert!(set(&["cores", "model", "kernel", "softmm_commit"]).is_subset(&machine_keys), "{m}");
    assert!(machine_keys.is_subset(&set(&["cores", "model", "kernel", "softmm_commit", "load_start", "load_end"])));
    // The load average at the start and the end of the run, where /proc has it.
    if Path::new("/proc/loadavg").exists() {
        assert_eq!(m["load_start"].as_array().map(Vec::len), Some(3), "{m}");
        assert_eq!(m["load_end"].as_array().map(Vec::len), Some(3), "{m}");
    }
    assert!(m["cores"].as_u64().unwrap() >= 1);
    for k in ["model", "kernel", "softmm_commit"] {
        assert!(!m[k].as_str().unwrap().is_empty(), "machine.{k}");
    }
    let samples = v["samples"].as_array().expect("samples").clone();
    let all_counters = set(&[
        "faults",
        "mmap_lock_acquisitions",
        "mmap_lock_writes",
        "flush_requests",
        "flush_wait_ns",
        "shootdowns",
        "local_shootdowns",
        "barriers",
        "barriers_joined",
        "flush_shared_writes",
        "spec_attempts",
        "spec_aborts",
        "fallbacks",
        "shared_writes",
        "range_writes",
        "range_conflicts",
    ]);
    for s in &samples {
        let mut k = keys(s);
        // The sample's CPU share, where it ran long enough to measure.
        if k.remove("cpu") {
            assert_eq!(keys(&s["cpu"]), set(&["cores", "others", "used", "tasks"]), "{s}");
            assert!(s["cpu"]["tasks"].as_u64().unwrap() >= s["threads"].as_u64().unwrap(), "{s}");
        }
        assert_eq!(
            k,
            set(&["workload", "mode", "policy", "threads", "repeat", "ops", "seconds", "ops_per_sec", "counters"]),
            "{s}"
        );
        let ops = s["ops"].as_u64().unwrap();
        let secs = s["seconds"].as_f64().unwrap();
        let rate = s["ops_per_sec"].as_f64().unwrap();
        assert!(ops > 0 && secs > 0.0, "{s}");
        assert!((rate - ops as f64 / secs).abs() <= 1e-6 * rate, "{s}");
        let policy = s["policy"].as_str().unwrap();
        let c = keys(&s["counters"]);
        assert!(c.is_subset(&all_counters), "{s}");
        if policy == "host" {
            assert_eq!(c, set(&["faults"]), "{s}");
        } else {
            assert!(POLICIES.contains(&policy) || WRITER_POLICIES.contains(&policy), "{s}");
            for k in ["faults", "mmap_lock_acquisitions", "flush_requests", "flush_wait_ns"] {
                assert!(c.contains(k), "{k} missing in {s}");
            }
            let lock_free = policy != "mmap-lock";
            for k in ["spec_attempts", "spec_aborts", "fallbacks"] {
                assert_eq!(c.contains(k), lock_free, "{k} in {s}");
            }
            assert_eq!(c.contains("shared_writes"), cfg!(feature = "shared-write-stats"), "{s}");
        }
    }
    samples
}

/// Runs one workload for every policy and the host at 1 and 2 threads and
/// checks that every (mode, policy, threads) has a sample.
fn bench(workload: &str, modes: &[&str], extra: &[&str]) -> Vec<Value> {
    bench_sized(workload, "1M", modes, extra)
}

fn bench_sized(workload: &str, size: &str, modes: &[&str], extra: &[&str]) -> Vec<Value> {
    let dir = scratch(workload);
    let json = dir.join("out.json");
    let json_s = json.to_str().unwrap();
    let mut args = vec!["bench", workload, "--threads", "1,2", "--iterations", "2", "--size", size, "--json", json_s];
    args.extend_from_slice(extra);
    let out = softmm_in(&dir, &args, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("ops/s") && out.stdout.contains(workload), "{}", out.stdout);
    let samples = check_json(&json);
    let mut want = BTreeSet::new();
    for m in modes {
        for p in POLICIES.iter().chain(&["host"]) {
            for t in [1, 2] {
                want.insert((m.to_string(), p.to_string(), t));
            }
        }
    }
    let got: BTreeSet<(String, String, u64)> = samples
        .iter()
        .map(|s| {
            assert_eq!(s["workload"], workload);
            (
                s["mode"].as_str().unwrap().to_string(),
                s["policy"].as_str().unwrap().to_string(),
                s["threads"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: BTreeSet<(String, String, u64)> = want.into_iter().collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
    samples
}

mod bench;
mod replay;
