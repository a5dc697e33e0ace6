//! The policies an address space runs, each a mechanism selectable beside
//! the one it replaced so that the lab measures old against new in one run:
//! faults ([`FaultPolicy`]), large unmaps ([`UnmapPolicy`]), pins
//! ([`PinPolicy`]), hugetlb's locking ([`HugetlbPolicy`]), placement
//! ([`PlacementPolicy`]), `MADV_DONTNEED`/`MADV_FREE` ([`MadvisePolicy`]),
//! writers ([`WriterPolicy`]), migration ([`MigratePolicy`]) and shared
//! mappings of host files ([`HostFileCoherence`]). Each has
//! `ALL` (for sweeps), `name` and `from_name` (the command line's names).
//!
//! They are vocabulary, re-exported at the crate root: the configuration
//! (`mm/config.rs`) carries them and only the mechanism that a policy
//! selects reads it, so this leaf module lets the core carry a feature's
//! policy (migration's) without depending on the feature. The shootdown
//! policies are the TLB's own (`tlb/`), below the core already.

/// How page faults synchronize with changes to the address space. More
/// policies may come, so a `match` on it needs a wildcard arm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultPolicy {
    /// Every fault takes `mmap_lock` for read.
    MmapLock,
    /// Seed 001: validate against the address space's sequence count.
    Speculative,
    /// Linux 6.4: a read reference on the VMA.
    PerVma,
    /// Validate against the VMA's own detached bit; no shared write.
    #[default]
    PerVmaSeq,
}

impl FaultPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [FaultPolicy] =
        &[FaultPolicy::MmapLock, FaultPolicy::Speculative, FaultPolicy::PerVma, FaultPolicy::PerVmaSeq];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            FaultPolicy::MmapLock => "mmap-lock",
            FaultPolicy::Speculative => "speculative",
            FaultPolicy::PerVma => "per-vma",
            FaultPolicy::PerVmaSeq => "per-vma-seq",
        }
    }

    /// The policy named `name` (see [`FaultPolicy::name`]).
    pub fn from_name(name: &str) -> Option<FaultPolicy> {
        FaultPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// How a large unmap (`munmap`, `mremap` shrink, `brk` shrink) synchronizes
/// with the rest of the address space (seed 002; see `mm/unmap.rs`). More
/// policies may come, so a `match` on it needs a wildcard arm. Every policy
/// gives the same result: once the call returns, nothing of the range is
/// mapped, no CPU can reach its old frames, and its frames and page tables
/// are freed (after the TLB flush).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnmapPolicy {
    /// The whole unmap under `mmap_lock` held for write (Linux before 4.20).
    Locked,
    /// Seed 002: the range in 1 GiB (PUD-sized) sections, each unmapped
    /// whole under the write lock, which is dropped between sections.
    Sectioned,
    /// Linux 4.20+ (`do_vmi_align_munmap`): the VMAs detached under the write
    /// lock, then the zap and the page-table freeing under the read lock.
    Downgrade,
    /// The VMAs detached and the range reserved under the write lock, then
    /// the zap with no `mmap_lock` at all; the page tables are freed and the
    /// reservation dropped in a second, short write section.
    #[default]
    LockFree,
}

impl UnmapPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [UnmapPolicy] =
        &[UnmapPolicy::Locked, UnmapPolicy::Sectioned, UnmapPolicy::Downgrade, UnmapPolicy::LockFree];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            UnmapPolicy::Locked => "locked",
            UnmapPolicy::Sectioned => "sectioned",
            UnmapPolicy::Downgrade => "downgrade",
            UnmapPolicy::LockFree => "lock-free",
        }
    }

    /// The policy named `name` (see [`UnmapPolicy::name`]).
    pub fn from_name(name: &str) -> Option<UnmapPolicy> {
        UnmapPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// How `pin_user_pages` synchronizes with changes to the address space
/// (seed 004). More policies may come, so a `match` on it needs a wildcard
/// arm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PinPolicy {
    /// `mmap_lock` for read taken and dropped around every page (VFIO
    /// before seed 004).
    PerPage,
    /// `mmap_lock` for read held across 512 pages, then dropped so writers
    /// are not starved (seed 004; VFIO's batching in Linux 5.12).
    Batched,
    /// gup-fast for present pages and the fault path's own lock-free
    /// protocol for the rest: no `mmap_lock` and no shared write per page.
    #[default]
    PerVma,
}

impl PinPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [PinPolicy] = &[PinPolicy::PerPage, PinPolicy::Batched, PinPolicy::PerVma];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            PinPolicy::PerPage => "per-page",
            PinPolicy::Batched => "batched",
            PinPolicy::PerVma => "per-vma",
        }
    }

    /// The policy named `name` (see [`PinPolicy::name`]).
    pub fn from_name(name: &str) -> Option<PinPolicy> {
        PinPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// How hugetlb faults synchronize with `huge_pmd_unshare` and truncate
/// (seed 000). More policies may come, so a `match` on it needs a wildcard
/// arm. Every policy gives the same result: a fault never maps through a PMD
/// table another address space has unlinked, and never maps a page truncate
/// has removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HugetlbPolicy {
    /// Linux 5.7–6.0: every hugetlb fault holds the file's `i_mmap` lock for
    /// read; unshare holds it for write.
    IMmapRwsem,
    /// Seed 000, Linux 6.1+: a per-VMA hugetlb lock (read across the fault,
    /// write around unshare) and the fault mutex table; `i_mmap` only inside
    /// `huge_pmd_share`.
    VmaLock,
    /// No shared lock in the fault: it validates under the PMD table's lock
    /// that the table is still linked into this address space. The default:
    /// in the lab (`docs/results/hugetlb.txt`) its forks cost as much CPU
    /// per fork as `IMmapRwsem`'s and its faults as little as the
    /// cheapest, with no lock shared across address spaces per fault.
    #[default]
    LockFree,
}

impl HugetlbPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [HugetlbPolicy] =
        &[HugetlbPolicy::IMmapRwsem, HugetlbPolicy::VmaLock, HugetlbPolicy::LockFree];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            HugetlbPolicy::IMmapRwsem => "i-mmap-rwsem",
            HugetlbPolicy::VmaLock => "vma-lock",
            HugetlbPolicy::LockFree => "lock-free",
        }
    }

    /// The policy named `name` (see [`HugetlbPolicy::name`]).
    pub fn from_name(name: &str) -> Option<HugetlbPolicy> {
        HugetlbPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// Where a non-fixed `mmap` or `mremap` move without a usable hint is
/// placed (issue 32, item 4). More policies may come, so a `match` on it
/// needs a wildcard arm.
///
/// Linux leaves that address to the kernel, and every policy keeps all the
/// rest of Linux's behaviour: a free hint is taken as is, `MAP_FIXED` and
/// `MAP_FIXED_NOREPLACE` are unaffected, `MAP_32BIT` searches its own
/// window, the stack guard gap, `mmap_min_addr`, hugetlb and THP alignment
/// are respected, and a call fails with `ENOMEM` exactly when Linux's
/// search finds no room (an arena's room is room Linux's search would have
/// found too). `brk` and the stack do not use placement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PlacementPolicy {
    /// Linux's `arch_get_unmapped_area_topdown`: the highest gap below
    /// `mmap_base`, then bottom-up from `TASK_SIZE / 3`. The default: the
    /// same calls from the same layout get the same addresses as on Linux,
    /// which the differential and replay tests compare.
    #[default]
    Linux,
    /// CortenMM's 1/N ranges: the mmap area below `mmap_base` is cut into
    /// 1 GiB-aligned 1 GiB arenas, numbered down from the highest, and the
    /// calling thread's slot (a small number per live thread, reused after
    /// it exits) owns arena `slot % arenas`. The search runs top-down in
    /// that arena first, then as [`PlacementPolicy::Linux`]. Threads'
    /// mappings then do not abut, do not merge with one another, and do
    /// not share page tables below the PUD level.
    Arenas,
}

impl PlacementPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [PlacementPolicy] = &[PlacementPolicy::Linux, PlacementPolicy::Arenas];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            PlacementPolicy::Linux => "linux",
            PlacementPolicy::Arenas => "arenas",
        }
    }

    /// The policy named `name` (see [`PlacementPolicy::name`]).
    pub fn from_name(name: &str) -> Option<PlacementPolicy> {
        PlacementPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// How `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED` and `MADV_FREE` synchronize
/// with changes to the address space (issue 26, `sys/madvise.rs`). More
/// policies may come, so a `match` on it needs a wildcard arm. Every policy
/// gives the same result and errno as Linux's locked `madvise` for any input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MadvisePolicy {
    /// `mmap_lock` held for read across the call (Linux before 6.16).
    MmapLock,
    /// A range inside one VMA runs under that VMA's read reference, taken
    /// after finding it in the RCU-published tree (Linux 6.16's
    /// `lock_vma_under_rcu` in `madvise_lock`); anything else, and a VMA
    /// being replaced, falls back to `mmap_lock`. The default: in the lab's
    /// tlb-flush it takes no `mmap_lock` per operation (`lock/op` 1 → 0) at
    /// the same throughput on the 2-CPU lab machine, where shootdowns
    /// dominate, and leaves writers on other VMAs alone (docs/architecture.md,
    /// "`MADV_DONTNEED` and `MADV_FREE` without `mmap_lock`").
    #[default]
    PerVma,
}

impl MadvisePolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [MadvisePolicy] = &[MadvisePolicy::MmapLock, MadvisePolicy::PerVma];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            MadvisePolicy::MmapLock => "mmap-lock",
            MadvisePolicy::PerVma => "per-vma",
        }
    }

    /// The policy named `name` (see [`MadvisePolicy::name`]).
    pub fn from_name(name: &str) -> Option<MadvisePolicy> {
        MadvisePolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// How `mmap_lock` writers run their serialized part (issue 32, "W1" of
/// the scaling design): how many write sections an unmap of a range with
/// nothing to zap takes, and how a writer waits for the lock. More policies
/// may come, so a `match` on it needs a wildcard arm. Every policy gives the
/// same mappings, errno and placement: only the number of write sections
/// and the way a waiting writer spends its time differ.
///
/// The ladder adds one mechanism per step, so the lab shows what each buys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WriterPolicy {
    /// Under [`UnmapPolicy::LockFree`], every unmap wider than one PTE
    /// table reserves its range and zaps it without `mmap_lock`, even a
    /// range with no page table to zap: three write sections per
    /// map-and-unmap. A waiting writer parks as `parking_lot` does (a few
    /// spins, `sched_yield`, then a futex).
    Reserve,
    /// An unmap that finds no leaf page table in its detached range (the
    /// check is stable under the write lock: the VMAs are detached and every
    /// table-allocating fault was waited for) finishes in its first write
    /// section: no reservation, no unreachable-range update, two write
    /// sections per map-and-unmap of untouched memory, as Linux. On the
    /// lab's loaded 2-CPU VM it did as well as `short-spin` or better
    /// (mmap1 and mmap2 threads, 2 threads, 7 repeats: 225k against 222k
    /// and 246k against 229k map+unmap/s), and 1.15-1.5x `reserve`. The
    /// old versions of the VMA windows are freed by whichever thread's
    /// epoch collection comes first, often a faulter's, which then pays
    /// for the writer's frees: beside an mmap/munmap loop a faulter kept
    /// 0.82-0.90 of its rate alone (see [`WriterPolicy::ShortOwnRcu`], the
    /// default, for the measurement).
    Short,
    /// [`WriterPolicy::Short`], and a writer that finds `mmap_lock` held
    /// spins (bounded) while it stays held before it parks, as Linux's
    /// rwsem optimistic spinning does while the owner runs: write sections
    /// last a few microseconds, less than a futex sleep and wakeup. Without
    /// knowing whether the owner runs, the spin also burns its bound when
    /// the owner was preempted, which on an oversubscribed machine (the
    /// lab's VM) costs what it saves.
    ShortSpin,
    /// [`WriterPolicy::Short`], and after publishing the VMA windows a
    /// write section changed, the writer hands its thread's epoch bag to
    /// the global queue and collects what has expired (crossbeam-epoch's
    /// `Guard::flush`). Otherwise the old versions a writer defers are
    /// freed by whichever thread's pin collects next (every 128th pin):
    /// often a faulting thread, which then pays for the writer's frees
    /// (issue 32 item 5, `interference`). Statistical only: a faulter that
    /// collects before the writer's next section still frees them; and
    /// each flush allocates a queue node and advances the epoch, whose line
    /// every pin reads.
    ShortCollect,
    /// [`WriterPolicy::Short`], and the old versions a write section
    /// unpublishes are the writer thread's own RCU callbacks
    /// (`sync::rcu::defer_destroy_own`, Linux's per-CPU callback lists):
    /// the collector only marks a batch's grace period as ended, one store
    /// per batch of 32 frees, and the writer frees the batch itself after a
    /// later write section, once `mmap_lock` is released. A faulting
    /// thread's collection never frees a writer's VMAs; a thread that
    /// exits hands what it still has queued to the collector. It removes
    /// the interference at no cost to the writers: on the lab's loaded
    /// 2-CPU VM a faulter beside an mmap/munmap loop kept 0.93-1.02 of its
    /// rate alone per CPU-second, against 0.82-0.90 under `short`, and
    /// wrote 0.067-0.069 shared lines per fault (as alone) against
    /// 0.14-0.155; mmap1/mmap2 ran within the noise of `short`
    /// (`docs/results/interference-2cpu.txt`). The default, for that
    /// measurement. What a caller can observe is released before the call
    /// returns under it as under every policy (Linux's `remove_vma`: a
    /// hugetlb mapping's reservations at `vm_ops->close`, its file use
    /// after the zap); only the VMAs' memory and the old window versions
    /// wait, until the writer's batch holds 32 frees and a later write
    /// section of it, or its exit.
    #[default]
    ShortOwnRcu,
    /// [`WriterPolicy::ShortOwnRcu`] for every call it does not cover, and
    /// range-parallel writers for those it does (issue 32 item 3, CortenMM's
    /// and RadixVM's point): a `munmap` of anonymous memory or of
    /// page-cache files, a `MAP_FIXED` (or, under
    /// [`PlacementPolicy::Arenas`], a non-fixed) `mmap` of private anonymous
    /// memory or of a page-cache file, or an `mprotect`, a VMA-flag
    /// `madvise` or an `mremap` of either, whose range and every VMA it touches or may
    /// merge with lie inside one 1 GiB window of the VMA set, runs without
    /// `mmap_lock`: in the address-space lock's shared mode
    /// (`sync/range_writers.rs`) under that window's own lock, on the
    /// window's published version, with the same split/merge/insert/remove
    /// code as the `mmap_lock` path, then publishes the window. Every
    /// `mmap_lock` holder blocks the shared mode, waits for it to drain and
    /// first brings its view of the VMA set up to date from the windows
    /// range writers published. The mappings, errnos and placement are
    /// those of every other policy; what falls back to `mmap_lock`, and why,
    /// is listed in `mm/range.rs`. A range writer frees the window versions
    /// it replaced itself, as `ShortOwnRcu`'s writers do. Not the default: on the lab's loaded
    /// 2-CPU VM a range write cost more CPU than a short write section
    /// (mmap1 with arenas, 0 global write acquisitions per op against 2,
    /// but 650-680k against 890-950k ops per CPU-second at one thread;
    /// `docs/results/range-writers-2cpu.txt`).
    Range,
}

impl WriterPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [WriterPolicy] = &[
        WriterPolicy::Reserve,
        WriterPolicy::Short,
        WriterPolicy::ShortSpin,
        WriterPolicy::ShortCollect,
        WriterPolicy::ShortOwnRcu,
        WriterPolicy::Range,
    ];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            WriterPolicy::Reserve => "reserve",
            WriterPolicy::Short => "short",
            WriterPolicy::ShortSpin => "short-spin",
            WriterPolicy::ShortCollect => "short-collect",
            WriterPolicy::ShortOwnRcu => "short-own-rcu",
            WriterPolicy::Range => "range",
        }
    }

    /// The policy named `name` (see [`WriterPolicy::name`]).
    pub fn from_name(name: &str) -> Option<WriterPolicy> {
        WriterPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }

    /// An unmap with nothing to zap ends in its first write section.
    pub(crate) fn short_unmap(self) -> bool {
        !matches!(self, WriterPolicy::Reserve)
    }

    /// A writer spins while `mmap_lock` is held before it parks.
    pub(crate) fn spin_handoff(self) -> bool {
        matches!(self, WriterPolicy::ShortSpin)
    }

    /// Bounded-range writers run in the shared mode, without `mmap_lock`,
    /// and every `mmap_lock` holder blocks them.
    pub(crate) fn range_writers(self) -> bool {
        matches!(self, WriterPolicy::Range)
    }
}

/// How `migrate_pages` moves a list of pages. The lab runs both in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigratePolicy {
    /// Before Linux 6.3: unmap, flush, copy and remap one page at a time
    /// (a TLB flush per page).
    OneByOne,
    /// Seed 003: unmap up to [`NR_MAX_BATCHED_MIGRATION`](crate::NR_MAX_BATCHED_MIGRATION) pages, one flush
    /// for every address space involved, copy all, remap all; page locks
    /// after the first taken with a trylock, failures retried one by one.
    #[default]
    Batched,
}

impl MigratePolicy {
    /// Every policy, for the lab.
    pub const ALL: [MigratePolicy; 2] = [MigratePolicy::OneByOne, MigratePolicy::Batched];

    /// The name the lab prints and parses (`one-by-one`, `batched`).
    pub fn name(self) -> &'static str {
        match self {
            MigratePolicy::OneByOne => "one-by-one",
            MigratePolicy::Batched => "batched",
        }
    }

    /// The policy named `name` (see [`MigratePolicy::name`]).
    pub fn from_name(name: &str) -> Option<MigratePolicy> {
        MigratePolicy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// What the pages of a `MAP_SHARED` mapping of a host file
/// ([`OpenFile::from_host`](crate::OpenFile::from_host)) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HostFileCoherence {
    /// softmm's own page cache, read from the host on a fault and written
    /// back at `msync(MS_SYNC)`, `File::sync` and the last unmap: a host
    /// write to a page already cached is not seen by the guest, and a guest
    /// write reaches the host at writeback.
    Cache,
    /// The default: Linux's behaviour, both sides see each other at once.
    /// The host's own `MAP_SHARED` mapping of the file (one per `mmap`), as
    /// `crate::host_mem` maps embedder memory: guest and host see each
    /// other's writes at once; an access to a page wholly past the host
    /// file's end is `SIGBUS` (`BUS_ADRERR`). The mapping has a shared
    /// file mapping's flags (not `VM_PFNMAP`): `MADV_DONTNEED` drops the
    /// translations (the bytes stay the file's), pins hold the host's page
    /// mapped, forced remote access reads and writes the file, `mremap`
    /// grows it over more of the file. `File::set_len` shoots the
    /// pages past the new end down before the host file shrinks; a
    /// truncation by the host itself leaves a window (a translation cached
    /// before it reaches the host's `SIGBUS`): see `docs/architecture.md`,
    /// "Coherent shared host files".
    #[default]
    Shared,
}

impl HostFileCoherence {
    /// Every policy, for the lab.
    pub const ALL: [HostFileCoherence; 2] = [HostFileCoherence::Cache, HostFileCoherence::Shared];

    /// The name the lab prints and parses (`cache`, `shared`).
    pub fn name(self) -> &'static str {
        match self {
            HostFileCoherence::Cache => "cache",
            HostFileCoherence::Shared => "shared",
        }
    }

    /// The policy named `name` (see [`HostFileCoherence::name`]).
    pub fn from_name(name: &str) -> Option<HostFileCoherence> {
        HostFileCoherence::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// What an atomic read-modify-write (or atomic load or store) that is not
/// naturally aligned does. More policies may come, so a `match` on it
/// needs a wildcard arm. Aligned atomics run the same code under every
/// policy: the policy is read only on the unaligned path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AtomicAlignment {
    /// `SIGBUS`/`BUS_ADRALN` ([`Fault::Unaligned`](crate::Fault::Unaligned)),
    /// as aarch64 and x86 with `split_lock_detect=fatal`. The default:
    /// what softmm always did, and what a guest that never splits an
    /// atomic keeps.
    #[default]
    Strict,
    /// x86's split locks: the atomic is made. Inside one naturally aligned
    /// 8-byte word, a compare-and-swap loop on that word (atomic with
    /// respect to every access); across words or pages, the bytes are
    /// read and written under the split lock with both pages' translations
    /// held (atomic with respect to other split atomics only: see
    /// `cpu/split_atomic.rs`).
    Split,
}

impl AtomicAlignment {
    /// Every policy, for sweeps.
    pub const ALL: &'static [AtomicAlignment] = &[AtomicAlignment::Strict, AtomicAlignment::Split];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            AtomicAlignment::Strict => "strict",
            AtomicAlignment::Split => "split",
        }
    }

    /// The policy named `name` (see [`AtomicAlignment::name`]).
    pub fn from_name(name: &str) -> Option<AtomicAlignment> {
        AtomicAlignment::ALL.iter().copied().find(|p| p.name() == name)
    }
}
