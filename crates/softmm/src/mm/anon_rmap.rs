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
mod tests {
    use super::*;
    use crate::phys::{Pfn, PhysConfig, PhysMem};
    use crate::sync::Ordering;
    use crate::uapi::*;
    use crate::{Cpu, MmConfig, PAGE_SIZE};

    /// The family, index and frame of the anonymous page at `addr` of `mm`.
    fn page_of(mm: &AddressSpace, addr: u64) -> (Arc<AnonFamily>, u64, Pfn) {
        let st = mm.read_lock();
        let v = st.vmas.find(addr).unwrap();
        let family = v.anon_vma.get().unwrap().family.clone();
        let pfn = mm.pte_at(addr).pfn();
        (family, mm.phys.desc(pfn).index.load(Ordering::Relaxed), pfn)
    }

    fn sorted(v: Vec<(Arc<AddressSpace>, u64)>) -> Vec<(usize, u64)> {
        let mut v: Vec<(usize, u64)> = v.into_iter().map(|(m, a)| (Arc::as_ptr(&m) as usize, a)).collect();
        v.sort();
        v
    }

    #[test]
    fn finds_every_mapping_through_fork_and_mremap() {
        let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
        let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = parent.mmap(0, 4 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        Cpu::attached(&parent).write_u64(a + PAGE_SIZE, 7).unwrap();
        let (family, index, pfn) = page_of(&parent, a + PAGE_SIZE);
        assert_eq!(sorted(anon_mappings(&family, index, pfn)), sorted(vec![(parent.clone(), a + PAGE_SIZE)]));
        // Two children share the page copy-on-write; a grandchild too.
        let c1 = parent.fork().unwrap();
        let c2 = parent.fork().unwrap();
        let g = c1.fork().unwrap();
        // c2 moves the page elsewhere with mremap (MAYMOVE to a new place).
        let b = c2.mmap(0, 8 * PAGE_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let moved =
            c2.mremap(a, 4 * PAGE_SIZE, 4 * PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, b + 2 * PAGE_SIZE).unwrap();
        assert_eq!(moved, b + 2 * PAGE_SIZE);
        let want = vec![
            (parent.clone(), a + PAGE_SIZE),
            (c1.clone(), a + PAGE_SIZE),
            (c2.clone(), moved + PAGE_SIZE),
            (g.clone(), a + PAGE_SIZE),
        ];
        assert_eq!(sorted(anon_mappings(&family, index, pfn)), sorted(want));
        // c1 writes: its COW copy is a new frame; the old one is no longer mapped there.
        Cpu::attached(&c1).write_u64(a + PAGE_SIZE, 8).unwrap();
        assert_ne!(c1.pte_at(a + PAGE_SIZE).pfn(), pfn);
        // A split by mprotect keeps the address.
        parent.mprotect(a, PAGE_SIZE, PROT_READ).unwrap();
        drop(g);
        let want = vec![(parent.clone(), a + PAGE_SIZE), (c2.clone(), moved + PAGE_SIZE)];
        assert_eq!(sorted(anon_mappings(&family, index, pfn)), sorted(want), "c1 copied, g is gone");
        // The copy c1 made belongs to the same family at the same index.
        let (f1, i1, p1) = page_of(&c1, a + PAGE_SIZE);
        assert!(Arc::ptr_eq(&f1, &family) && i1 == index);
        assert_eq!(sorted(anon_mappings(&family, index, p1)), sorted(vec![(c1.clone(), a + PAGE_SIZE)]));
    }
}
