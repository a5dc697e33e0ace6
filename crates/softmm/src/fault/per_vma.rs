//! [`FaultPolicy::PerVma`](crate::FaultPolicy::PerVma) (a read reference on
//! the VMA, Linux 6.4) and [`FaultPolicy::PerVmaSeq`](crate::FaultPolicy::PerVmaSeq)
//! (validation against the VMA's detached bit, no shared write; the
//! reference only for the rare fault that allocates a page table); and the
//! reference itself, which `MADV_DONTNEED` and `MADV_FREE` take too
//! ([`crate::MadvisePolicy::PerVma`]).

use std::sync::Arc;

use crate::mm::AddressSpace;
use crate::sync::shared_write;
use crate::vma::{VmFlags, Vma};

use super::handler::{self, Check, FaultCtx};
use super::{Abort, Access, FaultError};

/// A read reference on a VMA of the published tree (Linux's per-VMA lock
/// held for read, `vma_start_read`): while it is held the VMA is attached,
/// and a writer that replaces or removes it waits in its detach
/// ([`crate::sync::VmaLock::detach`]) until the reference is dropped, so
/// everything done under it, a TLB flush included, comes before any change
/// of the VMA (only [`crate::vma::VmaTree::remove`] takes a VMA out of the
/// tree, and it detaches first). Dropping it is `vma_end_read`.
pub(crate) struct VmaReadRef<'g> {
    vma: &'g Arc<Vma>,
}

impl<'g> VmaReadRef<'g> {
    /// Takes `vma`'s read reference; `None` if a writer has detached it.
    pub(crate) fn try_new(vma: &'g Arc<Vma>) -> Option<VmaReadRef<'g>> {
        shared_write(2); // the reference, taken and dropped
                         // `then`, not `then_some`: a reference built for a failed
                         // `try_read` would be dropped, and put a reference never taken.
        vma.lock.try_read().then(|| VmaReadRef { vma })
    }
}

impl std::ops::Deref for VmaReadRef<'_> {
    type Target = Arc<Vma>;
    fn deref(&self) -> &Arc<Vma> {
        self.vma
    }
}

impl Drop for VmaReadRef<'_> {
    fn drop(&mut self) {
        self.vma.lock.read_unlock();
    }
}

/// The last private anonymous VMA a CPU faulted in (Linux's per-task
/// `vmacache`, removed in 6.1 with the maple tree). A fault at an address
/// inside it starts from it instead of looking the address up in the
/// published VMA set, whose nodes a writer of the same window copies anew
/// at every call: each lookup after one missed the cache on every level
/// (a faulter beside an unrelated mmap/munmap loop, `docs/interference.md`).
///
/// Linux validated its cache by a per-mm sequence number that every VMA
/// change wrote, a line every fault read; this one is validated by the
/// VMA's own detached bit, which only a writer removing or replacing this
/// VMA writes: a VMA that is attached is in the current published set (a
/// VMA leaves it only detached, [`crate::vma::VmaTree::remove`]), so a
/// hinted VMA found attached is the one the lookup would have found.
///
/// Only private anonymous VMAs without special flags are kept: the `Arc`
/// keeps the VMA until the CPU's next fault elsewhere, its detach or its
/// drop, and such a VMA holds nothing whose release Linux makes visible
/// (a file, a hugetlb reservation, embedder memory).
#[derive(Default)]
pub(crate) struct VmaHint(Option<Arc<Vma>>);

impl VmaHint {
    /// Takes the hinted VMA out if it holds `addr` and is still attached
    /// (put back with [`VmaHint::keep`]: no reference count is written on
    /// a hit).
    fn take_for(&mut self, addr: u64) -> Option<Arc<Vma>> {
        self.0.take_if(|v| v.start <= addr && addr < v.end && !v.lock.is_detached())
    }

    /// Whether a hint may hold `vma`.
    fn may_hold(vma: &Vma) -> bool {
        vma.is_anonymous() && !vma.flags.intersects(VmFlags::SPECIAL)
    }

    /// Keeps `vma` as the hint.
    fn keep(&mut self, vma: Arc<Vma>) {
        debug_assert!(Self::may_hold(&vma));
        self.0 = Some(vma);
    }

    /// Forgets the hint (the CPU leaves its address space).
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}

/// The fault at `addr`: on the VMA of `hint` (the faulting CPU's
/// [`VmaHint`]) if it holds `addr`, else on the one of the published set,
/// which becomes the hint if it may.
pub(super) fn handle(
    mm: &AddressSpace,
    addr: u64,
    access: Access,
    with_ref: bool,
    hint: Option<&mut VmaHint>,
) -> Result<(), FaultError> {
    let guard = crossbeam_epoch::pin();
    let find = || mm.vmas_rcu(&guard).find(addr).ok_or(FaultError::Abort(Abort::Unsupported));
    let Some(hint) = hint else { return fault_on(mm, find()?, addr, access, with_ref) };
    let vma = match hint.take_for(addr) {
        Some(v) => v,
        None => {
            let v = find()?;
            if !VmaHint::may_hold(v) {
                return fault_on(mm, v, addr, access, with_ref);
            }
            // One reference count write per change of VMA.
            v.clone()
        }
    };
    let r = fault_on(mm, &vma, addr, access, with_ref);
    hint.keep(vma);
    r
}

/// `with_ref`: take the VMA's read reference (`PerVma`); else validate
/// optimistically (`PerVmaSeq`), taking the reference only when a page table
/// must be allocated. `vma` was found in the published set, or is a hint
/// found attached: either way a VMA of the current set until it is
/// detached, which both ways check.
fn fault_on(mm: &AddressSpace, vma: &Arc<Vma>, addr: u64, access: Access, with_ref: bool) -> Result<(), FaultError> {
    if with_ref {
        let vma = VmaReadRef::try_new(vma).ok_or(FaultError::Abort(Abort::VmaChanged))?;
        return with_reference(mm, &vma, addr, access);
    }
    if vma.lock.is_detached() {
        return Err(FaultError::Abort(Abort::VmaChanged));
    }
    let ctx = FaultCtx { mm, vma, check: Check::VmaDetached, may_sleep: false, may_alloc_tables: false, forced: false };
    match handler::handle_vma_fault(&ctx, addr, access) {
        // A table installed without the reference could escape the zap of a
        // writer removing the VMA (docs/architecture.md); with it, the
        // writer's detach waits for this fault, and then sees the table.
        // Once per new page table: the shared write stays off the fast path.
        Err(FaultError::Abort(Abort::NoPageTable)) => {
            let vma = VmaReadRef::try_new(vma).ok_or(FaultError::Abort(Abort::VmaChanged))?;
            with_reference(mm, &vma, addr, access)
        }
        r => r,
    }
}

/// The fault under the VMA's read reference (Linux 6.4's per-VMA lock).
fn with_reference(mm: &AddressSpace, vma: &VmaReadRef<'_>, addr: u64, access: Access) -> Result<(), FaultError> {
    let ctx = FaultCtx { mm, vma, check: Check::None, may_sleep: false, may_alloc_tables: true, forced: false };
    handler::handle_vma_fault(&ctx, addr, access)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::mm::MmConfig;
    use crate::phys::{PhysConfig, PhysMem};
    use crate::uapi::*;
    use crate::PAGE_SIZE;

    /// A reference is refused on a detached VMA and then leaves the VMA's
    /// lock word as it was: detached, no reader (a refused reference that
    /// still put one would clear the detached bit and leave a reader count
    /// that a later detach waits on forever).
    #[test]
    fn a_refused_reference_leaves_the_vma_detached_and_unread() {
        let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let guard = crossbeam_epoch::pin();
        let vma = mm.vmas_rcu(&guard).find(a).unwrap();
        {
            let r = VmaReadRef::try_new(vma).expect("attached");
            assert_eq!(r.start, a);
        }
        vma.lock.detach(); // returns: the reference was dropped
        assert!(VmaReadRef::try_new(vma).is_none());
        assert!(vma.lock.is_detached());
        assert!(matches!(handle(&mm, a, Access::Write, true, None), Err(FaultError::Abort(Abort::VmaChanged))));
        vma.lock.detach(); // returns: no reader left behind
        assert!(vma.lock.is_detached());
    }

    /// A CPU's hint serves only the VMA it names, only while that VMA is
    /// in the set: after a fault in one VMA, a fault in its neighbour (other
    /// protections) and faults after the hinted VMA was replaced (mprotect)
    /// or removed and its range mapped anew each give the result of the set
    /// as it is, under both per-VMA policies. A hint taken for any address
    /// (no range check) wrote the read-only neighbour; one taken while
    /// detached fell back to the locked path, which gives the same results.
    #[test]
    fn a_cpus_vma_hint_never_serves_another_vma() {
        use crate::error::{Fault, SegvCode};
        use crate::Cpu;
        for policy in [crate::FaultPolicy::PerVmaSeq, crate::FaultPolicy::PerVma] {
            let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
            let mm = Arc::new(AddressSpace::new(&phys, MmConfig::default().policy(policy)).unwrap());
            let a = mm.mmap(0, 4 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
            let b = a + 2 * PAGE_SIZE;
            mm.mprotect(b, 2 * PAGE_SIZE, PROT_READ).unwrap();
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u8(a, 1).unwrap(); // the hint: [a, b)
            let acc = |addr| Err(Fault::Segv { addr, code: SegvCode::AccErr });
            assert_eq!(cpu.write_u8(b, 1), acc(b), "{policy:?}: the read-only neighbour");
            assert_eq!(cpu.read_u8(b + PAGE_SIZE), Ok(0), "{policy:?}");
            cpu.write_u8(a + PAGE_SIZE, 2).unwrap(); // the hint: [a, b) again
                                                     // Replaced from another thread: the hinted VMA is detached.
            let m = mm.clone();
            std::thread::spawn(move || m.mprotect(a, 2 * PAGE_SIZE, PROT_READ).unwrap()).join().unwrap();
            let addr = a + PAGE_SIZE;
            assert_eq!(cpu.write_u8(addr, 3), acc(addr), "{policy:?}: after mprotect");
            assert_eq!(cpu.read_u8(addr), Ok(2), "{policy:?}");
            // Removed and mapped anew, writable, with fresh pages.
            let m = mm.clone();
            std::thread::spawn(move || {
                m.mprotect(a, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE).unwrap();
                m.munmap(a, 2 * PAGE_SIZE).unwrap();
                m.mmap(a, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0)
                    .unwrap();
            })
            .join()
            .unwrap();
            assert_eq!(cpu.read_u8(a + PAGE_SIZE), Ok(0), "{policy:?}: a new mapping");
            cpu.write_u8(a + PAGE_SIZE, 4).unwrap();
            assert_eq!(cpu.read_u8(a + PAGE_SIZE), Ok(4), "{policy:?}");
            // The CPU's hint is no reference the address space waits on.
            drop(cpu);
            let m = Arc::try_unwrap(mm).ok().expect("the last reference");
            drop(m);
            assert_eq!(phys.quiesce().vmas, 0, "{policy:?}");
        }
    }
}
