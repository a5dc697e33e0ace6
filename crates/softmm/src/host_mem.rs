//! Host memory in the guest: the backing of [`AddressSpace::mmap_host`]
//! (`crate::sys::mmap_host`), a mapping of memory the embedder owns, as
//! unicorn's `uc_mem_map_ptr` or Linux's `remap_pfn_range` of device
//! memory (`VM_PFNMAP`).
//!
//! The pages are not arena frames: no descriptor, no reference count, no
//! page-table entry. The mapping's file is an inode with a [`HostMem`]
//! window, and a TLB fill translates a guest address from the VMA itself
//! (`Cpu::fill_host_mem`): page `pgoff + (va - start) / PAGE_SIZE` of the
//! window. Because no entry records who filled from it, every change that
//! removes or narrows such a VMA shoots down every CPU of the address space
//! once the new VMA tree is published (`AddressSpace::end_write_section`),
//! before the VMA's file use is put.
//!
//! # Protocol
//!
//! The embedder's release callback runs once no CPU can reach the memory:
//!
//! 1. A CPU reads the window only inside an access section, from a VMA of
//!    a tree version it loaded inside that section (the fill), or through a
//!    TLB entry that fill made.
//! 2. A write section that removes a host-memory VMA (munmap, mprotect,
//!    mremap, `MAP_FIXED` over it) publishes the new tree, then shoots down
//!    every CPU of the address space: the shootdown waits for every CPU
//!    inside a section (which may have loaded the old tree) and empties
//!    every TLB, so after it no CPU holds a translation into the removed
//!    part and none can make one (a new section loads the new tree).
//! 3. Only then is the VMA's use of its inode put (`put_files`); the last
//!    use evicts the inode, which drops its hold on the [`HostRelease`].
//! 4. `Cpu::with_slice` hands the embedder's closure a slice that outlives
//!    the section; it holds the [`HostRelease`] too (taken inside the
//!    section, from the inode of a VMA that still maps the page), so the
//!    release waits for the closure as well.
//! 5. The release callback runs when the last hold goes: after all of the
//!    above, on the thread that dropped it.
//!
//! Step 2's order is the point: a shootdown before the publication would
//! let a CPU fill again from the old tree. `broken::NO_SHOOTDOWN`
//! (`crate::sync::broken::host_mem`) skips the shootdown, and the loom
//! model of this protocol (`host_mem/loom_tests.rs`, the real `Cpu`
//! against the real `munmap`) then reads released memory.

use std::sync::Arc;

use crate::sync::Mutex;
use crate::PAGE_SIZE;

#[cfg(all(test, loom))]
mod loom_tests;

/// The embedder's release callback: run once, when the last hold on it goes.
pub(crate) type ReleaseFn = Box<dyn FnOnce() + Send>;

/// A hold on a host-memory window's release (see the protocol): the
/// callback runs when the last one is dropped.
pub(crate) struct HostRelease {
    release: Mutex<Option<ReleaseFn>>,
}

impl Drop for HostRelease {
    fn drop(&mut self) {
        if let Some(release) = self.release.get_mut().take() {
            release();
        }
    }
}

/// A window of embedder memory, `len` bytes at `base`, which a
/// host-memory inode maps page by page.
pub(crate) struct HostMem {
    /// The first byte, page aligned.
    base: usize,
    /// The window's length, a multiple of the page size.
    len: u64,
    /// The file page index of its first page: 0 for embedder memory, the
    /// mapped offset's page for a window onto a host file (whose VMAs'
    /// `pgoff` is then the host file's, as `/proc/pid/maps` shows it).
    first: u64,
    /// The inode's hold on the release, dropped when it is evicted.
    hold: Mutex<Option<Arc<HostRelease>>>,
    /// For the window of a host file (`HostFileCoherence::Shared`): its
    /// end of file and its `fsync`.
    file: Option<HostFileHooks>,
}

/// What a window onto a host file asks of the file.
pub(crate) struct HostFileHooks {
    /// The host file's inode id: a truncate of it shoots the window's
    /// address spaces down (`AddressSpace::unmap_file_range`).
    pub(crate) origin: u64,
    /// The pages of the window that lie (at least in part) below the
    /// host file's end now; an access to a page past them is `SIGBUS`.
    pub(crate) pages: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// `msync(MS_SYNC)`/`fsync` of the window: the host's `fdatasync`.
    pub(crate) sync: Box<dyn Fn() -> crate::error::Result<()> + Send + Sync>,
    /// The host file itself, for a new window over more of it (`mremap`
    /// growth): a `Weak` of its inode, which this layer cannot name.
    pub(crate) owner: Box<dyn std::any::Any + Send + Sync>,
    /// The file's `FOLL_PIN` pins by file page, shared by every window
    /// onto the file (its `HostBacking`'s).
    pub(crate) pins: Arc<PinCounts>,
}

/// The `FOLL_PIN` pins of a host file's pages, by file page index: Linux's
/// pin count of a page-cache page (`folio_maybe_dma_pinned`), which every
/// mapping of the page sees, whichever window the pin went through.
#[derive(Default)]
pub(crate) struct PinCounts {
    counts: Mutex<std::collections::HashMap<u64, u64>>,
}

impl std::fmt::Debug for PinCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PinCounts")
    }
}

impl PinCounts {
    /// Whether file page `index` is pinned now.
    pub(crate) fn pinned(&self, index: u64) -> bool {
        self.counts.lock().contains_key(&index)
    }

    fn get(&self, index: u64) {
        *self.counts.lock().entry(index).or_insert(0) += 1;
    }

    fn put(&self, index: u64) {
        let mut counts = self.counts.lock();
        if let std::collections::hash_map::Entry::Occupied(mut e) = counts.entry(index) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// The pages of coherent host-file windows an address space has mapped:
/// what Linux's page table would hold present for its shared file
/// mappings, counted in smaps `Rss`. A window page has no entry (its
/// translations live only in TLBs, which may drop them at any time), so
/// this records, by guest page address, the pages a fill or a pin brought
/// in, until a zap of their range (`munmap`, `MADV_DONTNEED`, a truncation
/// through softmm) takes them out; `mremap` moves them, `mprotect` keeps
/// them, and a fork's child starts without them, as Linux's page table.
/// A page the host itself dropped from its page cache (its truncate or
/// hole punch, which on Linux unmap it from every mapping of the file)
/// is not counted while it is not cached ([`HostPresent::count`]): a
/// mapped page is always cached, so one the host no longer caches is not
/// mapped. It stays recorded: a CPU's translation may still reach it (the
/// host's drop shoots no softmm TLB down), and the access through it
/// caches the page again, as Linux's next fault there would map it.
///
/// Bookkeeping for smaps only: no protocol depends on it, so it uses the
/// standard library's lock and flag, not `crate::sync`'s, and the loom
/// models do not explore it (nothing runs under its lock but the set's
/// own operations).
#[derive(Debug, Default)]
pub(crate) struct HostPresent {
    /// Set by the first page recorded: until then no zap takes the lock.
    any: std::sync::atomic::AtomicBool,
    pages: std::sync::Mutex<std::collections::BTreeSet<u64>>,
}

impl HostPresent {
    fn pages(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<u64>> {
        self.pages.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The window page at `va` is mapped now; `true` if it was not before
    /// (Linux's fault, where a TLB refill of a mapped page is none).
    pub(crate) fn insert(&self, va: u64) -> bool {
        self.insert_all(std::iter::once(va)) == 1
    }

    /// [`HostPresent::insert`] of every page of `vas`; how many were new.
    pub(crate) fn insert_all(&self, vas: impl IntoIterator<Item = u64>) -> usize {
        if !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            self.any.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut pages = self.pages();
        vas.into_iter().filter(|va| pages.insert(va & !(PAGE_SIZE - 1))).count()
    }

    /// The pages recorded in `[start, end)`, taken out.
    fn take(&self, start: u64, end: u64) -> Vec<u64> {
        if start >= end || !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            return Vec::new();
        }
        let mut pages = self.pages();
        let taken: Vec<u64> = pages.range(start..end).copied().collect();
        for p in &taken {
            pages.remove(p);
        }
        taken
    }

    /// `[start, end)` is zapped: none of its pages is mapped any more.
    pub(crate) fn clear(&self, start: u64, end: u64) {
        self.take(start, end);
    }

    /// `[old, old + len)` moved to `new` (`mremap`): its pages with it.
    pub(crate) fn moved(&self, old: u64, new: u64, len: u64) {
        let taken = self.take(old, old.saturating_add(len));
        if !taken.is_empty() {
            let mut pages = self.pages();
            pages.extend(taken.into_iter().map(|p| p - old + new));
        }
    }

    /// How many pages are recorded in `[start, end)` that `cached` finds
    /// still cached: it is called, without the lock, once per run of
    /// consecutive recorded pages, with the run's first page and length,
    /// and answers per page (`None` if it cannot tell: the run counts
    /// whole). Time and memory are those of the pages recorded, whatever
    /// the range's length.
    pub(crate) fn count(&self, start: u64, end: u64, mut cached: impl FnMut(u64, usize) -> Option<Vec<bool>>) -> u64 {
        if start >= end || !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        let recorded: Vec<u64> = self.pages().range(start..end).copied().collect();
        let mut count = 0;
        for run in recorded.chunk_by(|a, b| a + PAGE_SIZE == *b) {
            count += match cached(run[0], run.len()) {
                Some(cached) => cached.iter().filter(|&&c| c).count(),
                None => run.len(),
            } as u64;
        }
        count
    }
}

/// A page of a host-memory window held mapped: what a pin of a host
/// file's shared mapping holds (Linux pins the page-cache page; here the
/// page is the host's, and the hold keeps the host mapping from being
/// released, step 4 of the protocol, until the pin goes).
pub(crate) struct HeldPage {
    /// The page's host address.
    addr: usize,
    /// Its file page index, and the host file's pages now (for a window
    /// onto a host file): the page is read and written only below them.
    index: u64,
    pages: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
    /// Taken for writing: the host memory is writable.
    writable: bool,
    /// A `FOLL_PIN` pin: the file's pin count of the page, put on drop.
    pin: Option<Arc<PinCounts>>,
    _hold: Arc<HostRelease>,
}

impl Drop for HeldPage {
    fn drop(&mut self) {
        if let Some(pins) = &self.pin {
            pins.put(self.index);
        }
    }
}

impl HeldPage {
    /// File page `index` of `mem`, held, for writing if `write` (the
    /// caller has checked that the mapping may write: `VM_MAYWRITE`, which
    /// a host file opened read-only never gives), and counted as a
    /// `FOLL_PIN` pin of the file's page while held if `pin`; `None`
    /// outside the window, past a host file's end now, or once the window
    /// is released.
    pub(crate) fn new(mem: &HostMem, index: u64, write: bool, pin: bool) -> Option<HeldPage> {
        let hold = mem.hold()?;
        let addr = mem.page_ptr(index).filter(|_| mem.page_backed(index))? as usize;
        let pages = mem.file.as_ref().map(|f| f.pages.clone());
        let pin = mem.file.as_ref().filter(|_| pin).map(|f| f.pins.clone());
        if let Some(pins) = &pin {
            pins.get(index);
        }
        Some(HeldPage { addr, index, pages, writable: write, pin, _hold: hold })
    }

    /// Whether the page lies below the host file's end now. A page the
    /// file no longer reaches is Linux's truncated page-cache page, which
    /// a pin keeps; here it is the host's `SIGBUS`, never touched.
    fn backed(&self) -> bool {
        self.pages.as_ref().is_none_or(|pages| self.index < pages())
    }

    /// Copies the page's bytes at `off` into `dst` (word-atomic, as the
    /// guest's accesses are); `false`, copying nothing, if the host file no
    /// longer reaches the page. Panics if the bytes leave the page.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        assert!(off + dst.len() <= PAGE_SIZE as usize, "inside the page");
        if !self.backed() {
            return false;
        }
        // SAFETY: inside the page (asserted), mapped until `_hold` goes;
        // the guest's accesses to it are atomic too (`HostMem::new`).
        unsafe { crate::access::copy_from_host((self.addr + off) as *const u8, dst) };
        true
    }

    /// Copies `src` to the page at `off`; `false` as for
    /// [`HeldPage::read`]. Panics if it leaves the page or the page was
    /// not taken for writing.
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> bool {
        assert!(off + src.len() <= PAGE_SIZE as usize, "inside the page");
        assert!(self.writable, "a page taken for writing");
        if !self.backed() {
            return false;
        }
        // SAFETY: as in `read`; taken for writing, so the memory is
        // writable (`HeldPage::new`).
        unsafe { crate::access::copy_to_host(src, (self.addr + off) as *mut u8) };
        true
    }
}

impl std::fmt::Debug for HostMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostMem({:#x}+{:#x})", self.base, self.len)
    }
}

impl HostMem {
    /// The window of `len` bytes at `base`, with `release` to run once no
    /// CPU can reach it.
    ///
    /// # Safety
    ///
    /// `[base, base + len)` is memory the caller owns, valid for reads and
    /// writes until `release` runs (or, if it is never called, for ever),
    /// and accessed by others only atomically or in an order the caller
    /// sets up (the guest's accesses are word-atomic, `crate::access`).
    pub(crate) unsafe fn new(base: *mut u8, len: u64, release: Option<ReleaseFn>) -> HostMem {
        debug_assert!(base as usize % PAGE_SIZE as usize == 0 && len % PAGE_SIZE == 0);
        let hold = Arc::new(HostRelease { release: Mutex::new(release) });
        HostMem { base: base as usize, len, first: 0, hold: Mutex::new(Some(hold)), file: None }
    }

    /// The window with `file`'s hooks: a window onto a host file whose
    /// first page is the file's page `first`.
    pub(crate) fn with_file(mut self, file: HostFileHooks, first: u64) -> HostMem {
        self.file = Some(file);
        self.first = first;
        self
    }

    /// Whether file page `index` may be accessed: for a host file, not
    /// wholly past its end now (Linux's `SIGBUS` past `i_size`; the host
    /// mapping is never touched there).
    #[inline]
    pub(crate) fn page_backed(&self, index: u64) -> bool {
        self.file.as_ref().is_none_or(|f| index < (f.pages)())
    }

    /// Which of file pages `[first, first + n)`, all inside the window, the
    /// host holds in its page cache now (`mincore` of the host mapping):
    /// what Linux's fault-around maps (`filemap_map_pages` maps only pages
    /// already cached). All `false` if the host refuses (nothing is then
    /// mapped around).
    pub(crate) fn cached(&self, first: u64, n: usize) -> Vec<bool> {
        self.try_cached(first, n).unwrap_or_else(|| vec![false; n])
    }

    /// [`HostMem::cached`], `None` if the host refuses (`mincore` failed)
    /// or the pages are not all inside the window.
    pub(crate) fn try_cached(&self, first: u64, n: usize) -> Option<Vec<bool>> {
        let last = first.checked_add(n as u64)?.checked_sub(1)?;
        let ptr = self.page_ptr(first).filter(|_| self.page_ptr(last).is_some())?;
        let mut vec = vec![0u8; n];
        // SAFETY: `[ptr, ptr + n pages)` lies inside the window (both ends
        // checked), which stays mapped until the release that follows the
        // inode's eviction, and the caller's VMA holds a use of the inode
        // (`mincore` reads no byte of it anyway); `vec` has one byte per
        // page, as `mincore` writes.
        let r = unsafe { libc::mincore(ptr.cast(), n * PAGE_SIZE as usize, vec.as_mut_ptr()) };
        (r == 0).then(|| vec.into_iter().map(|b| b & 1 != 0).collect())
    }

    /// The file's pages now (Linux's `i_size` in pages, rounded up): an
    /// access past them is `SIGBUS`. `u64::MAX` for embedder memory.
    pub(crate) fn backed_pages(&self) -> u64 {
        self.file.as_ref().map_or(u64::MAX, |f| (f.pages)())
    }

    /// The hooks of a window onto a host file, `None` for embedder memory.
    pub(crate) fn hooks(&self) -> Option<&HostFileHooks> {
        self.file.as_ref()
    }

    /// Whether the window holds file pages `[first, end)`.
    pub(crate) fn covers(&self, first: u64, end: u64) -> bool {
        first < end && self.page_ptr(first).is_some() && self.page_ptr(end - 1).is_some()
    }

    /// Whether file page `index` of this window's host file is pinned
    /// (`FOLL_PIN`) now; `false` for embedder memory, which nothing pins.
    pub(crate) fn page_pinned(&self, index: u64) -> bool {
        self.file.as_ref().is_some_and(|f| f.pins.pinned(index))
    }

    /// The id of the host file this is a window onto, if any.
    pub(crate) fn origin(&self) -> Option<u64> {
        self.file.as_ref().map(|f| f.origin)
    }

    /// `fsync` of the window's host file (`Ok` for embedder memory).
    pub(crate) fn sync(&self) -> crate::error::Result<()> {
        self.file.as_ref().map_or(Ok(()), |f| (f.sync)())
    }

    /// Whether this is a window onto a host file
    /// (`HostFileCoherence::Shared`), not embedder memory (`mmap_host`).
    pub(crate) fn is_file(&self) -> bool {
        self.file.is_some()
    }

    /// The host address of file page `index`, `None` outside the window.
    #[inline]
    pub(crate) fn page_ptr(&self, index: u64) -> Option<*mut u8> {
        let off = index.checked_sub(self.first)?.checked_mul(PAGE_SIZE).filter(|&o| o < self.len)?;
        Some((self.base + off as usize) as *mut u8)
    }

    /// A hold on the release for a user of the window outside a section
    /// (`Cpu::with_slice`, a pin); `None` once the inode is evicted.
    pub(crate) fn hold(&self) -> Option<Arc<HostRelease>> {
        self.hold.lock().clone()
    }

    /// The inode is evicted: its hold goes, and the release runs now unless
    /// a `with_slice` still holds it.
    pub(crate) fn retire(&self) {
        let hold = self.hold.lock().take();
        drop(hold);
    }

    /// Takes the release callback back without running it (`mmap_host`
    /// refused: the caller keeps its memory and the callback is dropped).
    pub(crate) fn defuse(&self) {
        if let Some(hold) = &*self.hold.lock() {
            drop(hold.release.lock().take());
        }
    }
}
