//! Writeback's write-protect walk of one address space (Linux's
//! `folio_mkclean` in `mm/rmap.c`), which a file's writeback reaches
//! through [`crate::file::Mapper::mkclean_file_pages`].

use crate::file::Inode;
use crate::pgtable::Pte;
use crate::phys::Pfn;
use crate::{PAGE_SHIFT, PAGE_SIZE};

use super::AddressSpace;

impl AddressSpace {
    /// Linux's `folio_mkclean` (`page_mkclean_one` over `rmap_walk_file`)
    /// for this address space: every writable entry of a VMA of `file` that
    /// maps one of the page-cache pages `pages` (`(index, pfn)`, by
    /// index) is made read-only and clean, then the TLB is shot down (and
    /// the shootdown waited for) if any was. A store to the page then takes
    /// the write-protect fault, whose shared case (`wp_page_shared`) marks
    /// the page dirty and the entry writable again. Private mappings hold
    /// the page read-only (a write copies it), so only shared ones change.
    /// Takes `mmap_lock` for read, recursively (the caller holds the file's
    /// `invalidate_lock`, as truncate does before its zap).
    pub(crate) fn page_mkclean(&self, file: &Inode, pages: &[(u64, Pfn)]) {
        let st = self.read_lock_recursive();
        let mut cleaned = false;
        for v in st.vmas().iter() {
            if v.file.as_ref().is_none_or(|f| f.id() != file.id()) {
                continue;
            }
            let (first, last) = (v.pgoff, v.pgoff + v.pages());
            let from = pages.partition_point(|&(i, _)| i < first);
            for &(index, pfn) in pages[from..].iter().take_while(|&&(i, _)| i < last) {
                let va = v.start + ((index - first) << PAGE_SHIFT);
                self.pgtables.update_range(va, va + PAGE_SIZE, |_, pte| {
                    let writable = pte.is_present() && pte.has(Pte::WRITE) && pte.pfn() == pfn;
                    cleaned |= writable;
                    writable.then(|| pte.clear(Pte::WRITE | Pte::DIRTY))
                });
            }
        }
        // Before the copy is taken: no CPU may keep a writable translation
        // of the page once writeback reads it.
        if cleaned && !crate::file::broken::skip_mkclean_flush() {
            self.flush_tlb();
        }
        drop(st);
    }
}
