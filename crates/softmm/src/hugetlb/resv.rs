//! Reservations (Linux's `resv_map`, `hugetlb_reserve_pages`,
//! `hugetlb_unreserve_pages`, `hugetlb_vm_op_close`): a mapping promised
//! huge pages at `mmap` gets them at fault time even when others have
//! emptied the pool since.
//!
//! Two kinds, as in Linux:
//!
//! - [`HugetlbInode`], per hugetlb file, for shared mappings: the huge page
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
//! of them exist) or, for a file, a page.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::error::Result;
use crate::phys::PhysMem;
use crate::sync::Mutex;

/// A hugetlb file's inode state: its reserve map (the inode's `resv_map`)
/// and its reverse map by VMA with its `i_mmap` lock. (Its faults serialize
/// on the pool's fault mutex table, `hugetlb/lock.rs`.)
// No `Debug`: loom's locks (under `cfg(loom)`) have none.
#[derive(Default)]
pub(crate) struct HugetlbInode {
    /// Indices reserved or instantiated (Linux's `file_region` list).
    regions: Mutex<BTreeSet<u64>>,
    /// The VMAs mapping the file (Linux's `i_mmap` interval tree).
    pub(crate) vmas: super::rmap::VmaIntervalTree,
}

impl HugetlbInode {
    /// `hugetlb_reserve_pages` for a shared mapping of indices `[from, to)`:
    /// reserves the indices not yet covered. `ENOMEM`, with nothing
    /// reserved, when the pool cannot promise them.
    pub(crate) fn reserve(&self, phys: &PhysMem, from: u64, to: u64) -> Result<()> {
        let mut regions = self.regions.lock();
        let missing: Vec<u64> = (from..to).filter(|i| !regions.contains(i)).collect();
        phys.hugetlb.reserve(missing.len() as u64)?;
        regions.extend(missing);
        Ok(())
    }

    /// `hugetlb_unreserve_pages(inode, from, to, freed)`: forgets the
    /// indices of `[from, to)`, of which `freed` held pages (their
    /// reservations were consumed when the pages were allocated), and gives
    /// the rest back to the pool.
    pub(crate) fn unreserve(&self, phys: &PhysMem, from: u64, to: u64, freed: u64) {
        let mut regions = self.regions.lock();
        let gone: Vec<u64> = regions.range(from..to).copied().collect();
        for i in &gone {
            regions.remove(i);
        }
        let chg = gone.len() as u64;
        debug_assert!(chg >= freed, "hugetlb: {freed} pages freed from {chg} regions");
        phys.hugetlb.unreserve(chg.saturating_sub(freed));
    }

    /// Records index `i` as instantiated without a reservation
    /// (`vma_commit_reservation`'s `region_add` for a `MAP_NORESERVE`
    /// fault), so removing its page later gives back nothing.
    pub(crate) fn add(&self, i: u64) {
        self.regions.lock().insert(i);
    }

    /// The indices of `[from, to)` reserved or instantiated.
    pub(crate) fn indices(&self, from: u64, to: u64) -> Vec<u64> {
        self.regions.lock().range(from..to).copied().collect()
    }

    /// Whether index `i` is reserved or instantiated (`region_chg == 0`).
    pub(crate) fn covers(&self, i: u64) -> bool {
        self.regions.lock().contains(&i)
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
}

impl PrivateResv {
    /// `hugetlb_reserve_pages` for a private mapping of indices `[from,
    /// to)`: the whole range, even if read-only (`mprotect` could make it
    /// writable). `ENOMEM`, with nothing reserved, when the pool cannot
    /// promise it.
    pub(crate) fn new(phys: &Arc<PhysMem>, from: u64, to: u64) -> Result<Arc<PrivateResv>> {
        phys.hugetlb.reserve(to - from)?;
        Ok(Arc::new(PrivateResv { phys: phys.clone(), unused: Mutex::new((from..to).collect()) }))
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
        let f = HugetlbInode::default();
        f.reserve(&phys, 0, 2).unwrap();
        f.reserve(&phys, 1, 3).unwrap();
        assert_eq!(phys.huge_page_stats().rsvd, 3, "index 1 is not reserved twice");
        assert_eq!(f.reserve(&phys, 3, 5), Err(Errno::NoMem));
        assert_eq!(phys.huge_page_stats().rsvd, 3, "a refused reservation leaves nothing");
        assert!(f.covers(2) && !f.covers(3));
        f.unreserve(&phys, 0, u64::MAX, 0);
        assert_eq!(phys.huge_page_stats().rsvd, 0);
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
