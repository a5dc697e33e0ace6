//! [`FaultPolicy::Speculative`](crate::FaultPolicy::Speculative): seed 001's
//! speculative page fault, validated against the address space's sequence
//! count.

use crate::mm::AddressSpace;

use super::handler::{self, Check, FaultCtx};
use super::{Abort, Access, FaultError};

pub(super) fn handle(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), FaultError> {
    let seq = mm.seq.read_begin().ok_or(FaultError::Abort(Abort::MmSeq))?;
    let guard = crossbeam_epoch::pin();
    let vma = mm.vmas_rcu(&guard).find(addr).ok_or(FaultError::Abort(Abort::Unsupported))?;
    let ctx = FaultCtx { mm, vma, check: Check::MmSeq(seq), may_sleep: false, may_alloc_tables: false, forced: false };
    handler::handle_vma_fault(&ctx, addr, access)
}
