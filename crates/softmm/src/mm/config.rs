//! An address space's configuration: its layout and limits ([`MmConfig`]),
//! the policies it runs (`crate::policy`), and the checks that refuse a
//! configuration Linux could not have.
//!
//! A policy is part of the configuration, not of its mechanism: the
//! address space and its calls only carry it, and the mechanism (the fault
//! handler, `crate::fault`, for [`FaultPolicy`]) is what reads it, so the
//! core of `mm` does not depend on the features.

use crate::policy::{
    AtomicAlignment, FaultPolicy, HostFileCoherence, HugetlbPolicy, MadvisePolicy, MigratePolicy, PinPolicy,
    PlacementPolicy, UnmapPolicy, WriterPolicy,
};
use crate::PAGE_SIZE;

/// Layout and limits of an address space. The defaults are those of an x86-64
/// Linux process started without address randomization and with an 8 MiB
/// stack limit, so that the same calls from the same layout get the same
/// addresses as on Linux.
///
/// # Validity
///
/// [`AddressSpace::new`](crate::AddressSpace::new) refuses with `EINVAL` a
/// configuration Linux could not have: `task_size` not page aligned, zero,
/// or above [`TASK_SIZE`] (4-level paging); `mmap_min_addr`,
/// `lsm_mmap_min_addr`, `mmap_base`, `start_brk` or `stack_guard_gap` not
/// page aligned; `mmap_base` not above both the first page and the larger of
/// the two minimum addresses, or above `task_size` (the top-down search needs
/// room between them); `start_brk` outside `[mmap_min_addr, task_size]`;
/// `stack_guard_gap` not below `task_size`; `max_map_count` zero or above
/// `i32::MAX` (a sysctl `int`); `fault_around_pages` above `PTRS_PER_PTE`
/// (512). As Linux's `fault_around_bytes` handler does, the address space
/// rounds `fault_around_pages` down to a power of two, and 0 becomes 1
/// ([`AddressSpace::config`](crate::AddressSpace::config) shows the result).
/// [`MmConfig::check`] names the field that breaks a rule.
///
/// The type may gain fields: build it from [`MmConfig::default`] with the
/// setters, named after the fields.
///
/// ```
/// use softmm::{AddressSpace, FaultPolicy, MmConfig, PhysConfig, PhysMem};
/// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
/// let config = MmConfig::default().policy(FaultPolicy::MmapLock).stack_limit(1 << 20);
/// let mm = AddressSpace::new(&phys, config).unwrap();
/// assert_eq!(mm.config().stack_limit, 1 << 20);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MmConfig {
    /// How page faults synchronize with mapping changes.
    pub policy: FaultPolicy,
    /// One past the highest user address (`TASK_SIZE`).
    pub task_size: u64,
    /// Top of the top-down mmap area (`mm->mmap_base`).
    pub mmap_base: u64,
    /// Lowest address a mapping may use (`vm.mmap_min_addr`): a fixed
    /// mapping below it is refused with `EPERM`.
    pub mmap_min_addr: u64,
    /// `CONFIG_LSM_MMAP_MIN_ADDR` (distributions: 65536; 0 here): Linux's
    /// effective minimum is the larger of it and `mmap_min_addr` for hints,
    /// searches and stack growth, while a fixed mapping is refused only below
    /// `mmap_min_addr` unless a security module enforces it too.
    pub lsm_mmap_min_addr: u64,
    /// Start of the brk heap (`mm->start_brk`).
    pub start_brk: u64,
    /// Most VMAs an address space may have (`vm.max_map_count`).
    pub max_map_count: usize,
    /// Gap kept below a growsdown stack (`stack_guard_gap`).
    pub stack_guard_gap: u64,
    /// `RLIMIT_STACK`: how far a growsdown VMA may grow.
    pub stack_limit: u64,
    /// Align anonymous mappings whose length is a multiple of 2 MiB to 2 MiB,
    /// as Linux 6.7+ does with transparent huge pages built in.
    pub thp_align: bool,
    /// Pages mapped around a file read fault from the page cache (Linux: 16).
    pub fault_around_pages: u64,
    /// Try [`FaultPolicy::Speculative`] even with a single CPU attached (seed
    /// 001 patch 33 tries it only in multithreaded address spaces).
    pub force_speculative: bool,
    /// `RLIMIT_MEMLOCK` in bytes (Linux's default: 8 MiB; `u64::MAX` is
    /// `RLIM_INFINITY`): the most `MAP_LOCKED` memory the address space holds.
    pub memlock_limit: u64,
    /// The process has `CAP_IPC_LOCK` (locks without limit).
    pub cap_ipc_lock: bool,
    /// `CAP_SYS_RAWIO`: a fixed mapping (`mmap`, `mremap`'s target) may
    /// go below `mmap_min_addr` (Linux's `cap_mmap_addr`; hints and
    /// searches still keep above it). Default false.
    pub cap_sys_rawio: bool,
    /// How `pin_user_pages` synchronizes with mapping changes. Long-term
    /// pins are charged to `pinned_vm` against `memlock_limit` too.
    pub pin_policy: PinPolicy,
    /// How large unmaps synchronize with other threads (seed 002).
    pub unmap_policy: UnmapPolicy,
    /// The process has `CAP_SYS_NICE` (may move shared pages:
    /// `MPOL_MF_MOVE_ALL`).
    pub cap_sys_nice: bool,
    /// How page migration batches its TLB flushes (seed 003).
    pub migrate_policy: MigratePolicy,
    /// Which CPUs a TLB shootdown waits for (issue 15).
    pub shootdown_policy: crate::tlb::ShootdownPolicy,
    /// Which CPUs a TLB shootdown asks (issue 26).
    pub shootdown_targets: crate::tlb::ShootdownTargets,
    /// How a TLB shootdown posts its requests and whose barrier covers
    /// them (issue 26).
    pub posting_policy: crate::tlb::PostingPolicy,
    /// How hugetlb faults synchronize with PMD unsharing and truncate
    /// (seed 000).
    pub hugetlb_policy: HugetlbPolicy,
    /// Where non-fixed mappings go when their hint cannot be used.
    pub placement: PlacementPolicy,
    /// How `MADV_DONTNEED` and `MADV_FREE` synchronize with mapping changes
    /// (issue 26).
    pub madvise_policy: MadvisePolicy,
    /// How `mmap_lock` writers run their serialized part (issue 32).
    pub writer_policy: WriterPolicy,
    /// What the pages of a `MAP_SHARED` mapping of a host file are
    /// (issue 31).
    pub host_file_coherence: HostFileCoherence,
    /// What an atomic that is not naturally aligned does (issue 28).
    pub atomic_alignment: AtomicAlignment,
    /// Whether unmaps read the clock to time their parts
    /// ([`UnmapStats`](crate::UnmapStats)'s `_ns` fields stay 0 otherwise).
    pub time_unmaps: bool,
}

/// x86-64 `TASK_SIZE` with 4-level paging.
pub const TASK_SIZE: u64 = 0x7fff_ffff_f000;

// The published VMA set's windows cover the whole user address space.
const _: () = assert!(crate::vma::WINDOWS_END >= TASK_SIZE);

impl Default for MmConfig {
    fn default() -> Self {
        MmConfig {
            policy: FaultPolicy::default(),
            task_size: TASK_SIZE,
            // TASK_SIZE - clamp(8 MiB stack + 1 MiB guard gap, 128 MiB, ..).
            mmap_base: TASK_SIZE - (128 << 20),
            mmap_min_addr: 0x1000,
            lsm_mmap_min_addr: 0,
            start_brk: 0x5555_5555_9000,
            max_map_count: 65530,
            stack_guard_gap: 256 * PAGE_SIZE,
            stack_limit: 8 << 20,
            thp_align: true,
            fault_around_pages: 16,
            force_speculative: false,
            memlock_limit: 8 << 20,
            cap_ipc_lock: false,
            cap_sys_rawio: false,
            pin_policy: PinPolicy::default(),
            unmap_policy: UnmapPolicy::default(),
            cap_sys_nice: false,
            migrate_policy: MigratePolicy::default(),
            shootdown_policy: crate::tlb::ShootdownPolicy::default(),
            shootdown_targets: crate::tlb::ShootdownTargets::default(),
            posting_policy: crate::tlb::PostingPolicy::default(),
            hugetlb_policy: HugetlbPolicy::default(),
            placement: PlacementPolicy::default(),
            madvise_policy: MadvisePolicy::default(),
            writer_policy: WriterPolicy::default(),
            host_file_coherence: HostFileCoherence::default(),
            atomic_alignment: AtomicAlignment::default(),
            time_unmaps: false,
        }
    }
}

impl MmConfig {
    /// The configuration a loom model whose protocol is not the writer's
    /// reclaimer starts from: the default with [`WriterPolicy::Short`],
    /// whose old window versions crossbeam-epoch frees. Under the default
    /// `short-own-rcu` each write section's batch marker (`call_rcu` and a
    /// flush of the thread's bag, which collects) is more for loom to
    /// explore: a hugetlb model took 134 s against 13.6 s, and the loom
    /// stage 1,046 s against 445 s. The own-list reclaimer has models of
    /// its own (`mm::loom_tests`, which set it), as do the range writers.
    #[cfg(all(test, loom))]
    pub(crate) fn model_default() -> MmConfig {
        MmConfig::default().writer_policy(WriterPolicy::Short)
    }
}

impl MmConfig {
    // Consuming setters, one per field, so that an embedder builds a
    // configuration from `MmConfig::default()` without a struct literal
    // (the type is `#[non_exhaustive]`: fields may be added). Each is
    // checked only when the address space is made (see "Validity").

    /// Sets `policy`: how page faults synchronize with mapping changes (default [`FaultPolicy::PerVmaSeq`]).
    #[must_use]
    pub fn policy(mut self, policy: FaultPolicy) -> MmConfig {
        self.policy = policy;
        self
    }

    /// Sets `task_size`: one past the highest user address (default [`TASK_SIZE`]).
    #[must_use]
    pub fn task_size(mut self, task_size: u64) -> MmConfig {
        self.task_size = task_size;
        self
    }

    /// Sets `mmap_base`: the top of the top-down mmap area (default `TASK_SIZE` - 128 MiB).
    #[must_use]
    pub fn mmap_base(mut self, mmap_base: u64) -> MmConfig {
        self.mmap_base = mmap_base;
        self
    }

    /// Sets `mmap_min_addr`: the lowest address a fixed mapping may use, `vm.mmap_min_addr` (default 4096).
    #[must_use]
    pub fn mmap_min_addr(mut self, mmap_min_addr: u64) -> MmConfig {
        self.mmap_min_addr = mmap_min_addr;
        self
    }

    /// Sets `lsm_mmap_min_addr`: the security modules' minimum address, `CONFIG_LSM_MMAP_MIN_ADDR` (default 0).
    #[must_use]
    pub fn lsm_mmap_min_addr(mut self, lsm_mmap_min_addr: u64) -> MmConfig {
        self.lsm_mmap_min_addr = lsm_mmap_min_addr;
        self
    }

    /// Sets `start_brk`: the start of the brk heap (default `0x5555_5555_9000`).
    #[must_use]
    pub fn start_brk(mut self, start_brk: u64) -> MmConfig {
        self.start_brk = start_brk;
        self
    }

    /// Sets `max_map_count`: the most VMAs the address space may have, `vm.max_map_count` (default 65530).
    #[must_use]
    pub fn max_map_count(mut self, max_map_count: usize) -> MmConfig {
        self.max_map_count = max_map_count;
        self
    }

    /// Sets `stack_guard_gap`: the gap kept below a growsdown stack, in bytes (default 1 MiB).
    #[must_use]
    pub fn stack_guard_gap(mut self, stack_guard_gap: u64) -> MmConfig {
        self.stack_guard_gap = stack_guard_gap;
        self
    }

    /// Sets `stack_limit`: `RLIMIT_STACK`, how far a growsdown VMA may grow, in bytes (default 8 MiB).
    #[must_use]
    pub fn stack_limit(mut self, stack_limit: u64) -> MmConfig {
        self.stack_limit = stack_limit;
        self
    }

    /// Sets `thp_align`: whether anonymous mappings whose length is a multiple of 2 MiB are 2 MiB aligned (default true).
    #[must_use]
    pub fn thp_align(mut self, thp_align: bool) -> MmConfig {
        self.thp_align = thp_align;
        self
    }

    /// Sets `fault_around_pages`: the pages mapped around a file read fault (default 16).
    #[must_use]
    pub fn fault_around_pages(mut self, fault_around_pages: u64) -> MmConfig {
        self.fault_around_pages = fault_around_pages;
        self
    }

    /// Sets `force_speculative`: whether [`FaultPolicy::Speculative`] is tried with a single CPU attached (default false).
    #[must_use]
    pub fn force_speculative(mut self, force_speculative: bool) -> MmConfig {
        self.force_speculative = force_speculative;
        self
    }

    /// Sets `memlock_limit`: `RLIMIT_MEMLOCK` in bytes, `u64::MAX` for no limit (default 8 MiB).
    #[must_use]
    pub fn memlock_limit(mut self, memlock_limit: u64) -> MmConfig {
        self.memlock_limit = memlock_limit;
        self
    }

    /// Sets `cap_ipc_lock`: whether the process has `CAP_IPC_LOCK` and locks without limit (default false).
    #[must_use]
    pub fn cap_ipc_lock(mut self, cap_ipc_lock: bool) -> MmConfig {
        self.cap_ipc_lock = cap_ipc_lock;
        self
    }

    /// Sets `cap_sys_rawio`: whether the process has `CAP_SYS_RAWIO` and may map below `mmap_min_addr` (default false).
    #[must_use]
    pub fn cap_sys_rawio(mut self, cap_sys_rawio: bool) -> MmConfig {
        self.cap_sys_rawio = cap_sys_rawio;
        self
    }

    /// Sets `cap_sys_nice`: whether the process has `CAP_SYS_NICE` and may move shared pages (default false).
    #[must_use]
    pub fn cap_sys_nice(mut self, cap_sys_nice: bool) -> MmConfig {
        self.cap_sys_nice = cap_sys_nice;
        self
    }

    /// Sets `migrate_policy`: how page migration batches its TLB flushes (default [`crate::MigratePolicy::Batched`]).
    #[must_use]
    pub fn migrate_policy(mut self, migrate_policy: MigratePolicy) -> MmConfig {
        self.migrate_policy = migrate_policy;
        self
    }

    /// Sets `shootdown_policy`: which CPUs a TLB shootdown waits for (default [`crate::ShootdownPolicy::AccessSections`]).
    #[must_use]
    pub fn shootdown_policy(mut self, shootdown_policy: crate::tlb::ShootdownPolicy) -> MmConfig {
        self.shootdown_policy = shootdown_policy;
        self
    }

    /// Sets `shootdown_targets`: which CPUs a TLB shootdown asks (default [`crate::ShootdownTargets::FillOwners`]).
    #[must_use]
    pub fn shootdown_targets(mut self, shootdown_targets: crate::tlb::ShootdownTargets) -> MmConfig {
        self.shootdown_targets = shootdown_targets;
        self
    }

    /// Sets `posting_policy`: how a TLB shootdown posts its requests and whose barrier covers them (default [`crate::PostingPolicy::Adaptive`]).
    #[must_use]
    pub fn posting_policy(mut self, posting_policy: crate::tlb::PostingPolicy) -> MmConfig {
        self.posting_policy = posting_policy;
        self
    }

    /// Sets `pin_policy`: how `pin_user_pages` synchronizes with mapping changes (default [`PinPolicy::PerVma`]).
    #[must_use]
    pub fn pin_policy(mut self, pin_policy: PinPolicy) -> MmConfig {
        self.pin_policy = pin_policy;
        self
    }

    /// Sets `unmap_policy`: how large unmaps synchronize with other threads (default [`UnmapPolicy::LockFree`]).
    #[must_use]
    pub fn unmap_policy(mut self, unmap_policy: UnmapPolicy) -> MmConfig {
        self.unmap_policy = unmap_policy;
        self
    }

    /// Sets `hugetlb_policy`: how hugetlb faults synchronize with PMD unsharing and truncate (default [`HugetlbPolicy::LockFree`]).
    #[must_use]
    pub fn hugetlb_policy(mut self, hugetlb_policy: HugetlbPolicy) -> MmConfig {
        self.hugetlb_policy = hugetlb_policy;
        self
    }

    /// Sets `placement`: where non-fixed mappings go when their hint cannot be used (default [`PlacementPolicy::Linux`]).
    #[must_use]
    pub fn placement(mut self, placement: PlacementPolicy) -> MmConfig {
        self.placement = placement;
        self
    }

    /// Sets `atomic_alignment`: what an unaligned atomic does (default
    /// [`AtomicAlignment::Strict`]).
    pub fn atomic_alignment(mut self, atomic_alignment: AtomicAlignment) -> MmConfig {
        self.atomic_alignment = atomic_alignment;
        self
    }

    /// Sets `madvise_policy`: how `MADV_DONTNEED` and `MADV_FREE` synchronize with mapping changes (default [`MadvisePolicy::PerVma`]).
    #[must_use]
    pub fn madvise_policy(mut self, madvise_policy: MadvisePolicy) -> MmConfig {
        self.madvise_policy = madvise_policy;
        self
    }

    /// Sets `writer_policy`: how `mmap_lock` writers run their serialized part (default [`WriterPolicy::ShortOwnRcu`]).
    #[must_use]
    pub fn writer_policy(mut self, writer_policy: WriterPolicy) -> MmConfig {
        self.writer_policy = writer_policy;
        self
    }

    /// Sets `host_file_coherence`: what the pages of a `MAP_SHARED` mapping of a host file are (default [`HostFileCoherence::Shared`]).
    #[must_use]
    pub fn host_file_coherence(mut self, host_file_coherence: HostFileCoherence) -> MmConfig {
        self.host_file_coherence = host_file_coherence;
        self
    }

    /// Sets `time_unmaps`: whether unmaps time their parts in [`crate::UnmapStats`] (default false).
    #[must_use]
    pub fn time_unmaps(mut self, time_unmaps: bool) -> MmConfig {
        self.time_unmaps = time_unmaps;
        self
    }
}

/// Most page-table entries in a leaf table (`PTRS_PER_PTE`).
const PTRS_PER_PTE: u64 = 512;

impl MmConfig {
    /// Linux's `mmap_min_addr` variable: the larger of the sysctl and the
    /// security modules' minimum.
    pub(crate) fn min_addr(&self) -> u64 {
        self.mmap_min_addr.max(self.lsm_mmap_min_addr)
    }

    /// Checks the configuration against the rules of the type's "Validity"
    /// section and names the first field that breaks one:
    /// [`AddressSpace::new`](crate::AddressSpace::new) refuses exactly the
    /// configurations this refuses, with `EINVAL`. Call it first to tell
    /// a user which setting to change.
    pub fn check(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        let aligned = |v: u64| v % PAGE_SIZE == 0;
        let rules = [
            (aligned(self.task_size) && self.task_size != 0 && self.task_size <= TASK_SIZE, E::TaskSize),
            (aligned(self.mmap_min_addr), E::MmapMinAddr),
            (aligned(self.lsm_mmap_min_addr), E::LsmMmapMinAddr),
            (
                aligned(self.mmap_base)
                    && PAGE_SIZE.max(self.min_addr()) < self.mmap_base
                    && self.mmap_base <= self.task_size,
                E::MmapBase,
            ),
            (
                aligned(self.start_brk) && self.mmap_min_addr <= self.start_brk && self.start_brk <= self.task_size,
                E::StartBrk,
            ),
            (aligned(self.stack_guard_gap) && self.stack_guard_gap < self.task_size, E::StackGuardGap),
            (self.max_map_count != 0 && self.max_map_count <= i32::MAX as usize, E::MaxMapCount),
            (self.fault_around_pages <= PTRS_PER_PTE, E::FaultAroundPages),
        ];
        match rules.into_iter().find(|(ok, _)| !ok) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// The configuration as an address space uses it, or `EINVAL` if Linux
    /// could not have it (the rules are the type's "Validity" section, and
    /// [`MmConfig::check`] names the field).
    pub(crate) fn validate(&self) -> Result<MmConfig, crate::Errno> {
        self.check().map_err(|_| crate::Errno::Inval)?;
        let mut cfg = self.clone();
        // fault_around_bytes_set: max(rounddown_pow_of_two(bytes) >> PAGE_SHIFT, 1).
        cfg.fault_around_pages = match self.fault_around_pages {
            0 => 1,
            n => 1 << n.ilog2(),
        };
        Ok(cfg)
    }
}

/// The field of an [`MmConfig`] that breaks a rule of its "Validity"
/// section, from [`MmConfig::check`]. Its `Display` names the field and
/// the rule. More variants may come with new fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `task_size` is zero, not page aligned, or above [`TASK_SIZE`].
    TaskSize,
    /// `mmap_min_addr` is not page aligned.
    MmapMinAddr,
    /// `lsm_mmap_min_addr` is not page aligned.
    LsmMmapMinAddr,
    /// `mmap_base` is not page aligned, not above the first page and both
    /// minimum addresses, or above `task_size`.
    MmapBase,
    /// `start_brk` is not page aligned or outside `[mmap_min_addr, task_size]`.
    StartBrk,
    /// `stack_guard_gap` is not page aligned or not below `task_size`.
    StackGuardGap,
    /// `max_map_count` is zero or above `i32::MAX`.
    MaxMapCount,
    /// `fault_around_pages` is above 512 (`PTRS_PER_PTE`).
    FaultAroundPages,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConfigError::TaskSize => "task_size must be page aligned, non-zero and at most TASK_SIZE",
            ConfigError::MmapMinAddr => "mmap_min_addr must be page aligned",
            ConfigError::LsmMmapMinAddr => "lsm_mmap_min_addr must be page aligned",
            ConfigError::MmapBase => {
                "mmap_base must be page aligned, above the first page and both minimum addresses, and at most task_size"
            }
            ConfigError::StartBrk => "start_brk must be page aligned and within [mmap_min_addr, task_size]",
            ConfigError::StackGuardGap => "stack_guard_gap must be page aligned and below task_size",
            ConfigError::MaxMapCount => "max_map_count must be between 1 and i32::MAX",
            ConfigError::FaultAroundPages => "fault_around_pages must be at most 512",
        })
    }
}

impl std::error::Error for ConfigError {}

/// The user address limit of a 32-bit task on x86-64 (`IA32_PAGE_OFFSET`
/// without `ADDR_LIMIT_3GB`): one page below 4 GiB, the vsyscall page's.
pub const TASK_SIZE_32: u64 = 0xffff_e000;

impl MmConfig {
    /// The layout Linux gives a 32-bit (ia32 compat) task on x86-64 started
    /// without address randomization and with an 8 MiB stack limit, for an
    /// emulator of i386 (or, with the same numbers, another 32-bit) guest:
    /// `task_size` [`TASK_SIZE_32`]; `mmap_base` 128 MiB below it
    /// (`arch/x86/mm/mmap.c`'s `mmap_base`: the stack limit plus the guard
    /// gap, raised to the 128 MiB minimum gap), so that the top-down search
    /// starts at `0xf7ffe000` as on Linux; `start_brk` after a small PIE
    /// loaded at `0x56555000` (the non-randomized ia32 PIE base, as the
    /// default's is the 64-bit one's); no THP alignment of anonymous
    /// mappings (Linux 6.8 stopped forcing it on 32-bit tasks). Every other
    /// field is the default's, and the setters apply on top.
    pub fn compat32() -> MmConfig {
        MmConfig {
            task_size: TASK_SIZE_32,
            mmap_base: TASK_SIZE_32 - (128 << 20),
            start_brk: 0x5655_9000,
            thp_align: false,
            ..MmConfig::default()
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
