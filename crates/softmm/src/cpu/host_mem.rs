//! The TLB fill of a host-memory mapping (`AddressSpace::mmap_host`): from
//! the VMA, not from a page-table entry (`crate::host_mem`'s protocol).

use std::sync::Arc;

use crossbeam_epoch::Guard;

use crate::error::{Fault, SegvCode};
use crate::fault::Access;
use crate::host_mem::HostRelease;
use crate::mm::AddressSpace;
use crate::vma::VmFlags;
use crate::watch::StoreCheck;
use crate::PAGE_SIZE;

use super::Cpu;

impl Cpu {
    /// A miss at `va` that no entry translates even after the fault
    /// handler returned for it (which it does at once for embedder memory,
    /// so that an ordinary fault never pays this lookup), inside a section: if a
    /// host-memory VMA of the tree `guard` reads maps it, the host address
    /// for the `size`-byte `access` (its TLB entry filled), or the fault
    /// Linux's `access_error` or the embedder's watches raise; `None` for
    /// every other address, which the fault handler takes.
    #[inline(never)]
    pub(super) fn fill_host_mem(
        &mut self,
        mm: &AddressSpace,
        va: u64,
        size: usize,
        access: Access,
        guard: &Guard,
    ) -> Option<Result<*mut u8, Fault>> {
        let vma = mm.vmas_rcu(guard).find(va)?;
        let mem = vma.file.as_ref()?.host_mem.as_ref()?;
        // x86-64's access_error: a write needs VM_WRITE, a fetch VM_EXEC,
        // a read any access at all (PROT_WRITE or PROT_EXEC imply reads).
        let allowed = match access {
            Access::Write => vma.flags.contains(VmFlags::WRITE),
            Access::Execute => vma.flags.contains(VmFlags::EXEC),
            Access::Read => vma.flags.intersects(VmFlags::ACCESS_FLAGS),
        };
        if !allowed {
            return Some(Err(Fault::Segv { addr: va, code: SegvCode::AccErr }));
        }
        let page = va & !(PAGE_SIZE - 1);
        let index = vma.pgoff + (page - vma.start) / PAGE_SIZE;
        // The VMA never reaches past its window (mremap cannot grow it); a
        // host file's page past its end now is SIGBUS, checked on every
        // fill (a truncation after the fill: `Inode::set_len` shoots the
        // page down first; see "Coherent shared host files" in
        // docs/architecture.md for one by the host).
        let Some(host) = mem.page_ptr(index).filter(|_| mem.page_backed(index)) else {
            return Some(Err(Fault::Bus { addr: va }));
        };
        // The embedder's watches, as for a page-table entry's fill, after a
        // barrier: embedder memory records no fill owner, so a watch armed
        // on it shoots every CPU down, and either its VMA lookup (after its
        // own barrier) sees this VMA or this check sees the watch.
        crate::tlb::reader_barrier(crate::tlb::reader_is_light());
        let watchpoint = mm.watches.point_hit(va, size, access.bit());
        if watchpoint && !self.pass_watchpoint {
            return Some(Err(Fault::Watchpoint { addr: va }));
        }
        let write = access == Access::Write;
        if write && mm.watches.store(va) == StoreCheck::Notify {
            return Some(Err(Fault::WriteWatch { addr: va }));
        }
        if watchpoint {
            self.pass_watchpoint = false;
        }
        let writable = vma.flags.contains(VmFlags::WRITE) && mm.watches.may_cache_write(page, 1);
        let perms = (Access::Read.bit()
            | if writable { Access::Write.bit() } else { 0 }
            | if vma.flags.contains(VmFlags::EXEC) { Access::Execute.bit() } else { 0 })
            & !mm.watches.point_mask(page, 1);
        self.state.tlb.fill(va, host, perms);
        // A host file's page is now mapped, as its page-table entry would
        // be on Linux (smaps `Rss`), and a read fault maps the cached pages
        // around it; embedder memory is `VM_PFNMAP`, which smaps never
        // counts and which nothing maps around.
        if mem.is_file() {
            crate::fault::host_window::mapped(mm, vma, va, write);
        }
        Some(Ok(host.wrapping_add((va % PAGE_SIZE) as usize)))
    }

    /// A hold on the release of the host memory that `ptr`, translated
    /// from `va` in the current section, lies in (step 4 of
    /// `crate::host_mem`'s protocol); `None` if the VMA that mapped it has
    /// left the published tree meanwhile, and the caller translates again.
    pub(super) fn hold_host_mem(mm: &AddressSpace, va: u64, ptr: *mut u8) -> Option<Arc<HostRelease>> {
        let guard = crossbeam_epoch::pin();
        let vma = mm.vmas_rcu(&guard).find(va)?;
        let mem = vma.file.as_ref()?.host_mem.as_ref()?;
        let index = vma.pgoff + ((va & !(PAGE_SIZE - 1)) - vma.start) / PAGE_SIZE;
        let page = mem.page_ptr(index)?;
        (page == ptr.wrapping_sub(ptr as usize % PAGE_SIZE as usize)).then(|| mem.hold())?
    }
}
