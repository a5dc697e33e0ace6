//! The huge page pool: 2 MiB pages carved out of each node's frames when the
//! arena is made (Linux's boot-time `hugepages=N`, or `nr_hugepages` written
//! once), with the counters `/proc/meminfo` shows.
//!
//! A huge page is 512 contiguous frames whose first frame number is a
//! multiple of 512; its head frame's descriptor carries the reference count,
//! as a folio's does. The pool's frames never enter the 4 KiB free lists, and
//! a huge page's last reference returns it here (`PhysMem::put` asks
//! [`HugePool::owns`]). Every count is changed under one lock, Linux's
//! `hugetlb_lock`: allocation, reservation and freeing are rare next to the
//! faults they serve (one per 2 MiB).

use crate::error::{Errno, Result};
use crate::phys::{FrameRef, Pfn, PhysMem};
use crate::sync::{AtomicU64, Mutex, Ordering};

use super::HPAGE_FRAMES;

/// Set on a huge page whose reservation comes back when it is freed
/// (Linux's `folio_set_hugetlb_restore_reserve`): an anonymous page of a
/// private mapping that still owns its reserve map, zapped by
/// `MADV_DONTNEED` while it had no other mapping. A high bit, clear of the
/// `PG_*` bits `phys` defines.
pub(crate) const PG_HUGETLB_RESTORE_RESERVE: u32 = 1 << 24;

/// The huge page counts of one arena, as `/proc/meminfo` prints them
/// (`HugePages_Total`, `HugePages_Free`, `HugePages_Rsvd`, `HugePages_Surp`),
/// and the pool's event counters. With every address space and file of the
/// arena gone, `free == total`, `rsvd == 0` and `surp == 0` again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HugePageStats {
    /// Huge pages in the pool (`HugePages_Total`, Linux's `nr_huge_pages`).
    pub total: u64,
    /// Pages not allocated, reserved ones included (`HugePages_Free`).
    pub free: u64,
    /// Pages promised to mappings but not yet allocated (`HugePages_Rsvd`):
    /// at most `free`, so a reserved fault always finds a page.
    pub rsvd: u64,
    /// Pages allocated beyond `total` (`HugePages_Surp`); always 0, as with
    /// Linux's default `nr_overcommit_hugepages = 0`.
    pub surp: u64,
    /// Pages handed out by the pool since the arena was made (Linux's
    /// `HTLB_BUDDY_PGALLOC` counts the buddy side; this counts dequeues).
    pub allocations: u64,
    /// Allocations refused because no unreserved page was free.
    pub alloc_failures: u64,
    /// PMD tables linked into an address space from another one
    /// (`huge_pmd_share` successes).
    pub pmd_shares: u64,
    /// Shared PMD tables unlinked from an address space
    /// (`huge_pmd_unshare` successes).
    pub pmd_unshares: u64,
}

/// The pool's counters and free lists, under `hugetlb_lock`.
#[derive(Debug, Default)]
struct PoolState {
    /// Free huge pages per node, as head frame numbers (popped from the end).
    free_lists: Vec<Vec<Pfn>>,
    free: u64,
    /// Reservations not yet consumed. Transiently negative, as Linux's
    /// `resv_huge_pages` wraps: an owner's `MADV_DONTNEED` of a page a child
    /// still maps gives the reservation back to the owner's map at once but
    /// to this count only when the child frees the page, and the owner may
    /// consume it (or exit, unreserving it) in between. Shown as 0 then.
    rsvd: i64,
}

impl PoolState {
    /// Free pages nobody reserved (Linux's `available_huge_pages`).
    fn available(&self) -> u64 {
        self.free - self.rsvd.clamp(0, self.free as i64) as u64
    }
}

/// The pool of one [`PhysMem`] (Linux's `hstate` for 2 MiB pages).
// No `Debug`: loom's locks (under `cfg(loom)`) have none.
#[derive(Default)]
pub(crate) struct HugePool {
    /// Per node, the frames `[lo, hi)` the pool's pages occupy (empty when
    /// the node has none): `owns` answers from these without the lock.
    ranges: Box<[(Pfn, Pfn)]>,
    total: u64,
    state: Mutex<PoolState>,
    allocations: AtomicU64,
    alloc_failures: AtomicU64,
    pub(crate) pmd_shares: AtomicU64,
    pub(crate) pmd_unshares: AtomicU64,
    /// Linux's `hugetlb_fault_mutex_table` (see `phys/hugetlb/lock.rs`).
    pub(crate) fault_mutexes: super::lock::FaultMutexTable,
    /// hugetlb lock acquisitions by kind ([`crate::HugetlbLockStats`]).
    pub(crate) locks: super::lock::LockCounters,
}

impl HugePool {
    /// Carves `per_node` huge pages out of the top of each node, where node
    /// `n` holds frames `[nodes[n].0, nodes[n].1)`. Returns the pool and, per
    /// node, the end of the frames left for 4 KiB allocation. `EINVAL` when a
    /// node cannot hold its huge pages, aligned, and still keep two small
    /// frames (node 0 keeps the zero page, and every node must be able to
    /// hand out a frame), or when the count overflows.
    pub(crate) fn carve(nodes: &[(Pfn, Pfn)], per_node: u64) -> Result<(HugePool, Vec<Pfn>)> {
        let span = per_node.checked_mul(HPAGE_FRAMES).ok_or(Errno::Inval)?;
        let mut ranges = Vec::with_capacity(nodes.len());
        let mut small_ends = Vec::with_capacity(nodes.len());
        let mut free_lists = Vec::with_capacity(nodes.len());
        for &(first, end) in nodes {
            if per_node == 0 {
                ranges.push((end, end));
                small_ends.push(end);
                free_lists.push(Vec::new());
                continue;
            }
            // The highest aligned blocks below the node's end.
            let hi = end.align_down(HPAGE_FRAMES);
            let lo = Pfn::new(hi.get().checked_sub(span).ok_or(Errno::Inval)?);
            if lo < first + 2 {
                return Err(Errno::Inval);
            }
            ranges.push((lo, hi));
            small_ends.push(lo);
            // Popped from the end: ascending addresses are handed out first.
            free_lists.push((0..per_node).rev().map(|i| lo + i * HPAGE_FRAMES).collect());
        }
        let total = span / HPAGE_FRAMES * nodes.len() as u64;
        let pool = HugePool {
            ranges: ranges.into_boxed_slice(),
            total,
            state: Mutex::new(PoolState { free_lists, free: total, rsvd: 0 }),
            allocations: AtomicU64::new(0),
            alloc_failures: AtomicU64::new(0),
            pmd_shares: AtomicU64::new(0),
            pmd_unshares: AtomicU64::new(0),
            fault_mutexes: Default::default(),
            locks: Default::default(),
        };
        Ok((pool, small_ends))
    }

    /// Frames the pool holds (for the commit limit, which Linux computes
    /// without hugetlb pages: `vm_commit_limit`).
    pub(crate) fn frames(&self) -> u64 {
        self.total * HPAGE_FRAMES
    }

    /// Whether `pfn` is a frame of a pool page of `node`.
    #[inline]
    pub(crate) fn owns(&self, node: usize, pfn: Pfn) -> bool {
        self.ranges.get(node).is_some_and(|&(lo, hi)| lo <= pfn && pfn < hi)
    }

    /// Whether the pool has any page at all (a fast test for `put`).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Linux's `hugetlb_acct_memory(h, delta)` for `delta > 0`: promises
    /// `pages` free pages to a mapping. `ENOMEM` (and nothing reserved) when
    /// fewer unreserved pages are free.
    pub(crate) fn reserve(&self, pages: u64) -> Result<()> {
        if pages == 0 {
            return Ok(());
        }
        let mut st = self.state.lock();
        // gather_surplus_pages with no surplus allowed: `rsvd + pages`
        // must not exceed `free` (a negative `rsvd` is a page owed back).
        if (st.free as i64).saturating_sub(st.rsvd) < pages as i64 {
            return Err(Errno::NoMem);
        }
        st.rsvd += pages as i64;
        Ok(())
    }

    /// Gives back `pages` reservations that will not be consumed
    /// (`hugetlb_acct_memory(h, -delta)`).
    pub(crate) fn unreserve(&self, pages: u64) {
        if pages == 0 {
            return;
        }
        let mut st = self.state.lock();
        st.rsvd -= pages as i64;
        debug_assert!(st.rsvd >= -(self.total as i64), "hugetlb: unreserved {pages} pages too many");
    }

    /// Linux's `dequeue_hugetlb_folio_vma`: takes a free page from the nodes
    /// `at` allows, in its zonelist order (a bound policy's mask only, as
    /// `huge_node` hands the mask to `dequeue_hugetlb_folio_nodemask`; any
    /// node after a preferred one's). With `reserved`, the caller
    /// consumes one of its reservations and may take any free page (there
    /// is one unless the reservation is still owed back by a page a child
    /// maps, see `PoolState::rsvd`); without, only a page nobody reserved
    /// may be taken. `None` when there is none.
    fn dequeue(&self, at: &crate::phys::Placement, reserved: bool) -> Option<Pfn> {
        let mut st = self.state.lock();
        if !reserved && st.available() == 0 {
            drop(st);
            self.alloc_failures.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let nodes = st.free_lists.len();
        let pfn = at.zonelist(nodes).find_map(|n| st.free_lists[n].pop())?;
        st.free -= 1;
        if reserved {
            st.rsvd -= 1;
        }
        debug_assert!(st.rsvd >= -(self.total as i64), "hugetlb: consumed a reservation that was not made");
        drop(st);
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Some(pfn)
    }

    /// Puts a page whose last reference went back on its node's free list;
    /// with `restore_reserve` the page is reserved again at once, under the
    /// same lock, so no unreserved allocation can take it in between
    /// (`free_huge_folio`).
    fn enqueue(&self, node: usize, pfn: Pfn, restore_reserve: bool) {
        let mut st = self.state.lock();
        st.free_lists[node].push(pfn);
        st.free += 1;
        if restore_reserve {
            st.rsvd += 1;
        }
    }

    /// The `/proc/meminfo` counts and the event counters.
    pub(crate) fn stats(&self) -> HugePageStats {
        let st = self.state.lock();
        HugePageStats {
            total: self.total,
            free: st.free,
            rsvd: st.rsvd.max(0) as u64,
            surp: 0,
            allocations: self.allocations.load(Ordering::Relaxed),
            alloc_failures: self.alloc_failures.load(Ordering::Relaxed),
            pmd_shares: self.pmd_shares.load(Ordering::Relaxed),
            pmd_unshares: self.pmd_unshares.load(Ordering::Relaxed),
        }
    }
}

impl PhysMem {
    /// The huge page pool's counts, as `/proc/meminfo`'s `HugePages_*`
    /// lines show them (see [`crate::PhysConfig::hugepages`]).
    pub fn huge_page_stats(&self) -> HugePageStats {
        self.hugetlb.stats()
    }

    /// hugetlb lock acquisitions by kind since the arena was made (seed
    /// 000's locking schemes, [`crate::HugetlbPolicy`]).
    pub fn hugetlb_lock_stats(&self) -> super::lock::HugetlbLockStats {
        self.hugetlb.locks.snapshot()
    }

    /// Allocates a zero-filled huge page where `at` allows (Linux's
    /// `alloc_hugetlb_folio` + `folio_zero_user`; no surplus pages, so a
    /// bound policy whose nodes have none free gets none): the returned reference,
    /// on its head frame, is its only one. With `reserved` the caller
    /// consumes a reservation it holds, which finds a page unless the
    /// reservation is still owed back (see `HugePool::dequeue`); without,
    /// `None` when every free page is reserved or the pool is empty.
    pub(crate) fn alloc_huge(&self, at: &crate::phys::Placement, reserved: bool) -> Option<FrameRef<'_>> {
        let pfn = self.hugetlb.dequeue(at, reserved)?;
        // `frame_ptr` checks the last frame is inside the arena; the pool's
        // pages are contiguous frames of it.
        let _ = self.frame_ptr(pfn + (HPAGE_FRAMES - 1));
        // The pool is part of the physical allocator, whose clear of a free
        // page is a `memset`.
        // SAFETY: the page's 512 frames are contiguous arena memory (checked
        // above) that nothing else maps or references: the page was free.
        unsafe { std::ptr::write_bytes(self.frame_ptr(pfn), 0, super::HPAGE_SIZE as usize) };
        let d = self.desc(pfn);
        d.flags.store(0, Ordering::Relaxed);
        d.mapping.store(0, Ordering::Relaxed);
        d.index.store(0, Ordering::Relaxed);
        d.refcount.store(1, Ordering::Release);
        Some(FrameRef::from_raw(self, pfn))
    }

    /// Whether `pfn` is a frame of a huge page (a test of two bounds, and
    /// none at all without a pool).
    #[inline]
    pub(crate) fn is_huge(&self, pfn: Pfn) -> bool {
        !self.hugetlb.is_empty() && self.hugetlb.owns(self.node_of(pfn), pfn)
    }

    /// The frame holding the reference count of `pfn`'s page (Linux's
    /// `compound_head`): the head of its huge page, or `pfn` itself. A
    /// reference taken through any 4 KiB of a huge page (a slice of guest
    /// memory) counts on the page.
    #[inline]
    pub(crate) fn compound_head(&self, pfn: Pfn) -> Pfn {
        if self.is_huge(pfn) {
            pfn.align_down(HPAGE_FRAMES)
        } else {
            pfn
        }
    }

    /// Called by `put` when the last reference of a pool page of `node` went.
    pub(crate) fn free_huge(&self, node: usize, pfn: Pfn) {
        debug_assert!(pfn.is_aligned(HPAGE_FRAMES), "huge page {pfn} freed through a tail frame");
        debug_assert_eq!(self.desc(pfn).mapcount.load(Ordering::Relaxed), 0, "huge page {pfn} freed while mapped");
        let restore = self.desc(pfn).flags.load(Ordering::Relaxed) & PG_HUGETLB_RESTORE_RESERVE != 0;
        self.hugetlb.enqueue(node, pfn, restore);
    }
}

/// One node's share of the huge page pool (Linux's per-node
/// `nr_hugepages` and `free_hugepages` under
/// `/sys/devices/system/node/nodeN/hugepages/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HugePageNodeStats {
    /// Huge pages carved out of this node.
    pub total: u64,
    /// Of those, the ones on the node's free list (reserved ones included).
    pub free: u64,
}

impl HugePool {
    /// `dequeue_hugetlb_folio_nodemask` for a migration target
    /// (`alloc_hugetlb_folio_nodemask` with `__GFP_THISNODE`): a free page
    /// of `node` only, and only while an unreserved page is free
    /// (`available_huge_pages`), so a migration never takes a page promised
    /// to a mapping. `None` (counted as an allocation failure) otherwise.
    fn dequeue_on_node(&self, node: usize) -> Option<Pfn> {
        let mut st = self.state.lock();
        let pfn = if st.available() > 0 { st.free_lists.get_mut(node).and_then(Vec::pop) } else { None };
        let Some(pfn) = pfn else {
            drop(st);
            self.alloc_failures.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        st.free -= 1;
        drop(st);
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Some(pfn)
    }

    /// Per node: pages carved out and pages free.
    fn node_stats(&self) -> Vec<HugePageNodeStats> {
        let st = self.state.lock();
        self.ranges
            .iter()
            .zip(&st.free_lists)
            .map(|(&(lo, hi), free)| HugePageNodeStats { total: (hi - lo) / HPAGE_FRAMES, free: free.len() as u64 })
            .collect()
    }
}

impl PhysMem {
    /// The huge page pool per node, in node order; the totals sum to
    /// [`HugePageStats::total`] and the free counts to
    /// [`HugePageStats::free`].
    pub fn huge_page_node_stats(&self) -> Vec<HugePageNodeStats> {
        self.hugetlb.node_stats()
    }

    /// A huge page of `node` for a migration to copy into (see
    /// `HugePool::dequeue_on_node`): not zeroed, as the copy overwrites all
    /// of it; its one reference is the caller's.
    pub(crate) fn alloc_huge_on(&self, node: usize) -> Option<FrameRef<'_>> {
        let pfn = self.hugetlb.dequeue_on_node(node)?;
        // As `alloc_huge`: the page's last frame is inside the arena.
        let _ = self.frame_ptr(pfn + (HPAGE_FRAMES - 1));
        let d = self.desc(pfn);
        d.flags.store(0, Ordering::Relaxed);
        d.mapping.store(0, Ordering::Relaxed);
        d.index.store(0, Ordering::Relaxed);
        d.refcount.store(1, Ordering::Release);
        Some(FrameRef::from_raw(self, pfn))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phys::{PhysConfig, Placement};
    use crate::PAGE_SIZE;

    /// [`HugePool::carve`] over frame numbers written as integers.
    fn carve(nodes: &[(u64, u64)], per_node: u64) -> Result<(HugePool, Vec<u64>)> {
        let nodes: Vec<_> = nodes.iter().map(|&(first, end)| (Pfn::new(first), Pfn::new(end))).collect();
        HugePool::carve(&nodes, per_node).map(|(pool, ends)| (pool, ends.into_iter().map(Pfn::get).collect()))
    }

    fn arena(nodes: usize, huge: u64) -> std::sync::Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(nodes as u64 * (8 << 20)).nodes(nodes).hugepages(huge)).unwrap()
    }

    #[test]
    fn carving_takes_aligned_blocks_from_every_node() {
        let (pool, ends) = carve(&[(0, 2000), (2000, 4000)], 2).unwrap();
        assert_eq!(pool.total, 4);
        // Node 0: highest aligned end 1536, two pages [512, 1536); node 1: end
        // 4000 → 3584, two pages [2560, 3584).
        assert_eq!(
            pool.ranges.iter().map(|&(lo, hi)| (lo.get(), hi.get())).collect::<Vec<_>>(),
            [(512, 1536), (2560, 3584)]
        );
        assert_eq!(ends, vec![512, 2560]);
        let p = Pfn::new;
        assert!(pool.owns(1, p(2560)) && !pool.owns(1, p(2559)) && !pool.owns(0, p(2560)));
    }

    #[test]
    fn a_node_too_small_for_its_pages_is_einval() {
        assert_eq!(carve(&[(0, 1024)], 2).err(), Some(Errno::Inval));
        // The aligned block below 513 is [0, 512): no frame left for node 0.
        assert_eq!(carve(&[(0, 513)], 1).err(), Some(Errno::Inval));
        assert!(carve(&[(0, 1024)], 1).is_ok());
        assert_eq!(carve(&[(0, 1 << 20)], u64::MAX / 2).err(), Some(Errno::Inval));
        assert_eq!(
            PhysMem::new(PhysConfig::new(2 << 20).hugepages(1)).err(),
            Some(Errno::Inval),
            "a 2 MiB arena cannot hold an aligned huge page and two frames"
        );
    }

    #[test]
    fn reservations_guarantee_pages_and_unreserved_allocations_respect_them() {
        let phys = arena(1, 3);
        let s = phys.huge_page_stats();
        assert_eq!((s.total, s.free, s.rsvd, s.surp), (3, 3, 0, 0));
        phys.hugetlb.reserve(2).unwrap();
        assert_eq!(phys.hugetlb.reserve(2), Err(Errno::NoMem), "only one page is unreserved");
        let a = phys.alloc_huge(&Placement::new(0, None), false).expect("one unreserved page");
        assert!(phys.alloc_huge(&Placement::new(0, None), false).is_none(), "the other two are reserved");
        let b = phys.alloc_huge(&Placement::new(0, None), true).unwrap();
        let s = phys.huge_page_stats();
        assert_eq!((s.free, s.rsvd, s.allocations, s.alloc_failures), (1, 1, 2, 1));
        assert!(a.pfn().is_aligned(HPAGE_FRAMES));
        assert_ne!(a.pfn(), b.pfn());
        drop(a);
        drop(b);
        phys.hugetlb.unreserve(1);
        let s = phys.huge_page_stats();
        assert_eq!((s.free, s.rsvd), (3, 0));
        assert_eq!(phys.stats().frames_used, 0, "huge pages are not 4 KiB frames");
    }

    #[test]
    #[cfg_attr(miri, ignore = "writes and reads 2 MiB, then allocates every frame: minutes under Miri")]
    fn pages_are_zeroed_and_never_handed_out_as_small_frames() {
        let phys = arena(2, 1);
        let p = phys.alloc_huge(&Placement::new(1, None), false).unwrap();
        assert_eq!(phys.node_of(p.pfn()), 1, "the preferred node first");
        // Dirty every frame, free, take it again: zero.
        phys.fill(p.pfn(), 0, 0xa5, crate::phys::hugetlb::HPAGE_SIZE as usize);
        let pfn = p.pfn();
        drop(p);
        let q = phys.alloc_huge(&Placement::new(1, None), false).unwrap();
        assert_eq!(q.pfn(), pfn);
        for f in q.pfn().range(q.pfn() + HPAGE_FRAMES) {
            let mut b = [0xffu8; PAGE_SIZE as usize];
            phys.read(f, 0, &mut b);
            assert!(b.iter().all(|&x| x == 0), "frame {f} not zeroed");
        }
        // Every 4 KiB frame of both nodes: none inside the pool.
        let mut small = Vec::new();
        while let Some(f) = phys.alloc(0) {
            assert!(!phys.hugetlb.owns(phys.node_of(f.pfn()), f.pfn()), "pool frame {} handed out", f.pfn());
            small.push(f);
        }
        assert!(!small.is_empty());
        drop(small);
        drop(q);
        let other = phys.alloc_huge(&Placement::new(0, None), false).unwrap();
        assert_eq!(phys.node_of(other.pfn()), 0);
        drop(other);
        let s = phys.huge_page_stats();
        assert_eq!((s.total, s.free), (2, 2));
    }

    #[test]
    fn the_commit_limit_leaves_the_pool_out() {
        let plain = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
        let pooled = PhysMem::new(PhysConfig::new(8 << 20).hugepages(2)).unwrap();
        let (a, b) = (plain.overcommit().commit_limit(), pooled.overcommit().commit_limit());
        assert!(a > b, "{a} vs {b}");
    }
}
