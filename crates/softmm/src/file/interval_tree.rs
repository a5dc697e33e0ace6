//! The reverse map of a hugetlb file by VMA (Linux's `mapping->i_mmap`, a
//! `vma_interval_tree`): which VMAs of which address spaces map which file
//! pages. `huge_pmd_share` will look up here the VMAs that map one file
//! index (seed 000's next step); today the address spaces keep it exact and
//! the leak checks count its entries.
//!
//! An interval map keyed by each VMA's first file page: a query for index
//! `i` scans the entries starting at or below `i` and keeps those ending
//! above it, as a stabbing query on an interval tree does (the entries of
//! one file are few: one per VMA that maps it).

use std::collections::BTreeMap;
use std::sync::Weak;

use super::Mapper;
use crate::phys::hugetlb::lock::{IMmapLock, Kind};
use crate::phys::PhysMem;
use crate::sync::{Mutex, RwLockReadGuard, RwLockWriteGuard};

/// One VMA in the reverse map: its address space, its range, and the file
/// page (in 4 KiB units, `vm_pgoff`) mapped at its start.
#[derive(Clone)]
pub(crate) struct RmapVma {
    pub(crate) mm: Weak<dyn Mapper>,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) pgoff: u64,
}

impl RmapVma {
    /// One past the last file page the VMA maps.
    fn last(&self) -> u64 {
        self.pgoff + ((self.end - self.start) >> crate::PAGE_SHIFT)
    }
}

impl std::fmt::Debug for RmapVma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RmapVma({:#x}-{:#x} pgoff {:#x})", self.start, self.end, self.pgoff)
    }
}

/// Key: (first file page, the address space's identity, VMA start).
type Key = (u64, usize, u64);

/// The VMAs mapping one hugetlb file, under the file's `i_mmap` lock
/// (`phys/hugetlb/lock.rs`): changes hold it for write, lookups for read.
// No `Debug`: loom's locks (under `cfg(loom)`) have none.
#[derive(Default)]
pub(crate) struct VmaIntervalTree {
    /// The file's `i_mmap` lock.
    pub(crate) i_mmap: IMmapLock,
    /// The entries; its own mutex only makes the map `Sync` (every access
    /// already holds `i_mmap`, for write to change it).
    map: Mutex<BTreeMap<Key, RmapVma>>,
}

/// An address space's identity in the map: its address, without the vtable.
pub(crate) fn mm_id(mm: &Weak<dyn Mapper>) -> usize {
    mm.as_ptr().cast::<()>().addr()
}

impl VmaIntervalTree {
    /// `vma_interval_tree_insert`: counted in [`PhysMem::stats`]'s
    /// reverse-map entries until removed.
    pub(crate) fn insert(&self, phys: &PhysMem, v: RmapVma) {
        let key = (v.pgoff, mm_id(&v.mm), v.start);
        let _i_mmap = phys.hugetlb.locks.write(Kind::IMmapWrite, &self.i_mmap);
        if self.map.lock().insert(key, v).is_none() {
            phys.account_rmap(1);
        }
    }

    /// `vma_interval_tree_remove` of the VMA of `mm` at `start` mapping
    /// from file page `pgoff`.
    pub(crate) fn remove(&self, phys: &PhysMem, mm: usize, start: u64, pgoff: u64) {
        let _i_mmap = phys.hugetlb.locks.write(Kind::IMmapWrite, &self.i_mmap);
        if self.map.lock().remove(&(pgoff, mm, start)).is_some() {
            phys.account_rmap(-1);
        }
    }

    /// `vma_interval_tree_foreach(vma, i_mmap, idx, idx)`: the VMAs that map
    /// file page `idx`, for `huge_pmd_share`, whose caller holds `i_mmap`
    /// for read (`_i_mmap`), so no VMA is linked or unlinked meanwhile.
    pub(crate) fn covering(&self, _i_mmap: &RwLockReadGuard<'_, ()>, idx: u64) -> Vec<RmapVma> {
        self.covering_unchecked(idx)
    }

    /// [`Self::covering`] for a caller holding `i_mmap` for write
    /// (`unmap_ref_private`).
    pub(crate) fn covering_locked(&self, _i_mmap: &RwLockWriteGuard<'_, ()>, idx: u64) -> Vec<RmapVma> {
        self.covering_unchecked(idx)
    }

    fn covering_unchecked(&self, idx: u64) -> Vec<RmapVma> {
        let map = self.map.lock();
        map.range(..=(idx, usize::MAX, u64::MAX)).map(|(_, v)| v).filter(|v| v.last() > idx).cloned().collect()
    }

    /// Entries left (for the file's drop accounting).
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::uapi::*;
    use crate::{AddressSpace, File, MmConfig, OpenFile, PhysConfig, PhysMem};

    const HP: u64 = 2 << 20;

    /// (start, pgoff) of the VMAs covering file page `idx`, in key order.
    fn covering(f: &File, idx: u64) -> Vec<(u64, u64)> {
        let vmas = &f.inode().hugetlb.as_ref().unwrap().vmas;
        vmas.covering(&vmas.i_mmap.read(), idx).iter().map(|v| (v.start, v.pgoff)).collect()
    }

    #[test]
    fn the_reverse_map_names_each_vma_and_follows_splits_moves_forks_and_exits() {
        let phys = PhysMem::new(PhysConfig::new(32 << 20).hugepages(4)).unwrap();
        let f = File::create_hugetlbfs(&phys, "/f", 4 * HP).unwrap();
        let open = OpenFile::read_write(&f);
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let flags = MAP_SHARED | MAP_NORESERVE;
        let a = mm.mmap(0, 4 * HP, PROT_READ | PROT_WRITE, flags, Some(&open), 0).unwrap();
        let b = mm.mmap(0, 2 * HP, PROT_READ, flags, Some(&open), 2 * HP).unwrap();
        assert_eq!(covering(&f, 0), vec![(a, 0)]);
        assert_eq!(covering(&f, 3 * 512), vec![(a, 0), (b, 1024)]);
        // A split: two VMAs, each with its own offset.
        mm.mprotect(a + HP, HP, PROT_READ).unwrap();
        assert_eq!(covering(&f, 512), vec![(a + HP, 512)]);
        assert_eq!(covering(&f, 0), vec![(a, 0)]);
        // A fork adds the child's VMAs, an exit removes them.
        let child = mm.fork().unwrap();
        assert_eq!(covering(&f, 2 * 512).len(), 4);
        drop(child);
        assert_eq!(covering(&f, 2 * 512).len(), 2);
        // A move renames the VMA; a munmap removes it.
        let far = 0x6000_0000_0000;
        mm.mremap(b, 2 * HP, 2 * HP, MREMAP_MAYMOVE | MREMAP_FIXED, far).unwrap();
        assert!(covering(&f, 2 * 512).contains(&(far, 1024)));
        mm.munmap(far, 2 * HP).unwrap();
        assert_eq!(covering(&f, 3 * 512 - 1), vec![(a + 2 * HP, 1024)]);
        assert!(covering(&f, 4 * 512).is_empty());
        drop(mm);
        assert_eq!(f.inode().hugetlb.as_ref().unwrap().vmas.len(), 0);
        drop((open, f));
        assert_eq!(phys.quiesce().rmap_entries, 0);
    }
}
