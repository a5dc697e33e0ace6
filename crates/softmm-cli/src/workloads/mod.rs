//! The benchmark workloads, each re-creating the access pattern of the public
//! benchmark it is named after, on softmm (one fault policy) or on the host.

pub mod big_munmap;
mod cortenmm;
pub mod harness;
pub mod hugetlb;
mod interference;
// seed 003's experiment, with its own sweep (`softmm bench migrate`)
pub mod migrate;
mod pft;
pub mod pin;
pub mod space;
mod tlb_flush;
mod wis;
pub mod writers;

use std::sync::Arc;

use softmm::{
    AddressSpace, AtomicAlignment, FaultPolicy, FaultStats, HostFileCoherence, MadvisePolicy, MmConfig, PhysMem,
    PlacementPolicy, ShootdownTargets, UnmapPolicy, WriterPolicy,
};

pub use crate::arena::Arena;
use crate::args::Limit;
use crate::counters::FaultCounters;
use crate::workload::Workload;
use harness::RunOut;
use space::SoftSpace;

/// Frames the softmm arena of a sample of `w` needs for `tasks` tasks of
/// `size` bytes.
pub fn arena_bytes(w: Workload, tasks: usize, size: u64) -> u64 {
    let t = tasks as u64;
    let frames = match w {
        Workload::Pft | Workload::PageFault1 | Workload::PageFault3 | Workload::Interference => t * size,
        // Page-cache page plus the private copy.
        Workload::PageFault2 => 2 * t * size,
        // Never touched, but a private writable mapping is charged to
        // the commit total, and the heuristic refuses one larger than RAM.
        Workload::Mmap1 | Workload::Mmap2 => size,
        Workload::TlbFlush => t * tlb_flush::region(size),
        Workload::Cortenmm => t * cortenmm::REGION,
        Workload::BigMunmap => size + big_munmap::arena_extra(tasks),
        // One page per thread.
        Workload::MadviseFlags | Workload::MremapMove => t * 4096,
    };
    // Frames may sit in per-thread caches of threads that have exited.
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get()) as u64;
    frames + (16 << 20) + cpus * (2 << 20)
}

/// What runs the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// softmm with a fault policy.
    Soft(FaultPolicy),
    /// The host kernel.
    Host,
    /// softmm with an unmap policy (big-munmap; faults under `mmap-lock`).
    Unmap(UnmapPolicy),
    /// softmm with a shootdown-target policy (faults under the default
    /// fault policy): `broadcast` against `fill-owners` in one run.
    Targets(ShootdownTargets),
    /// softmm with a `madvise` policy (tlb-flush with `--madvise`; faults
    /// under the default fault policy).
    Madvise(MadvisePolicy),
    /// softmm with a writer policy (mmap1-2 and the other workloads that
    /// map and unmap; faults under the default fault policy).
    Writers(WriterPolicy),
    /// softmm with an atomic-alignment policy (faults under the default
    /// fault policy): what an unaligned or page-crossing atomic does. The
    /// lab's workloads make no atomic access, so its rows show that the
    /// policy costs nothing off that path; the atomics' own cost under
    /// each is the criterion group `atomics` (`benches/mmu.rs`).
    Atomics(AtomicAlignment),
    /// softmm with a host-file coherence policy (faults under the default
    /// fault policy): what a `MAP_SHARED` mapping of a host file is. The
    /// lab's workloads map no host file, so its rows show the policy costs
    /// nothing off that path; `replay` of a program that maps files (and
    /// `tests/semantics/host_file*.rs`) tells the two apart.
    HostFile(HostFileCoherence),
}

impl Backend {
    /// The result's `policy` field.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Soft(p) => p.name(),
            Backend::Host => "host",
            Backend::Unmap(p) => p.name(),
            Backend::Targets(p) => p.name(),
            // Named apart from the fault policies of the same names.
            Backend::Madvise(MadvisePolicy::MmapLock) => "madvise-mmap-lock",
            Backend::Madvise(MadvisePolicy::PerVma) => "madvise-per-vma",
            Backend::Madvise(_) => "madvise-other",
            Backend::Writers(p) => p.name(),
            // Named apart from the other policies' `strict`-like names.
            Backend::Atomics(AtomicAlignment::Strict) => "atomics-strict",
            Backend::Atomics(AtomicAlignment::Split) => "atomics-split",
            Backend::Atomics(_) => "atomics-other",
            Backend::HostFile(HostFileCoherence::Cache) => "host-file-cache",
            Backend::HostFile(HostFileCoherence::Shared) => "host-file-shared",
        }
    }

    /// Which policy it varies, as an index: fault 0, unmap 1, shootdown
    /// targets 2, `madvise` 3, writers 4, the host 5, atomic alignment 6,
    /// host-file coherence 7 (plots colour by it).
    pub fn kind(self) -> usize {
        match self {
            Backend::Soft(_) => 0,
            Backend::Unmap(_) => 1,
            Backend::Targets(_) => 2,
            Backend::Madvise(_) => 3,
            Backend::Writers(_) => 4,
            Backend::Host => 5,
            Backend::Atomics(_) => 6,
            Backend::HostFile(_) => 7,
        }
    }

    /// Runs on softmm (needs an arena).
    pub fn is_soft(self) -> bool {
        !matches!(self, Backend::Host)
    }

    /// Every softmm backend: each fault, unmap, shootdown-target, `madvise`,
    /// writer, atomic-alignment and host-file coherence policy, the others
    /// at their defaults.
    pub fn all_soft() -> Vec<Backend> {
        let mut out: Vec<Backend> = FaultPolicy::ALL.iter().map(|&p| Backend::Soft(p)).collect();
        out.extend(UnmapPolicy::ALL.iter().map(|&p| Backend::Unmap(p)));
        out.extend(ShootdownTargets::ALL.iter().map(|&p| Backend::Targets(p)));
        out.extend(MadvisePolicy::ALL.iter().map(|&p| Backend::Madvise(p)));
        out.extend(WriterPolicy::ALL.iter().map(|&p| Backend::Writers(p)));
        out.extend(AtomicAlignment::ALL.iter().map(|&p| Backend::Atomics(p)));
        out.extend(HostFileCoherence::ALL.iter().map(|&p| Backend::HostFile(p)));
        out
    }

    /// The softmm backend named `name` (as [`Backend::name`] names it).
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::all_soft().into_iter().find(|b| b.name() == name)
    }

    /// `config` with this backend's policy; an unmap policy runs its faults
    /// under `mmap-lock`, as big-munmap measures it.
    pub fn configure(self, config: MmConfig) -> MmConfig {
        match self {
            Backend::Soft(p) => config.policy(p),
            Backend::Host => config,
            Backend::Unmap(u) => config.policy(FaultPolicy::MmapLock).unmap_policy(u),
            Backend::Targets(t) => config.shootdown_targets(t),
            Backend::Madvise(m) => config.madvise_policy(m),
            Backend::Writers(w) => config.writer_policy(w),
            Backend::Atomics(a) => config.atomic_alignment(a),
            Backend::HostFile(c) => config.host_file_coherence(c),
        }
    }
}

/// The parameters of one sample.
#[derive(Debug, Clone)]
pub struct Params {
    /// Tasks (threads or processes); faulting threads for `interference`.
    pub threads: usize,
    /// One of the workload's modes.
    pub mode: &'static str,
    /// How long.
    pub limit: Limit,
    /// Region size in bytes (see each workload).
    pub size: u64,
    /// softmm's `MmConfig::force_speculative`.
    pub force_speculative: bool,
    /// softmm's `MmConfig::placement` (`--placement`).
    pub placement: PlacementPolicy,
}

/// The result's `policy` field of a sample of `backend` under `placement`:
/// the backend's name, with `+placement` where a softmm fault-policy row
/// does not place as Linux (so that both placements show in one table).
pub fn policy_label(backend: Backend, placement: PlacementPolicy) -> String {
    match backend {
        Backend::Soft(_) | Backend::Writers(_) if placement != PlacementPolicy::Linux => {
            format!("{}+{}", backend.name(), placement.name())
        }
        _ => backend.name().to_string(),
    }
}

/// What a sample measured, with its experiment's counters `C`.
#[derive(Debug, Clone)]
pub struct Measured<C = FaultCounters> {
    /// Operations.
    pub ops: u64,
    /// Seconds they took.
    pub seconds: f64,
    /// CPU seconds of the tasks.
    pub cpu_seconds: f64,
    /// Per-sample totals.
    pub counters: C,
}

/// The TLB shootdown policy of every address space the lab makes
/// (`--shootdown`), set once before the runs.
static SHOOTDOWN: std::sync::OnceLock<softmm::ShootdownPolicy> = std::sync::OnceLock::new();

/// Sets the shootdown policy of every address space made from
/// [`mm_config`] from now on; the first call of the process wins.
pub fn set_shootdown_policy(policy: softmm::ShootdownPolicy) {
    let _ = SHOOTDOWN.set(policy);
}

/// The configuration every address space of the lab starts from:
/// The shootdown policy the run's address spaces use (`--shootdown`, or
/// the default when it was not set), as the JSON records it.
pub fn shootdown_policy() -> softmm::ShootdownPolicy {
    SHOOTDOWN.get().copied().unwrap_or_default()
}

/// The shootdown posting policy of the address spaces made from
/// [`mm_config`] from now on (`--posting`: the sweep sets each sample's),
/// as an index into `PostingPolicy::ALL`.
static POSTING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// The `--posting` policies of the run, as the JSON records them.
static POSTINGS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the shootdown posting policy of every address space made from
/// [`mm_config`] from now on.
pub fn set_posting_policy(policy: softmm::PostingPolicy) {
    let i = softmm::PostingPolicy::ALL.iter().position(|&p| p == policy).expect("one of ALL");
    POSTING.store(i, std::sync::atomic::Ordering::Relaxed);
}

/// The posting policy the next address space gets (`--posting`, or the
/// library's default).
pub fn posting_policy() -> softmm::PostingPolicy {
    let i = POSTING.load(std::sync::atomic::Ordering::Relaxed);
    softmm::PostingPolicy::ALL.get(i).copied().unwrap_or_default()
}

/// Records the run's `--posting` policies for the JSON; the first call wins.
pub fn set_postings_label(postings: &[softmm::PostingPolicy]) {
    let names: Vec<_> = postings.iter().map(|p| p.name()).collect();
    let _ = POSTINGS.set(names.join(","));
}

/// The run's `--posting` policies, comma-separated (the default's name
/// when none was set).
pub fn postings_label() -> String {
    POSTINGS.get().cloned().unwrap_or_else(|| softmm::PostingPolicy::default().name().to_string())
}

/// A run's results: its machine and samples, with the run's `--shootdown`
/// and `--posting` policies.
pub fn results<C>(
    machine: crate::machine::Machine,
    samples: Vec<crate::report::Sample<C>>,
) -> crate::report::Results<C> {
    crate::report::Results {
        machine,
        samples,
        shootdown: shootdown_policy().name().to_string(),
        posting: postings_label(),
    }
}

/// `MmConfig::default()` with `--shootdown`'s policy and the sample's
/// posting policy.
pub fn mm_config() -> MmConfig {
    MmConfig::default().shootdown_policy(SHOOTDOWN.get().copied().unwrap_or_default()).posting_policy(posting_policy())
}

/// The context of a softmm sample: the arena and the configuration its
/// address spaces get.
pub struct SoftEnv {
    /// Physical memory.
    pub phys: Arc<PhysMem>,
    /// Every address space of the sample is made with this.
    pub config: MmConfig,
}

impl SoftEnv {
    /// A fresh address space.
    pub fn space(&self) -> SoftSpace {
        SoftSpace { mm: AddressSpace::new(&self.phys, self.config.clone()).expect("the default layout is valid") }
    }

    /// The fault policy of its address spaces.
    pub fn policy(&self) -> FaultPolicy {
        self.config.policy
    }
}

/// Runs one sample.
pub fn run(w: Workload, backend: Backend, p: &Params, arena: &mut Arena) -> Result<Measured, String> {
    let env = match backend {
        Backend::Host => None,
        _ => {
            let base = mm_config().force_speculative(p.force_speculative).placement(p.placement);
            Some(SoftEnv { phys: arena.get(arena_bytes(w, p.threads, p.size))?, config: backend.configure(base) })
        }
    };
    match w {
        Workload::Pft => pft::run(env.as_ref(), p),
        Workload::PageFault1 | Workload::PageFault2 | Workload::PageFault3 | Workload::Mmap1 | Workload::Mmap2 => {
            wis::run(w, env.as_ref(), p)
        }
        Workload::TlbFlush => tlb_flush::run(env.as_ref(), p),
        Workload::Interference => interference::run(env.as_ref(), p),
        Workload::Cortenmm => cortenmm::run(env.as_ref(), p),
        Workload::BigMunmap => big_munmap::run(env.as_ref(), p),
        Workload::MadviseFlags | Workload::MremapMove => writers::run(w, env.as_ref(), p),
    }
}

/// The counters of `fault` (the run's CPUs') under `policy` and of the
/// statistics of `spaces`, summed (taken after the run): lock
/// acquisitions, flush requests and shootdowns.
pub fn space_counters<'a>(
    policy: FaultPolicy,
    fault: &FaultStats,
    spaces: impl IntoIterator<Item = &'a AddressSpace>,
) -> FaultCounters {
    let (mut lock, mut wlock, mut flush, mut flush_wait_ns) = (0, 0, 0, 0);
    let (mut shootdowns, mut local, mut barriers, mut joined, mut flush_shared) = (0, 0, 0, 0, 0);
    let (mut range, mut range_conflicts) = (0, 0);
    for mm in spaces {
        let st = mm.stats();
        lock += st.mmap_lock_write + st.mmap_lock_read;
        wlock += st.mmap_lock_write;
        flush += st.tlb.flush_requests;
        flush_wait_ns += st.tlb.flush_wait_ns;
        shootdowns += st.tlb.flushes;
        local += st.tlb.local_flushes;
        barriers += st.tlb.barriers;
        joined += st.tlb.barriers_joined;
        flush_shared += st.tlb.shared_writes;
        range += st.range.writes;
        range_conflicts += st.range.conflicts;
    }
    FaultCounters {
        flush_wait_ns: Some(flush_wait_ns),
        shootdowns: Some(shootdowns),
        local_shootdowns: Some(local),
        barriers: Some(barriers),
        barriers_joined: Some(joined),
        flush_shared_writes: cfg!(feature = "shared-write-stats").then_some(flush_shared),
        mmap_lock_writes: Some(wlock),
        range_writes: Some(range),
        range_conflicts: Some(range_conflicts),
        ..soft_counters(policy, fault, lock, flush)
    }
}

/// The counters of a softmm run: its CPUs' fault counters and its address
/// spaces' statistics (taken after the run).
pub fn soft_measured(policy: FaultPolicy, out: &RunOut, spaces: &[&SoftSpace]) -> Measured {
    let fault = out.fault().unwrap_or_default();
    let counters = FaultCounters {
        // The tasks' own calls (mmap, munmap) as well as their faults.
        shared_writes: cfg!(feature = "shared-write-stats").then(|| out.shared_writes()),
        ..space_counters(policy, &fault, spaces.iter().map(|s| &*s.mm))
    };
    Measured { ops: out.ops(), seconds: out.seconds(), cpu_seconds: out.cpu_seconds(), counters }
}

/// The counters of a softmm sample.
pub fn soft_counters(policy: FaultPolicy, fault: &FaultStats, mm_lock: u64, flush_requests: u64) -> FaultCounters {
    let lock_free = policy != FaultPolicy::MmapLock;
    let aborts = fault.aborts_mm_seq + fault.aborts_vma + fault.aborts_unsupported + fault.aborts_contended;
    FaultCounters {
        faults: Some(fault.faults),
        mmap_lock_acquisitions: Some(fault.mmap_lock_acquisitions + mm_lock),
        flush_requests: Some(flush_requests),
        spec_attempts: lock_free.then_some(fault.spec_attempts),
        spec_aborts: lock_free.then_some(aborts),
        fallbacks: lock_free.then_some(fault.fallbacks),
        shared_writes: cfg!(feature = "shared-write-stats").then_some(fault.shared_writes),
        ..FaultCounters::default()
    }
}

/// The counters of a host run: the minor faults the kernel counted.
pub fn host_measured(out: &RunOut) -> Measured {
    Measured {
        ops: out.ops(),
        seconds: out.seconds(),
        cpu_seconds: out.cpu_seconds(),
        counters: FaultCounters { faults: Some(out.minflt()), ..FaultCounters::default() },
    }
}
