//! The hooks through which the core asks a VMA's backing (Linux's
//! `vm_operations_struct`): one [`VmaOps`] per kind of backing, held by
//! each VMA ([`super::Vma::ops`]), copied to every piece split from it, to
//! every copy of it made by a merge, a move or a fork.
//!
//! Anonymous memory and files take the defaults ([`DEFAULT_VM_OPS`]):
//! split anywhere, nothing to prepare, close or unshare, 4 KiB pages, a zap
//! of the entries, and at fork a copy of them that copies a pinned page into
//! a 4 KiB page. hugetlb implements every hook (`hugetlb/vm_ops.rs`, Linux's
//! `hugetlb_vm_ops`), so the core (`mm/`) and fork never name hugetlb to
//! split, close, zap or copy a mapping.

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::mm::{AddressSpace, MmuGather};
use crate::pgtable::Pte;
use crate::phys::PhysMem;
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
/// for a VMA of the address space the hook is given; none may take
/// `mmap_lock`. The defaults are anonymous memory's and a file's.
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
    /// `mm`'s tree and is about to be replaced by its pieces.
    fn split(&self, _mm: &AddressSpace, _vma: &Vma, _addr: u64) {}

    /// `vm_ops->close` for the part `[start, end)` of `vma` that leaves the
    /// address space (munmap, exit): what the backing keeps for that part
    /// goes. A published VMA never changes, so a partial unmap closes the
    /// part that goes, not the VMA.
    fn close(&self, _vma: &Vma, _start: u64, _end: u64) {}

    /// `vm_ops->pagesize`: the size of the pages that map `vma`.
    fn pagesize(&self, _vma: &Vma) -> u64 {
        PAGE_SIZE
    }

    /// `unmap_single_vma` under `mmap_lock` for read (truncate, hole punch):
    /// clears the entries of `[start, end)`, a range of `vma`, that
    /// `details` selects, gathering their frames in `tlb`.
    /// `copy_page_range` at fork (`dup_mmap`, for a VMA with anonymous
    /// pages): copies `vma`'s entries from `src` into `dst`, the child,
    /// both `mmap_lock`s held for write; the parent's write-protected
    /// entries go into `tlb`'s flush. A pinned anonymous page is copied at
    /// once, into a 4 KiB page here (`ENOMEM` if none is left); hugetlb
    /// copies into a pool page (Linux's `copy_hugetlb_page_range`).
    fn copy_page_range(&self, dst: &AddressSpace, src: &AddressSpace, vma: &Vma, tlb: &mut MmuGather) -> Result<()> {
        crate::mm::copy_page_range(dst, src, vma, tlb, &|va, pfn| {
            src.phys.alloc_copy_at(pfn, &src.placement(vma, va)).ok_or(Errno::NoMem)
        })
    }

    fn zap(&self, mm: &AddressSpace, _vma: &Vma, start: u64, end: u64, tlb: &mut MmuGather, details: ZapDetails<'_>) {
        mm.zap_range(start, end, tlb, details.filter);
    }
}

/// Linux's `struct zap_details`: which entries a zap of a file's range
/// clears.
pub(crate) struct ZapDetails<'a> {
    /// Private copies go too (truncate), not only the file's own pages
    /// (hole punch): Linux's `even_cows`.
    pub(crate) even_cows: bool,
    /// Whether the entry goes (`filter` already answers `even_cows`).
    pub(crate) filter: &'a mut dyn FnMut(Pte) -> bool,
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
