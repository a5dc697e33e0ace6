//! The hooks through which the core asks a VMA's backing (Linux's
//! `vm_operations_struct`): one [`VmaOps`] per kind of backing, held by
//! each VMA ([`super::Vma::ops`]), copied to every piece split from it, to
//! every copy of it made by a merge, a move or a fork.
//!
//! Anonymous memory and files take the defaults ([`DEFAULT_VM_OPS`]):
//! split anywhere, nothing to prepare, close or unshare, 4 KiB pages, no
//! shared page tables, and at fork a pinned page copied into a 4 KiB page.
//! hugetlb implements every hook (`hugetlb/vm_ops.rs`, Linux's
//! `hugetlb_vm_ops`), so the core (`mm/`) and fork never name hugetlb to
//! split, close, zap or copy a mapping.
//!
//! The hooks take the types of the layers below this one (the page tables,
//! the arena, a placement), never the address space: what a backing asks
//! of the core (an unshare before a split, the locks of a zap) it returns,
//! and the core does it.

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::pgtable::{PageTables, PUD_SIZE};
use crate::phys::hugetlb::lock::IMmapLock;
use crate::phys::{FrameRef, Pfn, PhysMem, Placement};
use crate::sync::RwLock;
use crate::PAGE_SIZE;

use super::{VmFlags, Vma};

/// A mapping as `mmap` has worked it out, before its VMA exists (Linux's
/// `vm_area_desc`, which `f_op->mmap_prepare` completes): what
/// [`VmaOps::mmap_prepare`] may change.
pub(crate) struct VmaDesc {
    /// The range to map.
    pub(crate) start: u64,
    /// One past its last byte.
    pub(crate) end: u64,
    /// Its page offset in `file` (a private anonymous mapping's linear index).
    pub(crate) pgoff: u64,
    /// Its `VM_*` flags.
    pub(crate) flags: VmFlags,
    /// The file mapped, `None` for anonymous memory.
    pub(crate) file: Option<Arc<crate::file::Inode>>,
    /// The page size asked for (`MAP_HUGETLB`'s, else the file's): what the
    /// backing must be able to map.
    pub(crate) page_size: u64,
    /// `MAP_NORESERVE` was passed, whatever the overcommit mode.
    pub(crate) map_noreserve: bool,
    /// A private hugetlb mapping's reserve map, made by the preparation.
    pub(crate) hugetlb_resv: Option<Arc<crate::phys::hugetlb::resv::PrivateResv>>,
}

/// One kind of backing's answers to the core, as Linux's
/// `vm_operations_struct`. Every hook is called with `mmap_lock` held (for
/// write where it changes the VMA set, for read at least where it zaps),
/// with the page tables or arena of the VMA's address space where it
/// needs them; none may take `mmap_lock`. The defaults are anonymous memory's and a file's.
pub(crate) trait VmaOps: Send + Sync + 'static {
    /// The backing's name, for debugging.
    fn name(&self) -> &'static str;

    /// `f_op->mmap` (Linux 6.17's `mmap_prepare`): completes the mapping
    /// `desc` describes before its VMA exists (flags, file, reservations),
    /// or refuses it with the errno `mmap` returns; refused, it has taken
    /// nothing (what it made is dropped with `desc`). Called once
    /// `mmap_region`'s refusals are checked, so nothing after it fails.
    fn mmap_prepare(&self, _phys: &Arc<PhysMem>, _desc: &mut VmaDesc) -> Result<()> {
        Ok(())
    }

    /// `vm_ops->may_split`: whether `vma` may be split at `addr`, an
    /// address strictly inside it; the errno if not. Asked for every edge
    /// of an operation before any change.
    fn may_split(&self, _vma: &Vma, _addr: u64) -> Result<()> {
        Ok(())
    }

    /// `__split_vma`'s backing step (Linux's `hugetlb_split`): `vma`, which
    /// [`VmaOps::may_split`] allowed to split at `addr`, is detached from
    /// its address space's tree and is about to be replaced by its pieces.
    /// Returns the range whose shared page tables the core must unshare
    /// first, because no piece will cover it whole (hugetlb: the PUD window
    /// around `addr`, which [`want_pmd_share`] would no longer allow).
    fn split(&self, _vma: &Vma, _addr: u64) -> Option<Range<u64>> {
        None
    }

    /// `vm_ops->close` for the part `[start, end)` of `vma` that leaves the
    /// address space (munmap, exit): what the backing keeps for that part
    /// goes. A published VMA never changes, so a partial unmap closes the
    /// part that goes, not the VMA.
    fn close(&self, _vma: &Vma, _start: u64, _end: u64) {}

    /// `vm_ops->pagesize`: the size of the pages that map `vma`.
    fn pagesize(&self, _vma: &Vma) -> u64 {
        PAGE_SIZE
    }

    /// `__unmap_hugepage_range`'s first step, before the core zaps
    /// `[start, end)`, a range of `vma`, in `pgtables` under `mmap_lock`
    /// for read (`MADV_DONTNEED`, truncate, hole punch); `even_cows`: private
    /// copies go too. hugetlb: a private owner gets back the reservations
    /// of its anonymous pages there.
    fn zap_begin(&self, _pgtables: &PageTables, _phys: &PhysMem, _vma: &Vma, _start: u64, _end: u64, _even_cows: bool) {
    }

    /// The lock that orders a zap under `mmap_lock` for read against the
    /// sharing of `vma`'s page tables (hugetlb: its file's `i_mmap`, for a
    /// `VM_MAYSHARE` VMA): the core zaps each PUD window of `vma` that
    /// [`want_pmd_share`] allows under it and its hugetlb VMA lock, both
    /// for write, as an unshare. `None` (the default): no table of `vma`
    /// is ever shared, the zap takes no lock.
    fn pmd_share_lock<'v>(&self, _vma: &'v Vma) -> Option<&'v IMmapLock> {
        None
    }

    /// The lock a zap of `vma` under `mmap_lock` for read holds for write
    /// from [`VmaOps::zap_begin`] until the pages it cleared are freed,
    /// and the backing's faults hold for read (hugetlb: a private owner's
    /// `resv_map->rw_sema`). `None` (the default): the zap takes no lock
    /// and leaves the freeing to its caller.
    fn zap_lock<'v>(&self, _vma: &'v Vma) -> Option<&'v RwLock<()>> {
        None
    }

    /// `copy_page_range`'s copy at fork of the pinned anonymous page `pfn`
    /// of `vma` (`folio_needs_cow_for_dma`): a new page of `phys` at
    /// `placement` with its contents, or the errno that fails the fork.
    /// The default copies into a 4 KiB page (`ENOMEM` if none is left);
    /// hugetlb into a pool page outside any reservation (`ENOSPC`, Linux's
    /// `copy_hugetlb_page_range`).
    fn copy_pinned<'p>(&self, phys: &'p PhysMem, _vma: &Vma, placement: &Placement, pfn: Pfn) -> Result<FrameRef<'p>> {
        phys.alloc_copy_at(pfn, placement).ok_or(Errno::NoMem)
    }
}

/// `want_pmd_share`: a `VM_MAYSHARE` VMA that covers the whole PUD-aligned
/// window around `addr`, whose PMD table it may share.
pub(crate) fn want_pmd_share(vma: &Vma, addr: u64) -> bool {
    let start = addr & !(PUD_SIZE - 1);
    vma.flags.contains(VmFlags::MAYSHARE)
        && start >= vma.start
        && start.checked_add(PUD_SIZE).is_some_and(|end| end <= vma.end)
}

/// Linux's `struct zap_details`: which entries a zap of a file's range
/// clears.
pub(crate) struct ZapDetails<'a> {
    /// Private copies go too (truncate), not only the file's own pages
    /// (hole punch): Linux's `even_cows`.
    pub(crate) even_cows: bool,
    /// Whether the entry goes (`filter` already answers `even_cows`).
    pub(crate) filter: &'a mut dyn FnMut(crate::pgtable::Pte) -> bool,
}

/// Anonymous memory's and a file's hooks: every default.
pub(crate) struct DefaultVmOps;

impl VmaOps for DefaultVmOps {
    fn name(&self) -> &'static str {
        "default"
    }
}

/// The hooks of every VMA that is not hugetlb.
pub(crate) static DEFAULT_VM_OPS: DefaultVmOps = DefaultVmOps;
