//! A CPU's access to device memory (`crate::mmio`): the one place where an
//! access leaves its section to call a device instead of touching a page.

use super::Cpu;
use crate::error::Fault;
use crate::fault::Access;
use crate::mmio::IoBytes;
use crate::tlb::QuiescentGuard;

impl Cpu {
    /// The device access of `bytes` at `va` (inside one page), for a lookup
    /// that returned [`Fault::Mmio`] inside a section: `None` if `va` is no
    /// longer device memory (translate again), else the access's result.
    ///
    /// The device is called out of the section, every CPU of the thread
    /// quiescent (as for a page fault): the callback may block without
    /// holding up any shootdown. The section is entered again before the
    /// return, with the TLB checked.
    #[cold]
    #[inline(never)]
    pub(super) fn mmio_access(&mut self, va: u64, access: Access, bytes: IoBytes<'_>) -> Option<Result<(), Fault>> {
        let Some(mm) = self.mm.clone() else { super::not_attached() };
        // A watchpoint stops a device access as any other, before it is made.
        let len = match &bytes {
            IoBytes::Load(b) => b.len(),
            IoBytes::Store(b) => b.len(),
        };
        let watchpoint = mm.watches.point_hit(va, len, access.bit());
        if watchpoint && !self.pass_watchpoint {
            return Some(Err(Fault::Watchpoint { addr: va }));
        }
        self.section_end();
        let quiescent = QuiescentGuard::enter();
        let r = crate::mmio::dispatch(&mm, va, access, bytes);
        drop(quiescent);
        self.section_begin();
        if watchpoint && r.is_some() {
            self.pass_watchpoint = false;
        }
        r
    }
}
