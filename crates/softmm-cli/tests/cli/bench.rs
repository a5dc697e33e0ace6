//! `softmm bench`: every workload with tiny sizes, its JSON, plots and
//! tables, the headline, the policies and its help.

use super::*;

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
    let policies = WRITER_POLICIES.join(",");
    a.extend(["--policy", &policies, "--json", json.to_str().unwrap()]);
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
