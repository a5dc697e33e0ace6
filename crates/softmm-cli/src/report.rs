//! Samples, the terminal table and the JSON file.
//!
//! JSON shape: `{"machine": {"cores", "model", "kernel", "softmm_commit"},
//! "shootdown", "samples": [{"workload", "mode", "policy", "threads",
//! "repeat", "ops", "seconds", "ops_per_sec", "counters": {...}}]}`;
//! `shootdown` is the `--shootdown` policy every softmm address space of the
//! run used; counters are totals for the sample and absent where they do
//! not apply.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::workloads::Workload;

/// Per-sample totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Page faults (softmm: handled by its CPUs; host: minor faults of the tasks).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub faults: Option<u64>,
    /// `mmap_lock` acquisitions: by faults, plus the address spaces' own.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mmap_lock_acquisitions: Option<u64>,
    /// TLB flush requests sent to other CPUs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flush_requests: Option<u64>,
    /// Nanoseconds the flushes spent waiting for CPUs inside an access
    /// (softmm's `TlbStats::flush_wait_ns`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flush_wait_ns: Option<u64>,
    /// Lock-free fault attempts.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub spec_attempts: Option<u64>,
    /// Lock-free attempts aborted (every cause).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub spec_aborts: Option<u64>,
    /// Lock-free attempts that fell back to `mmap_lock`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fallbacks: Option<u64>,
    /// Writes to shared cache lines by faults, or in big-munmap by the
    /// munmapping thread during the munmap (`shared-write-stats` builds).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub shared_writes: Option<u64>,
    /// Pages pinned (`pin`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pages: Option<u64>,
    /// Pages migrated (`migrate`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pages_migrated: Option<u64>,
    /// big-munmap: how long the large `munmap` took, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_ns: Option<u64>,
    /// big-munmap: median latency of the other threads' operations that
    /// overlapped the munmap, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub p50_ns: Option<u64>,
    /// big-munmap: their 99th percentile, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub p99_ns: Option<u64>,
    /// big-munmap: their maximum, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_ns: Option<u64>,
    /// big-munmap: the other threads' operations per second during the munmap.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ops_per_sec: Option<u64>,
    /// big-munmap: the same threads' operations per second before it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub alone_ops_per_sec: Option<u64>,
    /// hugetlb: PMD tables linked from another address space (`huge_pmd_share`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pmd_shares: Option<u64>,
    /// hugetlb: shared PMD tables detached from an address space (`huge_pmd_unshare`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pmd_unshares: Option<u64>,
    /// hugetlb: the files' `i_mmap` lock taken for read (`HugetlbLockStats`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub i_mmap_read: Option<u64>,
    /// hugetlb: the files' `i_mmap` lock taken for write.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub i_mmap_write: Option<u64>,
    /// hugetlb: the hugetlb VMA lock taken for read.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vma_lock_read: Option<u64>,
    /// hugetlb: the hugetlb VMA lock taken for write.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vma_lock_write: Option<u64>,
    /// hugetlb: fault mutexes taken.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fault_mutex: Option<u64>,
    /// hugetlb: lock-free faults that found their PMD table unshared and retried.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub validation_retries: Option<u64>,
    /// hugetlb host rows: `/proc/vmstat` `htlb_buddy_alloc_success` during the sample.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub htlb_buddy_alloc_success: Option<u64>,
    /// hugetlb host rows: `/proc/vmstat` `htlb_buddy_alloc_fail` during the sample.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub htlb_buddy_alloc_fail: Option<u64>,
    /// big-munmap: time the munmap held `mmap_lock` for write (softmm's `UnmapStats`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_write_hold_ns: Option<u64>,
    /// big-munmap: time it held `mmap_lock` for read (`downgrade`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_read_hold_ns: Option<u64>,
    /// big-munmap: time it waited to take `mmap_lock` for write again.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_lock_wait_ns: Option<u64>,
    /// big-munmap: time in its zap loop, flushes and frees of full gathers included.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_zap_ns: Option<u64>,
    /// big-munmap: its TLB shootdowns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_flushes: Option<u64>,
    /// big-munmap: time in them, request to last acknowledgement.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_flush_ns: Option<u64>,
    /// big-munmap: the part of that spent waiting for other CPUs' acknowledgements.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_flush_wait_ns: Option<u64>,
    /// big-munmap: time putting frames and scheduling tables after the flushes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_free_ns: Option<u64>,
    /// big-munmap: time detaching the range's page tables (`free_pgtables`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_pgtable_ns: Option<u64>,
    /// big-munmap: time the munmapping thread waited for a grace period and
    /// freed the range's page tables itself, after dropping every lock.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_table_free_ns: Option<u64>,
    /// big-munmap: page tables it left to the epoch collector instead (the
    /// grace period outlasted its wait).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_tables_deferred: Option<u64>,
    /// big-munmap: the munmap's flushes that forced a barrier (an IPI per
    /// CPU running another thread of the process, with `membarrier`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_barriers: Option<u64>,
    /// big-munmap: the munmap's frees of gathered frames and tables (one
    /// per full gather and one at the end), with a shootdown before each
    /// except under `lock-free`, which shoots its range down once.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_batches: Option<u64>,
    /// big-munmap: CPU time of the munmapping thread during the munmap (`/proc/.../schedstat`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_cpu_ns: Option<u64>,
    /// big-munmap: its run-queue delay meanwhile: runnable but not running.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub munmap_runq_ns: Option<u64>,
    /// big-munmap: CPU time of the other threads during the munmap, summed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub other_cpu_ns: Option<u64>,
    /// big-munmap: their run-queue delay meanwhile, summed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub other_runq_ns: Option<u64>,
    /// migrate: CPU time of the migrator thread over the sample, in ns
    /// (its cost per page, which preemption by other tasks does not inflate).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub migrator_cpu_ns: Option<u64>,
    /// migrate: PTE locks the migrations' unmap and remap walks took.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ptl_locks: Option<u64>,
    /// hugetlb: CPU time of the program's instance threads over the sample
    /// (`CLOCK_THREAD_CPUTIME_ID`), in ns: its cost per op, which the
    /// other program's share of the CPUs does not inflate.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cpu_ns: Option<u64>,
    /// hugetlb: time the program's instance threads waited for hugetlb
    /// locks (`HugetlbLockStats::thread_wait_ns`), in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lock_wait_ns: Option<u64>,
    /// hugetlb: waits for the files' `i_mmap` locks, whole arena, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub i_mmap_wait_ns: Option<u64>,
    /// hugetlb: waits for hugetlb VMA locks, whole arena, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub vma_lock_wait_ns: Option<u64>,
    /// hugetlb: waits for fault mutexes, whole arena, in ns.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fault_mutex_wait_ns: Option<u64>,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        fn add(a: &mut Option<u64>, b: Option<u64>) {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0) + b);
            }
        }
        add(&mut self.faults, o.faults);
        add(&mut self.mmap_lock_acquisitions, o.mmap_lock_acquisitions);
        add(&mut self.flush_requests, o.flush_requests);
        add(&mut self.flush_wait_ns, o.flush_wait_ns);
        add(&mut self.spec_attempts, o.spec_attempts);
        add(&mut self.spec_aborts, o.spec_aborts);
        add(&mut self.fallbacks, o.fallbacks);
        add(&mut self.shared_writes, o.shared_writes);
        add(&mut self.pages, o.pages);
        add(&mut self.pmd_shares, o.pmd_shares);
        add(&mut self.pmd_unshares, o.pmd_unshares);
        add(&mut self.i_mmap_read, o.i_mmap_read);
        add(&mut self.i_mmap_write, o.i_mmap_write);
        add(&mut self.vma_lock_read, o.vma_lock_read);
        add(&mut self.vma_lock_write, o.vma_lock_write);
        add(&mut self.fault_mutex, o.fault_mutex);
        add(&mut self.validation_retries, o.validation_retries);
        add(&mut self.htlb_buddy_alloc_success, o.htlb_buddy_alloc_success);
        add(&mut self.htlb_buddy_alloc_fail, o.htlb_buddy_alloc_fail);
        add(&mut self.pages_migrated, o.pages_migrated);
        add(&mut self.migrator_cpu_ns, o.migrator_cpu_ns);
        add(&mut self.ptl_locks, o.ptl_locks);
        add(&mut self.cpu_ns, o.cpu_ns);
        add(&mut self.lock_wait_ns, o.lock_wait_ns);
        add(&mut self.i_mmap_wait_ns, o.i_mmap_wait_ns);
        add(&mut self.vma_lock_wait_ns, o.vma_lock_wait_ns);
        add(&mut self.fault_mutex_wait_ns, o.fault_mutex_wait_ns);
        // Durations and rates do not add up: a row keeps the worst.
        fn max(a: &mut Option<u64>, b: Option<u64>) {
            if let Some(b) = b {
                *a = Some(a.map_or(b, |a| a.max(b)));
            }
        }
        max(&mut self.munmap_ns, o.munmap_ns);
        max(&mut self.p50_ns, o.p50_ns);
        max(&mut self.p99_ns, o.p99_ns);
        max(&mut self.max_ns, o.max_ns);
        max(&mut self.ops_per_sec, o.ops_per_sec);
        max(&mut self.alone_ops_per_sec, o.alone_ops_per_sec);
        max(&mut self.munmap_write_hold_ns, o.munmap_write_hold_ns);
        max(&mut self.munmap_read_hold_ns, o.munmap_read_hold_ns);
        max(&mut self.munmap_lock_wait_ns, o.munmap_lock_wait_ns);
        max(&mut self.munmap_zap_ns, o.munmap_zap_ns);
        max(&mut self.munmap_flushes, o.munmap_flushes);
        max(&mut self.munmap_flush_ns, o.munmap_flush_ns);
        max(&mut self.munmap_flush_wait_ns, o.munmap_flush_wait_ns);
        max(&mut self.munmap_free_ns, o.munmap_free_ns);
        max(&mut self.munmap_pgtable_ns, o.munmap_pgtable_ns);
        max(&mut self.munmap_table_free_ns, o.munmap_table_free_ns);
        max(&mut self.munmap_tables_deferred, o.munmap_tables_deferred);
        max(&mut self.munmap_barriers, o.munmap_barriers);
        max(&mut self.munmap_batches, o.munmap_batches);
        max(&mut self.munmap_cpu_ns, o.munmap_cpu_ns);
        max(&mut self.munmap_runq_ns, o.munmap_runq_ns);
        max(&mut self.other_cpu_ns, o.other_cpu_ns);
        max(&mut self.other_runq_ns, o.other_runq_ns);
    }
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    /// Workload name.
    pub workload: String,
    /// Mode (`threads`, `processes`, `alone`, `interfered`, a CortenMM operation).
    pub mode: String,
    /// A fault policy's name, or `host`.
    pub policy: String,
    /// Tasks.
    pub threads: usize,
    /// Repetition index.
    pub repeat: usize,
    /// Operations.
    pub ops: u64,
    /// Seconds.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_sec: f64,
    /// Totals.
    pub counters: Counters,
    /// CPU seconds of the tasks (table only).
    #[serde(skip)]
    pub cpu_seconds: f64,
}

/// Everything a run wrote.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    /// Where it ran.
    pub machine: Machine,
    /// Every sample.
    pub samples: Vec<Sample>,
}

/// The samples of one table row (same workload, mode, policy, threads).
pub struct Row<'a> {
    /// The samples, one per repeat.
    pub samples: Vec<&'a Sample>,
}

impl Row<'_> {
    fn first(&self) -> &Sample {
        self.samples[0]
    }

    /// Sorted throughputs.
    fn rates(&self) -> Vec<f64> {
        let mut r: Vec<f64> = self.samples.iter().map(|s| s.ops_per_sec).collect();
        r.sort_by(f64::total_cmp);
        r
    }

    /// Median throughput.
    pub fn median(&self) -> f64 {
        let r = self.rates();
        let m = r.len() / 2;
        if r.len() % 2 == 1 {
            r[m]
        } else {
            (r[m - 1] + r[m]) / 2.0
        }
    }

    fn min(&self) -> f64 {
        self.rates()[0]
    }

    fn max(&self) -> f64 {
        *self.rates().last().expect("non-empty row")
    }

    fn ops(&self) -> u64 {
        self.samples.iter().map(|s| s.ops).sum()
    }

    fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for s in &self.samples {
            c.add(&s.counters);
        }
        c
    }

    fn per_cpu_second(&self) -> Option<f64> {
        let cpu: f64 = self.samples.iter().map(|s| s.cpu_seconds).sum();
        (cpu > 0.0).then(|| self.ops() as f64 / cpu)
    }
}

fn policy_rank(p: &str) -> usize {
    softmm::FaultPolicy::ALL.iter().position(|q| q.name() == p).unwrap_or(usize::MAX - 1)
}

fn workload_rank(w: &str) -> usize {
    Workload::ALL.iter().position(|q| q.name() == w).unwrap_or(usize::MAX)
}

fn mode_rank(w: &str, m: &str) -> usize {
    Workload::from_name(w).and_then(|w| w.modes().iter().position(|q| *q == m)).unwrap_or(usize::MAX)
}

/// Groups samples into rows, in workload, mode, policy (host last), threads order.
pub fn rows(samples: &[Sample]) -> Vec<Row<'_>> {
    type Key = (usize, String, usize, String, usize, String, usize);
    let mut map: BTreeMap<Key, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        let key = (
            workload_rank(&s.workload),
            s.workload.clone(),
            mode_rank(&s.workload, &s.mode),
            s.mode.clone(),
            policy_rank(&s.policy),
            s.policy.clone(),
            s.threads,
        );
        map.entry(key).or_default().push(s);
    }
    map.into_values().map(|samples| Row { samples }).collect()
}

/// `1.23M`-style number.
pub fn si(x: f64) -> String {
    let (v, unit) = match x.abs() {
        a if a >= 1e9 => (x / 1e9, "G"),
        a if a >= 1e6 => (x / 1e6, "M"),
        a if a >= 1e3 => (x / 1e3, "k"),
        _ => (x, ""),
    };
    if v.abs() >= 100.0 {
        format!("{v:.0}{unit}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

fn per_op(total: Option<u64>, ops: u64) -> String {
    match total {
        None => "-".to_string(),
        Some(_) if ops == 0 => "-".to_string(),
        Some(t) => {
            let v = t as f64 / ops as f64;
            if v == 0.0 {
                "0".to_string()
            } else if v >= 100.0 {
                format!("{v:.0}")
            } else if v >= 0.01 {
                format!("{v:.3}")
            } else {
                format!("{v:.1e}")
            }
        }
    }
}

/// The terminal table.
pub fn table(samples: &[Sample]) -> String {
    let rows = rows(samples);
    let shared = samples.iter().any(|s| s.counters.shared_writes.is_some());
    let mut head = vec![
        "workload",
        "mode",
        "policy",
        "thr",
        "ops/s",
        "min",
        "max",
        "ops/cpu-s",
        "vs alone",
        "faults/op",
        "lock/op",
        "flush/op",
        "spec/op",
        "aborts/op",
        "fallbk/op",
    ];
    if shared {
        head.push("shared/op");
    }
    // How long the flushes waited for CPUs inside an access, next to their
    // count, where a sample measured it.
    let waits = samples.iter().any(|s| s.counters.flush_wait_ns.is_some());
    let wait_col = head.iter().position(|h| *h == "flush/op").map_or(head.len(), |i| i + 1);
    if waits {
        head.insert(wait_col, "fwait ns/op");
    }
    let mut cells: Vec<Vec<String>> = Vec::new();
    for row in &rows {
        let s = row.first();
        let c = row.counters();
        let ops = row.ops();
        let vs_alone = if s.mode == "interfered" {
            rows.iter()
                .find(|r| {
                    let a = r.first();
                    a.workload == s.workload && a.mode == "alone" && a.policy == s.policy && a.threads == s.threads
                })
                .map(|a| format!("{:.2}x", row.median() / a.median()))
                .unwrap_or_else(|| "-".to_string())
        } else {
            "-".to_string()
        };
        let mut line = vec![
            s.workload.clone(),
            s.mode.clone(),
            s.policy.clone(),
            s.threads.to_string(),
            si(row.median()),
            si(row.min()),
            si(row.max()),
            row.per_cpu_second().map_or("-".to_string(), si),
            vs_alone,
            per_op(c.faults, ops),
            per_op(c.mmap_lock_acquisitions, ops),
            per_op(c.flush_requests, ops),
            per_op(c.spec_attempts, ops),
            per_op(c.spec_aborts, ops),
            per_op(c.fallbacks, ops),
        ];
        if shared {
            line.push(per_op(c.shared_writes, ops));
        }
        if waits {
            line.insert(wait_col, per_op(c.flush_wait_ns, ops));
        }
        cells.push(line);
    }
    let widths: Vec<usize> =
        (0..head.len()).map(|i| cells.iter().map(|r| r[i].len()).chain([head[i].len()]).max().unwrap_or(0)).collect();
    let mut out = String::new();
    let fmt_line = |out: &mut String, cols: &[String]| {
        for (i, c) in cols.iter().enumerate() {
            if i < 3 {
                let _ = write!(out, "{:<w$}  ", c, w = widths[i]);
            } else {
                let _ = write!(out, "{:>w$}  ", c, w = widths[i]);
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    fmt_line(&mut out, &head.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let mut last = String::new();
    for (row, line) in rows.iter().zip(&cells) {
        let group = format!("{}/{}", row.first().workload, row.first().mode);
        if !last.is_empty() && group != last {
            out.push('\n');
        }
        last = group;
        fmt_line(&mut out, line);
    }
    out
}

/// A legend under the table: what one operation is.
pub fn legend(samples: &[Sample]) -> String {
    let mut seen = Vec::new();
    for s in samples {
        if let Some(w) = Workload::from_name(&s.workload) {
            if !seen.contains(&w) {
                seen.push(w);
            }
        }
    }
    let mut out = String::from(
        "ops/s: median of the repeats (min, max); per-op counters: totals over the repeats / operations; \
         lock = mmap_lock acquisitions, flush = TLB flush requests, fwait = ns the flushes waited for CPUs \
         inside an access, spec = lock-free fault attempts.\n",
    );
    for w in seen {
        let _ = writeln!(out, "  {}: one op = one {}", w.name(), w.op_unit());
    }
    out
}

/// Writes `results` as JSON to `path`, if one was given (`--json`), and
/// says so.
pub fn save_json(path: Option<&std::path::Path>, results: &Results) -> Result<(), String> {
    if let Some(path) = path {
        write_json(path, results)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Writes `results` as JSON, with the run's `--shootdown` policy.
pub fn write_json(path: &std::path::Path, results: &Results) -> Result<(), String> {
    let mut v = serde_json::to_value(results).map_err(|e| e.to_string())?;
    if let Some(o) = v.as_object_mut() {
        o.insert("shootdown".into(), crate::workloads::shootdown_policy().name().into());
    }
    let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}
