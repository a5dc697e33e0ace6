//! Reservations (Linux's `resv_map`, `hugetlb_reserve_pages`,
//! `hugetlb_unreserve_pages`, `hugetlb_vm_op_close`): a mapping promised
//! huge pages at `mmap` gets them at fault time even when others have
//! emptied the pool since.
//!
//! Two kinds, as in Linux:
//!
//! - [`Regions`], in each hugetlb file's inode (`file/hugetlbfs.rs`'s
//!   `HugetlbInode`), for shared mappings: the huge page
//!   indices that are reserved or instantiated, so a second mapping of the
//!   same range reserves nothing more. Released when pages leave the file
//!   (truncate, hole punch) or the file dies.
//! - [`PrivateResv`], per private mapping (its owner, `HPAGE_RESV_OWNER`),
//!   shared by the VMAs split from it: the indices whose reservation is still
//!   unused. A fault consumes one; closing (unmapping) part of the mapping
//!   gives that part's unused ones back. A forked child gets none.
//!
//! Both are sets of huge page indices, bounded by the pool's size: an index
//! is in a set only while it holds a reservation (at most `HugePages_Total`
//! of them exist) or, for a file, a page. A file's set is kept as disjoint
//! ranges ([`Regions`], Linux's `file_region` list), so that mapping a file
//! whose pages are all there costs one lookup, not one per huge page (the
//! lab's 1 GiB map of 512 pages paid 512 set lookups per `mmap`, the larger
//! part of a fork loop's time).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::Result;
use crate::phys::PhysMem;
use crate::sync::{Mutex, RwLock};

/// A set of huge page indices as disjoint, non-adjacent ranges `[start,
/// end)`, keyed by start: Linux's `file_region` list, as a B-tree.
#[derive(Default, Debug)]
pub(crate) struct Regions(BTreeMap<u64, u64>);

impl Regions {
    /// The parts of `[from, to)` in the set, in order.
    pub(crate) fn iter(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        // The range starting at or below `from` may reach into it.
        let first = self.0.range(..=from).next_back().map_or(from, |(&s, _)| s);
        self.0.range(first..to).filter_map(move |(&s, &e)| {
            let (s, e) = (s.max(from), e.min(to));
            (s < e).then_some((s, e))
        })
    }

    /// How many indices of `[from, to)` are in the set.
    pub(crate) fn count(&self, from: u64, to: u64) -> u64 {
        self.iter(from, to).map(|(s, e)| e - s).sum()
    }

    /// Adds `[from, to)`, merging it with the ranges it overlaps or
    /// touches.
    pub(crate) fn insert(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        let (mut start, mut end) = (from, to);
        // Every range that overlaps or touches `[from, to]` joins it.
        let first = self.0.range(..=from).next_back().filter(|(_, &e)| e >= from).map_or(from, |(&s, _)| s);
        let joined: Vec<(u64, u64)> = self.0.range(first..=to).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in joined {
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    /// Removes `[from, to)`, splitting the ranges it cuts; returns how many
    /// indices were in the set.
    pub(crate) fn remove(&mut self, from: u64, to: u64) -> u64 {
        if from >= to {
            return 0;
        }
        let first = self.0.range(..=from).next_back().map_or(from, |(&s, _)| s);
        let cut: Vec<(u64, u64)> = self.0.range(first..to).map(|(&s, &e)| (s, e)).filter(|&(_, e)| e > from).collect();
        let mut removed = 0;
        for (s, e) in cut {
            self.0.remove(&s);
            removed += e.min(to) - s.max(from);
            if s < from {
                self.0.insert(s, from);
            }
            if e > to {
                self.0.insert(to, e);
            }
        }
        removed
    }
}

/// The reserve map of a private hugetlb mapping, shared by the VMAs split
/// from it (Linux's `resv_map` with `HPAGE_RESV_OWNER`). Dropping the last
/// reference gives back whatever is still reserved, so an error path or an
/// address space that dies cannot leak a reservation.
pub(crate) struct PrivateResv {
    phys: Arc<PhysMem>,
    /// Indices whose reservation is still unused.
    unused: Mutex<BTreeSet<u64>>,
    /// The owner's hugetlb VMA lock (`resv_map->rw_sema`, which Linux's
    /// `hugetlb_vma_lock_read`/`_write` take for a private owner's VMA): a
    /// fault holds it for read; a zap holds it for write from before it
    /// restores the reservations of the pages it clears until those pages
    /// are freed (`__hugetlb_zap_begin` to `__hugetlb_zap_end`), so that no
    /// fault maps a page between the restore's look and the clearing (the
    /// page would go back to the pool with no reservation), and no fault
    /// finds the reservation back in the map while the pool does not have
    /// the page yet.
    pub(crate) vma_lock: RwLock<()>,
}

impl PrivateResv {
    /// `hugetlb_reserve_pages` for a private mapping of indices `[from,
    /// to)`: the whole range, even if read-only (`mprotect` could make it
    /// writable). `ENOMEM`, with nothing reserved, when the pool cannot
    /// promise it.
    pub(crate) fn new(phys: &Arc<PhysMem>, from: u64, to: u64) -> Result<Arc<PrivateResv>> {
        phys.hugetlb.reserve(to - from)?;
        Ok(Arc::new(PrivateResv {
            phys: phys.clone(),
            unused: Mutex::new((from..to).collect()),
            vma_lock: RwLock::new(()),
        }))
    }

    /// `hugetlb_vm_op_close` for the part `[from, to)` of the mapping: its
    /// unused reservations go back to the pool.
    pub(crate) fn close(&self, from: u64, to: u64) {
        let mut unused = self.unused.lock();
        let gone: Vec<u64> = unused.range(from..to).copied().collect();
        for i in &gone {
            unused.remove(i);
        }
        drop(unused);
        self.phys.hugetlb.unreserve(gone.len() as u64);
    }

    /// Consumes the reservation of index `i` if it is still unused
    /// (`vma_needs_reservation` + `vma_commit_reservation` for the owner).
    pub(crate) fn take(&self, i: u64) -> bool {
        self.unused.lock().remove(&i)
    }

    /// Marks index `i`'s reservation unused again, for a page whose
    /// freeing restores it to the pool (`vma_add_reservation` after
    /// `folio_set_hugetlb_restore_reserve`). `false` if it was unused.
    pub(crate) fn restore(&self, i: u64) -> bool {
        self.unused.lock().insert(i)
    }

    /// Reservations still unused.
    pub(crate) fn unused(&self) -> u64 {
        self.unused.lock().len() as u64
    }
}

impl std::fmt::Debug for PrivateResv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateResv({} unused)", self.unused())
    }
}

impl Drop for PrivateResv {
    fn drop(&mut self) {
        let left = self.unused.get_mut().len() as u64;
        self.phys.hugetlb.unreserve(left);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::error::Errno;
    use crate::phys::PhysConfig;

    fn pool(pages: u64) -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(16 << 20).hugepages(pages)).unwrap()
    }

    #[test]
    fn a_file_reserves_each_index_once() {
        let phys = pool(4);
        let f = crate::file::HugetlbInode::default();
        f.reserve(&phys, 0, 2).unwrap();
        f.reserve(&phys, 1, 3).unwrap();
        assert_eq!(phys.huge_page_stats().rsvd, 3, "index 1 is not reserved twice");
        assert_eq!(f.reserve(&phys, 3, 5), Err(Errno::NoMem));
        assert_eq!(phys.huge_page_stats().rsvd, 3, "a refused reservation leaves nothing");
        assert!(f.covers(2) && !f.covers(3));
        f.unreserve(&phys, 0, u64::MAX, 0);
        assert_eq!(phys.huge_page_stats().rsvd, 0);
    }

    /// The ranges behave as the set of indices they stand for, under
    /// random inserts and removals (checked against a `BTreeSet`).
    #[test]
    fn regions_are_the_set_of_their_indices() {
        let mut r = Regions::default();
        let mut set = BTreeSet::new();
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        // Under Miri, fewer rounds: 2,000 take minutes there, and the
        // module has no unsafe code, so Miri checks std's BTreeMap here,
        // which 50 rounds of inserts, removals and merges already drive.
        for _ in 0..if cfg!(miri) { 50 } else { 2000 } {
            let from = next(64);
            let to = from + next(12);
            if next(2) == 0 {
                r.insert(from, to);
                set.extend(from..to);
            } else {
                let had = set.range(from..to).count() as u64;
                assert_eq!(r.remove(from, to), had, "remove [{from}, {to})");
                set.retain(|i| !(from..to).contains(i));
            }
            let a = next(70);
            let b = a + next(20);
            assert_eq!(r.count(a, b), set.range(a..b).count() as u64, "count [{a}, {b}) of {r:?}");
            let listed: Vec<u64> = r.iter(0, u64::MAX).flat_map(|(s, e)| s..e).collect();
            assert_eq!(listed, set.iter().copied().collect::<Vec<_>>());
            // Disjoint and merged: no two ranges touch.
            assert!(r.0.iter().zip(r.0.iter().skip(1)).all(|((_, &e), (&s, _))| e < s), "{r:?}");
        }
    }

    #[test]
    fn a_private_map_gives_back_what_each_closed_part_did_not_use() {
        let phys = pool(4);
        let r = PrivateResv::new(&phys, 0, 4).unwrap();
        assert_eq!(PrivateResv::new(&phys, 0, 1).err(), Some(Errno::NoMem));
        r.close(0, 1);
        assert_eq!(phys.huge_page_stats().rsvd, 3);
        r.close(0, 1);
        assert_eq!(phys.huge_page_stats().rsvd, 3, "closing twice gives back nothing more");
        assert_eq!(r.unused(), 3);
        drop(r);
        assert_eq!(phys.huge_page_stats().rsvd, 0, "the last reference gives back the rest");
    }
}
