//! The workloads of the thread sweep (`softmm bench pft,...`): their
//! names, modes and units, which the sweep, its tables and its plot share.
//! How each runs is in `workloads/`.
//!
//! A leaf: it imports nothing else of the lab.

/// big-munmap's modes: what the other threads do while the munmap runs.
pub const BIG_MUNMAP_MODES: &[&str] = &["fault", "mmap", "maps", "fault-other-mm", "alone"];

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// mmtests' page-fault test.
    Pft,
    /// will-it-scale page_fault1: anonymous private.
    PageFault1,
    /// will-it-scale page_fault2: private file.
    PageFault2,
    /// will-it-scale page_fault3: shared file.
    PageFault3,
    /// will-it-scale mmap1: anonymous map/unmap.
    Mmap1,
    /// will-it-scale mmap2: file map/unmap.
    Mmap2,
    /// will-it-scale tlb_flush1-3: write, MADV_DONTNEED, check.
    TlbFlush,
    /// Faulting threads beside an mmap/munmap thread.
    Interference,
    /// The CortenMM microbenchmarks.
    Cortenmm,
    /// Seed 002: a large munmap beside faulting, mapping or maps-reading threads.
    BigMunmap,
    /// `MADV_DONTFORK` and `MADV_DOFORK` on one page of each thread's own
    /// mapping: a split and a merge per operation (issue 32's range
    /// `madvise`).
    MadviseFlags,
    /// A page of each thread's own mapping moved with
    /// `MREMAP_MAYMOVE | MREMAP_FIXED` and back (issue 32's range `mremap`).
    MremapMove,
}

/// The CortenMM operations, each in low and high contention.
pub const CORTENMM_MODES: &[&str] = &[
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

impl Workload {
    /// Every workload, in the order they are listed and run.
    pub const ALL: &'static [Workload] = &[
        Workload::Pft,
        Workload::PageFault1,
        Workload::PageFault2,
        Workload::PageFault3,
        Workload::Mmap1,
        Workload::Mmap2,
        Workload::TlbFlush,
        Workload::Interference,
        Workload::Cortenmm,
        Workload::MadviseFlags,
        Workload::MremapMove,
        Workload::BigMunmap,
    ];

    /// The command-line and result name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Pft => "pft",
            Workload::PageFault1 => "page-fault1",
            Workload::PageFault2 => "page-fault2",
            Workload::PageFault3 => "page-fault3",
            Workload::Mmap1 => "mmap1",
            Workload::Mmap2 => "mmap2",
            Workload::TlbFlush => "tlb-flush",
            Workload::Interference => "interference",
            Workload::Cortenmm => "cortenmm",
            Workload::BigMunmap => "big-munmap",
            Workload::MadviseFlags => "madvise-flags",
            Workload::MremapMove => "mremap-move",
        }
    }

    /// The workload called `name`.
    pub fn from_name(name: &str) -> Option<Workload> {
        Workload::ALL.iter().copied().find(|w| w.name() == name)
    }

    /// The modes it can run in.
    pub fn modes(self) -> &'static [&'static str] {
        match self {
            Workload::Pft => &["threads"],
            Workload::PageFault1
            | Workload::PageFault2
            | Workload::PageFault3
            | Workload::Mmap1
            | Workload::Mmap2
            | Workload::TlbFlush => &["threads", "processes"],
            Workload::Interference => &["alone", "interfered"],
            Workload::Cortenmm => CORTENMM_MODES,
            Workload::BigMunmap => BIG_MUNMAP_MODES,
            Workload::MadviseFlags | Workload::MremapMove => &["threads"],
        }
    }

    /// The modes it runs in when `--mode` names none of its own.
    pub fn default_modes(self) -> &'static [&'static str] {
        match self {
            Workload::Interference | Workload::Cortenmm | Workload::BigMunmap => self.modes(),
            _ => &self.modes()[..1],
        }
    }

    /// What one operation is, for the table's legend.
    pub fn op_unit(self) -> &'static str {
        match self {
            Workload::Pft | Workload::PageFault1 | Workload::PageFault2 | Workload::PageFault3 => "page faulted",
            Workload::Mmap1 | Workload::Mmap2 => "map+unmap",
            Workload::TlbFlush => "page written, dropped, checked",
            Workload::Interference => "page faulted by a faulter",
            Workload::Cortenmm => "16 KiB region operation",
            Workload::BigMunmap => "other thread's operation during the munmap",
            Workload::MadviseFlags => "DONTFORK+DOFORK pair (a split and a merge)",
            Workload::MremapMove => "page moved and moved back",
        }
    }

    /// Threads (or processes) of a sample in `mode` with `threads` tasks
    /// that want a CPU at once: the tasks, and the mapping thread of
    /// `interference`'s interfered mode or the munmapping thread of
    /// `big-munmap`.
    pub fn tasks(self, mode: &str, threads: usize) -> usize {
        match (self, mode) {
            (Workload::Interference, "interfered") | (Workload::BigMunmap, _) => threads + 1,
            _ => threads,
        }
    }
}
