//! Virtual memory areas and the tree that holds them.
//!
//! A [`Vma`] is immutable once published: a writer under `mmap_lock` builds
//! new VMAs and a new [`VmaTree`] version (a persistent B-tree, so a version
//! costs O(log n) new nodes), then publishes it. Lock-free readers load the
//! published version under an epoch guard and read it without writing any
//! shared memory; an old version, and the VMAs only it holds, are freed after
//! the grace period.

use std::sync::{Arc, OnceLock};

use crate::file::File;
use crate::phys::PhysMem;
use crate::sync::VmaLock;
use crate::PAGE_SHIFT;

/// `VM_*` flags, with Linux's values.
pub mod flags {
    /// Readable.
    pub const VM_READ: u64 = 0x1;
    /// Writable.
    pub const VM_WRITE: u64 = 0x2;
    /// Executable.
    pub const VM_EXEC: u64 = 0x4;
    /// Shared and writable through the file: writes reach the page cache.
    pub const VM_SHARED: u64 = 0x8;
    /// `mprotect` may add `PROT_READ`.
    pub const VM_MAYREAD: u64 = 0x10;
    /// `mprotect` may add `PROT_WRITE`.
    pub const VM_MAYWRITE: u64 = 0x20;
    /// `mprotect` may add `PROT_EXEC`.
    pub const VM_MAYEXEC: u64 = 0x40;
    /// Mapped `MAP_SHARED` (shown as `s` in maps).
    pub const VM_MAYSHARE: u64 = 0x80;
    /// A stack that grows down on faults below it.
    pub const VM_GROWSDOWN: u64 = 0x100;
    /// `mlock`ed.
    pub const VM_LOCKED: u64 = 0x2000;
    /// `MADV_DONTFORK`: not copied to a child.
    pub const VM_DONTCOPY: u64 = 0x20000;
    /// Cannot be expanded by mremap.
    pub const VM_DONTEXPAND: u64 = 0x40000;
    /// Charged to the commit limit (private writable).
    pub const VM_ACCOUNT: u64 = 0x100000;
    /// `MAP_NORESERVE`.
    pub const VM_NORESERVE: u64 = 0x200000;
    /// `MADV_WIPEONFORK`: the child sees zeroes.
    pub const VM_WIPEONFORK: u64 = 0x2000000;
    /// The access bits.
    pub const VM_ACCESS_FLAGS: u64 = VM_READ | VM_WRITE | VM_EXEC;
}
use flags::*;

/// The anonymous-memory identity of a VMA (Linux's `anon_vma`): VMAs that share
/// one may merge; it is assigned on the first anonymous fault.
#[derive(Debug)]
pub struct AnonVma {
    /// Unique id.
    pub id: u64,
    /// True for the anon_vma a child gets at fork (Linux's chained anon_vma).
    pub forked: bool,
}

/// One mapping: `[start, end)` with one protection, one set of flags and one
/// backing object.
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `VM_*` flags.
    pub flags: u64,
    /// Page offset in the file of `start` (for anonymous memory, Linux's linear index).
    pub pgoff: u64,
    /// The backing file, for file and shared anonymous mappings.
    pub file: Option<Arc<File>>,
    /// Set on the first anonymous fault, shared by the VMAs split from this one.
    pub anon_vma: OnceLock<Arc<AnonVma>>,
    /// True for the mapping whose file stands for `MAP_SHARED|MAP_ANONYMOUS`.
    pub shared_anon: bool,
    /// Detached when a writer replaces or removes this VMA; lock-free faults
    /// validate against it (see [`crate::sync::VmaLock`]).
    pub lock: VmaLock,
    acct: Arc<PhysMem>,
}

impl std::fmt::Debug for Vma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vma({:#x}-{:#x} flags={:#x} pgoff={:#x})", self.start, self.end, self.flags, self.pgoff)
    }
}

impl Drop for Vma {
    fn drop(&mut self) {
        self.acct.account_vma(-1);
    }
}

impl Vma {
    /// A new VMA, counted in `phys`'s VMA statistics until it is dropped.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        phys: &Arc<PhysMem>,
        start: u64,
        end: u64,
        flags: u64,
        pgoff: u64,
        file: Option<Arc<File>>,
        anon_vma: Option<Arc<AnonVma>>,
        shared_anon: bool,
    ) -> Vma {
        debug_assert!(start < end);
        phys.account_vma(1);
        let cell = OnceLock::new();
        if let Some(a) = anon_vma {
            let _ = cell.set(a);
        }
        Vma { start, end, flags, pgoff, file, anon_vma: cell, shared_anon, lock: VmaLock::new(), acct: phys.clone() }
    }

    /// A copy of this VMA limited to `[start, end)` with `flags`.
    pub(crate) fn slice(&self, start: u64, end: u64, flags: u64) -> Vma {
        debug_assert!(self.start <= start && end <= self.end);
        Vma::new(
            &self.acct,
            start,
            end,
            flags,
            self.pgoff_at(start),
            self.file.clone(),
            self.anon_vma.get().cloned(),
            self.shared_anon,
        )
    }

    /// The same VMA with other bounds and page offset (for merges and moves).
    pub(crate) fn rebound(&self, start: u64, end: u64, pgoff: u64) -> Vma {
        Vma::new(
            &self.acct,
            start,
            end,
            self.flags,
            pgoff,
            self.file.clone(),
            self.anon_vma.get().cloned(),
            self.shared_anon,
        )
    }

    /// Sets the anon_vma of a VMA not yet published.
    pub(crate) fn set_anon(&mut self, anon: Option<Arc<AnonVma>>) {
        self.anon_vma = OnceLock::new();
        if let Some(a) = anon {
            let _ = self.anon_vma.set(a);
        }
    }

    /// The file page offset that `addr` maps.
    #[inline]
    pub fn pgoff_at(&self, addr: u64) -> u64 {
        self.pgoff + ((addr - self.start) >> PAGE_SHIFT)
    }

    /// Length in pages.
    pub fn pages(&self) -> u64 {
        (self.end - self.start) >> PAGE_SHIFT
    }

    /// True for private anonymous memory (no file at all).
    pub fn is_anonymous(&self) -> bool {
        self.file.is_none()
    }

    /// True if `addr` is inside.
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The bottom of the stack guard gap below a growsdown VMA (`vm_start_gap`).
    pub fn start_gap(&self, guard_gap: u64) -> u64 {
        if self.flags & VM_GROWSDOWN != 0 {
            self.start.saturating_sub(guard_gap)
        } else {
            self.start
        }
    }

    /// The identity of the backing file, for merge checks.
    fn file_id(&self) -> Option<u64> {
        self.file.as_ref().map(|f| f.id())
    }

    /// Linux's `is_mergeable_vma` + `is_mergeable_anon_vma` for placing
    /// something with `flags`, `file`, `anon` directly after this VMA, where
    /// that something would start at file page `pgoff`.
    pub(crate) fn can_merge_after(
        &self,
        flags: u64,
        file: Option<u64>,
        anon: Option<&Arc<AnonVma>>,
        pgoff: u64,
    ) -> bool {
        mergeable(self, flags, file, anon) && self.pgoff + self.pages() == pgoff
    }

    /// As [`Vma::can_merge_after`], for something of `pages` pages placed directly before.
    pub(crate) fn can_merge_before(
        &self,
        flags: u64,
        file: Option<u64>,
        anon: Option<&Arc<AnonVma>>,
        pgoff: u64,
        pages: u64,
    ) -> bool {
        mergeable(self, flags, file, anon) && pgoff + pages == self.pgoff
    }
}

/// Flags that forbid any merge (Linux's `VM_SPECIAL` subset softmm has).
const VM_NOMERGE: u64 = VM_DONTEXPAND;

fn mergeable(v: &Vma, flags: u64, file: Option<u64>, anon: Option<&Arc<AnonVma>>) -> bool {
    v.flags == flags && flags & VM_NOMERGE == 0 && v.file_id() == file && anon_compatible(v.anon_vma.get(), anon)
}

/// Linux's `is_mergeable_anon_vma`: either side without one, or the same one,
/// except that a forked (chained) anon_vma only merges with itself.
pub(crate) fn anon_compatible(a: Option<&Arc<AnonVma>>, b: Option<&Arc<AnonVma>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (Some(x), None) | (None, Some(x)) => !x.forked,
        (None, None) => true,
    }
}

/// A version of the VMA set: an ordered map from start address to VMA.
#[derive(Clone, Default)]
pub struct VmaTree {
    map: imbl::OrdMap<u64, Arc<Vma>>,
}

impl VmaTree {
    /// The VMA containing `addr`.
    #[inline]
    pub fn find(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.map.get_prev(&addr).map(|(_, v)| v).filter(|v| v.end > addr)
    }

    /// Linux's `find_vma`: the first VMA with `end > addr`.
    pub fn find_from(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.find(addr).or_else(|| self.map.get_next(&addr).map(|(_, v)| v))
    }

    /// The last VMA with `end <= addr` (the one before a gap at `addr`).
    pub fn prev_of(&self, addr: u64) -> Option<&Arc<Vma>> {
        let mut it = self.map.range(..addr).rev();
        it.find(|(_, v)| v.end <= addr).map(|(_, v)| v)
    }

    /// Every VMA overlapping `[start, end)`, in address order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &Arc<Vma>> {
        let first = self.find_from(start).map_or(end, |v| v.start.min(end));
        self.map.range(first..end).map(|(_, v)| v).filter(move |v| v.end > start)
    }

    /// The first VMA starting at or above `addr`.
    pub fn first_starting_at(&self, addr: u64) -> Option<&Arc<Vma>> {
        self.map.range(addr..).next().map(|(_, v)| v)
    }

    /// The VMAs starting below `addr`, highest first.
    pub fn rev_starting_before(&self, addr: u64) -> impl Iterator<Item = &Arc<Vma>> {
        self.map.range(..addr).rev().map(|(_, v)| v)
    }

    /// Every VMA in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        self.map.values()
    }

    /// Number of VMAs (Linux's `map_count`).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if there is no VMA.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Inserts a VMA that overlaps none.
    pub(crate) fn insert(&mut self, v: Vma) -> Arc<Vma> {
        debug_assert!(self.overlapping(v.start, v.end).next().is_none(), "overlap inserting {v:?}");
        let v = Arc::new(v);
        self.map.insert(v.start, v.clone());
        v
    }

    /// Removes the VMA starting at `start` and detaches it, waiting for
    /// faults holding it (see [`VmaLock::detach`]). Callers hold `mmap_lock`
    /// for write and have not yet touched the VMA's page-table entries.
    pub(crate) fn remove(&mut self, start: u64) -> Option<Arc<Vma>> {
        let v = self.map.remove(&start)?;
        v.lock.detach();
        Some(v)
    }

    /// Replaces the VMA starting at `old_start` by `v` (see [`VmaTree::remove`]).
    pub(crate) fn replace(&mut self, old_start: u64, v: Vma) -> Arc<Vma> {
        self.remove(old_start);
        self.insert(v)
    }
}
