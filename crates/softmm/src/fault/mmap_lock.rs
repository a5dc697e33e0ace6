//! [`FaultPolicy::MmapLock`](super::FaultPolicy::MmapLock): the whole fault
//! under `mmap_lock` held for read.

use std::sync::atomic::Ordering;

use crate::error::{Fault, SegvCode};
use crate::mm::AddressSpace;
use crate::vma::flags::VM_GROWSDOWN;

use super::{handler, Access};

pub(super) fn handle(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Fault> {
    mm.counters.mmap_lock_read.fetch_add(1, Ordering::Relaxed);
    let st = mm.read_lock();
    match st.vmas.find(addr) {
        Some(vma) => handler::handle_vma_fault(mm, vma, addr, access),
        None => {
            let below_stack = st.vmas.find_from(addr).is_some_and(|v| v.flags & VM_GROWSDOWN != 0);
            drop(st);
            if !below_stack {
                return Err(Fault::Segv { addr, code: SegvCode::MapErr });
            }
            // Expanding the stack changes the VMA tree: it needs the write
            // lock, never an upgrade of the read lock (StackRot).
            mm.expand_stack(addr).map_err(|_| Fault::Segv { addr, code: SegvCode::MapErr })?;
            mm.counters.mmap_lock_read.fetch_add(1, Ordering::Relaxed);
            let st = mm.read_lock();
            let vma = st.vmas.find(addr).ok_or(Fault::Segv { addr, code: SegvCode::MapErr })?;
            handler::handle_vma_fault(mm, vma, addr, access)
        }
    }
}
