//! Virtual memory areas and the tree that holds them.
//!
//! A [`Vma`] is immutable once published: a writer under `mmap_lock` builds
//! new VMAs and a new [`VmaTree`] version, then publishes it. The set is
//! sharded by 1 GiB window, each VMA stored once, in the window of its
//! start; each window is a persistent B-tree (so a version costs O(log n)
//! new nodes in the windows it changes, whatever the VMAs' sizes), and each
//! changed window is published on its own (`windows.rs`). Lock-free
//! readers load a window's published version under an epoch guard and read
//! it without writing any shared memory; an old version, and the VMAs only
//! it holds, are freed after the grace period.

use std::any::Any;
use std::sync::{Arc, OnceLock, Weak};

use crate::file::Inode;
use crate::mempolicy::MemPolicy;
use crate::phys::{PhysMem, VmaAcct};
use crate::sync::{Mutex, VmaLock};
use crate::PAGE_SHIFT;

mod flags;
mod ops;
// The published set's RCU (crossbeam-epoch's `defer_destroy` and loads of
// its `Shared` pointers) and its install-once leaves: the one module of this
// layer with `unsafe`, each block with the invariant that makes it sound.
#[allow(unsafe_code)]
mod windows;

/// A VMA's backing for merge checks: the file's id and the open's.
pub(crate) type FileKey = (u64, u64);

pub(crate) use flags::VmFlags;
pub(crate) use ops::{want_pmd_share, VmaDesc, VmaOps, ZapDetails, DEFAULT_VM_OPS};
pub(crate) use windows::{PublishedVmas, WindowDir, WINDOWS_END};

/// The anonymous-memory identity of a VMA (Linux's `anon_vma`): VMAs that share
/// one may merge; it is assigned on the first anonymous fault. Its identity is
/// its address (compared with `Arc::ptr_eq`).
#[derive(Debug)]
pub struct AnonVma {
    /// True for the anon_vma a child gets at fork (Linux's chained anon_vma).
    pub forked: bool,
    /// The family it belongs to: the anon_vma made at a first fault and
    /// every one forked from it share one.
    pub(crate) family: Arc<AnonFamily>,
}

/// A member of an anon family: an address space, held as `dyn Any` so that
/// this layer need not name `AddressSpace` (the reverse walk downcasts it).
pub(crate) type AnonMember = Weak<dyn Any + Send + Sync>;

/// The address spaces that may map the anonymous pages of one origin: the
/// one whose first fault made the family's anon_vma and every address space
/// forked from it, recursively (Linux's anon_vma root, whose interval tree
/// reaches every VMA of the chain). A page's mappings are found by walking
/// the members' VMAs of this family at the page's linear index (see
/// `mm/anon_rmap.rs`); the fault path never touches it after the VMA's
/// first fault.
pub struct AnonFamily {
    members: Mutex<Vec<AnonMember>>,
}

impl std::fmt::Debug for AnonFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AnonFamily({} members)", self.members.lock().len())
    }
}

impl AnonFamily {
    /// Adds `member` unless it is in already; drops members that died.
    pub(crate) fn join(&self, member: AnonMember) {
        let mut m = self.members.lock();
        m.retain(|w| w.strong_count() > 0);
        if !m.iter().any(|w| Weak::ptr_eq(w, &member)) {
            m.push(member);
        }
    }

    /// A family with no member: its walk finds nothing.
    pub(crate) fn empty() -> AnonFamily {
        AnonFamily { members: Mutex::new(Vec::new()) }
    }

    /// The members still alive.
    #[cfg_attr(not(test), allow(dead_code, reason = "the reverse walk's; migration calls it"))]
    pub(crate) fn members(&self) -> Vec<Arc<dyn Any + Send + Sync>> {
        self.members.lock().iter().filter_map(Weak::upgrade).collect()
    }
}

impl AnonVma {
    /// A new anon_vma heading a family of which `member` is the first member.
    pub(crate) fn new(member: AnonMember) -> Arc<AnonVma> {
        let family = Arc::new(AnonFamily { members: Mutex::new(vec![member]) });
        Arc::new(AnonVma { forked: false, family })
    }

    /// The anon_vma a child's VMA gets at fork: the same family, which
    /// `child` joins (Linux's `anon_vma_fork`).
    pub(crate) fn fork(&self, child: AnonMember) -> Arc<AnonVma> {
        self.family.join(child);
        Arc::new(AnonVma { forked: true, family: self.family.clone() })
    }

    /// An anon_vma of a family with no member, for tests of the merge rules.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn detached(forked: bool) -> AnonVma {
        AnonVma { forked, family: Arc::new(AnonFamily { members: Mutex::new(Vec::new()) }) }
    }
}

/// One mapping: `[start, end)` with one protection, one set of flags and one
/// backing object.
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `VM_*` flags.
    pub flags: VmFlags,
    /// Page offset in the file of `start` (for anonymous memory, Linux's linear index).
    pub pgoff: u64,
    /// The backing file, for file and shared anonymous mappings. The `Arc`
    /// keeps its memory for as long as this VMA's (lock-free readers may
    /// look at a removed VMA); its use, which keeps its pages, is
    /// `file_ref`.
    pub file: Option<Arc<Inode>>,
    /// This VMA still holds its use of `file` ([`crate::file::Inode::ihold`]):
    /// taken when the VMA is made, put when it is removed from its address
    /// space ([`Vma::put_file`]), at the latest when it is dropped.
    file_ref: crate::sync::AtomicBool,
    /// The open `file` was mapped through ([`crate::OpenFile`]'s identity; 0
    /// for the private file of a shared anonymous mapping). With `file`, it
    /// is Linux's `vm_file`: VMAs of two opens of one file never merge.
    pub(crate) open: u64,
    /// Set on the first anonymous fault, shared by the VMAs split from this one.
    pub anon_vma: OnceLock<Arc<AnonVma>>,
    /// Detached when a writer replaces or removes this VMA; lock-free faults
    /// validate against it (see [`crate::sync::VmaLock`]).
    pub lock: VmaLock,
    /// The VMA's NUMA memory policy (`mbind`), `None` for the address
    /// space's. VMAs merge only with equal policies.
    pub(crate) policy: Option<Arc<MemPolicy>>,
    /// A private hugetlb mapping's reserve map (Linux's `vm_private_data`
    /// with `HPAGE_RESV_OWNER`), shared by the VMAs split from it; `None`
    /// for every other VMA, a `MAP_NORESERVE` one and a forked child's.
    pub(crate) hugetlb_resv: Option<Arc<crate::phys::hugetlb::resv::PrivateResv>>,
    /// Linux's `HPAGE_RESV_UNMAPPED`: the owner of this private hugetlb
    /// mapping's reservations took a page from it when a copy-on-write
    /// found the pool empty (`unmap_ref_private`), so the next fault here
    /// that needs a page raises `SIGBUS`. Kept by split pieces; a fork's
    /// child starts without it. `None` for a VMA that is not hugetlb: only
    /// those are ever marked, and no other VMA pays for the allocation.
    hugetlb_unmapped: Option<Arc<crate::sync::AtomicBool>>,
    /// For a copy ([`Vma::slice`], [`Vma::rebound`]) of a private hugetlb
    /// VMA without reservations (the only kind `unmap_ref_private` marks),
    /// the mark of the VMA it was copied from: the owner may mark that one
    /// (found in the published tree, under the file's `i_mmap` lock, with
    /// no lock of ours) after the copy and before the copy is published,
    /// and the end of the write section carries such a mark over under the
    /// same lock (`AddressSpace::publish`'s caller).
    pub(crate) hugetlb_unmapped_from: Option<Arc<crate::sync::AtomicBool>>,
    /// The backing's hooks (Linux's `vm_ops`): [`DEFAULT_VM_OPS`] unless
    /// the mapping's preparation chose others; every copy keeps them.
    pub(crate) ops: &'static dyn VmaOps,
    /// Counts this VMA in its arena's statistics until it is dropped
    /// (see [`VmaAcct`]: not the arena itself, whose reference count every
    /// address space writes).
    acct: VmaAcct,
}

impl std::fmt::Debug for Vma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vma({:#x}-{:#x} flags={:#x} pgoff={:#x})", self.start, self.end, self.flags, self.pgoff)
    }
}

impl Drop for Vma {
    fn drop(&mut self) {
        // The file first: once the count says no VMA is left, a file that
        // only VMAs held is gone too (its pages freed, a host-backed one
        // written back), so `PhysMem::quiesce` sees the end state. Its use
        // was put when the VMA was removed, unless the VMA never was in an
        // address space's tree (a copy made and dropped on an error path).
        self.put_file();
        drop(self.file.take());
        // `acct` is dropped after this, writing its slot's line.
        self.acct.note_write();
    }
}

impl Vma {
    /// A new VMA, counted in `phys`'s VMA statistics until it is dropped.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        phys: &PhysMem,
        start: u64,
        end: u64,
        flags: VmFlags,
        pgoff: u64,
        file: Option<Arc<Inode>>,
        anon_vma: Option<Arc<AnonVma>>,
    ) -> Vma {
        Vma::counted(phys.account_vma(), start, end, flags, pgoff, file, anon_vma)
    }

    /// A new VMA counted by `acct`.
    #[allow(clippy::too_many_arguments)]
    fn counted(
        acct: VmaAcct,
        start: u64,
        end: u64,
        flags: VmFlags,
        pgoff: u64,
        file: Option<Arc<Inode>>,
        anon_vma: Option<Arc<AnonVma>>,
    ) -> Vma {
        debug_assert!(start < end);
        acct.note_write();
        if let Some(f) = &file {
            f.ihold();
        }
        let cell = OnceLock::new();
        if let Some(a) = anon_vma {
            let _ = cell.set(a);
        }
        Vma {
            start,
            end,
            flags,
            pgoff,
            file_ref: crate::sync::AtomicBool::new(file.is_some()),
            file,
            open: 0,
            anon_vma: cell,
            lock: VmaLock::new(),
            policy: None,
            hugetlb_resv: None,
            hugetlb_unmapped: flags.contains(VmFlags::HUGETLB).then(|| Arc::new(crate::sync::AtomicBool::new(false))),
            hugetlb_unmapped_from: None,
            ops: &DEFAULT_VM_OPS,
            acct,
        }
    }

    /// Puts this VMA's use of its file, once (Linux's `fput` of `vm_file`
    /// in `remove_vma`): called when the VMA has left its address space,
    /// after the entries it mapped were zapped, so that the last mapping of
    /// a shared anonymous object or of a file without a handle frees its
    /// pages, charge and reservations before the call that removed it
    /// returns, not when the VMA's memory is reclaimed.
    pub(crate) fn put_file(&self) {
        if self.file_ref.swap(false, crate::sync::Ordering::AcqRel) {
            if let Some(f) = &self.file {
                f.iput();
            }
        }
    }

    /// The same VMA mapped through the open `open` (see [`Vma::open`]).
    pub(crate) fn with_open(mut self, open: u64) -> Vma {
        self.open = open;
        self
    }

    /// A copy of this VMA limited to `[start, end)` with `flags`, counted
    /// in the calling thread's slot ([`crate::phys::VmaAcct::this_slot`]).
    pub(crate) fn slice(&self, start: u64, end: u64, flags: VmFlags) -> Vma {
        debug_assert!(self.start <= start && end <= self.end);
        let mut v = Vma::counted(
            self.acct.this_slot(),
            start,
            end,
            flags,
            self.pgoff_at(start),
            self.file.clone(),
            self.anon_vma.get().cloned(),
        )
        .with_open(self.open);
        v.policy = self.policy.clone();
        v.hugetlb_resv = self.hugetlb_resv.clone();
        v.ops = self.ops;
        self.copy_hugetlb_unmapped(&mut v);
        v
    }

    /// The same VMA with other bounds and page offset (for merges and
    /// moves), counted in the calling thread's slot.
    pub(crate) fn rebound(&self, start: u64, end: u64, pgoff: u64) -> Vma {
        let mut v = Vma::counted(
            self.acct.this_slot(),
            start,
            end,
            self.flags,
            pgoff,
            self.file.clone(),
            self.anon_vma.get().cloned(),
        )
        .with_open(self.open);
        v.policy = self.policy.clone();
        v.hugetlb_resv = self.hugetlb_resv.clone();
        v.ops = self.ops;
        self.copy_hugetlb_unmapped(&mut v);
        v
    }

    /// The same VMA over another file (a coherent window onto more of a
    /// host file, `sys/mmap_host.rs`), which takes its own use of it.
    pub(crate) fn with_file(&self, file: Arc<Inode>) -> Vma {
        let mut v = Vma::counted(
            self.acct.clone(),
            self.start,
            self.end,
            self.flags,
            self.pgoff,
            Some(file),
            self.anon_vma.get().cloned(),
        )
        .with_open(self.open);
        v.policy = self.policy.clone();
        v.ops = self.ops;
        v
    }

    /// Gives `v`, a copy of this VMA, its `HPAGE_RESV_UNMAPPED` mark as it
    /// is now and, if the owner could still mark this VMA before `v` is
    /// published, a link to this VMA's mark ([`Vma::hugetlb_unmapped_from`]).
    fn copy_hugetlb_unmapped(&self, v: &mut Vma) {
        if let Some(mark) = &self.hugetlb_unmapped {
            v.hugetlb_unmapped =
                Some(Arc::new(crate::sync::AtomicBool::new(mark.load(crate::sync::Ordering::Relaxed))));
            v.hugetlb_unmapped_from = self.may_be_marked_unmapped().then(|| mark.clone());
        }
    }

    /// Linux's `is_vma_resv_set(vma, HPAGE_RESV_UNMAPPED)`: the owner of
    /// this private hugetlb mapping's reservations took a page from it.
    pub(crate) fn hugetlb_unmapped(&self) -> bool {
        self.hugetlb_unmapped.as_ref().is_some_and(|m| m.load(crate::sync::Ordering::Relaxed))
    }

    /// Sets the `HPAGE_RESV_UNMAPPED` mark of this hugetlb VMA (Relaxed:
    /// the caller orders it before what a fault must see it with).
    pub(crate) fn mark_hugetlb_unmapped(&self) {
        debug_assert!(self.flags.contains(VmFlags::HUGETLB), "only hugetlb VMAs are marked");
        if let Some(m) = &self.hugetlb_unmapped {
            m.store(true, crate::sync::Ordering::Relaxed);
        }
    }

    /// A private hugetlb VMA without reservations of its own: the kind
    /// `unmap_ref_private` takes a page from and marks.
    pub(crate) fn may_be_marked_unmapped(&self) -> bool {
        self.flags.contains(VmFlags::HUGETLB) && !self.flags.contains(VmFlags::MAYSHARE) && self.hugetlb_resv.is_none()
    }

    /// Linux's `mpol_equal` between this VMA's policy and `policy`.
    pub(crate) fn same_policy(&self, policy: Option<&Arc<MemPolicy>>) -> bool {
        match (self.policy.as_ref(), policy) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// Sets the anon_vma of a VMA not yet published.
    pub(crate) fn set_anon(&mut self, anon: Option<Arc<AnonVma>>) {
        self.anon_vma = OnceLock::new();
        if let Some(a) = anon {
            let _ = self.anon_vma.set(a);
        }
    }

    /// Linux's `vma_hugecache_offset`: the huge page index in the file (or
    /// the private mapping's reserve map) of `addr` in a hugetlb VMA.
    pub(crate) fn huge_index(&self, addr: u64) -> u64 {
        ((addr - self.start) >> crate::phys::hugetlb::HPAGE_SHIFT)
            + (self.pgoff >> (crate::phys::hugetlb::HPAGE_SHIFT - PAGE_SHIFT))
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

    /// Linux's `vma_needs_dirty_tracking`: a shared writable mapping of a
    /// file whose dirty pages are written back ([`File::can_writeback`]: a
    /// host-backed file), which must see every write to mark the page
    /// dirty. In-memory files are shmem and hugetlbfs files have no
    /// writeback, so their mappings need none.
    pub(crate) fn needs_dirty_tracking(&self) -> bool {
        self.flags.contains(VmFlags::SHARED | VmFlags::WRITE) && self.file.as_ref().is_some_and(|f| f.can_writeback())
    }

    /// The bottom of the stack guard gap below a growsdown VMA (`vm_start_gap`).
    pub fn start_gap(&self, guard_gap: u64) -> u64 {
        if self.flags.contains(VmFlags::GROWSDOWN) {
            self.start.saturating_sub(guard_gap)
        } else {
            self.start
        }
    }

    /// The identity of the backing file and of the open it was mapped
    /// through (Linux's `vm_file`), for merge checks.
    pub(crate) fn file_id(&self) -> Option<FileKey> {
        self.file.as_ref().map(|f| (f.id(), self.open))
    }

    /// Linux's `is_mergeable_vma` + `is_mergeable_anon_vma` for placing
    /// something with `flags`, `file`, `anon` directly after this VMA, where
    /// that something would start at file page `pgoff`.
    pub(crate) fn can_merge_after(
        &self,
        flags: VmFlags,
        file: Option<FileKey>,
        anon: Option<&Arc<AnonVma>>,
        pgoff: u64,
    ) -> bool {
        mergeable(self, flags, file, anon) && self.pgoff + self.pages() == pgoff
    }

    /// As [`Vma::can_merge_after`], for something of `pages` pages placed directly before.
    pub(crate) fn can_merge_before(
        &self,
        flags: VmFlags,
        file: Option<FileKey>,
        anon: Option<&Arc<AnonVma>>,
        pgoff: u64,
        pages: u64,
    ) -> bool {
        mergeable(self, flags, file, anon) && pgoff + pages == self.pgoff
    }

    /// Linux's `anon_vma_compatible`: `next` directly follows this VMA and
    /// the two could merge but for their access flags (and anon_vmas), so
    /// that they may share an anon_vma and merge after an mprotect.
    pub(crate) fn anon_vma_compatible(&self, next: &Vma) -> bool {
        self.end == next.start
            && self.file_id() == next.file_id()
            && (self.flags ^ next.flags).difference(VmFlags::ACCESS_FLAGS).is_empty()
            && next.pgoff == self.pgoff + self.pages()
    }
}

fn mergeable(v: &Vma, flags: VmFlags, file: Option<FileKey>, anon: Option<&Arc<AnonVma>>) -> bool {
    v.flags == flags
        && !flags.intersects(VmFlags::SPECIAL)
        && v.file_id() == file
        && anon_compatible(v.anon_vma.get(), anon)
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

/// The span of one window of the VMA set: 1 GiB, one PMD table's span.
pub(crate) const WINDOW_SHIFT: u32 = 30;

/// The window holding `addr`.
#[inline]
pub(crate) fn window_of(addr: u64) -> u64 {
    addr >> WINDOW_SHIFT
}

/// The first address of window `w`.
#[inline]
fn window_start(w: u64) -> u64 {
    w << WINDOW_SHIFT
}

/// One window's VMAs: those that START in the window, keyed by start. A
/// VMA is stored once, however many windows it covers, so that making,
/// splitting or removing one costs O(log n) whatever its size.
pub(crate) type WindowMap = imbl::OrdMap<u64, Arc<Vma>>;

/// A set of windows, read through: the writer's own version
/// ([`VmaTree`]) or the published one (`crate::mm`'s window directory).
/// The queries of the VMA set are written once over it ([`query`]).
///
/// The invariant every query relies on: a VMA is in the map of the window
/// of its start and of no other, and a window with no VMA is absent (or,
/// in a published set, may read as absent or empty).
pub(crate) trait Windows<'a>: Copy {
    /// Window `w`'s map, `None` if no VMA starts in it.
    fn window(self, w: u64) -> Option<&'a WindowMap>;
    /// The first window at or after `w` that holds a VMA.
    fn next_window(self, w: u64) -> Option<u64>;
    /// The last window at or before `w` that holds a VMA.
    fn prev_window(self, w: u64) -> Option<u64>;
}

/// The queries of the VMA set over any [`Windows`].
pub(crate) mod query {
    use super::*;

    /// The last VMA starting in a window below `w`: the last VMA of the
    /// nearest non-empty window below (one bitmap scan). A window listed
    /// but read empty (a published one emptied since) is skipped.
    fn last_below<'a>(s: impl Windows<'a>, w: u64) -> Option<&'a Arc<Vma>> {
        let mut w = w.checked_sub(1)?;
        loop {
            let at = s.prev_window(w)?;
            if let Some((_, v)) = s.window(at).and_then(|m| m.get_max()) {
                return Some(v);
            }
            w = at.checked_sub(1)?;
        }
    }

    /// The last VMA starting at or below `addr`: in `addr`'s window if one
    /// starts there at or below it, else the last of the windows below.
    #[inline]
    pub(crate) fn last_at_or_below<'a>(s: impl Windows<'a>, addr: u64) -> Option<&'a Arc<Vma>> {
        let w = window_of(addr);
        match s.window(w).and_then(|m| m.get_prev(&addr)) {
            Some((_, v)) => Some(v),
            None => last_below(s, w),
        }
    }

    /// The VMA containing `addr`.
    #[inline]
    pub(crate) fn find<'a>(s: impl Windows<'a>, addr: u64) -> Option<&'a Arc<Vma>> {
        last_at_or_below(s, addr).filter(|v| v.end > addr)
    }

    /// The first VMA starting at or above `addr`.
    pub(crate) fn first_starting_at<'a>(s: impl Windows<'a>, addr: u64) -> Option<&'a Arc<Vma>> {
        let w = window_of(addr);
        if let Some((_, v)) = s.window(w).and_then(|m| m.get_next(&addr)) {
            return Some(v);
        }
        let mut w = w.checked_add(1)?;
        loop {
            let at = s.next_window(w)?;
            if let Some((_, v)) = s.window(at).and_then(|m| m.get_min()) {
                return Some(v);
            }
            w = at.checked_add(1)?;
        }
    }

    /// Linux's `find_vma`: the first VMA with `end > addr`.
    pub(crate) fn find_from<'a>(s: impl Windows<'a>, addr: u64) -> Option<&'a Arc<Vma>> {
        find(s, addr).or_else(|| first_starting_at(s, addr))
    }

    /// The last VMA with `end <= addr`.
    pub(crate) fn prev_of<'a>(s: impl Windows<'a> + 'a, addr: u64) -> Option<&'a Arc<Vma>> {
        // At most one VMA starting below `addr` ends above it (the one
        // containing it), so this looks at two VMAs at most.
        rev_starting_before(s, addr).find(|v| v.end <= addr)
    }

    /// The windows holding a VMA from `first` on, ascending.
    fn ascending<'a>(s: impl Windows<'a> + 'a, first: u64) -> impl Iterator<Item = u64> + 'a {
        std::iter::successors(s.next_window(first), move |&w| s.next_window(w.checked_add(1)?))
    }

    /// The VMAs starting at or above `from`, in address order.
    pub(crate) fn starting_at<'a>(s: impl Windows<'a> + 'a, from: u64) -> impl Iterator<Item = &'a Arc<Vma>> {
        let first = window_of(from);
        ascending(s, first).flat_map(move |w| {
            let lo = if w == first { from } else { window_start(w) };
            s.window(w).into_iter().flat_map(move |m| m.range(lo..)).map(|(_, v)| v)
        })
    }

    /// Every VMA overlapping `[start, end)`, in address order.
    pub(crate) fn overlapping<'a>(
        s: impl Windows<'a> + 'a,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = &'a Arc<Vma>> {
        // From the VMA containing `start` if any (an empty range inside a
        // VMA still yields it, as a range query of one ordered map did).
        let lo = find_from(s, start).map_or(end, |v| v.start.min(end));
        starting_at(s, lo).take_while(move |v| v.start < end).filter(move |v| v.end > start)
    }

    /// The VMAs starting below `addr`, highest first.
    pub(crate) fn rev_starting_before<'a>(s: impl Windows<'a> + 'a, addr: u64) -> impl Iterator<Item = &'a Arc<Vma>> {
        let top = addr.checked_sub(1).map(window_of);
        std::iter::successors(top.and_then(|w| s.prev_window(w)), move |&w| s.prev_window(w.checked_sub(1)?))
            .flat_map(move |w| s.window(w).into_iter().flat_map(move |m| m.range(..addr).rev()).map(|(_, v)| v))
    }

    /// Every VMA in address order.
    pub(crate) fn iter<'a>(s: impl Windows<'a> + 'a) -> impl Iterator<Item = &'a Arc<Vma>> {
        starting_at(s, 0)
    }
}

/// The writer's windows that hold a VMA, sorted by window: a binary
/// search finds one, or the next or previous one, in a few compares of one
/// contiguous array (a process has VMAs in a handful of windows; a
/// `BTreeMap`'s range searches cost mmap1 ~5%). Making or emptying a
/// window moves the entries above it: at most 2^17 windows of 24 bytes.
#[derive(Clone, Default)]
struct WindowList(Vec<(u64, WindowMap)>);

impl WindowList {
    /// The index of the first window at or after `w`.
    #[inline]
    fn at_or_after(&self, w: u64) -> usize {
        self.0.partition_point(|&(k, _)| k < w)
    }

    #[inline]
    fn get(&self, w: u64) -> Option<&WindowMap> {
        self.0.get(self.at_or_after(w)).filter(|(k, _)| *k == w).map(|(_, m)| m)
    }

    fn next(&self, w: u64) -> Option<u64> {
        self.0.get(self.at_or_after(w)).map(|&(k, _)| k)
    }

    fn prev(&self, w: u64) -> Option<u64> {
        let i = w.checked_add(1).map_or(self.0.len(), |above| self.at_or_after(above));
        i.checked_sub(1).map(|i| self.0[i].0)
    }

    /// Window `w`'s map, made (from `spare` if there is one) if absent.
    fn get_or_make(&mut self, w: u64, spare: &mut Option<WindowMap>) -> &mut WindowMap {
        let i = self.at_or_after(w);
        if self.0.get(i).is_none_or(|(k, _)| *k != w) {
            self.0.insert(i, (w, spare.take().unwrap_or_default()));
        }
        &mut self.0[i].1
    }

    /// Removes the VMA starting at `start` from window `w`; an emptied
    /// window's map is returned in `spare`.
    fn remove(&mut self, w: u64, start: u64, spare: &mut Option<WindowMap>) -> Option<Arc<Vma>> {
        let i = self.at_or_after(w);
        let (k, map) = self.0.get_mut(i)?;
        if *k != w {
            return None;
        }
        let v = map.remove(&start)?;
        if map.is_empty() {
            *spare = Some(self.0.remove(i).1);
        }
        Some(v)
    }

    /// Sets window `w`'s map (`None`: no VMA starts there any more) and
    /// returns the one it replaced.
    fn set(&mut self, w: u64, map: Option<WindowMap>) -> Option<WindowMap> {
        let i = self.at_or_after(w);
        let present = self.0.get(i).is_some_and(|(k, _)| *k == w);
        match (map, present) {
            (Some(m), true) => Some(std::mem::replace(&mut self.0[i].1, m)),
            (Some(m), false) => {
                self.0.insert(i, (w, m));
                None
            }
            (None, true) => Some(self.0.remove(i).1),
            (None, false) => None,
        }
    }

    #[cfg(all(test, not(loom)))]
    fn len(&self) -> usize {
        self.0.len()
    }

    #[cfg(all(test, not(loom)))]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A version of the VMA set as its writer holds it: one persistent ordered
/// map per 1 GiB window ([`WindowMap`]) of the VMAs starting in it, each
/// VMA once. The writer changes its own version; the windows it changed
/// are published when its write section ends (`AddressSpace::publish`),
/// each as one RCU version, in the order [`VmaTree::publish_changed`] gives.
#[derive(Default)]
pub struct VmaTree {
    /// The windows holding a VMA.
    windows: WindowList,
    /// Number of VMAs.
    len: usize,
    /// The windows changed since the last [`VmaTree::publish_changed`].
    changed: Vec<u64>,
    /// The VMAs with a file that [`VmaTree::remove`] took out and whose
    /// uses of their files are still to be put ([`VmaTree::take_removed`]):
    /// by the owner of the tree, once the entries they mapped are zapped.
    /// Never copied: a clone is a version for readers.
    removed: Vec<Arc<Vma>>,
    /// The map of the last window emptied, kept for the next window made:
    /// an imbl map always holds a root node, and a map and unmap alone in
    /// their window would otherwise allocate and free one each time.
    spare: Option<WindowMap>,
    /// A range writer's view of one window ([`VmaTree::window_view`]):
    /// the bounds of that window, which stand for the VMAs beyond it where
    /// the page-table floor and ceiling are computed
    /// ([`VmaTree::table_bounds`]). `None` for the whole set.
    view: Option<(u64, u64)>,
}

impl Clone for VmaTree {
    /// A version for readers (tests' snapshots): without the changes and
    /// removals still to be handled, which stay the writer's.
    fn clone(&self) -> VmaTree {
        VmaTree {
            windows: self.windows.clone(),
            len: self.len,
            changed: Vec::new(),
            removed: Vec::new(),
            spare: None,
            view: self.view,
        }
    }
}

impl<'a> Windows<'a> for &'a VmaTree {
    #[inline]
    fn window(self, w: u64) -> Option<&'a WindowMap> {
        self.windows.get(w)
    }
    fn next_window(self, w: u64) -> Option<u64> {
        self.windows.next(w)
    }
    fn prev_window(self, w: u64) -> Option<u64> {
        self.windows.prev(w)
    }
}

impl VmaTree {
    /// The VMA containing `addr`.
    #[inline]
    pub fn find(&self, addr: u64) -> Option<&Arc<Vma>> {
        query::find(self, addr)
    }

    /// Linux's `find_vma`: the first VMA with `end > addr`.
    pub fn find_from(&self, addr: u64) -> Option<&Arc<Vma>> {
        query::find_from(self, addr)
    }

    /// The last VMA with `end <= addr` (the one before a gap at `addr`).
    pub fn prev_of(&self, addr: u64) -> Option<&Arc<Vma>> {
        query::prev_of(self, addr)
    }

    /// Every VMA overlapping `[start, end)`, in address order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &Arc<Vma>> {
        query::overlapping(self, start, end)
    }

    /// The first VMA starting at or above `addr`.
    pub fn first_starting_at(&self, addr: u64) -> Option<&Arc<Vma>> {
        query::first_starting_at(self, addr)
    }

    /// The VMAs starting below `addr`, highest first.
    pub fn rev_starting_before(&self, addr: u64) -> impl Iterator<Item = &Arc<Vma>> {
        query::rev_starting_before(self, addr)
    }

    /// Every VMA in address order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Vma>> {
        query::iter(self)
    }

    /// Number of VMAs (Linux's `map_count`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// A range writer's view of window `w` alone (`mm/range.rs`): its
    /// published `map`, with `len` standing for the whole set's map count
    /// (a bound on it, for the `max_map_count` checks). The range writer
    /// has checked that no VMA crosses the window's bounds, so every query
    /// the `mmap_lock` path's code asks about a range inside the window
    /// gets the whole set's answer, except that nothing lies below or above
    /// the window: [`VmaTree::table_bounds`] stops the page-table floor and
    /// ceiling at its bounds instead.
    pub(crate) fn window_view(w: u64, map: Option<WindowMap>, len: usize) -> VmaTree {
        let mut windows = WindowList::default();
        windows.set(w, map);
        VmaTree {
            windows,
            len,
            changed: Vec::new(),
            removed: Vec::new(),
            spare: None,
            view: Some((window_start(w), window_start(w + 1))),
        }
    }

    /// The end of [`VmaTree::window_view`]: window `w`'s map now (`None`:
    /// empty), whether it changed, and the VMAs with a file it removed.
    pub(crate) fn into_window(mut self, w: u64) -> (Option<WindowMap>, bool, Vec<Arc<Vma>>) {
        assert!(self.changed.iter().all(|&c| c == w), "a range writer changed a window outside its own");
        let changed = !self.changed.is_empty();
        (self.windows.set(w, None), changed, std::mem::take(&mut self.removed))
    }

    /// Makes window `w` hold `map` (the version a range writer published),
    /// for an `mmap_lock` holder that has blocked the range writers. Not a
    /// change to publish: the window is published already.
    pub(crate) fn sync_window(&mut self, w: u64, map: Option<WindowMap>) {
        let new = map.as_ref().map_or(0, |m| m.len());
        let old = self.windows.set(w, map.filter(|m| !m.is_empty())).map_or(0, |m| m.len());
        self.len = self.len + new - old;
    }

    /// The bounds of the window a range writer's view holds
    /// ([`VmaTree::window_view`]); `None` for the whole set.
    pub(crate) fn view(&self) -> Option<(u64, u64)> {
        self.view
    }

    /// Where the page-table floor and ceiling stop when no VMA lies below
    /// or above: the user address space's ends for the whole set, a
    /// window's bounds for a range writer's view (whose neighbours' tables
    /// it must not free), its top no higher than the whole set's (a
    /// window reaching past a small address space's table top).
    pub(crate) fn table_bounds(&self, task_top: u64) -> (u64, u64) {
        self.view.map_or((0, task_top), |(lo, hi)| (lo, hi.min(task_top)))
    }

    /// Inserts a VMA that overlaps none, in the window of its start only.
    pub(crate) fn insert(&mut self, v: Vma) -> Arc<Vma> {
        debug_assert!(self.overlapping(v.start, v.end).next().is_none(), "overlap inserting {v:?}");
        debug_assert_eq!(
            v.flags.contains(VmFlags::HUGETLB),
            v.ops.pagesize(&v) != crate::PAGE_SIZE,
            "{v:?} has {} hooks",
            v.ops.name()
        );
        let v = Arc::new(v);
        let w = window_of(v.start);
        self.windows.get_or_make(w, &mut self.spare).insert(v.start, v.clone());
        self.changed.push(w);
        self.len += 1;
        v
    }

    /// Removes the VMA starting at `start` and detaches it, waiting for
    /// faults holding it (see [`VmaLock::detach`]). Callers hold `mmap_lock`
    /// for write and have not yet touched the VMA's page-table entries.
    /// Detached before any window is published: a reader still finding it
    /// in a window not yet republished aborts.
    pub(crate) fn remove(&mut self, start: u64) -> Option<Arc<Vma>> {
        let w = window_of(start);
        let v = self.windows.remove(w, start, &mut self.spare)?;
        self.changed.push(w);
        self.len -= 1;
        if !(self.view.is_some() && crate::sync::broken::range_writers::no_detach()) {
            v.lock.detach();
        }
        if v.file.is_some() {
            self.removed.push(v.clone());
        }
        Some(v)
    }

    /// The VMAs with a file removed since the last call, whose file uses the
    /// caller puts ([`Vma::put_file`]) once their entries are zapped. A VMA
    /// that replaced one of them took its own use first, so a file mapped
    /// on both sides of a split or move is never left without one.
    pub(crate) fn take_removed(&mut self) -> Vec<Arc<Vma>> {
        std::mem::take(&mut self.removed)
    }

    /// Replaces the VMA starting at `old_start` by `v` (see [`VmaTree::remove`]).
    pub(crate) fn replace(&mut self, old_start: u64, v: Vma) -> Arc<Vma> {
        self.remove(old_start);
        self.insert(v)
    }

    /// Calls `f` with each window changed since the last call, each once,
    /// and its map now (`None`: the window holds no VMA any more), in an
    /// order in which a lock-free reader of `old` (the version published
    /// before, which `f` replaces window by window) finds at every address
    /// either what `old` held there or what this version holds: never a
    /// hole where both hold a VMA. Allocates nothing once the list of
    /// changed windows has grown to its size.
    ///
    /// # Protocol
    ///
    /// A reader looks for `addr` in `addr`'s window; if no VMA starts there
    /// at or below `addr`, it takes the last VMA of the nearest non-empty
    /// window below. Each window it reads is at its old or its new version.
    /// Every VMA this section removed or replaced was detached before the
    /// first publication ([`VmaTree::remove`]), so finding an old VMA is
    /// safe (a per-VMA fault aborts on it); the danger is a reader falling
    /// through a window to a lower one whose VMA ends below `addr`.
    ///
    /// 1. First, in descending order, the windows whose first VMA starts
    ///    inside an old VMA that started in a lower window (the right-hand
    ///    piece of a split, a mapping placed over the middle of a big one).
    ///    Below that first VMA such a window falls through to the lower
    ///    windows, all still old, which answer the old VMA; at and above
    ///    it, the window answers itself. Descending: a lower one of them
    ///    published first would shorten what the higher ones fall through
    ///    to while they still hold nothing there.
    /// 2. Then every other changed window, ascending: when one is published
    ///    every changed window below it is new, so its fall-through reads
    ///    the new version. One not yet published either answers itself
    ///    (old) or falls through to a new window whose last VMA is the new
    ///    VMA at `addr`: a new VMA starting in an old window below, or in
    ///    this one, over an old VMA from below, would have put that window
    ///    in step 1.
    ///
    /// `broken::windows::publish_reversed` publishes in the reverse order;
    /// the models of `mm/loom_tests.rs` (a split and a merge across a
    /// window boundary against a lock-free lookup) then fail.
    ///
    /// The order alone does not make a lookup exact: a reader loads
    /// `addr`'s window before the one it falls through to, so it may pair
    /// the first at an older version with the second at a newer one. A
    /// lookup that falls through to find nothing is therefore confirmed
    /// against the sequence count of sections publishing several windows
    /// (`windows.rs`); `several` is called before the first of them.
    pub(crate) fn publish_changed<'o>(
        &mut self,
        old: impl Windows<'o>,
        several: impl FnOnce(),
        mut f: impl FnMut(u64, Option<&WindowMap>),
    ) {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        if changed.len() > 1 {
            several();
        }
        if changed.len() == 1 {
            f(changed[0], self.windows.get(changed[0]));
        } else {
            // Step 1's windows, found before anything is published (`old`
            // then reads the new versions).
            let mut first: Vec<u64> = Vec::new();
            for &w in &changed {
                let start = self.windows.get(w).and_then(|m| m.get_min()).map(|(_, v)| v.start);
                if start.is_some_and(|a| query::find(old, a).is_some_and(|o| window_of(o.start) < w)) {
                    first.push(w);
                }
            }
            let order = first.iter().rev().chain(changed.iter().filter(|w| !first.contains(w)));
            if crate::sync::broken::windows::publish_reversed() {
                let order: Vec<u64> = order.copied().collect();
                for &w in order.iter().rev() {
                    f(w, self.windows.get(w));
                }
            } else {
                for &w in order {
                    f(w, self.windows.get(w));
                }
            }
        }
        changed.clear();
        self.changed = changed;
    }

    /// The windows [`VmaTree::publish_changed`] would publish now, in its
    /// order (for tests; the list is cleared as by a publication).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn take_changed<'o>(&mut self, old: impl Windows<'o>) -> Vec<u64> {
        let mut out = Vec::new();
        self.publish_changed(old, || (), |w, _| out.push(w));
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phys::PhysConfig;
    use crate::PAGE_SIZE;

    const RW: VmFlags =
        VmFlags::READ.union(VmFlags::WRITE).union(VmFlags::MAYREAD).union(VmFlags::MAYWRITE).union(VmFlags::MAYEXEC);

    /// A tiny arena: VMAs only need it for their accounting.
    fn phys() -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(64 << 10)).unwrap()
    }

    /// A private anonymous read-write VMA `[start, end)` with linear page offset `start >> PAGE_SHIFT`.
    fn anon(phys: &Arc<PhysMem>, start: u64, end: u64) -> Vma {
        Vma::new(phys, start, end, RW, start >> PAGE_SHIFT, None, None)
    }

    /// A tree of `[0x1000, 0x3000)` and `[0x5000, 0x8000)`, with a gap between them.
    fn two_vmas(phys: &Arc<PhysMem>) -> VmaTree {
        let mut t = VmaTree::default();
        t.insert(anon(phys, 0x5000, 0x8000));
        t.insert(anon(phys, 0x1000, 0x3000));
        t
    }

    /// A VMA counts itself in a per-CPU slot of the arena, not by holding
    /// the arena (whose reference count every address space of it writes),
    /// and its count stays sound when it outlives the arena, as a VMA of an
    /// old tree version freed after a grace period may.
    #[test]
    fn a_vma_takes_no_reference_on_its_arena_and_may_outlive_it() {
        let phys = phys();
        let vmas: Vec<Vma> = (1..9).map(|i| anon(&phys, i << 16, (i << 16) + 0x1000)).collect();
        let copy = vmas[0].slice(0x10000, 0x11000, RW);
        assert_eq!(Arc::strong_count(&phys), 1, "the arena's count is not written per VMA");
        assert_eq!(phys.stats().vmas, 9);
        drop(copy);
        assert_eq!(phys.stats().vmas, 8);
        let made_elsewhere = std::thread::scope(|s| s.spawn(|| anon(&phys, 0x100000, 0x101000)).join().unwrap());
        assert_eq!(phys.stats().vmas, 9);
        drop(phys);
        // Dropped after the arena: each drops its count in its slot's block.
        drop(vmas);
        drop(made_elsewhere);
    }

    /// Only a hugetlb VMA carries an `HPAGE_RESV_UNMAPPED` mark: making any
    /// other VMA allocates nothing for it, and its copies neither.
    #[test]
    fn only_hugetlb_vmas_allocate_the_unmapped_mark() {
        let phys = phys();
        let v = anon(&phys, 0x1000, 0x3000);
        assert!(v.hugetlb_unmapped.is_none() && v.slice(0x1000, 0x2000, RW).hugetlb_unmapped.is_none());
        assert!(!v.hugetlb_unmapped());
        let h = Vma::new(&phys, 0x200000, 0x600000, RW | VmFlags::HUGETLB, 0, None, None);
        let piece = h.slice(0x200000, 0x400000, RW | VmFlags::HUGETLB);
        h.mark_hugetlb_unmapped();
        assert!(h.hugetlb_unmapped() && !piece.hugetlb_unmapped());
        assert!(piece.hugetlb_unmapped_from.as_ref().is_some_and(|m| m.load(crate::sync::Ordering::Relaxed)));
        assert!(h.rebound(0x200000, 0x400000, 0).hugetlb_unmapped(), "a copy keeps the mark");
    }

    /// Each copy of a tree leaf writes the `Arc<Vma>` strong count of every
    /// VMA in it (and each old version's drop, often on a faulting thread's
    /// epoch collection, writes it again) while every fault reads the VMA's
    /// fields: the count is on a line of its own, because `Vma`'s alignment
    /// (its padded `VmaLock`) puts the fields a full line past the `Arc`'s
    /// counts.
    #[test]
    fn the_arc_count_is_off_the_lines_a_fault_reads() {
        assert!(std::mem::align_of::<Vma>() >= 64);
        let phys = phys();
        let v = Arc::new(anon(&phys, 0x1000, 0x3000));
        // The counts precede the value (`Arc`'s layout), which starts a
        // line: the last of them is at most this word.
        let counts_end = Arc::as_ptr(&v) as usize - std::mem::size_of::<usize>();
        assert_eq!(Arc::as_ptr(&v) as usize % 64, 0);
        assert_ne!(counts_end / 64, &v.start as *const u64 as usize / 64);
    }

    /// A `per-vma` fault writes the VMA's reference word twice while every
    /// fault on the VMA reads its bounds, flags, file and `anon_vma`: on one
    /// cache line, each of those writes would evict the line from every other
    /// faulting CPU (16 threads faulting one VMA ran at 0.8x `mmap-lock`).
    /// Linux keeps its per-VMA lock on a cache line of its own for the same
    /// reason.
    #[test]
    fn the_reference_word_has_a_cache_line_of_its_own() {
        let phys = phys();
        let v = anon(&phys, 0x1000, 0x3000);
        let base = &v as *const Vma as usize;
        let word = &v.lock as *const VmaLock as usize - base;
        let line = |off: usize| off / 64;
        let read_by_a_fault = [
            &v.start as *const u64 as usize,
            &v.end as *const u64 as usize,
            &v.flags as *const VmFlags as usize,
            &v.pgoff as *const u64 as usize,
            &v.file as *const Option<Arc<Inode>> as usize,
            &v.anon_vma as *const OnceLock<Arc<AnonVma>> as usize,
            &v.policy as *const Option<Arc<MemPolicy>> as usize,
        ];
        for f in read_by_a_fault {
            let off = f - base;
            assert_ne!(line(off), line(word), "field at {off} shares the reference word's line at {word}");
        }
        assert!(std::mem::size_of::<VmaLock>() >= 64 && word % 64 == 0);
    }

    /// The bounds of an optional VMA, for compact assertions.
    fn span(v: Option<&Arc<Vma>>) -> Option<(u64, u64)> {
        v.map(|v| (v.start, v.end))
    }

    /// The bounds of every VMA an iterator yields.
    fn spans<'a>(it: impl Iterator<Item = &'a Arc<Vma>>) -> Vec<(u64, u64)> {
        it.map(|v| (v.start, v.end)).collect()
    }

    const A: (u64, u64) = (0x1000, 0x3000);
    const B: (u64, u64) = (0x5000, 0x8000);

    #[test]
    fn empty_tree_answers_nothing() {
        let t = VmaTree::default();
        assert_eq!(t.len(), 0);
        assert_eq!(span(t.find(0)), None);
        assert_eq!(span(t.find_from(0)), None);
        assert_eq!(span(t.prev_of(u64::MAX)), None);
        assert_eq!(spans(t.overlapping(0, u64::MAX)), []);
        assert_eq!(span(t.first_starting_at(0)), None);
        assert_eq!(spans(t.rev_starting_before(u64::MAX)), []);
        assert_eq!(spans(t.iter()), []);
    }

    #[test]
    fn find_is_end_exclusive() {
        let p = phys();
        let t = two_vmas(&p);
        assert_eq!(t.len(), 2);
        assert_eq!(span(t.find(0)), None);
        assert_eq!(span(t.find(0xfff)), None);
        assert_eq!(span(t.find(0x1000)), Some(A));
        assert_eq!(span(t.find(0x2fff)), Some(A));
        assert_eq!(span(t.find(0x3000)), None, "an address at a VMA's end is outside it");
        assert_eq!(span(t.find(0x4fff)), None);
        assert_eq!(span(t.find(0x5000)), Some(B));
        assert_eq!(span(t.find(0x7fff)), Some(B));
        assert_eq!(span(t.find(0x8000)), None);
        assert_eq!(span(t.find(u64::MAX)), None);
    }

    #[test]
    fn find_from_is_linux_find_vma() {
        let p = phys();
        let t = two_vmas(&p);
        assert_eq!(span(t.find_from(0)), Some(A));
        assert_eq!(span(t.find_from(0x2000)), Some(A), "the VMA containing the address");
        assert_eq!(span(t.find_from(0x3000)), Some(B), "at A's end: the next VMA");
        assert_eq!(span(t.find_from(0x4000)), Some(B), "in the gap: the next VMA");
        assert_eq!(span(t.find_from(0x7fff)), Some(B));
        assert_eq!(span(t.find_from(0x8000)), None);
    }

    #[test]
    fn prev_of_is_the_last_vma_ending_at_or_below() {
        let p = phys();
        let t = two_vmas(&p);
        assert_eq!(span(t.prev_of(0)), None);
        assert_eq!(span(t.prev_of(0x2000)), None, "A contains it, nothing ends below");
        assert_eq!(span(t.prev_of(0x3000)), Some(A), "A ends exactly there");
        assert_eq!(span(t.prev_of(0x4000)), Some(A));
        assert_eq!(span(t.prev_of(0x5000)), Some(A));
        assert_eq!(span(t.prev_of(0x6000)), Some(A), "B contains it, so A is the one before");
        assert_eq!(span(t.prev_of(0x8000)), Some(B));
        assert_eq!(span(t.prev_of(u64::MAX)), Some(B));
    }

    #[test]
    fn overlapping_yields_every_intersecting_vma_in_order() {
        let p = phys();
        let t = two_vmas(&p);
        assert_eq!(spans(t.overlapping(0, 0x1000)), [], "ends where A starts");
        assert_eq!(spans(t.overlapping(0, 0x1001)), [A]);
        assert_eq!(spans(t.overlapping(0x2000, 0x6000)), [A, B]);
        assert_eq!(spans(t.overlapping(0x2fff, 0x5001)), [A, B]);
        assert_eq!(spans(t.overlapping(0x3000, 0x5000)), [], "exactly the gap");
        assert_eq!(spans(t.overlapping(0x6000, 0x7000)), [B], "inside B");
        assert_eq!(spans(t.overlapping(0x8000, 0x9000)), []);
        assert_eq!(spans(t.overlapping(0, u64::MAX)), [A, B]);
    }

    #[test]
    fn first_starting_at_and_rev_starting_before() {
        let p = phys();
        let t = two_vmas(&p);
        assert_eq!(span(t.first_starting_at(0)), Some(A));
        assert_eq!(span(t.first_starting_at(0x1000)), Some(A));
        assert_eq!(span(t.first_starting_at(0x1001)), Some(B), "A contains it but starts below");
        assert_eq!(span(t.first_starting_at(0x5000)), Some(B));
        assert_eq!(span(t.first_starting_at(0x5001)), None);
        assert_eq!(spans(t.rev_starting_before(0x1000)), []);
        assert_eq!(spans(t.rev_starting_before(0x1001)), [A]);
        assert_eq!(spans(t.rev_starting_before(0x5000)), [A]);
        assert_eq!(spans(t.rev_starting_before(0x5001)), [B, A]);
        assert_eq!(spans(t.rev_starting_before(u64::MAX)), [B, A]);
        assert_eq!(spans(t.iter()), [A, B]);
    }

    #[test]
    fn remove_detaches_and_old_versions_keep_their_vmas() {
        let p = phys();
        let mut t = two_vmas(&p);
        let old = t.clone();
        assert!(t.remove(0x2000).is_none(), "only a VMA's start removes it");
        let a = t.remove(0x1000).unwrap();
        assert_eq!((a.start, a.end), A);
        assert!(a.lock.is_detached(), "removal must detach for lock-free faults");
        assert_eq!(spans(t.iter()), [B]);
        let c = t.replace(0x5000, anon(&p, 0x5000, 0x6000));
        assert_eq!((c.start, c.end), (0x5000, 0x6000));
        assert_eq!(spans(t.iter()), [(0x5000, 0x6000)]);
        // The version readers may still hold is a separate, untouched snapshot.
        assert_eq!(spans(old.iter()), [A, B]);
        assert_eq!(span(old.find(0x7000)), Some(B));
        // It shares the replaced VMA itself, now detached so lock-free faults on it retry.
        assert!(old.find(0x7000).unwrap().lock.is_detached());
        assert!(Arc::ptr_eq(old.find(0x1000).unwrap(), &a));
    }

    #[test]
    fn slice_and_rebound_keep_the_backing_object() {
        let p = phys();
        let handle = crate::file::File::create(&p, "f", 1 << 20).unwrap();
        let file = handle.inode().clone();
        let av = Arc::new(AnonVma::detached(false));
        let v = Vma::new(&p, 0x10000, 0x20000, RW | VmFlags::SHARED, 5, Some(file.clone()), Some(av.clone()));
        assert_eq!(v.pages(), 16);
        assert_eq!((v.pgoff_at(0x10000), v.pgoff_at(0x10fff), v.pgoff_at(0x11000), v.pgoff_at(0x1f000)), (5, 5, 6, 20));
        assert!(!v.is_anonymous());

        let s = v.slice(0x14000, 0x18000, VmFlags::READ);
        assert_eq!((s.start, s.end, s.flags, s.pgoff), (0x14000, 0x18000, VmFlags::READ, 9));
        assert!(Arc::ptr_eq(s.file.as_ref().unwrap(), &file));
        assert!(Arc::ptr_eq(s.anon_vma.get().unwrap(), &av));
        assert!(!s.lock.is_detached());

        let r = v.rebound(0x40000, 0x42000, 100);
        assert_eq!((r.start, r.end, r.flags, r.pgoff), (0x40000, 0x42000, RW | VmFlags::SHARED, 100));
        assert!(Arc::ptr_eq(r.file.as_ref().unwrap(), &file));
        assert!(Arc::ptr_eq(r.anon_vma.get().unwrap(), &av));
        assert_eq!(r.pgoff_at(0x41000), 101);
    }

    #[test]
    fn set_anon_replaces_or_clears_the_anon_vma() {
        let p = phys();
        let mut v = anon(&p, 0x1000, 0x2000);
        assert!(v.anon_vma.get().is_none());
        let av = Arc::new(AnonVma::detached(false));
        v.set_anon(Some(av.clone()));
        assert!(Arc::ptr_eq(v.anon_vma.get().unwrap(), &av));
        v.set_anon(None);
        assert!(v.anon_vma.get().is_none());
    }

    #[test]
    fn start_gap_only_for_growsdown() {
        let p = phys();
        let gap = 256 * PAGE_SIZE;
        let plain = anon(&p, 0x20_0000, 0x30_0000);
        assert_eq!(plain.start_gap(gap), 0x20_0000);
        let stack = Vma::new(&p, 0x20_0000, 0x30_0000, RW | VmFlags::GROWSDOWN, 0, None, None);
        assert_eq!(stack.start_gap(gap), 0x10_0000);
        // Near address zero the gap saturates instead of wrapping (vm_start_gap).
        let low = Vma::new(&p, 0x1000, 0x2000, RW | VmFlags::GROWSDOWN, 0, None, None);
        assert_eq!(low.start_gap(gap), 0);
    }

    #[test]
    fn anon_compatible_follows_is_mergeable_anon_vma() {
        let a = Arc::new(AnonVma::detached(false));
        let b = Arc::new(AnonVma::detached(false));
        let f = Arc::new(AnonVma::detached(true));
        assert!(anon_compatible(None, None));
        assert!(anon_compatible(Some(&a), None));
        assert!(anon_compatible(None, Some(&a)));
        assert!(anon_compatible(Some(&a), Some(&a)));
        assert!(!anon_compatible(Some(&a), Some(&b)), "identity, not id equality");
        // A forked (chained) anon_vma only merges with itself.
        assert!(!anon_compatible(Some(&f), None));
        assert!(!anon_compatible(None, Some(&f)));
        assert!(!anon_compatible(Some(&f), Some(&a)));
        assert!(anon_compatible(Some(&f), Some(&f)));
    }

    #[test]
    fn merge_predicates_need_equal_flags_file_anon_and_contiguous_pgoff() {
        let p = phys();
        // Four pages at pgoff 10..14.
        let v = Vma::new(&p, 0x10000, 0x14000, RW, 10, None, None);
        assert!(v.can_merge_after(RW, None, None, 14));
        assert!(!v.can_merge_after(RW, None, None, 13), "pgoff not contiguous");
        assert!(!v.can_merge_after(RW, None, None, 15));
        assert!(!v.can_merge_after(RW | VmFlags::EXEC, None, None, 14), "flags differ");
        assert!(!v.can_merge_after(RW, Some((1, 0)), None, 14), "file differs");
        assert!(v.can_merge_before(RW, None, None, 8, 2));
        assert!(v.can_merge_before(RW, None, None, 6, 4));
        assert!(!v.can_merge_before(RW, None, None, 7, 2), "pgoff not contiguous");
        assert!(!v.can_merge_before(VmFlags::READ, None, None, 8, 2), "flags differ");

        // VM_DONTEXPAND (VM_SPECIAL) never merges, even with identical flags.
        let special = Vma::new(&p, 0x10000, 0x14000, RW | VmFlags::DONTEXPAND, 10, None, None);
        assert!(!special.can_merge_after(RW | VmFlags::DONTEXPAND, None, None, 14));
        assert!(!special.can_merge_before(RW | VmFlags::DONTEXPAND, None, None, 8, 2));
    }

    #[test]
    fn merge_predicates_compare_file_identity_and_anon_vma() {
        let p = phys();
        let handles = [
            crate::file::File::create(&p, "f", 1 << 20).unwrap(),
            crate::file::File::create(&p, "g", 1 << 20).unwrap(),
        ];
        let (file, other) = (handles[0].inode().clone(), handles[1].inode().clone());
        let v = Vma::new(&p, 0x10000, 0x12000, RW | VmFlags::SHARED, 0, Some(file.clone()), None).with_open(7);
        assert!(v.can_merge_after(RW | VmFlags::SHARED, Some((file.id(), 7)), None, 2));
        assert!(!v.can_merge_after(RW | VmFlags::SHARED, Some((file.id(), 8)), None, 2), "another open of the file");
        assert!(!v.can_merge_after(RW | VmFlags::SHARED, Some((other.id(), 7)), None, 2));
        assert!(!v.can_merge_after(RW | VmFlags::SHARED, None, None, 2), "file next to anonymous memory");

        let own = Arc::new(AnonVma::detached(false));
        let forked = Arc::new(AnonVma::detached(true));
        let with_anon = Vma::new(&p, 0x10000, 0x12000, RW, 0, None, Some(own.clone()));
        assert!(with_anon.can_merge_after(RW, None, None, 2), "a faulted VMA absorbs an unfaulted one");
        assert!(with_anon.can_merge_after(RW, None, Some(&own), 2));
        assert!(!with_anon.can_merge_after(RW, None, Some(&forked), 2));
        let child = Vma::new(&p, 0x10000, 0x12000, RW, 10, None, Some(forked.clone()));
        assert!(!child.can_merge_after(RW, None, None, 12), "a forked anon_vma only merges with itself");
        assert!(!child.can_merge_before(RW, None, None, 8, 2));
        assert!(child.can_merge_after(RW, None, Some(&forked), 12));
        assert!(child.can_merge_before(RW, None, Some(&forked), 8, 2));
    }

    const GIB: u64 = 1 << WINDOW_SHIFT;

    /// Every query of the windowed set answers as a brute-force search of
    /// its VMAs, for VMAs that span many windows, end on window
    /// boundaries, or share a window, at addresses around every boundary.
    #[test]
    #[cfg_attr(miri, ignore = "safe code only, 6,000 range queries against a brute-force search: minutes under Miri")]
    fn the_windowed_queries_answer_as_a_search_of_every_vma() {
        let p = phys();
        let mut t = VmaTree::default();
        let layout = [
            (0x1000, 0x3000),
            (GIB - 0x1000, GIB + 0x1000),
            (3 * GIB, 3 * GIB + 0x1000),
            (3 * GIB + 0x2000, 9 * GIB),
            (9 * GIB, 10 * GIB),
            (12 * GIB + 0x5000, (1 << 44) + 0x1000),
            ((1 << 46) - GIB, 1 << 46),
        ];
        for &(s, e) in &layout {
            t.insert(anon(&p, s, e));
        }
        let all: Vec<(u64, u64)> = layout.to_vec();
        let mut probes = vec![0, u64::MAX, 1 << 47];
        for &(s, e) in &all {
            for a in [s, e] {
                probes.extend([a - 0x1000, a, a + 0x1000, window_start(window_of(a)), window_start(window_of(a) + 1)]);
            }
            probes.push(s + (e - s) / 2);
        }
        assert_eq!(t.len(), all.len());
        assert_eq!(spans(t.iter()), all);
        for &a in &probes {
            let find = all.iter().copied().find(|&(s, e)| s <= a && a < e);
            assert_eq!(span(t.find(a)), find, "find {a:#x}");
            assert_eq!(span(t.find_from(a)), all.iter().copied().find(|&(_, e)| e > a), "find_from {a:#x}");
            assert_eq!(span(t.prev_of(a)), all.iter().copied().rev().find(|&(_, e)| e <= a), "prev_of {a:#x}");
            assert_eq!(span(t.first_starting_at(a)), all.iter().copied().find(|&(s, _)| s >= a), "first {a:#x}");
            let below: Vec<_> = all.iter().copied().rev().filter(|&(s, _)| s < a).collect();
            assert_eq!(spans(t.rev_starting_before(a)), below, "rev_starting_before {a:#x}");
            for &b in &probes {
                // An empty range inside a VMA yields it (but for one at its start).
                let over: Vec<_> = all.iter().copied().filter(|&(s, e)| s < b && e > a).collect();
                if a <= b {
                    assert_eq!(spans(t.overlapping(a, b)), over, "overlapping {a:#x}..{b:#x}");
                }
            }
        }
    }

    /// A VMA is stored once, in the window of its start: making, splitting
    /// and removing one of 16 TiB changes one or two windows, not the 16384
    /// it covers.
    #[test]
    fn a_vma_is_stored_once_whatever_its_size() {
        let p = phys();
        let mut t = VmaTree::default();
        let (s, e) = (GIB, GIB + (16 << 40));
        t.insert(Vma::new(&p, s, e, VmFlags::empty(), 0, None, None));
        assert_eq!(t.take_changed(&VmaTree::default()), [1]);
        assert_eq!(t.windows.len(), 1);
        let old = t.clone();
        let mid = s + (8 << 40) + 0x1000;
        let v = t.remove(s).unwrap();
        t.insert(v.slice(s, mid, RW));
        t.insert(v.slice(mid, e, VmFlags::empty()));
        assert_eq!(t.take_changed(&old), [window_of(mid), 1], "the split's two windows, the gaining one first");
        assert_eq!((t.windows.len(), t.len()), (2, 2));
        t.remove(s);
        t.remove(mid);
        assert_eq!(t.take_changed(&old).len(), 2);
        assert!(t.windows.is_empty());
    }

    /// The order of publication: the right-hand piece of a split across a
    /// window boundary before the window that keeps the left one; a merge's
    /// window before the window that loses the VMA merged into it; and a
    /// merge into a VMA from below before the windows it covers, ascending.
    #[test]
    fn windows_gaining_a_vma_are_published_before_those_losing_it() {
        let p = phys();
        let mut t = VmaTree::default();
        t.insert(anon(&p, GIB - 0x1000, 3 * GIB + 0x1000));
        t.take_changed(&VmaTree::default());
        // Split at 2 GiB + 4 KiB: window 2 gains the right piece.
        let old = t.clone();
        let v = t.remove(GIB - 0x1000).unwrap();
        t.insert(v.slice(GIB - 0x1000, 2 * GIB + 0x1000, RW));
        t.insert(v.slice(2 * GIB + 0x1000, 3 * GIB + 0x1000, RW));
        assert_eq!(t.take_changed(&old), [2, 0]);
        // Merge back: window 0 gains the whole, window 2 loses its piece.
        let old = t.clone();
        t.remove(GIB - 0x1000);
        t.remove(2 * GIB + 0x1000);
        t.insert(anon(&p, GIB - 0x1000, 3 * GIB + 0x1000));
        assert_eq!(t.take_changed(&old), [0, 2]);
        // A merge from window 0 over windows 2 and 3 that also splits the
        // VMA starting in window 3: ascending, so that window 3, falling
        // through below its new piece, never reaches window 2's old VMA
        // (ending at 3 GiB) while window 0's new one covers the address.
        t.remove(GIB - 0x1000);
        t.insert(anon(&p, GIB - 0x1000, GIB));
        t.insert(anon(&p, 2 * GIB, 3 * GIB));
        t.insert(anon(&p, 3 * GIB, 3 * GIB + 0x2000));
        t.take_changed(&VmaTree::default());
        let old = t.clone();
        t.remove(GIB - 0x1000);
        t.remove(2 * GIB);
        t.remove(3 * GIB);
        t.insert(anon(&p, GIB - 0x1000, 3 * GIB + 0x1000));
        t.insert(anon(&p, 3 * GIB + 0x1000, 3 * GIB + 0x2000));
        assert_eq!(t.take_changed(&old), [0, 2, 3]);
    }

    #[test]
    fn vmas_are_counted_until_dropped() {
        let p = phys();
        let v = anon(&p, 0x1000, 0x4000);
        assert_eq!(p.stats().vmas, 1);
        let s = v.slice(0x2000, 0x3000, RW);
        let r = v.rebound(0x8000, 0xb000, 8);
        assert_eq!(p.stats().vmas, 3);
        drop((v, s));
        assert_eq!(p.stats().vmas, 1);
        let mut t = two_vmas(&p);
        t.insert(r);
        assert_eq!(p.stats().vmas, 3);
        let snapshot = t.clone();
        let removed = t.remove(0x8000).unwrap();
        drop(removed);
        assert_eq!(p.stats().vmas, 3, "the old version still holds the removed VMA");
        drop(snapshot);
        assert_eq!(p.stats().vmas, 2);
        drop(t);
        assert_eq!(p.stats().vmas, 0);
        assert_eq!(p.quiesce().vmas, 0);
    }
}
