//! [`FaultPolicy::PerVma`](crate::FaultPolicy::PerVma) (a read reference on
//! the VMA, Linux 6.4) and [`FaultPolicy::PerVmaSeq`](crate::FaultPolicy::PerVmaSeq)
//! (validation against the VMA's detached bit, no shared write; the
//! reference only for the rare fault that allocates a page table).

use crate::mm::AddressSpace;
use crate::sync::shared_write;
use crate::vma::Vma;

use super::handler::{self, Check, FaultCtx};
use super::{Abort, Access, FaultError};

/// `with_ref`: take the VMA's read reference (`PerVma`); else validate
/// optimistically (`PerVmaSeq`), taking the reference only when a page table
/// must be allocated.
pub(super) fn handle(mm: &AddressSpace, addr: u64, access: Access, with_ref: bool) -> Result<(), FaultError> {
    let guard = crossbeam_epoch::pin();
    let vma = mm.vmas_rcu(&guard).find(addr).ok_or(FaultError::Abort(Abort::Unsupported))?;
    if with_ref {
        return with_reference(mm, vma, addr, access);
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
        Err(FaultError::Abort(Abort::NoPageTable)) => with_reference(mm, vma, addr, access),
        r => r,
    }
}

/// The fault under the VMA's read reference (Linux 6.4's per-VMA lock).
fn with_reference(mm: &AddressSpace, vma: &Vma, addr: u64, access: Access) -> Result<(), FaultError> {
    shared_write(2); // the reference, taken and dropped
    if !vma.lock.try_read() {
        return Err(FaultError::Abort(Abort::VmaChanged));
    }
    let ctx = FaultCtx { mm, vma, check: Check::None, may_sleep: false, may_alloc_tables: true, forced: false };
    let r = handler::handle_vma_fault(&ctx, addr, access);
    vma.lock.read_unlock();
    r
}
