//! Page pinning: `pin_user_pages` (`FOLL_PIN`) and `get_user_pages`
//! (`FOLL_GET`) for a device that reads and writes user memory directly, as
//! DMA does (VFIO, RDMA, io_uring fixed buffers), Linux's `mm/gup.c`.
//!
//! # What a pin is
//!
//! A pin holds one reference on the frame (`refcount`) and counts one in its
//! `pincount` (Linux's `_pincount` of a large folio: exact, so
//! [`AddressSpace::page_maybe_dma_pinned`] has no false positives). A
//! `FOLL_GET` reference holds the reference only. Both live in a
//! [`PinnedPages`] handle that puts them when dropped, and gives the device's
//! view of the frames: byte access that bypasses page tables and TLBs.
//!
//! An anonymous page is pinned only while it is exclusive to this address
//! space (`PG_ANON_EXCLUSIVE`): a write pin breaks COW first (a write fault),
//! a read-only pin of a shared anonymous page unshares it first (Linux's
//! `FAULT_FLAG_UNSHARE`, 5.19), so the pinned frame is the one the process
//! reads and writes through its page tables, and `fork` copies pinned pages
//! into the child instead of sharing them (CVE-2020-29374).
//!
//! # Paths
//!
//! * gup-fast (`fast.rs`): a lock-free walk under the epoch guard that pins
//!   present pages with a try-get on the refcount and re-checks the entry
//!   after taking it; a pin that races with `fork`'s write-protect (the
//!   address space's `write_protect_seq`) is undone.
//! * the slow path (`slow.rs`): per page, under `mmap_lock` for read, the
//!   VMA checks (`check_vma_flags`), a locked look at the entry, and a fault
//!   or an unshare where the page cannot be pinned as it is; which lock
//!   protocol it runs under is the [`PinPolicy`].
//! * parallel pinning (`parallel.rs`): the range split into 2 MiB-aligned
//!   chunks taken by N worker threads (seed 004's ktask).
//!
//! Long-term pins are charged to the address space's `pinned_vm` against
//! `RLIMIT_MEMLOCK` (the address space's `PinState`, `mm/pin_state.rs`).

mod fast;
pub(crate) mod hugetlb;
#[cfg(all(test, loom))]
mod loom_tests;
mod parallel;
mod slow;

use std::sync::Arc;

pub(crate) use crate::mm::PinState;

use crate::error::{Errno, Result};
use crate::host_mem::HeldPage;
use crate::mm::{AddressSpace, PinPolicy};
use crate::phys::{FrameRef, Pfn, PhysMem, PG_DIRTY};
use crate::sync::Ordering;
use crate::PAGE_SIZE;

/// The most worker threads [`AddressSpace::pin_user_pages_parallel`] uses.
pub const MAX_PIN_THREADS: usize = 256;

bitflags::bitflags! {
    /// `FOLL_*` flags of a pin or reference request, with Linux's values.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Foll: u32 {
        /// `FOLL_WRITE`: the device will write: break COW first and require a
        /// writable mapping.
        const WRITE = 1 << 0;
        /// `FOLL_LONGTERM`: the pin is held indefinitely (RDMA, VFIO,
        /// io_uring): charged to `pinned_vm` against `RLIMIT_MEMLOCK`, and a
        /// read-only one in a copy-on-write mapping unshares the page first.
        const LONGTERM = 1 << 8;
    }
}

/// Counts of one pin request: how the pages were obtained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PinStats {
    /// Pages pinned (or referenced).
    pub pages: u64,
    /// Of those, pages gup-fast took without any lock.
    pub fast_pages: u64,
    /// Faults the pin raised to bring pages in (or to break COW).
    pub faults: u64,
    /// `mmap_lock` acquisitions (read), by the pin itself and by its faults'
    /// fallbacks.
    pub mmap_lock_acquisitions: u64,
}

impl PinStats {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &PinStats) {
        self.pages += o.pages;
        self.fast_pages += o.fast_pages;
        self.faults += o.faults;
        self.mmap_lock_acquisitions += o.mmap_lock_acquisitions;
    }
}

/// Pages pinned (`FOLL_PIN`) or referenced (`FOLL_GET`) by
/// [`AddressSpace::pin_user_pages`] or [`AddressSpace::get_user_pages`]:
/// dropping it unpins (`unpin_user_pages`) or puts them, and returns a
/// long-term pin's `pinned_vm` charge. A handle taken with [`Foll::WRITE`]
/// marks its pages dirty as it goes (`unpin_user_pages_dirty_lock(..,
/// true)`), so that what the device wrote is written back to a host-backed
/// file; [`PinnedPages::unpin`] chooses.
///
/// It holds the frames by reference, not the mappings: an `munmap`,
/// `MADV_DONTNEED` or exit of the address space unmaps them, but the frames
/// stay allocated, and the device view reads and writes them, until the
/// handle goes. The device view addresses bytes from the first pinned page
/// (`offset` 0 is the page containing the address the pin was asked for).
///
/// A page of a coherent shared mapping of a host file
/// (`HostFileCoherence::Shared`) is the host's page, not a frame: the
/// handle holds the host mapping of it (Linux pins the page-cache page),
/// which stays mapped, and the device view reads and writes the file's
/// bytes there, until the handle goes.
#[must_use = "dropping the handle unpins the pages at once"]
pub struct PinnedPages {
    phys: Arc<PhysMem>,
    state: Arc<PinState>,
    addr: u64,
    pfns: Vec<Pfn>,
    /// The host pages among them, by index in `pfns` (whose entry there is
    /// the zero page's, which a release skips), in order.
    host: Vec<(usize, HeldPage)>,
    /// `FOLL_PIN` (else `FOLL_GET`).
    pin: bool,
    write: bool,
    /// Pages charged to `pinned_vm` (long-term pins).
    accounted: u64,
    stats: PinStats,
}

impl PinnedPages {
    /// The page-aligned user address of the first page.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of pages held.
    pub fn len(&self) -> usize {
        self.pfns.len()
    }

    /// True if no page is held (a request for 0 pages).
    pub fn is_empty(&self) -> bool {
        self.pfns.is_empty()
    }

    /// True for pins (`pin_user_pages`), false for references (`get_user_pages`).
    pub fn is_pin(&self) -> bool {
        self.pin
    }

    /// How the pages were obtained.
    pub fn stats(&self) -> PinStats {
        self.stats
    }

    /// The frame of the `i`-th page held (`None` past the end).
    pub(crate) fn pfn(&self, i: usize) -> Option<Pfn> {
        self.pfns.get(i).copied()
    }

    /// The device reads `buf.len()` bytes at `offset`, straight from the
    /// frames. `EFAULT` (nothing read) if the range is not inside the pages;
    /// `EFAULT` too, at a host file's page the file no longer reaches (the
    /// bytes before it read), where Linux's pin would read a truncated
    /// page-cache page.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        let mut done = 0;
        while done < buf.len() {
            // Inside one frame that this handle holds a reference on (so it
            // is not freed and reused).
            let (page, within, n) = self.frame_bytes(offset + done as u64, buf.len() - done);
            match self.host_page(page) {
                Some(held) if !held.read(within, &mut buf[done..done + n]) => return Err(Errno::Fault),
                Some(_) => {}
                None => self.phys.read(self.pfns[page], within, &mut buf[done..done + n]),
            }
            done += n;
        }
        Ok(())
    }

    /// The device writes `buf` at `offset`, straight into the frames (no
    /// page table or TLB is involved, so the process sees it only if the
    /// frame is still the one its page tables map). `EFAULT` (nothing
    /// written) if the range is not inside the pages, `EPERM` if they were
    /// not taken with [`Foll::WRITE`] (the frame may be the shared zero page
    /// or a page the process shares copy-on-write); `EFAULT` at a host
    /// file's page as for [`PinnedPages::read`].
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        if !self.write {
            return Err(Errno::Perm);
        }
        let mut done = 0;
        while done < buf.len() {
            let (page, within, n) = self.frame_bytes(offset + done as u64, buf.len() - done);
            match self.host_page(page) {
                Some(held) if !held.write(within, &buf[done..done + n]) => return Err(Errno::Fault),
                Some(_) => {}
                None => self.phys.write(self.pfns[page], within, &buf[done..done + n]),
            }
            done += n;
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) -> Result<()> {
        let size = self.pfns.len() as u64 * PAGE_SIZE;
        match offset.checked_add(len as u64) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Errno::Fault),
        }
    }

    /// The index of the page holding byte `offset`, the byte's offset in
    /// it, and how many bytes of the page follow it, at most `max`.
    fn frame_bytes(&self, offset: u64, max: usize) -> (usize, usize, usize) {
        let page = (offset / PAGE_SIZE) as usize;
        let within = offset % PAGE_SIZE;
        let n = ((PAGE_SIZE - within) as usize).min(max);
        (page, within as usize, n)
    }

    /// The host page at index `page`, if it is one.
    fn host_page(&self, page: usize) -> Option<&HeldPage> {
        let i = self.host.binary_search_by_key(&page, |(i, _)| *i).ok()?;
        Some(&self.host[i].1)
    }
}

impl PinnedPages {
    /// Linux's `unpin_user_pages_dirty_lock(pages, npages, make_dirty)`
    /// (for references, `set_page_dirty_lock` then `put_page`): drops the
    /// pins, first marking every page dirty when `make_dirty`, so that the
    /// device's writes, which no page table saw, reach a host-backed file
    /// at its next writeback ([`File::sync`](crate::File::sync),
    /// `msync`). Dropping the handle is `unpin(true)` for a handle taken
    /// with [`Foll::WRITE`] (the device may have written) and
    /// `unpin(false)` otherwise; `unpin(false)` on a write handle is for a
    /// device that wrote nothing. A handle taken without [`Foll::WRITE`]
    /// never dirties a page (the device could not write it).
    pub fn unpin(mut self, make_dirty: bool) {
        self.release_all(make_dirty);
    }

    /// Drops every pin or reference, dirtying the pages first when
    /// `make_dirty` and the device could write them, and returns the
    /// `pinned_vm` charge; the handle is empty afterwards.
    fn release_all(&mut self, make_dirty: bool) {
        let dirty = make_dirty && self.write;
        for pfn in std::mem::take(&mut self.pfns) {
            if dirty {
                set_page_dirty(&self.phys, pfn);
            }
            release(&self.phys, pfn, self.pin);
        }
        // The holds on host pages: a released window unmaps after this.
        self.host.clear();
        self.state.unaccount(std::mem::take(&mut self.accounted));
    }
}

impl Drop for PinnedPages {
    fn drop(&mut self) {
        self.release_all(self.write);
    }
}

impl std::fmt::Debug for PinnedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPages")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("pages", &self.pfns.len())
            .field("pin", &self.pin)
            .finish()
    }
}

/// Drops one pin (`unpin_user_page`) or reference on `pfn`; the zero page
/// holds neither.
pub(crate) fn release(phys: &PhysMem, pfn: Pfn, pin: bool) {
    if pfn == phys.zero_pfn() {
        return;
    }
    if pin {
        // Before the reference: a reader that sees the pin gone must not see
        // the reference it held still counted as a mapping's.
        // A hugetlb subpage's pin counts on its head frame.
        let old = phys.desc(phys.compound_head(pfn)).pincount.fetch_sub(1, Ordering::Release);
        debug_assert!(old > 0, "frame {pfn} pincount underflow");
    }
    drop(FrameRef::from_raw(phys, pfn));
}

/// Linux's `folio_mark_dirty` of the page a device wrote through a pin or
/// reference on `pfn` (a huge page's state is its head's), before that
/// pin or reference goes: writeback writes a page-cache page again only if
/// it is dirty. Release: writeback's clear of the flag (an acquire) that
/// reads this store also sees the device's bytes in its copy; a clear
/// ordered before it leaves the page dirty for the next writeback.
fn set_page_dirty(phys: &PhysMem, pfn: Pfn) {
    if pfn != phys.zero_pfn() {
        phys.desc(phys.compound_head(pfn)).flags.fetch_or(PG_DIRTY, Ordering::Release);
    }
}

/// What one request asks for, checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) write: bool,
    pub(crate) longterm: bool,
    /// `FOLL_PIN` (else `FOLL_GET`).
    pub(crate) pin: bool,
}

impl Request {
    /// `gup_fast_fallback`'s argument checks: the address is rounded down to
    /// its page; `EOVERFLOW` if the range wraps, `EFAULT` if it ends above
    /// the address space.
    fn new(mm: &AddressSpace, addr: u64, npages: usize, flags: Foll, pin: bool) -> Result<Request> {
        let start = addr & !(PAGE_SIZE - 1);
        let len = (npages as u64).checked_mul(PAGE_SIZE).ok_or(Errno::Overflow)?;
        let end = start.checked_add(len).ok_or(Errno::Overflow)?;
        if end > mm.config.task_size {
            return Err(Errno::Fault);
        }
        Ok(Request { start, end, write: flags.contains(Foll::WRITE), longterm: flags.contains(Foll::LONGTERM), pin })
    }

    fn pages(&self) -> u64 {
        (self.end - self.start) / PAGE_SIZE
    }
}

/// The frames one worker took, released on drop unless handed on.
pub(crate) struct Taken<'a> {
    phys: &'a PhysMem,
    pin: bool,
    pub(crate) pfns: Vec<Pfn>,
    /// The host pages taken, by index in `pfns` (see [`PinnedPages`]).
    pub(crate) host: Vec<(usize, HeldPage)>,
    pub(crate) stats: PinStats,
}

impl<'a> Taken<'a> {
    pub(crate) fn new(phys: &'a PhysMem, pin: bool, capacity: usize) -> Taken<'a> {
        // Reserved for at most 64Ki pages up front: a request may name far
        // more pages than exist (it then fails), and the vector only grows
        // with pages actually taken, which the arena bounds.
        let pfns = Vec::with_capacity(capacity.min(1 << 16));
        Taken { phys, pin, pfns, host: Vec::new(), stats: PinStats::default() }
    }

    /// Takes a host page: the zero page's entry in `pfns` stands for it.
    pub(crate) fn push_host(&mut self, held: HeldPage) {
        self.host.push((self.pfns.len(), held));
        self.pfns.push(self.phys.zero_pfn());
    }

    fn into_pfns(mut self) -> Pages {
        (std::mem::take(&mut self.pfns), std::mem::take(&mut self.host), self.stats)
    }
}

/// What a request took: the frames, the host pages among them, the stats.
pub(crate) type Pages = (Vec<Pfn>, Vec<(usize, HeldPage)>, PinStats);

impl Taken<'_> {}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for &pfn in &self.pfns {
            release(self.phys, pfn, self.pin);
        }
    }
}

/// Pins or references `[req.start, req.end)` under `policy` into `out`.
pub(crate) fn take_range(mm: &AddressSpace, req: &Request, start: u64, end: u64, out: &mut Taken<'_>) -> Result<()> {
    match mm.config.pin_policy {
        PinPolicy::PerPage => slow::take_locked(mm, req, start, end, 1, out),
        PinPolicy::Batched => slow::take_locked(mm, req, start, end, slow::BATCH_PAGES, out),
        _ => slow::take_lock_free(mm, req, start, end, out),
    }
}

impl AddressSpace {
    /// Linux's `pin_user_pages` (`FOLL_PIN`) on `npages` pages from the page
    /// of `addr`: each page is faulted in if needed (for write with
    /// [`Foll::WRITE`], which breaks COW, so the pinned frame is the one the
    /// process writes through), then pinned; the handle holds the pins and is
    /// the device's view of the frames. Under the address space's
    /// [`PinPolicy`].
    ///
    /// All or nothing, as io_uring's and RDMA's callers make it: on error no
    /// page stays pinned and nothing stays charged. Errors: `EOVERFLOW` if
    /// the range wraps, `EFAULT` if it leaves the address space, hits an
    /// unmapped page or a VMA the access is not allowed in (`VM_IO`,
    /// `VM_PFNMAP`, a write without `VM_WRITE`, a read without `VM_READ`, a
    /// [`Foll::WRITE`] | [`Foll::LONGTERM`] pin of a shared writable
    /// mapping of a host-backed file, which needs dirty tracking) or
    /// a page whose fault raises a signal (a guard marker, past the end of a
    /// file); `ENOMEM` if frames run out, or if a long-term pin would take
    /// `pinned_vm` past `RLIMIT_MEMLOCK` (see [`AddressSpace::pinned_vm`]);
    /// `EAGAIN` if a page is changed by others (migrated, zapped) faster
    /// than it can be faulted in and pinned, 64 times over: the pin holds
    /// `mmap_lock` and never spins on one page without end.
    pub fn pin_user_pages(&self, addr: u64, npages: usize, flags: Foll) -> Result<PinnedPages> {
        self.take_pages(addr, npages, flags, true, 1)
    }

    /// [`AddressSpace::pin_user_pages`] split across `threads` worker
    /// threads (seed 004's parallel pinning; never merged into Linux): the
    /// range is cut into chunks aligned to 2 MiB, so that no two workers
    /// share a page table and its lock, which the workers take in turn.
    /// The same result and errors; `threads` 0 is `EINVAL`, and more than
    /// [`MAX_PIN_THREADS`] work as that many.
    pub fn pin_user_pages_parallel(
        &self,
        addr: u64,
        npages: usize,
        flags: Foll,
        threads: usize,
    ) -> Result<PinnedPages> {
        if threads == 0 {
            return Err(Errno::Inval);
        }
        self.take_pages(addr, npages, flags, true, threads.min(MAX_PIN_THREADS))
    }

    /// Linux's `get_user_pages` (`FOLL_GET`): short-term references on the
    /// pages, as for a `read`/`write` through `O_DIRECT`. They are not pins:
    /// [`AddressSpace::page_maybe_dma_pinned`] stays false, `fork` shares the
    /// pages copy-on-write, and nothing is charged to `pinned_vm`
    /// ([`Foll::LONGTERM`] is `EINVAL` here, as Linux refuses it for
    /// `FOLL_GET`). Otherwise as [`AddressSpace::pin_user_pages`].
    pub fn get_user_pages(&self, addr: u64, npages: usize, flags: Foll) -> Result<PinnedPages> {
        if flags.contains(Foll::LONGTERM) {
            return Err(Errno::Inval);
        }
        self.take_pages(addr, npages, flags, false, 1)
    }

    /// Pages charged by live long-term pins (`pinned_vm`, `/proc/pid/status`'s
    /// `VmPin` in pages).
    pub fn pinned_vm(&self) -> u64 {
        self.pins.pinned_vm()
    }

    /// Linux's `page_maybe_dma_pinned` for the page mapped at `addr`: true
    /// if it is pinned (exact here: the frame's pin count; for a coherent
    /// shared mapping of a host file, the file page's `FOLL_PIN` pins
    /// through any mapping of the file, as a page-cache page's pin count).
    /// False if nothing is mapped there.
    pub fn page_maybe_dma_pinned(&self, addr: u64) -> bool {
        let pte = self.pte_at(addr & !(PAGE_SIZE - 1));
        if pte.has_frame() {
            return self.phys.desc(pte.pfn()).pincount.load(Ordering::Acquire) > 0;
        }
        // A host file's page has no entry: its window knows its pins.
        let guard = crossbeam_epoch::pin();
        self.vmas_rcu(&guard).find(addr).is_some_and(|v| crate::fault::host_window::page_pinned(v, addr))
    }

    fn take_pages(&self, addr: u64, npages: usize, flags: Foll, pin: bool, threads: usize) -> Result<PinnedPages> {
        let _q = crate::tlb::QuiescentGuard::enter();
        // is_valid_gup_args: flags the caller may not pass (FOLL_PIN,
        // FOLL_GET and any bit softmm does not know) are EINVAL.
        if Foll::from_bits(flags.bits()).is_none() {
            return Err(Errno::Inval);
        }
        let req = Request::new(self, addr, npages, flags, pin)?;
        let accounted = if pin && req.longterm { req.pages() } else { 0 };
        // Charged before any page is pinned, as ib_umem_get does: a pin over
        // the limit fails with nothing pinned.
        self.pins.account(accounted, &self.config)?;
        if pin {
            self.pins.set_has_pinned();
        }
        let taken = if threads > 1 {
            parallel::take(self, &req, threads)
        } else {
            let mut out = Taken::new(&self.phys, pin, req.pages() as usize);
            take_range(self, &req, req.start, req.end, &mut out).map(|()| out.into_pfns())
        };
        let (pfns, host, stats) = match taken {
            Ok(t) => t,
            Err(e) => {
                self.pins.unaccount(accounted);
                return Err(e);
            }
        };
        Ok(PinnedPages {
            phys: self.phys.clone(),
            state: self.pins.clone(),
            addr: req.start,
            pfns,
            host,
            pin,
            write: req.write,
            accounted,
            stats,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::mm::{AddressSpace, MmConfig};
    use crate::phys::{PhysConfig, PhysMem};
    use crate::uapi::*;
    use crate::{Foll, PAGE_SIZE};

    /// The device view's copies (the `unsafe` of this module, which Miri
    /// checks) across a page boundary, against the process's view, and the
    /// release of every pin and frame.
    #[test]
    fn the_device_view_reads_and_writes_the_pinned_frames() {
        let phys = PhysMem::new(PhysConfig::new(64 * PAGE_SIZE)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let p = mm.pin_user_pages(a, 2, Foll::WRITE | Foll::LONGTERM).unwrap();
        assert!(mm.page_maybe_dma_pinned(a + PAGE_SIZE));
        let data: Vec<u8> = (0..21).collect();
        p.write(PAGE_SIZE - 10, &data).unwrap();
        let mut back = vec![0u8; 21];
        p.read(PAGE_SIZE - 10, &mut back).unwrap();
        assert_eq!(back, data);
        let mut cpu = crate::Cpu::attached(&mm);
        assert_eq!(cpu.read_u8(a + PAGE_SIZE + 10).unwrap(), 20);
        drop(cpu);
        assert_eq!(mm.pinned_vm(), 2);
        drop(p);
        assert!(!mm.page_maybe_dma_pinned(a));
        assert_eq!(mm.pinned_vm(), 0);
        drop(mm);
        assert_eq!(phys.quiesce().frames_used, 0);
    }
}
