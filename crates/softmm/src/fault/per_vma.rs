//! [`FaultPolicy::PerVma`](crate::FaultPolicy::PerVma) (a read reference on
//! the VMA, Linux 6.4) and [`FaultPolicy::PerVmaSeq`](crate::FaultPolicy::PerVmaSeq)
//! (validation against the VMA's detached bit, no shared write; the
//! reference only for the rare fault that allocates a page table); and the
//! reference itself, which `MADV_DONTNEED` and `MADV_FREE` take too
//! ([`crate::MadvisePolicy::PerVma`]).

use std::sync::Arc;

use crossbeam_epoch::Guard;

use crate::mm::AddressSpace;
use crate::sync::shared_write;
use crate::vma::Vma;

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

/// Linux's `lock_vma_under_rcu`: the VMA holding `addr` in the tree published
/// for lock-free readers, with its read reference taken. `Unsupported` if no
/// VMA holds `addr` (the caller's `mmap_lock` path decides what that means:
/// a stack to grow, `SIGSEGV`, `ENOMEM`), `VmaChanged` if a writer is
/// replacing or removing the one found. The VMA lives as long as `guard`.
fn lock_vma_under_rcu<'g>(mm: &AddressSpace, addr: u64, guard: &'g Guard) -> Result<VmaReadRef<'g>, Abort> {
    let vma = mm.vmas_rcu(guard).find(addr).ok_or(Abort::Unsupported)?;
    VmaReadRef::try_new(vma).ok_or(Abort::VmaChanged)
}

/// `with_ref`: take the VMA's read reference (`PerVma`); else validate
/// optimistically (`PerVmaSeq`), taking the reference only when a page table
/// must be allocated.
pub(super) fn handle(mm: &AddressSpace, addr: u64, access: Access, with_ref: bool) -> Result<(), FaultError> {
    let guard = crossbeam_epoch::pin();
    if with_ref {
        let vma = lock_vma_under_rcu(mm, addr, &guard).map_err(FaultError::Abort)?;
        return with_reference(mm, &vma, addr, access);
    }
    let vma = mm.vmas_rcu(&guard).find(addr).ok_or(FaultError::Abort(Abort::Unsupported))?;
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
        assert!(lock_vma_under_rcu(&mm, a, &guard).is_err());
        vma.lock.detach(); // returns: no reader left behind
        assert!(vma.lock.is_detached());
    }
}
