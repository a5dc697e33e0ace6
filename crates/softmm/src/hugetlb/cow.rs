//! The owner's copy-on-write when the pool is empty (Linux's
//! `unmap_ref_private`).
//!
//! A private hugetlb mapping reserves a page per index for its owner (the
//! process that mapped it, `HPAGE_RESV_OWNER`), not for the children that
//! share its pages after `fork`. When the owner writes to such a shared
//! page and no page is left for the copy, Linux does not fail the owner: it
//! unmaps the page from the children, marks their VMAs
//! (`HPAGE_RESV_UNMAPPED`), and reuses the page, now its own; a child that
//! later faults there (or anywhere in that VMA) gets `SIGBUS`, which is
//! what "the children may be killed" in the hugetlb documentation means.

use crate::mm::{AddressSpace, MmuGather};
use crate::phys::Pfn;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SHIFT;

use super::HPAGE_SIZE;

/// `unmap_ref_private`: unmaps the huge page `head`, which the owner's
/// VMA `vma` maps at `haddr`, from every other private mapping of the
/// same file page that holds no reservations of its own (a child since
/// `fork`), marking each VMA it unmapped from. The owner's
/// copy-on-write then retries whatever it unmapped, as Linux's does, and
/// finds the page its own unless a child still maps it.
///
/// As Linux 6.12's: under the file's `i_mmap` lock for write, and no
/// lock of the other address spaces, so a child whose `mmap_lock` is
/// held meanwhile (a writer there may itself wait for `i_mmap`) loses
/// the page all the same. The caller holds this address space's
/// `mmap_lock` for read or the VMA's read reference, and nothing else:
/// `hugetlb_wp` drops the fault mutex and the policy's lock first (an
/// `i-mmap-rwsem` fault holds `i_mmap` for read), as Linux's does.
///
/// Sound without the child's `mmap_lock`: its VMA is found in the tree
/// published for lock-free readers, under an epoch guard; the walk goes
/// from the root under guards of its own and changes the entry only
/// under its PMD table's lock, where a zap of the child's own finds it
/// cleared or clears it first. A VMA the child is moving or copying
/// may keep a mapping of the page (a fork that copied the entry before
/// its child's VMA was linked): the owner's retry then finds the page
/// still shared and comes back here. A private VMA's PMD table is
/// never shared (`want_pmd_share` needs `VM_MAYSHARE`), so the walk
/// unshares nothing, and the child's TLB is flushed before `i_mmap`
/// goes.
pub(crate) fn unmap_ref_private(mm: &AddressSpace, vma: &Vma, haddr: u64, head: Pfn) {
    let Some(file) = vma.file.as_ref() else { return };
    let Some(inode) = file.hugetlb.as_ref() else { return };
    let pgoff = vma.pgoff_at(haddr);
    // The address spaces upgraded below, dropped after `i_mmap`
    // (declared first, so dropped last): ours may be the last reference
    // to one, and its exit unlinks its VMAs under `i_mmap` for write.
    let mut reap = Vec::new();
    let i_mmap = mm.phys.hugetlb.locks.write(super::lock::Kind::IMmapWrite, &inode.vmas.i_mmap);
    for r in inode.vmas.covering_locked(&i_mmap, pgoff) {
        let Some(smm) = r.mm.upgrade() else { continue };
        reap.push(smm.clone());
        let Some(smm) = AddressSpace::from_mapper(smm) else { continue };
        if std::ptr::eq(&*smm, mm) {
            continue;
        }
        let saddr = r.start + ((pgoff - r.pgoff) << PAGE_SHIFT);
        let sv = {
            let guard = crossbeam_epoch::pin();
            let Some(sv) = smm.vmas_rcu(&guard).find(saddr).cloned() else { continue };
            sv
        };
        // The VMA the reverse map names; shared mappings map the page
        // cache, and another owner's pages are its own: only
        // reserve-less private mappings lose it.
        if sv.start != r.start
            || sv.pgoff != r.pgoff
            || sv.flags.contains(VmFlags::MAYSHARE)
            || sv.hugetlb_resv.is_some()
            || !sv.file.as_ref().is_some_and(|f| std::sync::Arc::ptr_eq(f, file))
        {
            continue;
        }
        let mut tlb = MmuGather::default();
        let filter = |pte: crate::pgtable::Pte| {
            let ours = pte.pfn() == head;
            if ours {
                // Before the entry goes (its store is Release): a fault
                // that finds it gone sees the mark.
                sv.mark_hugetlb_unmapped();
            }
            ours
        };
        smm.zap_walk(saddr, saddr + HPAGE_SIZE, &mut tlb, filter, false);
        tlb.finish(&smm);
    }
    drop(i_mmap);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::uapi::*;
    use crate::{AddressSpace, Cpu, Fault, HugetlbPolicy, MmConfig, PhysConfig, PhysMem};

    const HP: u64 = 2 << 20;

    /// Every policy; under Miri the default only (each takes a minute
    /// there): the policies differ in which lock a fault takes, in code
    /// with no `unsafe`, while the frame copies and page tables Miri checks
    /// are the same for all of them.
    fn policies() -> Vec<HugetlbPolicy> {
        if cfg!(miri) {
            vec![HugetlbPolicy::default()]
        } else {
            HugetlbPolicy::ALL.to_vec()
        }
    }

    /// Linux's `unmap_ref_private` takes no lock of the children: a child
    /// whose `mmap_lock` another of its threads holds for write (a munmap,
    /// an mprotect) at the moment of the owner's failed COW still loses the
    /// page, and its next fault there is `SIGBUS`; the owner writes. Under
    /// every policy, `i-mmap-rwsem`'s included (its fault holds `i_mmap`
    /// for read, which the unmap takes for write once the fault's locks
    /// are dropped). Failed before the unmap stopped trying the child's
    /// `mmap_lock`: the owner got `SIGBUS`.
    #[test]
    fn a_child_whose_mmap_lock_is_held_still_loses_the_page_to_the_owner() {
        for policy in policies() {
            let phys = PhysMem::new(PhysConfig::new((16 << 20) + 3 * HP).hugepages(2)).unwrap();
            let parent = AddressSpace::new(&phys, MmConfig::default().hugetlb_policy(policy)).unwrap();
            let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
            let a = parent.mmap(0, 2 * HP, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
            {
                let mut pc = Cpu::attached(&parent);
                pc.write_u64(a, 1).unwrap();
                pc.write_u64(a + HP, 2).unwrap();
            }
            assert_eq!(phys.huge_page_stats().free, 0, "{policy:?}: the pool is empty");
            let child = parent.fork().unwrap();
            let mut cc = Cpu::attached(&child);
            assert_eq!(cc.read_u64(a).unwrap(), 1);
            let held = child.write_lock();
            let wrote = std::thread::scope(|s| {
                s.spawn(|| {
                    let mut pc = Cpu::attached(&parent);
                    pc.write_u64(a, 3).and_then(|()| pc.read_u64(a))
                })
                .join()
                .unwrap()
            });
            drop(held);
            assert_eq!(wrote, Ok(3), "{policy:?}: the owner took the page back and wrote it");
            assert_eq!(cc.read_u64(a), Err(Fault::Bus { addr: a }), "{policy:?}: the child lost it");
            assert_eq!(cc.read_u64(a + HP).unwrap(), 2, "{policy:?}: and only it");
            assert_eq!(phys.hugetlb_lock_stats().i_mmap_wait_ns, 0, "{policy:?}: nobody waited on i_mmap");
            drop(cc);
            drop((child, parent));
            let s = phys.quiesce();
            assert_eq!((s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0), "{policy:?}");
            assert_eq!(phys.huge_page_stats().free, 2, "{policy:?}");
        }
    }

    /// `HPAGE_RESV_UNMAPPED` set while the child splits the VMA: the owner's
    /// `unmap_ref_private` runs (on another thread, holding no lock of the
    /// child's) after the child's split copied the VMA's mark into the new
    /// pieces and before it published them, so it marks the old VMA, the
    /// one its reverse-map lookup finds. The piece holding the page it took
    /// still raises `SIGBUS` once the split is done, even with a page free
    /// by then (without the mark the child's fault would take that page
    /// and read zeroes, "looking like data was lost"). Seen failing with
    /// the carry-over in `publish_carrying_marks` removed: the child read 0.
    #[test]
    #[cfg_attr(miri, ignore = "safe mark bookkeeping; the hugetlb COW copy runs under Miri in the other cow tests")]
    fn an_unmapped_mark_set_during_a_childs_split_is_kept_by_the_pieces() {
        for policy in policies() {
            let phys = PhysMem::new(PhysConfig::new((16 << 20) + 4 * HP).hugepages(3)).unwrap();
            let cfg = MmConfig::default().hugetlb_policy(policy);
            let parent = AddressSpace::new(&phys, cfg.clone()).unwrap();
            let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
            let a = parent.mmap(0, 2 * HP, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
            {
                let mut pc = Cpu::attached(&parent);
                pc.write_u64(a, 1).unwrap();
                pc.write_u64(a + HP, 2).unwrap();
            }
            // The pool's last page, held elsewhere until the split is done.
            let other = AddressSpace::new(&phys, cfg).unwrap();
            let o = other.mmap(0, HP, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
            Cpu::attached(&other).write_u64(o, 9).unwrap();
            assert_eq!(phys.huge_page_stats().free, 0, "{policy:?}: the pool is empty");
            let child = parent.fork().unwrap();
            assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 1);
            let owner = parent.clone();
            let wrote = std::sync::Arc::new(std::sync::Mutex::new(None));
            let seen = wrote.clone();
            crate::mm::hooks::set_before_publish(move || {
                let w = std::thread::spawn(move || {
                    let mut pc = Cpu::attached(&owner);
                    pc.write_u64(a, 3).and_then(|()| pc.read_u64(a))
                })
                .join()
                .unwrap();
                *seen.lock().unwrap() = Some(w);
            });
            // Splits [a, a + 2 MiB) at a + 1 MiB of huge pages: two pieces.
            child.mprotect(a + HP, HP, PROT_READ).unwrap();
            assert_eq!(*wrote.lock().unwrap(), Some(Ok(3)), "{policy:?}: the owner took the page during the split");
            drop(other);
            assert_eq!(phys.huge_page_stats().free, 1, "{policy:?}: a page is free again");
            let mut cc = Cpu::attached(&child);
            assert_eq!(cc.read_u64(a), Err(Fault::Bus { addr: a }), "{policy:?}: the piece kept the mark");
            assert_eq!(cc.read_u64(a + HP).unwrap(), 2, "{policy:?}: the other page stays mapped");
            // Both pieces carry the mark, as if the owner had come before
            // the split (the other one needs no page while its entry stays).
            let guard = crossbeam_epoch::pin();
            let marked = |at: u64| child.vmas_rcu(&guard).find(at).unwrap().hugetlb_unmapped();
            assert!(marked(a) && marked(a + HP), "{policy:?}: both pieces");
            drop(guard);
            drop(cc);
            drop((child, parent));
            let s = phys.quiesce();
            assert_eq!((s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0), "{policy:?}");
            assert_eq!(phys.huge_page_stats().free, 3, "{policy:?}");
        }
    }

    /// The owner's copy-on-write with the pool empty meets its child
    /// dropping the shared page between the owner's map count check and
    /// `unmap_ref_private` (the child's `munmap` here, or its exit, whose
    /// reverse-map unlink comes before its page tables go): the page is the
    /// owner's alone by then, and Linux's `hugetlb_wp`, finding the entry
    /// unchanged after `unmap_ref_private`, retries (`goto
    /// retry_avoidcopy`) and reuses it whatever `unmap_ref_private` did;
    /// so does softmm's fault, which retries the access (it was `SIGBUS`
    /// when `unmap_ref_private` unmapped nothing). Found by
    /// `tests/stress/hugetlb_stress.rs` (both orders: the child's COW or munmap,
    /// and its exit, where the dying child's Weak no longer upgrades while
    /// its entries still map the page).
    #[test]
    #[cfg_attr(miri, ignore = "safe COW-ownership logic; the hugetlb COW copy runs under Miri in the other cow tests")]
    fn an_owner_whose_child_drops_the_page_during_its_cow_reuses_it() {
        let mut failed = Vec::new();
        // Miri runs the default fault policy only (each arena costs it many
        // seconds); the policies differ in how the fault is found, which
        // the other runs check.
        let policies: &[_] = match cfg!(miri) {
            true => &[crate::FaultPolicy::default()],
            false => crate::FaultPolicy::ALL,
        };
        for (exit, policy) in [false, true].into_iter().flat_map(|e| policies.iter().map(move |&p| (e, p))) {
            let phys = PhysMem::new(PhysConfig::new((16 << 20) + 2 * HP).hugepages(1)).unwrap();
            let parent = AddressSpace::new(&phys, MmConfig::default().policy(policy)).unwrap();
            let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;
            let a = parent.mmap(0, HP, PROT_READ | PROT_WRITE, flags, None, 0).unwrap();
            let mut pc = Cpu::attached(&parent);
            pc.write_u64(a, 1).unwrap();
            let child = parent.fork().unwrap();
            assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 1);
            assert_eq!(phys.huge_page_stats().free, 0, "exit {exit}: the pool is empty");
            let kept = std::rc::Rc::new(std::cell::RefCell::new(None));
            let slot = kept.clone();
            crate::mm::hooks::set_before_unmap_ref_private(move || {
                if !exit {
                    child.munmap(a, HP).unwrap();
                    *slot.borrow_mut() = Some(child);
                }
            });
            let wrote = pc.write_u64(a, 2);
            if wrote.is_err() {
                failed.push(format!("exit {exit} {policy:?}: {wrote:?}"));
            } else {
                assert_eq!(pc.read_u64(a), Ok(2), "exit {exit}");
            }
            drop((pc, kept, parent));
            let s = phys.quiesce();
            assert_eq!((s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0), "exit {exit}");
            assert_eq!(phys.huge_page_stats().free, 1, "exit {exit}");
        }
        assert!(failed.is_empty(), "the owner's write was SIGBUS: {failed:?}");
    }
}
