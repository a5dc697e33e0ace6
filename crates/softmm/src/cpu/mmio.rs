//! A CPU's access to device memory (`crate::mmio`): the one place where an
//! access leaves its section to call a device instead of touching a page.

use super::Cpu;
use crate::error::Fault;
use crate::fault::Access;

use crate::error::SegvCode;
use crate::mm::AddressSpace;
use crate::mmio::{broken, IoBytes};
use crate::tlb::QuiescentGuard;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SIZE;

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
        let r = dispatch(&mm, va, access, bytes);
        drop(quiescent);
        self.section_begin();
        if watchpoint && r.is_some() {
            self.pass_watchpoint = false;
        }
        r
    }
}

/// Drops a VMA's read reference, also on a callback's panic.
struct ReadRef<'a>(&'a Vma);

impl Drop for ReadRef<'_> {
    fn drop(&mut self) {
        self.0.lock.read_unlock();
    }
}

/// The device access of `bytes` at `va` (inside one page) for `access`,
/// for a CPU whose thread is quiescent (no access section open): `None`
/// if `va` is no longer in a device VMA (a writer changed it since the
/// fault said it was; the caller translates again), else the access's
/// result (`SEGV_ACCERR` if the region's protection refuses it).
fn dispatch(mm: &AddressSpace, va: u64, access: Access, bytes: IoBytes<'_>) -> Option<std::result::Result<(), Fault>> {
    debug_assert!(bytes.len() != 0 && (va % PAGE_SIZE) as usize + bytes.len() <= PAGE_SIZE as usize);
    let vma = {
        let guard = crossbeam_epoch::pin();
        mm.vmas_rcu(&guard).find(va)?.clone()
    };
    let slot = vma.file.as_ref()?.mmio.as_ref()?;
    // The read reference: a writer that removes or changes the VMA
    // detaches it first, and waits for this callback to return. Taken
    // before the device, which is dropped before it: the inode's eviction,
    // after the last VMA's detach, then drops the last reference.
    let skip = broken::DISPATCH_WITHOUT_REFERENCE.with(std::cell::Cell::get);
    if !skip && !vma.lock.try_read() {
        return None;
    }
    let _held = (!skip).then(|| ReadRef(&vma));
    // Attached, so the inode (which the VMA uses) is not evicted.
    let device = slot.get()?;
    // x86's `access_error`, as the fault that sent the access here.
    let allowed = match access {
        Access::Read => vma.flags.intersects(VmFlags::ACCESS_FLAGS),
        Access::Write => vma.flags.contains(VmFlags::WRITE),
        Access::Execute => vma.flags.contains(VmFlags::EXEC),
    };
    if !allowed {
        return Some(Err(Fault::Segv { addr: va, code: SegvCode::AccErr }));
    }
    let base = vma.pgoff.wrapping_mul(PAGE_SIZE).wrapping_add(va - vma.start);
    let whole = matches!(bytes.len(), 1 | 2 | 4 | 8);
    let (mut done, len) = (0, bytes.len());
    let mut bytes = bytes;
    while done < len {
        let at = va + done as u64;
        // One call for a scalar; else the widest aligned piece that fits.
        let n = if whole {
            len
        } else {
            [8, 4, 2, 1].into_iter().find(|&w| at % w as u64 == 0 && w <= len - done).expect("1 fits")
        };
        let offset = base.wrapping_add(done as u64);
        match &mut bytes {
            IoBytes::Load(b) => {
                let v = device.read(offset, n);
                b[done..done + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            IoBytes::Store(b) => {
                let mut v = [0; 8];
                v[..n].copy_from_slice(&b[done..done + n]);
                device.write(offset, n, u64::from_le_bytes(v));
            }
        }
        done += n;
    }
    Some(Ok(()))
}
