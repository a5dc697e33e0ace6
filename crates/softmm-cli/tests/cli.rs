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
const WRITER_POLICIES: &[&str] = &["reserve", "short", "short-spin"];

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

fn faults(s: &Value) -> u64 {
    s["counters"]["faults"].as_u64().unwrap()
}

#[test]
fn bench_pft() {
    let samples = bench("pft", &["threads"], &[]);
    for s in samples.iter().filter(|s| s["policy"] != "host") {
        // 2 passes over 1 MiB per thread, one fault per page.
        assert_eq!(s["ops"].as_u64().unwrap(), 2 * 256 * s["threads"].as_u64().unwrap(), "{s}");
        assert_eq!(faults(s), s["ops"].as_u64().unwrap(), "{s}");
    }
}

#[test]
fn bench_page_fault1() {
    bench("page-fault1", &["threads", "processes"], &["--mode", "threads,processes"]);
}

#[test]
fn bench_page_fault2() {
    bench("page-fault2", &["threads", "processes"], &["--mode", "threads,processes"]);
}

#[test]
fn bench_page_fault3() {
    let samples = bench("page-fault3", &["threads", "processes"], &["--mode", "threads,processes"]);
    for s in samples.iter().filter(|s| s["policy"] != "host") {
        assert_eq!(faults(s), s["ops"].as_u64().unwrap(), "{s}");
    }
}

#[test]
fn bench_mmap1() {
    // The lab's default size: each mapping must pass the commit check alone
    // in its own arena, never touched.
    let samples = bench_sized("mmap1", "128M", &["threads", "processes"], &["--mode", "threads,processes"]);
    for s in samples.iter().filter(|s| s["policy"] != "host") {
        // Two iterations per task, each one map and one unmap under the write lock.
        assert_eq!(s["ops"].as_u64().unwrap(), 2 * s["threads"].as_u64().unwrap(), "{s}");
        assert!(s["counters"]["mmap_lock_acquisitions"].as_u64().unwrap() >= 2 * s["ops"].as_u64().unwrap(), "{s}");
    }
}

#[test]
fn bench_mmap2() {
    bench_sized("mmap2", "128M", &["threads", "processes"], &["--mode", "threads,processes"]);
}

#[test]
fn bench_tlb_flush() {
    let samples = bench("tlb-flush", &["threads", "processes"], &["--mode", "threads,processes"]);
    for s in samples.iter().filter(|s| s["policy"] != "host") {
        // The write faults the page in, the check after MADV_DONTNEED faults the zero page.
        assert_eq!(faults(s), 2 * s["ops"].as_u64().unwrap(), "{s}");
    }
}

/// The JSON records the `--shootdown` policy of the run, and the table
/// shows the flushes' wait next to their count.
#[test]
fn bench_records_the_shootdown_policy_and_shows_flush_waits() {
    for policy in ["next-access", "access-sections"] {
        let dir = scratch(&format!("shootdown-{policy}"));
        let args = [
            "bench",
            "tlb-flush",
            "--threads",
            "2",
            "--iterations",
            "2",
            "--size",
            "1M",
            "--shootdown",
            policy,
            "--json",
            "out.json",
            "--wide",
        ];
        let out = softmm_in(&dir, &args, Duration::from_secs(60));
        assert_eq!(out.code, Some(0), "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
        let head = out.stdout.lines().find(|l| l.starts_with("policy")).expect("the table");
        assert!(head.contains("flush/op  fwait ns/op"), "{head}");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("out.json")).unwrap()).unwrap();
        assert_eq!(v["shootdown"], policy);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn bench_interference() {
    let samples = bench("interference", &["alone", "interfered"], &[]);
    // Two softmm faulters plus the mapper: the address space is multithreaded.
    let spec = samples
        .iter()
        .find(|s| s["policy"] == "speculative" && s["mode"] == "interfered" && s["threads"] == 1)
        .expect("sample");
    assert!(spec["counters"]["spec_attempts"].as_u64().unwrap() > 0, "{spec}");
}

#[test]
fn bench_cortenmm() {
    let modes = [
        "mmap-low",
        "mmap-high",
        "mmap-pf-low",
        "mmap-pf-high",
        "pf-low",
        "pf-high",
        "unmap-virt-low",
        "unmap-virt-high",
        "unmap-low",
        "unmap-high",
    ];
    let samples = bench("cortenmm", &modes, &[]);
    for s in samples.iter().filter(|s| s["policy"] != "host") {
        // Operations that touch write the 4 pages of a fresh 16 KiB region.
        if ["mmap-pf-low", "mmap-pf-high", "pf-low", "pf-high"].contains(&s["mode"].as_str().unwrap()) {
            assert_eq!(faults(s), 4 * s["ops"].as_u64().unwrap(), "{s}");
        }
    }
}

#[test]
fn bench_default_policy_records_its_name_and_plots() {
    let dir = scratch("plot");
    let args = ["bench", "pft", "--policy", "default", "--threads", "1", "--iterations", "1", "--size", "1M"];
    for (file, magic) in [("p.svg", &b"<svg"[..]), ("p.png", &b"\x89PNG"[..])] {
        let json = dir.join(format!("{file}.json"));
        let mut a = args.to_vec();
        a.extend(["--plot", file, "--json", json.to_str().unwrap()]);
        let out = softmm_in(&dir, &a, Duration::from_secs(30));
        assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
        let bytes = std::fs::read(dir.join(file)).expect("plot written");
        assert!(bytes.len() > 1000 && bytes.starts_with(magic), "{file}: {} bytes", bytes.len());
        let samples = check_json(&json);
        let policies: BTreeSet<&str> = samples.iter().map(|s| s["policy"].as_str().unwrap()).collect();
        // The library's default policy, under its real name, and the host.
        assert_eq!(policies.len(), 2, "{policies:?}");
        assert!(policies.contains("host"));
        assert!(policies.iter().any(|p| POLICIES.contains(p)));
    }
    let out = softmm_in(&dir, &["bench", "pft", "--plot", "p.gif"], Duration::from_secs(10));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    // Plotting again from the JSON.
    let out = softmm_in(&dir, &["plot", "p.svg.json", "again.png"], Duration::from_secs(10));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(std::fs::read(dir.join("again.png")).unwrap().starts_with(b"\x89PNG"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seed 002's experiment: one sample per unmap policy (and the host) and
/// mode, each with the munmap's duration and the other thread's latency
/// percentiles (ordered) and throughput during it and alone.
#[test]
fn bench_big_munmap() {
    let dir = scratch("big-munmap");
    let json = dir.join("out.json");
    let args = ["bench", "big-munmap", "--size", "16M", "--threads", "1", "--duration", "0.02", "--json"];
    let mut args = args.to_vec();
    args.push(json.to_str().unwrap());
    let out = softmm_in(&dir, &args, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("the munmap, and the other threads' operations overlapping it"), "{}", out.stdout);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let samples = v["samples"].as_array().unwrap();
    // `fault-other-mm` (the faulter in a second address space) and `alone`
    // (the other thread idle): the controls of the munmap's duration.
    for mode in ["fault", "mmap", "maps", "fault-other-mm", "alone"] {
        for policy in ["locked", "sectioned", "downgrade", "lock-free", "host"] {
            let s = samples
                .iter()
                .find(|s| s["workload"] == "big-munmap" && s["mode"] == mode && s["policy"] == policy)
                .unwrap_or_else(|| panic!("no {mode}/{policy} sample"));
            let c = &s["counters"];
            let n = |k: &str| c[k].as_u64();
            assert!(n("munmap_ns").is_some_and(|ns| ns > 0), "{s}");
            assert!(n("ops_per_sec").is_some() && n("alone_ops_per_sec").is_some(), "{s}");
            if let (Some(p50), Some(p99), Some(max)) = (n("p50_ns"), n("p99_ns"), n("max_ns")) {
                assert!(p50 <= p99 && p99 <= max, "{s}");
            }
            assert_eq!(n("mmap_lock_acquisitions").is_some(), policy != "host", "{s}");
            // The frees of its gathers; lock-free shoots its range down once.
            assert_eq!(n("munmap_batches").is_some_and(|b| b >= 1), policy != "host", "{s}");
            if policy == "lock-free" {
                assert!(n("munmap_barriers").is_some_and(|b| b <= 1), "{s}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_without_workload_runs_the_headline() {
    let dir = scratch("headline");
    let out =
        softmm_in(&dir, &["bench", "--threads", "1", "--duration", "0.02", "--size", "1M"], Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    for needle in [
        "pft",
        "interference",
        "interfered",
        "vs alone",
        "host",
        "per-vma-seq",
        "softmm-results.svg",
        "Per seed",
        "001 speculative faults",
        "002 big munmap",
        "003 batched migration",
        "004 page pinning",
        "000 hugetlb PMD sharing",
        "load average at the start: ",
        "load average at the end: ",
    ] {
        assert!(out.stdout.contains(needle), "{needle} missing in\n{}", out.stdout);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(out.stdout.contains(&format!(" on {cpus} CPUs")), "{}", out.stdout);
    // Every seed's row: the old design against the default, both measured,
    // the gain, and a note naming both policies.
    let lines: Vec<&str> = out.stdout.lines().collect();
    for (seed, old, new) in [
        ("000 hugetlb PMD sharing", "i-mmap-rwsem", softmm::HugetlbPolicy::default().name()),
        ("001 speculative faults", "mmap-lock", softmm::FaultPolicy::default().name()),
        ("002 big munmap", "locked", softmm::UnmapPolicy::default().name()),
        ("003 batched migration", "one-by-one", "batched"),
        ("004 page pinning", "per-page", softmm::PinPolicy::default().name()),
    ] {
        let i = lines.iter().position(|l| l.starts_with(seed)).unwrap_or_else(|| panic!("no {seed} row"));
        let cells: Vec<&str> = lines[i][seed.len()..].split_whitespace().collect();
        assert!(cells[0] != "-" && cells.last().is_some_and(|g| g.ends_with('x')), "{}", lines[i]);
        let notes = lines[i + 1..].iter().take_while(|l| l.starts_with("    ")).map(|l| l.trim()).collect::<Vec<_>>();
        let notes = notes.join(" ");
        assert!(notes.contains(&format!("old {old}, new {new}")), "{seed}: {notes}");
    }
    // The seeds whose throughput needs more CPUs point to the 16-CPU results.
    assert!(out.stdout.matches("docs/results/16cpu/README.md").count() >= 2, "{}", out.stdout);
    for l in &lines {
        assert!(l.chars().count() <= 100, "{} columns: {l}", l.chars().count());
    }
    let svg = std::fs::read_to_string(dir.join("softmm-results.svg")).expect("headline plot");
    assert!(svg.starts_with("<svg") && svg.contains("interference"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_pin_sweeps_the_pin_policies_with_counters() {
    let dir = scratch("pin");
    let out = softmm_in(
        &dir,
        &["bench", "pin", "--size", "8M", "--threads", "1,2", "--json", "pin.json"],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    for needle in ["per-page", "batched", "per-vma", "interfered", "lock/512", "512.00", "speedup"] {
        assert!(out.stdout.contains(needle), "{needle} missing in\n{}", out.stdout);
    }
    // The host pins through io_uring, or says why not.
    assert!(out.stdout.contains("host"), "{}", out.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pin.json")).expect("json")).expect("valid json");
    let samples = json["samples"].as_array().expect("samples");
    let batched = samples.iter().find(|s| s["policy"] == "batched" && s["mode"] == "alone").expect("a batched sample");
    assert_eq!(batched["counters"]["pages"], 2048);
    assert_eq!(batched["counters"]["mmap_lock_acquisitions"], 4, "one per 512 pages");
    assert_eq!(batched["ops"], 2048);
    let bad = softmm_in(&dir, &["bench", "pin", "--policy", "nope"], Duration::from_secs(10));
    assert_ne!(bad.code, Some(0));
    assert!(bad.stderr.contains("unknown pin policy"), "{}", bad.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_hugetlb_fork_fault_gives_a_forks_and_a_faults_sample_per_instance_count() {
    let dir = scratch("hugetlb");
    let out = softmm_in(
        &dir,
        &[
            "bench",
            "hugetlb-fork-fault",
            "--threads",
            "1,2",
            "--duration",
            "0.05",
            "--repeat",
            "1",
            "--wide",
            "--json",
            "h.json",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    for needle in ["1024 MiB", "softmm PMD sharing: ", "faults/op", "share/op", "unshare/op", "mmap_lock/op"] {
        assert!(out.stdout.contains(needle), "{needle} missing in\n{}", out.stdout);
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("h.json")).expect("json")).expect("valid json");
    let samples = json["samples"].as_array().expect("samples");
    // Every softmm policy: per instance count one forks and one faults
    // sample, with softmm's counters.
    for policy in ["i-mmap-rwsem", "vma-lock", "lock-free"] {
        for t in [1, 2] {
            for mode in ["forks", "faults"] {
                let of: Vec<_> = samples
                    .iter()
                    .filter(|s| s["policy"] == policy && s["threads"] == t && s["mode"] == mode)
                    .collect();
                assert_eq!(of.len(), 1, "{policy}, {t} instances, {mode}: {of:?}");
                let s = of[0];
                assert_eq!(s["workload"], "hugetlb-fork-fault");
                assert!(s["ops"].as_u64().unwrap() > 0 && s["ops_per_sec"].as_f64().unwrap() > 0.0, "{s}");
                for c in [
                    "faults",
                    "mmap_lock_acquisitions",
                    "flush_requests",
                    "pmd_shares",
                    "pmd_unshares",
                    "i_mmap_read",
                    "i_mmap_write",
                    "vma_lock_read",
                    "vma_lock_write",
                    "fault_mutex",
                    "validation_retries",
                ] {
                    assert!(s["counters"][c].as_u64().is_some(), "{c}: {s}");
                }
                // A fork is at least the child's fault; a page written
                // faults at most once.
                let (ops, faults) = (s["ops"].as_u64().unwrap(), s["counters"]["faults"].as_u64().unwrap());
                if mode == "forks" {
                    assert!(faults >= ops, "{s}");
                } else {
                    assert!(faults <= ops, "{s}");
                }
            }
        }
    }
    let host: Vec<_> = samples.iter().filter(|s| s["policy"] == "host").collect();
    if out.stdout.contains("host row skipped") {
        // Not root, or no memory for 512 huge pages: the reason is printed.
        assert!(out.stdout.contains("host cannot give 1024 MiB of huge pages: "), "{}", out.stdout);
        assert!(host.is_empty());
    } else {
        for t in [1, 2] {
            for mode in ["forks", "faults"] {
                let of: Vec<_> = host.iter().filter(|s| s["threads"] == t && s["mode"] == mode).collect();
                assert_eq!(of.len(), 1, "{t} instances, {mode}: {of:?}");
                let s = of[0];
                assert_eq!(s["workload"], "hugetlb-fork-fault");
                assert!(s["ops_per_sec"].as_f64().unwrap() > 0.0, "{s}");
                assert!(s["counters"]["faults"].as_u64().is_some(), "{s}");
                assert!(s["counters"]["htlb_buddy_alloc_success"].as_u64().is_some(), "{s}");
            }
        }
    }
    for (args, needle) in [
        (&["bench", "hugetlb-fault", "--size", "3M"][..], "multiple of 2M"),
        (&["bench", "hugetlb-fault", "--size", "4G"][..], "more than"),
        (&["bench", "hugetlb-fault", "--policy", "mmap-lock"][..], "unknown hugetlb policy `mmap-lock`"),
        (&["bench", "hugetlb-fault,pft"][..], "give only hugetlb-* workloads"),
    ] {
        let bad = softmm_in(&dir, args, Duration::from_secs(10));
        assert_ne!(bad.code, Some(0), "{args:?}");
        assert!(bad.stderr.contains(needle), "{args:?}: {}", bad.stderr);
    }
}

#[test]
fn bench_migrate_runs_both_policies_with_accessors_and_counters() {
    let dir = scratch("migrate");
    let out = softmm_in(
        &dir,
        &["bench", "migrate", "--size", "4M", "--duration", "0.05", "--threads", "1", "--json", "migrate.json"],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    for needle in ["one-by-one", "batched", "flush/page", "accesses/s", "batched vs one-by-one", "host"] {
        assert!(out.stdout.contains(needle), "{needle} missing in\n{}", out.stdout);
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("migrate.json")).expect("json")).expect("valid json");
    let samples = json["samples"].as_array().expect("samples");
    let get = |mode: &str, policy: &str| {
        samples.iter().find(|s| s["mode"] == mode && s["policy"] == policy).unwrap_or_else(|| panic!("{mode} {policy}"))
    };
    for policy in ["one-by-one", "batched"] {
        let m = get("migrate", policy);
        let pages = m["counters"]["pages_migrated"].as_u64().expect("pages_migrated");
        assert!(pages >= 1024, "{policy}: at least one pass over the 1024 pages: {m}");
        assert_eq!(m["ops"].as_u64(), Some(pages));
        let flushes = m["counters"]["flush_requests"].as_u64().expect("flush_requests");
        // One accessor CPU: one request per flush; a flush per page, or per batch of 512.
        if policy == "one-by-one" {
            assert!(flushes >= pages, "{m}");
        } else {
            assert!(flushes * 100 <= pages, "{m}");
        }
        let a = get("accessors", policy);
        assert!(a["ops"].as_u64().unwrap() > 0 && a["counters"]["p99_ns"].as_u64().is_some(), "{a}");
    }
    let bad = softmm_in(&dir, &["bench", "migrate", "--policy", "nope"], Duration::from_secs(10));
    assert_ne!(bad.code, Some(0));
    assert!(bad.stderr.contains("unknown migrate policy"), "{}", bad.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

fn logs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs")
}

fn replay(log: &str, extra: &[&str]) -> Out {
    let path = logs().join(log);
    let mut args = vec!["replay", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    softmm_in(&logs(), &args, Duration::from_secs(30))
}

fn replays_cleanly(log: &str) {
    for mode in ["recorded", "own"] {
        let out = replay(log, &["--addresses", mode]);
        assert_eq!(out.code, Some(0), "{log} --addresses {mode}:\n{}\n{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("OK: 0 mismatches, 0 unparsed lines"), "{}", out.stdout);
        assert!(!out.stdout.contains("MISMATCH"), "{}", out.stdout);
    }
}

#[test]
fn replay_jvm_start() {
    replays_cleanly("java-version.log");
}

#[test]
fn replay_node_worker_threads() {
    replays_cleanly("node-workers.log");
}

#[test]
fn replay_python_threads() {
    replays_cleanly("python-threads.log");
}

#[test]
fn replay_c_realloc() {
    replays_cleanly("c-realloc.log");
    let out = replay("c-realloc.log", &["--maps"]);
    // The buffer grown by mremap was shrunk and unmapped; libc is mapped.
    assert!(out.stdout.contains("/usr/lib/x86_64-linux-gnu/libc.so.6"), "{}", out.stdout);
    assert!(out.stdout.contains("[heap]"), "{}", out.stdout);
    assert!(out.stdout.contains("mremap 7"), "{}", out.stdout);
}

#[test]
fn replay_c_edge_cases() {
    replays_cleanly("c-edge-cases.log");
}

#[test]
fn replay_handwritten_log() {
    replays_cleanly("synthetic.log");
    let out = replay("synthetic.log", &["--maps"]);
    for line in [
        "555555559000-555555569000 rw-p 00000000 00:00 0",
        "7ffff7ddc000-7ffff7dfc000 rw-p 00000000 00:00 0",
        "7ffff7dfe000-7ffff7e00000 r--p 00002000",
        "/data/table.bin",
        "7ffff7e10000-7ffff7e20000 ---p",
    ] {
        assert!(out.stdout.contains(line), "{line} missing in\n{}", out.stdout);
    }
}

#[test]
fn replay_reports_mismatches_with_line_numbers() {
    let dir = scratch("mismatch");
    let log = dir.join("bad.log");
    std::fs::write(
        &log,
        "brk(NULL) = 0x555555559000\n\
         mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7ffff7ff0000\n\
         munmap(0x7ffff7ff1000, 4096) = 0\n\
         mprotect(0x7ffff7ff1000, 4096, PROT_READ) = 0\n\
         mmap(NULL, 4096, PROT_READ, BOGUS_FLAG, -1, 0) = 0x1000\n",
    )
    .unwrap();
    let out = softmm_in(&dir, &["replay", log.to_str().unwrap()], Duration::from_secs(10));
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("MISMATCH line 4: mprotect(0x7ffff7ff1000, 4096, PROT_READ) = 0 recorded, softmm -1 ENOMEM"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("line 5: cannot parse: unknown flag `BOGUS_FLAG`"), "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mremap(MREMAP_MAYMOVE | MREMAP_DONTUNMAP)` of part of an anonymous VMA
/// (once ENOMEM, and with `MREMAP_FIXED` a hang).
#[test]
fn replay_mremap_dontunmap_of_part_of_a_vma() {
    replays_cleanly("dontunmap-part-of-vma.log");
}

#[test]
fn replay_descriptors_whose_first_call_fails() {
    // Each descriptor's first mmap fails (ENOMEM, EINVAL, EEXIST, EOVERFLOW
    // with an offset near 2^63, EACCES) and a later one succeeds; strace
    // marks the unlinked files `N</path>(deleted)`.
    replays_cleanly("fd-first-use-fails.log");
}

/// The `/proc/self/maps` lines (start-end perms) of `maps` that start in
/// `[lo, hi)`.
fn maps_in(maps: &str, lo: u64, hi: u64) -> Vec<String> {
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            (lo <= start && start < hi && perms.len() == 4).then(|| format!("{range} {perms}"))
        })
        .collect()
}

#[test]
fn replay_invents_no_memory_where_the_log_proves_none() {
    // Recorded by attaching to a program that mapped its window first (see
    // programs/record-attached.sh); the program printed the window's maps at
    // its end. Same-size and shrinking mremaps past a VMA's end and a
    // multi-VMA move with a hole succeed on Linux without that memory.
    replays_cleanly("pretrace-remap.log");
    let out = replay("pretrace-remap.log", &["--maps"]);
    let host = std::fs::read_to_string(logs().join("pretrace-remap.maps")).expect("host maps");
    let (lo, hi) = (0x3_0000_0000, 0x3_0008_0000);
    assert_eq!(maps_in(&out.stdout, lo, hi), maps_in(&host, lo, hi), "{}", out.stdout);
    // Each placeholder is reported with the line that proved it.
    assert!(out.stdout.contains("placeholder 300008000-300009000 for line 3 (mremap)"), "{}", out.stdout);
    assert!(out.stdout.contains("placeholder 300043000-300045000 for line 7 (mprotect)"), "{}", out.stdout);
    assert!(!out.stdout.contains("munmap 1 ("), "munmap proves nothing:\n{}", out.stdout);
}

/// Compares each process's final mappings in the replay of `log` with the
/// host's `/proc/self/maps` at its exit (`maps`, appended by the preloaded
/// `programs/dumpmaps.c`): every softmm mapping is the host's (range and
/// permissions, and the path of a file mapping), and every host mapping
/// softmm lacks is one no traced call of that program touched (the
/// executable and its bss, ld.so, `[stack]`, `[vdso]`, `[vvar]`,
/// `[vsyscall]`: mapped by the kernel before tracing began). Returns how many
/// processes it compared.
fn final_maps_match_host(log: &str, maps: &str) -> usize {
    let out = replay(log, &["--maps"]);
    let text = std::fs::read_to_string(logs().join(log)).unwrap();
    // The ranges a pid's successful calls named after its last execve.
    let touched = |pid: &str| -> Vec<(u64, u64)> {
        let num = |s: &str| {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => s.parse().ok(),
            }
        };
        let mut out = Vec::new();
        for l in text.lines().filter(|l| l.starts_with(&format!("{pid} "))) {
            if l.contains("execve(") && l.ends_with("= 0") {
                out.clear();
            }
            let Some((call, ret)) = l.rsplit_once(") = ") else { continue };
            let Some(ret) = num(ret.split_whitespace().next().unwrap_or("")) else { continue };
            let Some((name, args)) =
                call.split_whitespace().nth(1).and_then(|_| call[pid.len()..].trim().split_once('('))
            else {
                continue;
            };
            let a: Vec<u64> = args.split(", ").map(|x| num(x).unwrap_or(0)).collect();
            match name {
                "mmap" => out.push((ret, a[1])),
                "munmap" | "mprotect" | "madvise" => out.push((a[0], a[1])),
                "mremap" => out.extend([(a[0], a[1]), (ret, a[2])]),
                _ => {}
            }
        }
        out
    };
    let host = std::fs::read_to_string(logs().join(maps)).unwrap();
    let fields = |l: &str| -> Option<(String, String, String)> {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 5)
            .then(|| (f[0].to_string(), f[1].to_string(), f.get(5..).map(|p| p.join(" ")).unwrap_or_default()))
    };
    let mut compared = 0;
    for block in host.split("== pid ").skip(1) {
        let (pid, lines) = block.split_once('\n').unwrap();
        let host: Vec<(String, String, String)> = lines.lines().filter_map(fields).collect();
        let header = format!("final mappings of pid {pid} ");
        // The last process of that pid: the program that ran last in it.
        let at = out.stdout.rfind(&header).unwrap_or_else(|| panic!("no maps of pid {pid}:\n{}", out.stdout));
        let mine: Vec<(String, String, String)> = out.stdout[at..]
            .lines()
            .skip(1)
            .take_while(|l| !l.is_empty() && !l.starts_with('('))
            .filter_map(fields)
            .collect();
        for (range, perms, path) in &mine {
            assert!(
                host.iter().any(|(r, p, h)| r == range && p == perms && (path.is_empty() || h == path)),
                "{log}: pid {pid}: softmm's {range} {perms} {path} is not the host's:\n{lines}"
            );
        }
        let touched = touched(pid);
        for (range, perms, path) in &host {
            if mine.iter().any(|(r, _, _)| r == range) {
                continue;
            }
            let (s, e) = range.split_once('-').unwrap();
            let (s, e) = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap());
            let pretrace = !touched.iter().any(|&(a, len)| a < e && s < a.saturating_add(len.max(1)));
            assert!(pretrace, "{log}: pid {pid}: the host's {range} {perms} {path} is missing in softmm");
        }
        compared += 1;
    }
    compared
}

/// Replays `log` cleanly and returns the `process pid ...` lines of its report.
fn process_lines(log: &str) -> Vec<String> {
    replays_cleanly(log);
    let out = replay(log, &[]);
    out.stdout.lines().filter(|l| l.starts_with("process pid ")).map(str::to_string).collect()
}

#[test]
fn replay_shell_pipeline_one_address_space_per_program() {
    // `sh -c 'seq 1000 | sort -n | tail -1'`: sh forks three children that
    // exec; each program's brk(NULL) and mprotect of its own image once
    // mismatched in a single address space.
    let procs = process_lines("pipeline.log");
    for prog in ["`sh -c seq 1000 | sort -n | tail -1`", "`seq 1000`", "`sort -n`", "`tail -1`"] {
        assert!(procs.iter().any(|l| l.contains(prog) && l.contains("0 mismatches")), "{prog} in {procs:#?}");
    }
    assert_eq!(procs.len(), 4, "{procs:#?}");
    // seq, sort and tail (sh exits without running destructors).
    assert_eq!(final_maps_match_host("pipeline.log", "pipeline.maps"), 3);
}

#[test]
fn replay_gcc_compile() {
    // gcc vforks cc1 and as (after failed execve's along PATH).
    let procs = process_lines("gcc-compile.log");
    assert_eq!(procs.len(), 3, "{procs:#?}");
    assert!(procs.iter().any(|l| l.contains("`as --64")), "{procs:#?}");
    assert!(procs.iter().any(|l| l.contains("cc1") || l.contains("/usr/lib/gcc/")), "{procs:#?}");
    assert_eq!(final_maps_match_host("gcc-compile.log", "gcc-compile.maps"), 3);
}

#[test]
fn replay_program_started_through_a_wrapper_script() {
    // programs/wrapper.sh: a subshell fork without exec, then exec of
    // python3.11 with four threads (clone3 CLONE_VM|CLONE_THREAD).
    let procs = process_lines("wrapper-python.log");
    assert!(procs.iter().any(|l| l.contains("`programs/wrapper.sh python3.11") && l.contains("ended by execve")));
    assert!(procs.iter().any(|l| l.contains("`/usr/bin/python3.11 programs/alloc_threads.py`")), "{procs:#?}");
    let out = replay("wrapper-python.log", &[]);
    assert!(out.stdout.contains("3 processes, 2 with memory calls"), "{}", out.stdout);
    assert_eq!(final_maps_match_host("wrapper-python.log", "wrapper-python.maps"), 1);
}

#[test]
fn replay_fork_child_replays_against_its_copy_of_the_parent() {
    // programs/fork_exec.c: the fork child unmaps half of its copy of the
    // parent's mapping and protects the rest; the parent's stays whole (its
    // MAP_FIXED_NOREPLACE over it is EEXIST, its mprotect of it succeeds).
    let procs = process_lines("fork-exec.log");
    assert!(procs.iter().any(|l| l.contains("(fork of pid 3818 at line 20")), "{procs:#?}");
    assert!(procs.iter().any(|l| l.contains("`true` (execve")), "{procs:#?}");
    let out = replay("fork-exec.log", &["--maps"]);
    assert!(out.stdout.contains("final mappings of pid 3819 `./fork_exec` (at its end):"), "{}", out.stdout);
    // The child's half, read-only, as it left it.
    assert!(out.stdout.contains("7f296d5b5000-7f296d5bd000 r--p"), "{}", out.stdout);
}

#[test]
fn replay_without_process_lines_starts_a_program_at_brk_null() {
    // The old `-e trace=mmap,...` set: no execve or clone lines. Each
    // program's first call, brk(NULL), starts a new address space.
    let procs = process_lines("pipeline-memory-only.log");
    assert_eq!(procs.len(), 4, "{procs:#?}");
    let out = replay("pipeline-memory-only.log", &[]);
    assert!(out.stdout.contains("no process lines in the log"), "{}", out.stdout);
    assert_eq!(out.stdout.matches(": a new program, a new address space").count(), 3, "{}", out.stdout);
}

#[test]
fn replay_open_modes_from_descriptor_lines() {
    // programs/open_modes.c: one file opened read-write, read-only,
    // write-only and O_PATH; a reused descriptor number; a dup; a memfd; a
    // fork child; an exec that keeps one descriptor and closes another.
    replays_cleanly("open-modes.log");
    let out = replay("open-modes.log", &[]);
    assert!(out.stdout.contains("open modes from the log's descriptor lines (close 5, dup 2, memfd_create 1, open 9)"));
    // Without the descriptor lines the modes are inferred from the memory
    // calls: the ENOMEM of an mprotect adding write over a hole shows the
    // descriptor was writable (it once came out EACCES), but the reused
    // number's read-only mode and the O_PATH descriptor cannot be told.
    let dir = scratch("modes");
    let log = dir.join("stripped.log");
    let text = std::fs::read_to_string(logs().join("open-modes.log")).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !["openat(", "close(", "dup(", "memfd_create("].iter().any(|c| l.contains(c)))
        .collect();
    std::fs::write(&log, kept.join("\n")).unwrap();
    let out = softmm_in(&dir, &["replay", log.to_str().unwrap()], Duration::from_secs(30));
    assert!(out.stdout.contains("no descriptor lines in the log: open modes inferred"), "{}", out.stdout);
    let mismatches: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("MISMATCH")).collect();
    assert_eq!(mismatches.len(), 2, "{}", out.stdout);
    assert!(mismatches[0].contains("mprotect(0x300020000, 8192, PROT_READ|PROT_WRITE) = -1 EACCES recorded, softmm 0"));
    assert!(mismatches[1].contains("7</tmp/softmm-modes-0tHu26>, 0) = -1 EBADF recorded"), "{mismatches:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_run_records_and_replays_at_once() {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("strace is not installed: replay_run_without_strace_is_a_clear_error covers --run");
        return;
    }
    let dir = scratch("run");
    let saved = dir.join("saved.log");
    let args = ["replay", "--run", "--save", saved.to_str().unwrap(), "--", "sh", "-c", "seq 100 | sort -n | tail -1"];
    let out = softmm_in(&dir, &args, Duration::from_secs(60));
    if out.stderr.contains("strace wrote no log") {
        eprintln!("strace cannot trace here: {}", out.stderr);
        return;
    }
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with("100\nrecorded `sh -c seq 100 | sort -n | tail -1` (exit status 0)"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("from the log's process lines"), "{}", out.stdout);
    assert!(out.stdout.contains("open modes from the log's descriptor lines"), "{}", out.stdout);
    for prog in ["`seq 100`", "`sort -n`", "`tail -1`"] {
        assert!(out.stdout.contains(prog), "{prog} in {}", out.stdout);
    }
    assert!(out.stdout.contains("OK: 0 mismatches, 0 unparsed lines"), "{}", out.stdout);
    let log = std::fs::read_to_string(&saved).expect("the saved log");
    assert!(log.contains("execve(\"/usr/bin/sort\"") || log.contains("execve(\"/bin/sort\""), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_run_without_strace_is_a_clear_error() {
    let dir = scratch("nostrace");
    let out = Command::new(env!("CARGO_BIN_EXE_softmm"))
        .args(["replay", "--run", "--", "true"])
        .env("PATH", &dir)
        .output()
        .expect("spawn softmm");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("strace is not installed (or not on PATH)"), "{err}");
    assert!(err.contains("-e trace=memory,process,open,openat,creat,close,dup,dup2,dup3,memfd_create"), "{err}");
    // A log and --run together, or --run without a command, are usage errors.
    let out = softmm_in(&dir, &["replay", "x.log", "--run", "--", "true"], Duration::from_secs(10));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let out = softmm_in(&dir, &["replay", "--run"], Duration::from_secs(10));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_takes_a_shootdown_policy() {
    let dir = scratch("shootdown");
    for policy in ["access-sections", "next-access"] {
        let args = ["bench", "tlb-flush", "--threads", "2", "--iterations", "1", "--size", "1M", "--no-host"];
        let json = dir.join(format!("{policy}.json"));
        let mut a = args.to_vec();
        a.extend(["--shootdown", policy, "--json", json.to_str().unwrap()]);
        let out = softmm_in(&dir, &a, Duration::from_secs(60));
        assert_eq!(out.code, Some(0), "{policy}: {}\n{}", out.stdout, out.stderr);
        // The flushes' wait time is reported beside their requests.
        for sample in check_json(&json) {
            assert!(sample["counters"]["flush_wait_ns"].is_u64(), "{sample}");
        }
    }
    let bad = softmm_in(&dir, &["bench", "tlb-flush", "--shootdown", "never"], Duration::from_secs(10));
    assert_ne!(bad.code, Some(0));
    assert!(bad.stderr.contains("unknown shootdown policy"), "{}", bad.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--posting all` runs each softmm policy under each posting policy, the
/// rows named `<policy>+<posting>`, with the barriers issued and joined
/// per op in the table and the JSON.
#[test]
fn bench_sweeps_the_posting_policies_with_barrier_counters() {
    let dir = scratch("posting");
    let json = dir.join("out.json");
    let args = [
        "bench",
        "tlb-flush",
        "--threads",
        "2",
        "--iterations",
        "50",
        "--size",
        "1M",
        "--repeat",
        "1",
        // Every CPU asked: under the default targets this workload's
        // shootdowns ask no other CPU, so there would be nothing to post.
        "--policy",
        "broadcast",
        "--posting",
        "all",
        "--no-host",
        "--wide",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = softmm_in(&dir, &args, Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let head = out.stdout.lines().find(|l| l.starts_with("policy")).expect("the table");
    assert!(head.contains("bar/op  join/op"), "{head}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let names: Vec<&str> = softmm::PostingPolicy::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(v["posting"], names.join(","));
    let samples = v["samples"].as_array().unwrap();
    assert_eq!(samples.len(), names.len());
    for (s, p) in samples.iter().zip(&names) {
        assert_eq!(s["policy"], format!("broadcast+{p}"), "{s}");
        let c = &s["counters"];
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}"));
        // 2 flushes per op, each asking the other thread's CPU: covered by
        // a barrier issued or joined, or, adaptive, by the CPU's fences.
        assert!(n("flush_requests") > 0, "{s}");
        assert!(n("barriers") + n("barriers_joined") <= n("flush_requests"), "{s}");
        if *p == "locked" || *p == "lock-free" {
            assert_eq!((n("barriers"), n("barriers_joined")), (n("flush_requests"), 0), "{s}");
        }
    }
    let bad = softmm_in(&dir, &["bench", "tlb-flush", "--posting", "never"], Duration::from_secs(10));
    assert_ne!(bad.code, Some(0));
    assert!(bad.stderr.contains("unknown posting policy"), "{}", bad.stderr);
}

/// mmap1 takes the writer policies on its policy axis: `reserve` write-locks
/// `mmap_lock` three times per map+unmap of untouched memory, the short
/// ones twice (the wlock/op column's count).
#[test]
fn bench_takes_a_writer_policy() {
    let dir = scratch("writers");
    let json = dir.join("out.json");
    let args = ["bench", "mmap1", "--threads", "1", "--iterations", "4", "--repeat", "1", "--no-host"];
    let mut a = args.to_vec();
    a.extend(["--policy", "reserve,short,short-spin", "--json", json.to_str().unwrap()]);
    let out = softmm_in(&dir, &a, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("wlock/op"), "{}", out.stdout);
    let samples = check_json(&json);
    for policy in WRITER_POLICIES {
        let s = samples.iter().find(|s| s["policy"] == *policy).unwrap_or_else(|| panic!("no {policy} sample"));
        let per_op = s["counters"]["mmap_lock_writes"].as_u64().unwrap() / s["ops"].as_u64().unwrap();
        assert_eq!(per_op, if *policy == "reserve" { 3 } else { 2 }, "{s}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An unknown policy or workload is refused with the names that are valid
/// for the workloads given.
#[test]
fn bench_errors_name_what_the_workload_takes() {
    let dir = scratch("errors");
    let err = |args: &[&str]| {
        let out = softmm_in(&dir, args, Duration::from_secs(10));
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stdout);
        out.stderr
    };
    let e = err(&["bench", "pft", "--policy", "foo"]);
    assert!(e.contains("for pft") && e.contains("mmap-lock") && e.contains("per-vma-seq"), "{e}");
    assert!(!e.contains("sectioned") && !e.contains("lock-free"), "big-munmap's names for pft: {e}");
    let e = err(&["bench", "big-munmap", "--policy", "foo"]);
    assert!(e.contains("for big-munmap") && e.contains("sectioned") && e.contains("lock-free"), "{e}");
    let e = err(&["bench", "nope"]);
    for name in ["pft", "big-munmap", "pin", "migrate", "hugetlb-fault", "hugetlb-fork", "hugetlb-fork-fault"] {
        assert!(e.contains(name), "{name} missing in {e}");
    }
    let e = err(&["bench", "pft,pin"]);
    assert!(e.contains("runs alone"), "{e}");
    let e = err(&["bench", "pft", "--mode", "processes"]);
    assert!(e.contains("pft: threads"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench --help` names each workload's policies, cites the seeds and
/// gives examples, within 100 columns.
#[test]
fn bench_help_names_policies_seeds_and_examples() {
    let dir = scratch("help");
    let out = softmm_in(&dir, &["bench", "--help"], Duration::from_secs(10));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let h = &out.stdout;
    for needle in [
        "mmap-lock",
        "per-vma-seq",
        "sectioned",
        "downgrade",
        "per-page",
        "i-mmap-rwsem",
        "vma-lock",
        "one-by-one",
        "Mike Kravetz",
        "Michel Lespinasse",
        "Yang Shi",
        "Huang Ying",
        "Daniel Jordan",
        "lore.kernel.org",
        "Examples:",
        "--wide",
    ] {
        assert!(h.contains(needle), "{needle} missing in\n{h}");
    }
    assert!(h.lines().filter(|l| l.trim_start().starts_with("softmm bench")).count() >= 3, "{h}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tables fit 100 columns and name what they leave out; `--wide` shows it.
#[test]
fn bench_tables_fit_100_columns_unless_wide() {
    let dir = scratch("wide");
    let args = ["bench", "interference", "--threads", "1", "--iterations", "1", "--size", "1M", "--repeat", "1"];
    let narrow = softmm_in(&dir, &args, Duration::from_secs(30));
    assert_eq!(narrow.code, Some(0), "{}", narrow.stderr);
    assert!(narrow.stdout.lines().all(|l| l.chars().count() <= 100), "{}", narrow.stdout);
    assert!(narrow.stdout.contains("--wide adds the columns"), "{}", narrow.stdout);
    let mut a = args.to_vec();
    a.push("--wide");
    let wide = softmm_in(&dir, &a, Duration::from_secs(30));
    assert_eq!(wide.code, Some(0), "{}", wide.stderr);
    assert!(wide.stdout.contains("fallbk/op") && !wide.stdout.contains("--wide adds"), "{}", wide.stdout);
    // The legend covers every column shown.
    for col in ["ops/cpu-s", "vs alone", "aborts/op", "fallbk/op", "spec/op", "cpus", "min-max"] {
        assert!(wide.stdout.contains(&format!("{col}: ")), "no gloss of {col} in\n{}", wide.stdout);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
