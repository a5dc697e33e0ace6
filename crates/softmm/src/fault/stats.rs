//! Per-CPU fault counters (seed 001 patch 35's `spf statistics`).

use super::Abort;

/// Fault counters of one CPU. Only that CPU writes them, so counting adds no
/// shared write. More counters may come: read the fields, and sum CPUs'
/// counters with [`FaultStats::add`] from [`FaultStats::default`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// Faults handled.
    pub faults: u64,
    /// Lock-free attempts.
    pub spec_attempts: u64,
    /// Lock-free attempts that committed.
    pub spec_successes: u64,
    /// Aborts because the address space's sequence count moved.
    pub aborts_mm_seq: u64,
    /// Aborts because the VMA was replaced or removed.
    pub aborts_vma: u64,
    /// Aborts for cases the lock-free path does not handle.
    pub aborts_unsupported: u64,
    /// Aborts because a lock was held.
    pub aborts_contended: u64,
    /// Lock-free attempts that fell back to `mmap_lock`.
    pub fallbacks: u64,
    /// `mmap_lock` read acquisitions by faults.
    pub mmap_lock_acquisitions: u64,
    /// Writes to shared cache lines made by faults (counted only with the
    /// `shared-write-stats` feature).
    pub shared_writes: u64,
}

impl FaultStats {
    pub(crate) fn count_abort(&mut self, cause: Abort) {
        match cause {
            Abort::MmSeq => self.aborts_mm_seq += 1,
            Abort::VmaChanged => self.aborts_vma += 1,
            Abort::Unsupported
            | Abort::NoPageTable
            | Abort::PmdUnshared
            | Abort::HugeMigration
            | Abort::HugePageLocked => self.aborts_unsupported += 1,
            Abort::Contended => self.aborts_contended += 1,
        }
    }

    /// Adds another CPU's counters.
    pub fn add(&mut self, o: &FaultStats) {
        self.faults += o.faults;
        self.spec_attempts += o.spec_attempts;
        self.spec_successes += o.spec_successes;
        self.aborts_mm_seq += o.aborts_mm_seq;
        self.aborts_vma += o.aborts_vma;
        self.aborts_unsupported += o.aborts_unsupported;
        self.aborts_contended += o.aborts_contended;
        self.fallbacks += o.fallbacks;
        self.mmap_lock_acquisitions += o.mmap_lock_acquisitions;
        self.shared_writes += o.shared_writes;
    }
}
