//! The pages of a host-memory VMA (`crate::host_mem`: `mmap_host`'s
//! embedder memory and the coherent windows onto host files), looked up
//! from the VMA for the fault handler and the callers above it: gup,
//! `madvise`, forced remote access, `mremap`.

use crate::host_mem::{HeldPage, HostMem};
use crate::mm::AddressSpace;
use crate::vma::{VmFlags, Vma};
use crate::PAGE_SIZE;

/// The host-memory window `vma` maps (its file's), if it is one.
#[inline]
pub(crate) fn window(vma: &Vma) -> Option<&HostMem> {
    vma.file.as_ref()?.host_mem.as_ref()
}

/// Whether `vma` is a coherent shared mapping of a host file
/// (`HostFileCoherence::Shared`): a window whose VMA has a shared file
/// mapping's flags, not `VM_PFNMAP`'s.
#[inline]
pub(crate) fn is_host_file_window(vma: &Vma) -> bool {
    window(vma).is_some_and(HostMem::is_file)
}

/// The file page index of `va` in `vma`.
#[inline]
fn index(vma: &Vma, va: u64) -> u64 {
    vma.pgoff + ((va & !(PAGE_SIZE - 1)) - vma.start) / PAGE_SIZE
}

/// The host address of the page holding `va` in `vma`, a host-memory
/// VMA: `None` outside its window or, for a host file, wholly past the
/// file's end now (`SIGBUS` for an access).
#[inline]
pub(crate) fn page_of(vma: &Vma, va: u64) -> Option<*mut u8> {
    let mem = window(vma)?;
    let index = index(vma, va);
    mem.page_ptr(index).filter(|_| mem.page_backed(index))
}

/// The page holding `va` of `vma`, a host-memory VMA, held mapped, for
/// writing if `write`, counted as a `FOLL_PIN` pin of the page while held
/// if `pin`: `None` where [`page_of`] finds none, the window is released
/// already, or `write` and the VMA may never write.
pub(crate) fn hold_page(vma: &Vma, va: u64, write: bool, pin: bool) -> Option<HeldPage> {
    if write && !vma.flags.contains(VmFlags::MAYWRITE) {
        return None;
    }
    HeldPage::new(window(vma)?, index(vma, va), write, pin)
}

/// Whether the page at `va` of `vma`, a host-memory VMA, is pinned
/// (`FOLL_PIN`) now, through any window onto its file.
pub(crate) fn page_pinned(vma: &Vma, va: u64) -> bool {
    window(vma).is_some_and(|m| m.page_pinned(index(vma, va)))
}

/// Copies `dst.len()` bytes at `va` of `vma`, a host-memory VMA, into
/// `dst`, all within the page holding `va`, under a hold on the window
/// (so the memory stays mapped for the copy, whoever calls); `false`,
/// having copied nothing, where [`hold_page`] finds no page or the bytes
/// leave it.
pub(crate) fn read_window(vma: &Vma, va: u64, dst: &mut [u8]) -> bool {
    let off = (va % PAGE_SIZE) as usize;
    off + dst.len() <= PAGE_SIZE as usize && hold_page(vma, va, false, false).is_some_and(|p| p.read(off, dst))
}

/// [`read_window`]'s write of `src` to `va` of `vma`; `false` also for a
/// VMA that may never write. The caller has checked that the VMA allows
/// the write now.
pub(crate) fn write_window(vma: &Vma, va: u64, src: &[u8]) -> bool {
    let off = (va % PAGE_SIZE) as usize;
    off + src.len() <= PAGE_SIZE as usize && hold_page(vma, va, true, false).is_some_and(|p| p.write(off, src))
}

/// The page at `va` of `vma`, a coherent window onto a host file, is
/// mapped now (a TLB fill or gup of it, which on Linux fault it in):
/// recorded for smaps `Rss` (`crate::host_mem::HostPresent`), and if it
/// was not mapped before and the access reads, the cached pages around it
/// too, as Linux's fault-around.
pub(crate) fn mapped(mm: &AddressSpace, vma: &Vma, va: u64, write: bool) {
    if mm.host_present.insert(va) && !write {
        if let Some(mem) = window(vma) {
            fault_around(mm, vma, mem, va & !(PAGE_SIZE - 1));
        }
    }
}

/// Linux's fault-around for a read fault at `page` of `vma`, a coherent
/// window onto a host file (`do_fault_around` with `filemap_map_pages`,
/// as `fault/handler.rs`'s `fault_around` does for softmm's page cache):
/// the pages of one `fault_around_pages` window from the aligned (then
/// clamped to the VMA and page table) start, below the file's end and
/// in the host's page cache, are mapped too, for smaps `Rss`. Their
/// translations are filled on their own first access, as any refill.
fn fault_around(mm: &AddressSpace, vma: &Vma, mem: &HostMem, page: u64) {
    let window = mm.config().fault_around_pages * PAGE_SIZE;
    if window <= PAGE_SIZE {
        return;
    }
    let pmd = crate::pgtable::PMD_SIZE;
    let table_start = page & !(pmd - 1);
    let start = (page & !(window - 1)).max(vma.start).max(table_start);
    let end = (start + window).min(vma.end).min(table_start + pmd);
    let first = vma.pgoff_at(start);
    // filemap_map_pages stops at the file's end.
    let n = ((end - start) / PAGE_SIZE).min(mem.backed_pages().saturating_sub(first));
    let cached = mem.cached(first, n as usize);
    let around = (0..n).filter(|&i| cached[i as usize]).map(|i| start + i * PAGE_SIZE);
    mm.host_present.insert_all(around);
}
