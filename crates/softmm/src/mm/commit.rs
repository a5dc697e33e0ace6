//! The address space's side of commit accounting: the pages a VMA tree
//! charges (`mm->total_vm`, `locked_vm`, the `VM_ACCOUNT` pages of a range)
//! and the memlock limit (`mlock_future_ok`, `can_do_mlock`). The charge
//! itself, `vm_committed_as` and the overcommit policy, belongs to the
//! arena (`phys/commit.rs`).

use crate::vma::VmFlags;
use crate::vma::VmaTree;
use crate::PAGE_SHIFT;

/// Pages of `VM_ACCOUNT` VMAs within `[start, end)`.
pub(crate) fn accounted_pages(vmas: &VmaTree, start: u64, end: u64) -> u64 {
    pages_with(vmas, start, end, VmFlags::ACCOUNT)
}

/// Pages of VMAs with any of `flags` within `[start, end)`.
pub(crate) fn pages_with(vmas: &VmaTree, start: u64, end: u64, flags: VmFlags) -> u64 {
    if start >= end {
        return 0;
    }
    vmas.overlapping(start, end)
        .filter(|v| v.flags.intersects(flags))
        .map(|v| (v.end.min(end) - v.start.max(start)) >> PAGE_SHIFT)
        .sum()
}

/// Every page of the VMAs `vmas` holds.
fn pages_of(vmas: &VmaTree) -> u64 {
    vmas.iter().map(|v| v.pages()).sum()
}

impl super::AddressSpace {
    /// `mm->total_vm`, every mapped page of the address space, for a call
    /// whose view of the VMA set is `vmas`. A range writer's view holds
    /// its own window alone (`VmaTree::window_view`): the other windows'
    /// pages are read from the published set, each window's version as
    /// some moment of the call left it (the range writers of other
    /// windows run beside it, unordered with it, as Linux's calls under
    /// `mmap_lock` are in some order). Only never-mode overcommit's charge
    /// and `mlockall` ask, so the walk over every VMA is theirs alone, as
    /// Linux's `__vm_enough_memory` reads a count kept on every change.
    pub(crate) fn total_vm(&self, vmas: &VmaTree) -> u64 {
        let own = pages_of(vmas);
        let Some((lo, hi)) = vmas.view() else {
            return own;
        };
        let guard = crossbeam_epoch::pin();
        let others = self.vmas_rcu(&guard).iter().filter(|v| v.end <= lo || v.start >= hi).map(|v| v.pages());
        own + others.sum::<u64>()
    }
}

/// `mm->locked_vm`: the pages of `VM_LOCKED` VMAs.
pub(crate) fn locked_vm(vmas: &VmaTree) -> u64 {
    vmas.iter().filter(|v| v.flags.contains(VmFlags::LOCKED)).map(|v| v.pages()).sum()
}

impl super::MmConfig {
    /// `can_do_mlock`: a locked mapping is possible at all.
    pub(crate) fn can_do_mlock(&self) -> bool {
        self.memlock_limit != 0 || self.cap_ipc_lock
    }

    /// `mlock_future_ok`: `bytes` more of a VMA with `flags` stay within
    /// `RLIMIT_MEMLOCK` given `locked` pages already locked.
    pub(crate) fn mlock_future_ok(&self, flags: VmFlags, bytes: u64, locked: impl FnOnce() -> u64) -> bool {
        if !flags.contains(VmFlags::LOCKED) || self.cap_ipc_lock {
            return true;
        }
        let pages = (bytes >> PAGE_SHIFT).saturating_add(locked());
        pages <= self.memlock_limit >> PAGE_SHIFT
    }
}
