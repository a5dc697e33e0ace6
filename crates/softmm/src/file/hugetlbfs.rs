//! Files of huge pages (hugetlbfs, seed 000): the page cache holds 2 MiB
//! pages by huge page index, sizes are huge-page aligned where Linux
//! requires it, `write` does not exist, and removing pages gives their
//! reservations back (`fs/hugetlbfs/inode.c`).
//!
//! Unlike a tmpfs fault, a hugetlb fault does not take `invalidate_lock`:
//! as in Linux, the fault mutex of the page (`phys/hugetlb/lock.rs`) orders it
//! against truncate and hole punch, which remove each page under it and
//! zap again a page found mapped behind their first zap
//! (`remove_huge_pages`).

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::phys::hugetlb::resv::Regions;
use crate::phys::hugetlb::{HPAGE_SHIFT, HPAGE_SIZE};
use crate::phys::{FrameRef, PhysMem};
use crate::sync::Mutex;
use crate::uapi::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE};
use crate::PAGE_SHIFT;

use super::{File, Inode, MAX_FILE_SIZE};

/// `FALLOC_FL_MODE_MASK` (6.12): the mutually exclusive modes.
const FALLOC_FL_MODE_MASK: i32 = 0x02 | 0x08 | 0x10 | 0x20 | 0x40;
/// `FALLOC_FL_COLLAPSE_RANGE` and `FALLOC_FL_INSERT_RANGE`.
const FALLOC_FL_COLLAPSE_OR_INSERT: [i32; 2] = [0x08, 0x20];

/// A hugetlb file's inode state: its reserve map (the inode's `resv_map`)
/// and its reverse map by VMA with its `i_mmap` lock. (Its faults serialize
/// on the pool's fault mutex table, `phys/hugetlb/lock.rs`.) Linux's
/// `hugetlbfs_inode_info`.
// No `Debug`: loom's locks (under `cfg(loom)`) have none.
#[derive(Default)]
pub(crate) struct HugetlbInode {
    /// Indices reserved or instantiated (Linux's `file_region` list).
    regions: Mutex<Regions>,
    /// The VMAs mapping the file (Linux's `i_mmap` interval tree).
    pub(crate) vmas: super::interval_tree::VmaIntervalTree,
}

impl HugetlbInode {
    /// `hugetlb_reserve_pages` for a shared mapping of indices `[from, to)`:
    /// reserves the indices not yet covered. `ENOMEM`, with nothing
    /// reserved, when the pool cannot promise them.
    pub(crate) fn reserve(&self, phys: &PhysMem, from: u64, to: u64) -> Result<()> {
        let mut regions = self.regions.lock();
        // region_chg, then region_add once the pool promised the pages.
        let missing = (to.saturating_sub(from)) - regions.count(from, to);
        if missing > 0 {
            phys.hugetlb.reserve(missing)?;
            regions.insert(from, to);
        }
        Ok(())
    }

    /// `hugetlb_unreserve_pages(inode, from, to, freed)`: forgets the
    /// indices of `[from, to)`, of which `freed` held pages (their
    /// reservations were consumed when the pages were allocated), and gives
    /// the rest back to the pool.
    pub(crate) fn unreserve(&self, phys: &PhysMem, from: u64, to: u64, freed: u64) {
        let chg = self.regions.lock().remove(from, to);
        debug_assert!(chg >= freed, "hugetlb: {freed} pages freed from {chg} regions");
        phys.hugetlb.unreserve(chg.saturating_sub(freed));
    }

    /// Records index `i` as instantiated without a reservation
    /// (`vma_commit_reservation`'s `region_add` for a `MAP_NORESERVE`
    /// fault), so removing its page later gives back nothing.
    pub(crate) fn add(&self, i: u64) {
        self.regions.lock().insert(i, i + 1);
    }

    /// The indices of `[from, to)` reserved or instantiated.
    pub(crate) fn indices(&self, from: u64, to: u64) -> Vec<u64> {
        self.regions.lock().iter(from, to).flat_map(|(s, e)| s..e).collect()
    }

    /// Whether index `i` is reserved or instantiated (`region_chg == 0`).
    pub(crate) fn covers(&self, i: u64) -> bool {
        self.regions.lock().count(i, i + 1) == 1
    }
}

impl File {
    /// A file on hugetlbfs of `size` bytes (`open(O_CREAT)` on a hugetlbfs
    /// mount, then `ftruncate(size)`): its pages are 2 MiB pages of the
    /// pool, allocated by faults and [`File::fallocate`], reserved by shared
    /// mappings. `EINVAL` for a size that is not a multiple of 2 MiB or is
    /// negative as an `off_t` (`hugetlbfs_setattr`).
    pub fn create_hugetlbfs(phys: &Arc<PhysMem>, name: &str, size: u64) -> Result<Arc<File>> {
        if size > MAX_FILE_SIZE || size % HPAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        Ok(File::named(Inode::new(phys, name, size, Some(HugetlbInode::default()))))
    }

    /// True for a file of huge pages ([`File::create_hugetlbfs`], or the
    /// file behind an anonymous `MAP_HUGETLB` mapping).
    pub fn is_hugetlbfs(&self) -> bool {
        self.inode().is_hugetlbfs()
    }

    /// `fallocate(mode, offset, len)` with `vfs_fallocate`'s checks in
    /// order: `EINVAL` for a negative offset or a length that is not
    /// positive, `EOPNOTSUPP` for an unknown mode or `PUNCH_HOLE` without
    /// `KEEP_SIZE`, `EFBIG` when `offset + len` passes the largest offset.
    ///
    /// On a hugetlbfs file (`hugetlbfs_fallocate`), only allocation (`0`,
    /// `KEEP_SIZE`) and `PUNCH_HOLE | KEEP_SIZE` exist (else `EOPNOTSUPP`).
    /// Allocation fills the huge pages `[offset rounded down, offset + len
    /// rounded up)` that are missing, zeroed, using the file's reservations
    /// and then unreserved pages, `ENOSPC` when the pool has none (pages
    /// allocated before stay), and grows the size to `offset + len` unless
    /// `KEEP_SIZE`. A hole punch zeroes the partial huge pages at its edges
    /// and removes the whole ones, unmapping them from every mapping,
    /// private copies too, and giving back their reservations. On a tmpfs
    /// file only `PUNCH_HOLE | KEEP_SIZE` is modelled ([`File::punch_hole`]);
    /// other modes are `EOPNOTSUPP`.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.inode().fallocate(mode, offset, len)
    }
}

impl Inode {
    /// [`File::is_hugetlbfs`].
    pub(crate) fn is_hugetlbfs(&self) -> bool {
        self.hugetlb.is_some()
    }

    /// [`File::fallocate`].
    pub(crate) fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        if (offset as i64) < 0 || (len as i64) <= 0 {
            return Err(Errno::Inval);
        }
        if mode & !(FALLOC_FL_MODE_MASK | FALLOC_FL_KEEP_SIZE) != 0 {
            return Err(Errno::OpNotSupp);
        }
        match mode & FALLOC_FL_MODE_MASK {
            0 | 0x10 | 0x40 => {}
            FALLOC_FL_PUNCH_HOLE if mode & FALLOC_FL_KEEP_SIZE == 0 => return Err(Errno::OpNotSupp),
            FALLOC_FL_PUNCH_HOLE => {}
            m if FALLOC_FL_COLLAPSE_OR_INSERT.contains(&m) && mode & FALLOC_FL_KEEP_SIZE != 0 => {
                return Err(Errno::OpNotSupp)
            }
            m if FALLOC_FL_COLLAPSE_OR_INSERT.contains(&m) => {}
            _ => return Err(Errno::OpNotSupp),
        }
        let end = (offset as i64).checked_add(len as i64).ok_or(Errno::FBig)? as u64;
        let Some(resv) = &self.hugetlb else {
            if mode == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE {
                return self.punch_hole(offset, len);
            }
            return Err(Errno::OpNotSupp);
        };
        if mode & !(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE) != 0 {
            return Err(Errno::OpNotSupp);
        }
        let _q = crate::tlb::QuiescentGuard::enter();
        if mode & FALLOC_FL_PUNCH_HOLE != 0 {
            self.hugetlbfs_punch_hole(offset, end);
            return Ok(());
        }
        // Held for read, as a fault: no truncate in between.
        let _inval = self.invalidate_lock.read();
        let (start, stop) = (offset >> HPAGE_SHIFT, end.div_ceil(HPAGE_SIZE));
        let mut res = Ok(());
        let hugetlb = &self.phys.hugetlb;
        for index in start..stop {
            let _fault_mutex = hugetlb.fault_mutexes.lock(&hugetlb.locks, self.id(), index);
            if self.inner.lock().pages.contains_key(&index) {
                continue;
            }
            // The pseudo-VMA is shared: the file's reservation if it has
            // one for the index, else an unreserved page.
            let reserved = resv.covers(index);
            let Some(page) = self.phys.alloc_huge(&crate::phys::Placement::LOCAL, reserved) else {
                res = Err(Errno::NoSpc);
                break;
            };
            if !reserved {
                resv.add(index);
            }
            let added = self.add_huge_page(index, &page);
            debug_assert!(added, "the fault mutex excludes a second instantiation");
        }
        res?;
        if mode & FALLOC_FL_KEEP_SIZE == 0 {
            let mut inner = self.inner.lock();
            inner.size = inner.size.max(end);
        }
        Ok(())
    }

    /// Grows the size to `size` if it is smaller (`hugetlbfs_file_mmap` for
    /// a writable mapping that reaches past the end).
    pub(crate) fn hugetlbfs_cover(&self, size: u64) {
        let mut inner = self.inner.lock();
        inner.size = inner.size.max(size);
    }

    /// `hugetlbfs_read_iter`: as [`File::read_at`], from huge pages.
    pub(super) fn hugetlbfs_read_at(&self, offset: u64, count: usize, buf: &mut [u8]) -> usize {
        let inner = self.inner.lock();
        let end = inner.size.min(offset + count as u64);
        let mut pos = offset;
        while pos < end {
            let in_page = (pos % HPAGE_SIZE) as usize;
            let n = ((HPAGE_SIZE - pos % HPAGE_SIZE).min(end - pos)) as usize;
            let dst = &mut buf[(pos - offset) as usize..][..n];
            match inner.pages.get(&(pos >> HPAGE_SHIFT)) {
                // `n` stops at the huge page's end: 512 contiguous frames.
                Some(&p) => self.phys.read(p, in_page, dst),
                None => dst.fill(0),
            }
            pos += n as u64;
        }
        end.saturating_sub(offset) as usize
    }

    /// `hugetlbfs_setattr` + `hugetlb_vmtruncate`: `EINVAL` unless the size
    /// is a multiple of 2 MiB; shrinking unmaps every mapping of the pages
    /// past the end (private copies too), drops them and gives back their
    /// reservations.
    pub(super) fn hugetlbfs_set_len(&self, size: u64) -> Result<()> {
        if size % HPAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let _q = crate::tlb::QuiescentGuard::enter();
        let _inval = self.invalidate_lock.write();
        let old = std::mem::replace(&mut self.inner.lock().size, size);
        if size < old {
            let first = size >> HPAGE_SHIFT;
            self.unmap_mapping_range(first << (HPAGE_SHIFT - PAGE_SHIFT), u64::MAX, true);
            self.remove_huge_pages(first, u64::MAX);
        }
        Ok(())
    }

    /// `hugetlbfs_punch_hole` of `[offset, end)`.
    fn hugetlbfs_punch_hole(&self, offset: u64, end: u64) {
        let _inval = self.invalidate_lock.write();
        let hole_start = offset.div_ceil(HPAGE_SIZE) * HPAGE_SIZE;
        let hole_end = end & !(HPAGE_SIZE - 1);
        if offset < hole_start {
            self.zero_partial_huge_page(offset, end.min(hole_start));
        }
        if end > hole_end && end > hole_start {
            self.zero_partial_huge_page(hole_end, end);
        }
        if hole_end > hole_start {
            let shift = HPAGE_SHIFT - PAGE_SHIFT;
            self.unmap_mapping_range((hole_start >> HPAGE_SHIFT) << shift, (hole_end >> HPAGE_SHIFT) << shift, true);
            self.remove_huge_pages(hole_start >> HPAGE_SHIFT, hole_end >> HPAGE_SHIFT);
        }
    }

    /// `hugetlbfs_zero_partial_page`: zeroes `[start, end)`, inside one huge
    /// page, if that page is cached.
    fn zero_partial_huge_page(&self, start: u64, end: u64) {
        let inner = self.inner.lock();
        if let Some(&p) = inner.pages.get(&(start >> HPAGE_SHIFT)) {
            // `[start, end)` lies in one huge page (the callers stop at a
            // huge page boundary).
            self.phys.fill(p, (start % HPAGE_SIZE) as usize, 0, (end - start) as usize);
        }
    }

    /// `remove_inode_hugepages` + `hugetlb_unreserve_pages` for huge
    /// indices `[first, last)`: each page leaves the page cache, and each
    /// index its reservation, under the index's fault mutex, as Linux's
    /// hole punch does per page. Called with `invalidate_lock` held for
    /// write, after the mappings were zapped. A hugetlb fault holds only the
    /// fault mutex against this (as Linux's), so one may have mapped a page
    /// again between that zap and its removal; such a page is zapped again
    /// before this returns (Linux's `hugetlb_unmap_file_folio`, here after
    /// the removal rather than under the fault mutex: once out of the page
    /// cache nothing maps the page anew, and the zap, which takes
    /// `mmap_lock`, must not run under a fault mutex that a fault holding
    /// a VMA reference may be waiting for while a writer waits on that
    /// reference).
    fn remove_huge_pages(&self, first: u64, last: u64) {
        let resv = self.hugetlb.as_ref().expect("a hugetlb file");
        let hugetlb = &self.phys.hugetlb;
        let mut indices = resv.indices(first, last);
        indices.extend(self.inner.lock().pages.range(first..last).map(|(&k, _)| k));
        indices.sort_unstable();
        indices.dedup();
        let mut mapped = false;
        for idx in indices {
            let _fault_mutex = hugetlb.fault_mutexes.lock(&hugetlb.locks, self.id(), idx);
            let page = self.inner.lock().pages.remove(&idx);
            resv.unreserve(&self.phys, idx, idx + 1, u64::from(page.is_some()));
            if let Some(p) = page {
                // The page cache's reference and another: a mapping (a
                // fault's own reference is taken under this mutex).
                mapped |= self.phys.desc(p).refcount.load(crate::sync::Ordering::Acquire) > 1;
                drop(FrameRef::from_raw(&self.phys, p));
            }
        }
        #[cfg(loom)]
        let mapped = mapped && !crate::phys::hugetlb::lock::broken::skip_rezap();
        if mapped {
            let shift = HPAGE_SHIFT - PAGE_SHIFT;
            self.unmap_mapping_range(first << shift, last.saturating_mul(1 << shift), true);
        }
    }
}
