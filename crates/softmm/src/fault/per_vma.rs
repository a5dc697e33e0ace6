//! [`FaultPolicy::PerVma`](super::FaultPolicy::PerVma) (a read reference on
//! the VMA, Linux 6.4) and [`FaultPolicy::PerVmaSeq`](super::FaultPolicy::PerVmaSeq)
//! (validation against the VMA's detached bit, no shared write).

use crate::mm::AddressSpace;

use super::handler::{self, Check, FaultCtx};
use super::{shared_write, Abort, Access, FaultError};

/// `with_ref`: take the VMA's read reference (`PerVma`); else validate
/// optimistically (`PerVmaSeq`).
pub(super) fn handle(mm: &AddressSpace, addr: u64, access: Access, with_ref: bool) -> Result<(), FaultError> {
    let guard = crossbeam_epoch::pin();
    let vma = mm.vmas_rcu(&guard).find(addr).ok_or(FaultError::Abort(Abort::Unsupported))?;
    if with_ref {
        shared_write(2); // the reference, taken and dropped
        if !vma.lock.try_read() {
            return Err(FaultError::Abort(Abort::VmaChanged));
        }
        let ctx = FaultCtx { mm, vma, check: Check::None, may_sleep: false, may_alloc_tables: true };
        let r = handler::handle_vma_fault(&ctx, addr, access);
        vma.lock.read_unlock();
        r
    } else {
        if vma.lock.is_detached() {
            return Err(FaultError::Abort(Abort::VmaChanged));
        }
        let ctx = FaultCtx { mm, vma, check: Check::VmaDetached, may_sleep: false, may_alloc_tables: false };
        handler::handle_vma_fault(&ctx, addr, access)
    }
}
