//! Splitting and modifying VMAs (Linux's `mm/vma.c`): the one `split_vma`
//! that `munmap`, `mprotect`, `madvise` and `mbind` share, and
//! `vma_modify`, which gives part of a VMA new flags or a new policy,
//! merging with a neighbour where the result allows and splitting where
//! not.
//!
//! A published [`Vma`] never changes, so a split replaces the VMA by its
//! pieces: the VMA is detached from the tree (faults through it abort or
//! wait, as Linux's `vma_start_write`), its backing is told of the split
//! ([`crate::vma::VmaOps::split`], Linux's `hugetlb_split` in
//! `__split_vma`), and the pieces outside the range that changes go back.
//! Whether a split is allowed at all ([`crate::vma::VmaOps::may_split`])
//! is checked, for every edge of an operation, before anything changes:
//! an operation refused there changes nothing.

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::mempolicy::MemPolicy;
use crate::vma::{anon_compatible, VmFlags, Vma};
use crate::PAGE_SIZE;

use super::{AddressSpace, MmState};

/// What [`AddressSpace::vma_modify`] changes in a range of a VMA: its
/// flags (`mprotect`, `madvise`) or its NUMA policy (`mbind`), Linux's
/// `vma_merge_struct` fields `flags` and `policy`.
pub(crate) struct VmaChange {
    /// The `VM_*` flags the range gets.
    pub(crate) flags: VmFlags,
    /// The policy the range gets (`None`: the address space's).
    pub(crate) policy: Option<Arc<MemPolicy>>,
}

impl AddressSpace {
    /// The refusals of [`Self::split_vma`] of `vma` around `[start, end)`,
    /// without changing anything: `vm_ops->may_split` at each edge of the
    /// range that lies inside `vma` (hugetlb: `EINVAL` inside a huge page).
    /// The callers check `max_map_count` first, each as Linux does.
    pub(crate) fn split_vma_check(vma: &Vma, start: u64, end: u64) -> Result<()> {
        if start > vma.start {
            vma.ops.may_split(vma, start)?;
        }
        if end < vma.end {
            vma.ops.may_split(vma, end)?;
        }
        Ok(())
    }

    /// Linux's `__split_vma` at each edge of `[start, end)` inside `vma`:
    /// removes `vma` from the tree (detaching it, so that no fault goes on
    /// through it), tells its backing of each split
    /// ([`crate::vma::VmaOps::split`]) and puts back the pieces of `vma`
    /// below `start` and above `end`. What covers `[start, end)` after,
    /// if anything, is the caller's. [`Self::split_vma_check`] has passed
    /// for the same range; `mmap_lock` is held for write.
    pub(crate) fn split_vma(&self, st: &mut MmState, vma: &Arc<Vma>, start: u64, end: u64) {
        st.vmas.remove(vma.start);
        // The backing's split (hugetlb_split) once both splits are allowed and the VMA is
        // detached (Linux write-locks it first, `vma_start_write`): a
        // fault through it could link the window's table again.
        if start > vma.start {
            self.split_unshare(vma, start);
        }
        if end < vma.end {
            self.split_unshare(vma, end);
        }
        if start > vma.start {
            st.vmas.insert(vma.slice(vma.start, start, vma.flags));
        }
        if end < vma.end {
            st.vmas.insert(vma.slice(end, vma.end, vma.flags));
        }
    }

    /// The backing's step of a split of the detached `vma` at `addr`
    /// ([`crate::vma::VmaOps::split`], Linux's `hugetlb_split`): the range
    /// it names, whose tables no piece will cover whole, is unshared now.
    fn split_unshare(&self, vma: &Vma, addr: u64) {
        if let Some(window) = vma.ops.split(vma, addr) {
            self.hugetlb_unshare_range(window.start, window.end);
            #[cfg(all(test, not(loom)))]
            super::hooks::after_hugetlb_split();
        }
    }

    /// `vma_modify`'s splits where nothing merges: `split_vma` of the head,
    /// then of the tail, each refused with `ENOMEM` once `map_count` is at
    /// `max_map_count`, then with the backing's `may_split` error. A
    /// refused tail leaves the head split off (the error returned, nothing
    /// else changed), as Linux does; a refused head changes nothing.
    fn check_splits_keeping_head(&self, st: &mut MmState, vma: &Arc<Vma>, start: u64, end: u64) -> Result<()> {
        let max = self.config.max_map_count;
        let head = start > vma.start;
        if head {
            if st.vmas.len() >= max {
                return Err(Errno::NoMem);
            }
            vma.ops.may_split(vma, start)?;
        }
        if end < vma.end {
            let tail =
                if st.vmas.len() + head as usize >= max { Err(Errno::NoMem) } else { vma.ops.may_split(vma, end) };
            if let Err(e) = tail {
                if head {
                    self.split_vma(st, vma, start, vma.end);
                    st.vmas.insert(vma.slice(start, vma.end, vma.flags));
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Linux's `vma_modify`: gives `[start, end)`, a range of `vma`, the
    /// flags and policy of `change`, merging with the previous or next VMA
    /// when the range touches it and they become identical (same flags,
    /// backing, compatible anon_vma and same policy), splitting `vma`
    /// otherwise. A merge checks no limit; a split is refused with `ENOMEM`
    /// at `max_map_count`, then with the backing's error, the head's
    /// before the tail's, and a refused tail leaves the head split off
    /// ([`Self::check_splits_keeping_head`]).
    pub(crate) fn vma_modify(
        &self,
        st: &mut MmState,
        vma: &Arc<Vma>,
        start: u64,
        end: u64,
        change: VmaChange,
    ) -> Result<()> {
        let VmaChange { flags, policy } = change;
        let file = vma.file_id();
        let anon = vma.anon_vma.get();
        let pgoff = vma.pgoff_at(start);
        let pages = (end - start) / PAGE_SIZE;
        let pol = policy.as_ref();
        let prev = st.vmas.prev_of(vma.start).filter(|p| p.end == start && start == vma.start).cloned();
        let next = st.vmas.first_starting_at(vma.end).filter(|n| n.start == end && end == vma.end).cloned();
        let left = prev.as_ref().is_some_and(|p| p.can_merge_after(flags, file, anon, pgoff) && p.same_policy(pol));
        let mut right =
            next.as_ref().is_some_and(|n| n.can_merge_before(flags, file, anon, pgoff, pages) && n.same_policy(pol));
        if left && right {
            right = anon_compatible(
                prev.as_ref().and_then(|p| p.anon_vma.get()),
                next.as_ref().and_then(|n| n.anon_vma.get()),
            );
        }
        if left || right {
            // `vma_merge_existing_range`: a merge adds no VMA, and checks
            // no limit.
            Self::split_vma_check(vma, start, end)?;
        } else {
            self.check_splits_keeping_head(st, vma, start, end)?;
        }
        self.split_vma(st, vma, start, end);
        let (mut lo, mut hi, mut pg) = (start, end, pgoff);
        let mut anon_new = vma.anon_vma.get().cloned();
        if let Some(p) = prev.as_ref().filter(|_| left) {
            st.vmas.remove(p.start);
            lo = p.start;
            pg = p.pgoff;
            anon_new = p.anon_vma.get().cloned().or(anon_new);
        }
        if let Some(n) = next.as_ref().filter(|_| right) {
            st.vmas.remove(n.start);
            hi = n.end;
            anon_new = anon_new.or_else(|| n.anon_vma.get().cloned());
        }
        let mut merged = vma.rebound(lo, hi, pg);
        merged.flags = flags;
        merged.policy = policy;
        merged.set_anon(anon_new);
        st.vmas.insert(merged);
        Ok(())
    }

    /// Linux's `vma_modify_flags`: [`Self::vma_modify`] to `newflags`,
    /// keeping the policy; nothing to do if the flags are `vma`'s.
    pub(crate) fn vma_modify_flags(
        &self,
        st: &mut MmState,
        vma: &Arc<Vma>,
        start: u64,
        end: u64,
        newflags: VmFlags,
    ) -> Result<()> {
        if newflags == vma.flags {
            return Ok(());
        }
        self.vma_modify(st, vma, start, end, VmaChange { flags: newflags, policy: vma.policy.clone() })
    }

    /// Linux's `vma_modify_policy` + `vma_replace_policy`:
    /// [`Self::vma_modify`] to `policy`, keeping the flags.
    pub(crate) fn vma_modify_policy(
        &self,
        st: &mut MmState,
        vma: &Arc<Vma>,
        start: u64,
        end: u64,
        policy: Option<Arc<MemPolicy>>,
    ) -> Result<()> {
        self.vma_modify(st, vma, start, end, VmaChange { flags: vma.flags, policy })
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
