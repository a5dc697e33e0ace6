//! [`FaultPolicy::MmapLock`](crate::FaultPolicy::MmapLock): the whole fault
//! under `mmap_lock` held for read; also every other policy's fallback.

use crate::error::{Fault, SegvCode};
use crate::mm::AddressSpace;
use crate::sync::shared_write;
use crate::vma::VmFlags;

use super::handler::{self, Check, FaultCtx};
use super::{Access, FaultError};

pub(super) fn handle(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Fault> {
    shared_write(2); // the rwlock word, on lock and on unlock
    let st = mm.read_lock_fault();
    let segv = Fault::Segv { addr, code: SegvCode::MapErr };
    if let Some(vma) = st.vmas.find(addr) {
        return locked(mm, vma, addr, access);
    }
    let below_stack = st.vmas.find_from(addr).is_some_and(|v| v.flags.contains(VmFlags::GROWSDOWN));
    drop(st);
    if !below_stack {
        return Err(segv);
    }
    // Expanding the stack changes the VMA tree: it needs the write lock,
    // never an upgrade of the read lock (StackRot).
    mm.expand_stack(addr).map_err(|_| segv)?;
    shared_write(2);
    let st = mm.read_lock_fault();
    let vma = st.vmas.find(addr).ok_or(segv)?;
    locked(mm, vma, addr, access)
}

/// The fault under `mmap_lock` (held by the caller, for read or write).
pub(super) fn locked(mm: &AddressSpace, vma: &crate::vma::Vma, addr: u64, access: Access) -> Result<(), Fault> {
    let ctx = FaultCtx { mm, vma, check: Check::None, may_sleep: true, may_alloc_tables: true, forced: false };
    match handler::handle_vma_fault(&ctx, addr, access) {
        Ok(()) => Ok(()),
        Err(FaultError::Signal(f)) => Err(f),
        Err(FaultError::Abort(a)) => unreachable!("locked fault aborted: {a:?}"),
    }
}
