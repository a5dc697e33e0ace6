//! The reverse walk of anonymous memory (Linux's `rmap_walk_anon` with
//! `vma_address`): from a page of an anon family at a linear index to every
//! address space and address that may map it.
//!
//! An anonymous page's linear index (`FrameDesc::index`, set at its fault
//! from the VMA's `pgoff`) does not change when its VMA is split, merged,
//! moved by `mremap` (which keeps the VMA's `pgoff`) or copied by `fork`, so
//! in every VMA of the family that maps it, it sits at
//! `start + (index - pgoff) * PAGE_SIZE`. The walk visits the family's
//! members (see [`crate::vma::AnonFamily`]) and their published VMA trees;
//! nothing on the fault path writes for it. It gives candidates: a caller
//! confirms each under the entry's table lock, since a VMA found here may be
//! changing under a concurrent writer (migration then sees a reference it
//! cannot account for and retries, as Linux's refcount freeze does).

use std::sync::Arc;

use crate::vma::{AnonFamily, Vma};
use crate::PAGE_SHIFT;

use super::AddressSpace;

/// Calls `f(mm, vma, addr)` for every VMA of `family`'s members that covers
/// linear index `index` of the family, with the address it has there.
pub(crate) fn for_each_anon_vma(family: &AnonFamily, index: u64, mut f: impl FnMut(&Arc<AddressSpace>, &Vma, u64)) {
    for member in family.members() {
        let Ok(mm) = member.downcast::<AddressSpace>() else { continue };
        let guard = crossbeam_epoch::pin();
        for v in mm.vmas_rcu(&guard).iter() {
            let ours = v.anon_vma.get().is_some_and(|a| std::ptr::eq(Arc::as_ptr(&a.family), family));
            if ours && (v.pgoff..v.pgoff + v.pages()).contains(&index) {
                f(&mm, v, v.start + ((index - v.pgoff) << PAGE_SHIFT));
            }
        }
    }
}

/// Every (address space, address) whose entry maps frame `pfn`, a page of
/// `family` at linear index `index`, as the entries are now (the tests'
/// view; migration counts them with `migrate::page_mapcount`).
#[cfg(all(test, not(loom)))]
pub(crate) fn anon_mappings(family: &AnonFamily, index: u64, pfn: crate::phys::Pfn) -> Vec<(Arc<AddressSpace>, u64)> {
    let mut out = Vec::new();
    for_each_anon_vma(family, index, |mm, _, addr| {
        let pte = mm.pte_at(addr);
        if pte.has_frame() && pte.pfn() == pfn {
            out.push((mm.clone(), addr));
        }
    });
    out
}

#[cfg(all(test, not(loom)))]
mod tests;
