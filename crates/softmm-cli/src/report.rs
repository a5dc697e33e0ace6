//! Samples, the terminal table and the JSON file.
//!
//! JSON shape: `{"machine": {"cores", "model", "kernel", "softmm_commit",
//! "load_start", "load_end"}, "shootdown", "posting", "samples": [{"workload", "mode",
//! "policy", "threads", "repeat", "ops", "seconds", "ops_per_sec",
//! "counters": {...}, "cpu": {"cores", "others", "used", "tasks"}}]}`;
//! `shootdown` is the `--shootdown` policy every softmm address space of the
//! run used, `posting` its `--posting` policies (comma-separated; with
//! several, a softmm sample's `policy` is `<policy>+<posting>`); counters are totals for the sample and absent where they do
//! not apply; `cpu` is the sample's [`CpuShare`].
//!
//! Every table is a [`Table`]: at most 100 columns unless `--wide`, its
//! legend built from the columns it shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::machine::{CpuShare, Machine};
use crate::stats::{self, per_op, si};
use crate::table::{wrap, Table};
use crate::workload::Workload;

/// Per-sample totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Page faults (softmm: handled by its CPUs; host: minor faults of the tasks).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub faults: Option<u64>,
    /// `mmap_lock` acquisitions: by faults, plus the address spaces' own.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mmap_lock_acquisitions: Option<u64>,
    /// The part of `mmap_lock_acquisitions` taken for write (softmm's
    /// address spaces' own: its faults never write-lock).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mmap_lock_writes: Option<u64>,
    /// TLB flush requests sent to other CPUs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flush_requests: Option<u64>,
    /// Nanoseconds the flushes spent waiting for CPUs inside an access
    /// (softmm's `TlbStats::flush_wait_ns`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flush_wait_ns: Option<u64>,
    /// TLB shootdowns begun (softmm's `TlbStats::flushes`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub shootdowns: Option<u64>,
    /// Shootdowns that asked no CPU of another thread: no request, no
    /// barrier, no wait (softmm's `TlbStats::local_flushes`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub local_shootdowns: Option<u64>,
    /// Process-wide barriers the shootdowns issued, `membarrier` (softmm's
    /// `TlbStats::barriers`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub barriers: Option<u64>,
    /// Flushes covered by another initiator's barrier
    /// (`TlbStats::barriers_joined`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub barriers_joined: Option<u64>,
    /// Writes the flushes made to shared cache lines
    /// (`TlbStats::shared_writes`, `shared-write-stats` builds).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub flush_shared_writes: Option<u64>,
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
        add(&mut self.mmap_lock_writes, o.mmap_lock_writes);
        add(&mut self.flush_requests, o.flush_requests);
        add(&mut self.flush_wait_ns, o.flush_wait_ns);
        add(&mut self.shootdowns, o.shootdowns);
        add(&mut self.local_shootdowns, o.local_shootdowns);
        add(&mut self.barriers, o.barriers);
        add(&mut self.barriers_joined, o.barriers_joined);
        add(&mut self.flush_shared_writes, o.flush_shared_writes);
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
    /// The CPUs the sample had (what other processes left it), where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuShare>,
}

/// Everything a run wrote.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    /// Where it ran.
    pub machine: Machine,
    /// Every sample.
    pub samples: Vec<Sample>,
    /// The `--shootdown` policy every softmm address space of the run used
    /// (absent from files written before it was recorded).
    #[serde(default)]
    pub shootdown: String,
    /// The run's `--posting` policies, comma-separated.
    #[serde(default)]
    pub posting: String,
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

    fn rates(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().map(|s| s.ops_per_sec)
    }

    /// Median throughput.
    pub fn median(&self) -> f64 {
        stats::median(self.rates()).expect("non-empty row")
    }

    /// `min-max` of the rates.
    pub fn min_max(&self) -> String {
        let (lo, hi) = stats::range(self.rates()).expect("non-empty row");
        format!("{}-{}", si(lo), si(hi))
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

/// The kind of policy a workload's rows name (see `seeds::POLICIES`).
pub fn policy_kind(workload: &str) -> &'static str {
    match workload {
        "big-munmap" => "unmap",
        "pin" => "pin",
        "migrate" => "migrate",
        w if w.starts_with("hugetlb-") => "hugetlb",
        _ => "fault",
    }
}

/// A row's place among its workload's policies: the library's order, the
/// host last.
/// A `+placement` row (see `workloads::policy_label`) comes right after its
/// policy's.
fn policy_rank(workload: &str, p: &str) -> usize {
    // tlb-flush --madvise's rows, in the library's order after the fault
    // policies'; a placed row right after its Linux-placed one.
    let (base, placed) = p.split_once('+').map_or((p, false), |(base, _)| (base, true));
    let kind = if base.starts_with("madvise-") { "madvise" } else { policy_kind(workload) };
    let offset = if kind == "madvise" { 2 * crate::seeds::POLICIES.len() } else { 0 };
    crate::seeds::names(kind)
        .iter()
        .position(|q| *q == base)
        .map_or(usize::MAX - 1, |i| offset + 2 * i + usize::from(placed))
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
            policy_rank(&s.workload, &s.policy),
            s.policy.clone(),
            s.threads,
        );
        map.entry(key).or_default().push(s);
    }
    map.into_values().map(|samples| Row { samples }).collect()
}

/// The median of the samples of `workload`/`mode`/`policy` at `threads`.
pub fn median(samples: &[Sample], workload: &str, mode: &str, policy: &str, threads: usize) -> Option<f64> {
    rows(samples)
        .into_iter()
        .find(|r| {
            let s = r.samples[0];
            s.workload == workload && s.mode == mode && s.policy == policy && s.threads == threads
        })
        .map(|r| r.median())
}

/// The CPUs free for the row's samples (median), `!` where one was short.
pub fn cpus_cell(samples: &[&Sample]) -> String {
    let mut free: Vec<f64> = samples.iter().filter_map(|s| s.cpu.map(|c| c.free())).collect();
    if free.is_empty() {
        return "-".into();
    }
    free.sort_by(f64::total_cmp);
    let short = samples.iter().any(|s| s.cpu.is_some_and(|c| c.short()));
    format!("{:.2}{}", free[free.len() / 2], if short { "!" } else { "" })
}

/// The gloss of the `cpus` column every sweep table shows.
pub const CPUS_GLOSS: &str = "CPUs free for the samples (the CPUs this process may use less the time other \
                              processes and the hypervisor took on them meanwhile; median of the repeats), `!` \
                              where a sample had well under a CPU per thread (see the warnings)";

/// The terminal table of the thread sweeps (pft, will-it-scale, interference,
/// cortenmm, big-munmap's counters): a heading per workload and mode, a row
/// per policy and thread count.
pub fn table(samples: &[Sample]) -> String {
    let rows = rows(samples);
    let shared = samples.iter().any(|s| s.counters.shared_writes.is_some());
    let waits = samples.iter().any(|s| s.counters.flush_wait_ns.is_some());
    let targets = samples.iter().any(|s| s.counters.shootdowns.is_some());
    let barriers = samples.iter().any(|s| s.workload == "tlb-flush" && s.counters.barriers.is_some());
    let flush_shared = samples.iter().any(|s| s.counters.flush_shared_writes.is_some());
    let interfered = samples.iter().any(|s| s.mode == "interfered");
    let mut t = Table::new();
    t.column("policy", true, 0, None)
        .column("thr", false, 0, Some("threads (tasks)"))
        .column("ops/s", false, 0, Some("operations per second, median of the repeats"))
        .column("min-max", false, 0, Some("the lowest and highest of the repeats"))
        .column("cpus", false, 0, Some(CPUS_GLOSS));
    if interfered {
        t.column("vs alone", false, 0, Some("the interfered median over the alone one"));
    }
    t.column("ops/cpu-s", false, 2, Some("operations per CPU second of the tasks"))
        .column("faults/op", false, 5, Some("page faults (host: the tasks' minor faults)"))
        .column("lock/op", false, 0, Some("mmap_lock acquisitions (by faults and the address space's own calls)"))
        .column("wlock/op", false, 0, Some("the part of lock/op taken for write"))
        .column("flush/op", false, 0, Some("TLB flush requests to other CPUs"));
    if waits {
        t.column("fwait ns/op", false, 4, Some("ns the flushes waited for CPUs inside an access"));
    }
    if targets {
        t.column("local", false, 2, Some("share of the shootdowns that asked no CPU of another thread"));
    }
    if barriers || targets {
        t.column("bar/op", false, 2, Some("process-wide barriers (membarrier) the shootdowns issued")).column(
            "join/op",
            false,
            2,
            Some("shootdowns covered by a barrier another shootdown issued"),
        );
    }
    if flush_shared {
        t.column("fshw/op", false, 1, Some("writes the shootdowns made to shared cache lines"));
    }
    t.column("spec/op", false, 3, Some("lock-free fault attempts"))
        .column("aborts/op", false, 0, Some("lock-free attempts aborted"))
        .column("fallbk/op", false, 3, Some("lock-free attempts that fell back to mmap_lock"));
    if shared {
        t.column("shared/op", false, 1, Some("writes to shared cache lines (by the tasks' faults and calls)"));
    }
    t.legend(
        "Per-op counters are totals over the repeats divided by the operations; `-`: the counter does not \
         apply (the host counts only its minor faults; mmap-lock makes no lock-free attempt).",
    );
    let mut last = String::new();
    let mut policies: Vec<&str> = Vec::new();
    for row in &rows {
        let s = row.first();
        let c = row.counters();
        let ops = row.ops();
        let group = format!("{}/{}", s.workload, s.mode);
        if group != last {
            let unit = Workload::from_name(&s.workload).map_or("operation", |w| w.op_unit());
            t.heading(&format!("{} {}: one op = one {unit}", s.workload, s.mode));
            last = group;
        }
        if !policies.contains(&s.policy.as_str()) {
            policies.push(&s.policy);
        }
        let mut line =
            vec![s.policy.clone(), s.threads.to_string(), si(row.median()), row.min_max(), cpus_cell(&row.samples)];
        if interfered {
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
            line.push(vs_alone);
        }
        line.extend([
            row.per_cpu_second().map_or("-".to_string(), si),
            per_op(c.faults, ops),
            per_op(c.mmap_lock_acquisitions, ops),
            per_op(c.mmap_lock_writes, ops),
            per_op(c.flush_requests, ops),
        ]);
        if waits {
            line.push(per_op(c.flush_wait_ns, ops));
        }
        if targets {
            line.push(match (c.local_shootdowns, c.shootdowns) {
                (Some(l), Some(n)) if n > 0 => format!("{:.0}%", 100.0 * l as f64 / n as f64),
                _ => "-".to_string(),
            });
        }
        if barriers || targets {
            line.extend([per_op(c.barriers, ops), per_op(c.barriers_joined, ops)]);
        }
        if flush_shared {
            line.push(per_op(c.flush_shared_writes, ops));
        }
        line.extend([per_op(c.spec_attempts, ops), per_op(c.spec_aborts, ops), per_op(c.fallbacks, ops)]);
        if shared {
            line.push(per_op(c.shared_writes, ops));
        }
        t.row(line);
    }
    let kind = if samples.iter().all(|s| s.workload == "big-munmap") { "unmap" } else { "fault" };
    let mut out = t.render();
    if !policies.is_empty() && kind == "fault" {
        let base: Vec<&str> = policies.iter().map(|p| p.split('+').next().unwrap_or(p)).collect();
        // `policy+placement+posting`: each suffix names a placement or a
        // shootdown posting policy.
        let suffixes: Vec<&str> = policies.iter().flat_map(|p| p.split('+').skip(1)).collect();
        out.push_str("Policies:\n");
        out.push_str(&crate::seeds::legend(kind, &base));
        // The host's line is the fault legend's.
        let soft: Vec<&str> = base.iter().copied().filter(|p| *p != "host").collect();
        out.push_str(&crate::seeds::legend("targets", &soft));
        let placed = crate::seeds::legend("placement", &suffixes);
        if !placed.is_empty() {
            out.push_str("Placements (`+name`; rows without one place as Linux):\n");
            out.push_str(&placed);
        }
        let posted = crate::seeds::legend("posting", &suffixes);
        if !posted.is_empty() {
            out.push_str("Shootdown posting (`+name`):\n");
            out.push_str(&posted);
        }
        // tlb-flush --madvise's rows (the host's line is the fault legend's).
        let madvise: Vec<&str> = policies.iter().copied().filter(|p| p.starts_with("madvise-")).collect();
        out.push_str(&crate::seeds::legend("madvise", &madvise));
        out.push_str(&crate::seeds::legend("writers", &soft));
    }
    out
}

/// Warnings for the samples that had well under a CPU per thread, one line
/// per table row naming each short sample's free CPUs (empty if none).
pub fn cpu_warnings(samples: &[Sample]) -> String {
    let short = samples.iter().filter(|s| s.cpu.is_some_and(|c| c.short())).count();
    if short == 0 {
        return String::new();
    }
    let mut out = wrap(
        &format!(
            "warning: {short} of {} samples had well under a CPU per task: other processes used the CPUs, \
             so their rates measure the machine's load too (rerun on an idle machine). CPUs free for \
             each such sample (#repeat), of {}:",
            samples.len(),
            samples.iter().find_map(|s| s.cpu.map(|c| c.cores)).unwrap_or(0)
        ),
        "  ",
    );
    for row in rows(samples) {
        let s = row.first();
        let bad: Vec<String> = row
            .samples
            .iter()
            .filter_map(|x| x.cpu.filter(|c| c.short()).map(|c| format!("#{} {:.2}", x.repeat, c.free())))
            .collect();
        if let (false, Some(c)) = (bad.is_empty(), s.cpu) {
            out.push_str(&wrap(
                &format!(
                    "  {} {} {}, {} thr, {} task{}: {}",
                    s.workload,
                    s.mode,
                    s.policy,
                    s.threads,
                    c.tasks,
                    if c.tasks == 1 { "" } else { "s" },
                    bad.join(", ")
                ),
                "    ",
            ));
        }
    }
    out
}

/// The stderr note of one sample whose CPUs fell short.
pub fn cpu_note(cpu: Option<CpuShare>) -> String {
    match cpu {
        Some(c) if c.short() => format!(
            " (warning: {:.2} of {} CPUs free for {} tasks: others used {:.2})",
            c.free(),
            c.cores,
            c.tasks,
            c.others
        ),
        _ => String::new(),
    }
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

/// Writes `results` as JSON, with the run's `--shootdown` and `--posting` policies.
pub fn write_json(path: &std::path::Path, results: &Results) -> Result<(), String> {
    // Through a `Value`, whose keys are sorted, as they always were.
    let v = serde_json::to_value(results).map_err(|e| e.to_string())?;
    let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}
