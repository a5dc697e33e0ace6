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
    pub(crate) pages: Box<dyn Fn() -> u64 + Send + Sync>,
    /// `msync(MS_SYNC)`/`fsync` of the window: the host's `fdatasync`.
    pub(crate) sync: Box<dyn Fn() -> crate::error::Result<()> + Send + Sync>,
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
        HostMem { base: base as usize, len, hold: Mutex::new(Some(hold)), file: None }
    }

    /// The window with `file`'s hooks: a window onto a host file.
    pub(crate) fn with_file(mut self, file: HostFileHooks) -> HostMem {
        self.file = Some(file);
        self
    }

    /// Whether page `index` of the window may be accessed: inside the
    /// window and, for a host file, not wholly past its end now (Linux's
    /// `SIGBUS` past `i_size`; the host mapping is never touched there).
    #[inline]
    pub(crate) fn page_backed(&self, index: u64) -> bool {
        self.file.as_ref().is_none_or(|f| index < (f.pages)())
    }

    /// The id of the host file this is a window onto, if any.
    pub(crate) fn origin(&self) -> Option<u64> {
        self.file.as_ref().map(|f| f.origin)
    }

    /// `fsync` of the window's host file (`Ok` for embedder memory).
    pub(crate) fn sync(&self) -> crate::error::Result<()> {
        self.file.as_ref().map_or(Ok(()), |f| (f.sync)())
    }

    /// The host address of page `index` of the window, `None` past its end.
    #[inline]
    pub(crate) fn page_ptr(&self, index: u64) -> Option<*mut u8> {
        let off = index.checked_mul(PAGE_SIZE).filter(|&o| o < self.len)?;
        Some((self.base + off as usize) as *mut u8)
    }

    /// A hold on the release for a user of the window outside a section
    /// (`Cpu::with_slice`); `None` once the inode is evicted.
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
