//! `mmap_host`: a mapping of the embedder's own memory (unicorn's
//! `uc_mem_map_ptr`), mapped as Linux maps device memory with
//! `remap_pfn_range`: `VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP`.
//! The mechanism and its protocol are `crate::host_mem`'s.
//!
//! What Linux's `VM_PFNMAP` rules give it here, unchanged: `fork` shares
//! the pages with the child (`copy_page_range` copies the raw entries;
//! nothing is copy-on-write), `mremap` may move or shrink it but not grow
//! it (`EFAULT`, `vma_to_resize`), `MADV_DONTNEED`/`MADV_FREE` are
//! `EINVAL`, `get_user_pages`/pins and forced remote access are `EFAULT`
//! (`check_vma_flags`), and `MAP_POPULATE`/`mlock` skip it (`__mm_populate`).
//!
//! A `MAP_SHARED` mapping of a host file under
//! [`HostFileCoherence::Shared`](crate::HostFileCoherence::Shared) has the
//! same mechanism ([`AddressSpace::mmap_host_file`]): its window is the
//! host's own `MAP_SHARED` mapping of the file's range, with the file's end
//! checked on every TLB fill. But it is Linux's shared file mapping, not
//! `VM_PFNMAP` ([`HostFileVmOps`]): its flags, offset and inode in
//! `/proc/pid/maps` and smaps are the file mapping's; `MADV_DONTNEED`
//! shoots its translations down (`sys/madvise.rs`); a pin holds the host
//! page and its window mapped (`host_mem::HeldPage`, `pin/slow.rs`);
//! forced remote access copies from and to the host page
//! (`sys/access_remote.rs`); gup and `MADV_POPULATE_*` past the file's end
//! are `EFAULT` (the fault handler's `SIGBUS`); `mremap` growth gives the
//! VMA a new window over all it will map
//! ([`AddressSpace::grow_host_file_window`]); adjacent mappings of the
//! file through one open merge as Linux's do, by being given one window
//! over all their pages ([`AddressSpace::merge_host_file_windows`]).
//! smaps `Rss` counts the pages fills and gup mapped
//! (`crate::host_mem::HostPresent`), and `page_maybe_dma_pinned` sees the
//! file pages' pins (`crate::host_mem::PinCounts`).

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::file::{File, Inode, OpenFile};
use crate::host_mem::{HostFileHooks, HostMem, ReleaseFn};
use crate::mm::{AddressSpace, MmState};
use crate::phys::PhysMem;
use crate::uapi::*;
use crate::vma::{VmFlags, Vma, VmaDesc, VmaOps};
use crate::{page_align, PAGE_SIZE};

/// The hooks of a host-memory VMA: its preparation marks it `VM_PFNMAP`.
pub(crate) struct HostMemVmOps;

impl VmaOps for HostMemVmOps {
    fn name(&self) -> &'static str {
        "host-mem"
    }

    /// `remap_pfn_range`'s flags: raw memory without page descriptors,
    /// never expanded, merged, dumped, populated or pinned.
    fn mmap_prepare(&self, _phys: &Arc<PhysMem>, desc: &mut VmaDesc) -> Result<()> {
        desc.flags |= VmFlags::IO | VmFlags::PFNMAP | VmFlags::DONTEXPAND | VmFlags::DONTDUMP;
        Ok(())
    }
}

/// The hooks of every host-memory VMA.
pub(crate) static HOST_MEM_VM_OPS: HostMemVmOps = HostMemVmOps;

/// The hooks of a coherent shared mapping of a host file: its flags are a
/// shared file mapping's, as Linux's over page-cache pages (no
/// `VM_PFNMAP`, `VM_IO`, `VM_DONTEXPAND` or `VM_DONTDUMP`), so
/// `MADV_DONTNEED`, pins, forced remote access and `mremap` growth treat
/// it as Linux treats a `MAP_SHARED` file mapping; each of them looks its
/// pages up in the window (`crate::host_mem::page_of`).
pub(crate) struct HostFileVmOps;

impl VmaOps for HostFileVmOps {
    fn name(&self) -> &'static str {
        "host-file"
    }
}

/// The hooks of every coherent shared mapping of a host file.
pub(crate) static HOST_FILE_VM_OPS: HostFileVmOps = HostFileVmOps;

/// The placement flags `mmap_host` takes.
const HOST_MAP_FLAGS: i32 = MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_32BIT;

impl AddressSpace {
    /// Maps `len` bytes of the caller's memory at `host` into the guest,
    /// shared (a guest store is a store to `host`, a host store is seen by
    /// the guest's next load), with protection `prot`, and returns the
    /// guest address. `flags` may hold `MAP_FIXED`, `MAP_FIXED_NOREPLACE`
    /// and `MAP_32BIT`, which place the mapping as `mmap`'s do, and nothing
    /// else; `addr` is `mmap`'s hint or fixed address.
    ///
    /// The mapping is Linux's `VM_PFNMAP` (see the module): forks share it,
    /// `mremap` moves or shrinks it but does not grow it, `mprotect` and
    /// `munmap` of part of it work as for any mapping; pins, forced remote
    /// access and `MADV_DONTNEED` refuse it.
    ///
    /// `release`, if given, runs exactly once, on the thread that ends the
    /// last mapping of this call's memory (`munmap`, `mremap`, `MAP_FIXED`
    /// over it, the exit of the last address space a fork shared it with,
    /// or the end of a `Cpu::with_slice` callback that was still using it),
    /// and only once no CPU can reach the memory any more: the caller may
    /// free it then. It must not call into this address space.
    ///
    /// Errors, with nothing mapped and `release` dropped without being
    /// called: `EINVAL` for a null or unaligned `host`, a `len` that is
    /// zero or not a multiple of the page size, or another flag; then
    /// every errno of [`AddressSpace::mmap`] of a shared file mapping.
    ///
    /// # Safety
    ///
    /// `[host, host + len)` must be memory the caller owns, valid for reads
    /// and writes from this call until `release` runs (for ever if it is
    /// `None`), and not freed, unmapped or made inaccessible meanwhile. The
    /// guest's accesses to it are word-atomic, as to any guest memory; the
    /// caller's own accesses while it is mapped must be atomic too (or
    /// ordered with the guest's by the caller), as with memory shared
    /// between processes.
    pub unsafe fn mmap_host(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        host: *mut u8,
        release: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<u64> {
        let release: Option<ReleaseFn> = release;
        if host.is_null() || host as usize % PAGE_SIZE as usize != 0 || len == 0 || len % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        if flags & !HOST_MAP_FLAGS != 0 || (host as u64).checked_add(len).is_none() {
            return Err(Errno::Inval);
        }
        let mut inode = Inode::new(&self.phys, "[host]", len, None);
        // SAFETY: the caller's contract is `HostMem::new`'s.
        inode.host_mem = Some(unsafe { HostMem::new(host, len, release) });
        let file = File::named(inode);
        let open = OpenFile::read_write(&file);
        let res = self.mmap(addr, len, prot, MAP_SHARED | flags, Some(&open), 0);
        if res.is_err() {
            // Refused: the caller keeps its memory, and the callback, which
            // dropping the only handle would run, is dropped unrun.
            file.inode().host_mem.as_ref().expect("made above").defuse();
        }
        res
    }

    /// A window onto `[offset, offset + len)` (page aligned) of the host
    /// file `inode`: a `[host]`-like inode named after the file whose
    /// `HostMem` is the host's own `MAP_SHARED` mapping of the range, made
    /// here and unmapped (with the file's use put) by the window's release
    /// (`crate::host_mem`'s protocol). The host `mmap`'s errnos (`EACCES`,
    /// `ENOMEM`, `ENODEV`).
    fn host_file_window(&self, inode: &Arc<Inode>, offset: u64, len: u64) -> Result<Arc<File>> {
        let backing = inode.host_backing().expect("a host file");
        let mapping = backing.map_shared(offset, len)?;
        let base = mapping.ptr();
        // Weak: the release's strong use is the one that keeps the host
        // descriptor open, and it goes with the host mapping (the window's
        // inode itself lives on until its VMAs' grace period).
        let hooks = {
            let (pages, sync) = (Arc::downgrade(inode), Arc::downgrade(inode));
            HostFileHooks {
                origin: inode.id(),
                pages: Arc::new(move || {
                    let Some(f) = pages.upgrade() else { return 0 };
                    // `window_size` first: a shrinking `File::set_len` lowers
                    // it before the host's size.
                    let lowered = f.window_size.load(crate::sync::Ordering::SeqCst);
                    let size = f.host_backing().map_or(0, |h| h.host_size()).min(lowered);
                    size.div_ceil(PAGE_SIZE)
                }),
                sync: Box::new(move || {
                    sync.upgrade().and_then(|f| Some(f.host_backing()?.sync_data())).unwrap_or(Ok(()))
                }),
                owner: Box::new(Arc::downgrade(inode)),
                pins: inode.host_pins.clone(),
            }
        };
        // The release: the host mapping goes, then the file's use.
        let keep = inode.clone();
        let release: ReleaseFn = Box::new(move || {
            drop(mapping);
            drop(keep);
        });
        let mut window = Inode::new(&self.phys, inode.name(), offset + len, None);
        // SAFETY: the host mapping is valid for reads (and writes, if the
        // file is writable: a read-only open never maps it writable, so no
        // guest store reaches it) until the release drops it; the guest's
        // accesses are atomic, the host's are the host's, as between
        // processes sharing the file.
        window.host_mem = Some(unsafe { HostMem::new(base, len, Some(release)) }.with_file(hooks, offset / PAGE_SIZE));
        Ok(File::named(window))
    }

    /// `mremap` growth of a coherent window (`vma_expand` of a shared file
    /// mapping, over more of the file): if the VMA at `addr`, growing so
    /// that `[addr, addr + new_len)` maps on from `addr`'s file offset,
    /// would reach past its window, it is replaced by the same VMA over a
    /// new window onto all it will map. The old VMA leaves the tree, so the
    /// write section's end shoots every CPU down before its window (the old
    /// host mapping, which `mremap(2)` of it could have moved) is released
    /// (`crate::host_mem`'s protocol, step 2); the growth then proceeds as
    /// for any VMA. Nothing for any other VMA. The host `mmap`'s errnos,
    /// and `EFAULT` if the file is gone (it cannot be while a VMA maps it).
    pub(super) fn grow_host_file_window(&self, st: &mut crate::mm::MmState, addr: u64, new_len: u64) -> Result<()> {
        let Some(vma) = st.vmas.find(addr).cloned() else { return Ok(()) };
        let Some(mem) = crate::fault::host_window::window(&vma).filter(|m| m.is_file()) else { return Ok(()) };
        let end = (vma.pgoff_at(addr) + (new_len >> crate::PAGE_SHIFT)).max(vma.pgoff + vma.pages());
        if mem.covers(vma.pgoff, end) {
            return Ok(());
        }
        let owner = mem.hooks().and_then(|h| h.owner.downcast_ref::<std::sync::Weak<Inode>>());
        let origin = owner.and_then(std::sync::Weak::upgrade).ok_or(Errno::Fault)?;
        let file = self.host_file_window(&origin, vma.pgoff * PAGE_SIZE, (end - vma.pgoff) * PAGE_SIZE)?;
        st.vmas.replace(vma.start, vma.with_file(file.inode().clone()));
        Ok(())
    }

    /// Whether `v` maps a coherent window onto the host file `file` (a
    /// window) is one onto, through the open `open`: a neighbour Linux
    /// would merge with (`vma_merge`, one `vm_file`) where flags, offsets
    /// and policy allow, whichever window each has.
    fn same_host_file(v: &Vma, file: Option<&Arc<Inode>>, open: u64) -> bool {
        let origin = |f: &Arc<Inode>| f.host_mem.as_ref().and_then(HostMem::origin);
        let Some(o) = file.and_then(origin) else { return false };
        v.open == open && v.file.as_ref().and_then(origin) == Some(o)
    }

    /// Whether `a` and `b` map the same window (one file, one identity).
    fn same_window(a: &Vma, b: &Vma) -> bool {
        matches!((&a.file, &b.file), (Some(x), Some(y)) if Arc::ptr_eq(x, y))
    }

    /// One window onto the host file over all the file pages of `vmas`
    /// (windows onto it, whose pages are contiguous): the file of their
    /// merged VMA. `None` if the host refuses the mapping (they then stay
    /// apart, each with its window, as before) or the file is gone. The
    /// handle is the window's only use until a VMA takes one: the caller
    /// keeps it until then (dropped first, it would release the window).
    fn window_over(&self, vmas: &[&Vma]) -> Option<Arc<File>> {
        let first = vmas.iter().map(|v| v.pgoff).min()?;
        let end = vmas.iter().map(|v| v.pgoff + v.pages()).max()?;
        let mem = crate::fault::host_window::window(vmas.first()?)?;
        let owner = mem.hooks()?.owner.downcast_ref::<std::sync::Weak<Inode>>()?.upgrade()?;
        self.host_file_window(&owner, first * PAGE_SIZE, (end - first) * PAGE_SIZE).ok()
    }

    /// Linux's `vma_merge_new_range` of `new`, a coherent window about to
    /// be inserted ([`AddressSpace::insert_merged`]), with a neighbour
    /// mapping the same host file through the same open at contiguous
    /// offsets, with the same flags and policy, over another window: the
    /// neighbours are replaced by themselves over one new window onto all
    /// of their pages and `new`'s, and `new` over it is returned, so that
    /// the insert merges them as one file's VMAs. The replaced VMAs leave
    /// the tree, so the write section's end shoots every CPU down before
    /// their old windows may be released (`crate::host_mem`'s protocol,
    /// step 2); a pin keeps its old window, the same file pages, until it
    /// goes. `None`, changing nothing, where no such neighbour is.
    pub(crate) fn merge_host_file_windows(&self, st: &mut MmState, new: &Vma) -> Option<Vma> {
        if !crate::fault::host_window::is_host_file_window(new) {
            return None;
        }
        let (anon, pol) = (new.anon_vma.get(), new.policy.as_ref());
        let mate = |v: &Arc<Vma>| Self::same_host_file(v, new.file.as_ref(), new.open) && v.same_policy(pol);
        let prev = st
            .vmas
            .prev_of(new.start)
            .filter(|p| p.end == new.start && mate(p) && p.can_merge_after(new.flags, p.file_id(), anon, new.pgoff));
        let next = st.vmas.first_starting_at(new.end).filter(|n| {
            n.start == new.end && mate(n) && n.can_merge_before(new.flags, n.file_id(), anon, new.pgoff, new.pages())
        });
        let (prev, next) = (prev.cloned(), next.cloned());
        if !prev.iter().chain(next.iter()).any(|v| !Self::same_window(v, new)) {
            return None;
        }
        let vmas: Vec<&Vma> = [prev.as_deref(), Some(new), next.as_deref()].into_iter().flatten().collect();
        let handle = self.window_over(&vmas)?;
        let window = handle.inode();
        for v in prev.iter().chain(next.iter()) {
            st.vmas.replace(v.start, v.with_file(window.clone()));
        }
        Some(new.with_file(window.clone()))
    }

    /// [`AddressSpace::merge_host_file_windows`] before `vma_modify` of
    /// `[start, end)` of `vma` to `flags` and `policy` (`mprotect` back to
    /// a neighbour's flags, `madvise`, `mlock`, `mseal`, `mbind`): where
    /// the VMA touching the range's start or end would merge with the
    /// range but for its window, it and `vma`, both coherent windows onto
    /// one host file, are replaced by themselves over one window onto all
    /// their pages, and `vma`'s replacement is returned for the caller to
    /// modify; `vma` itself otherwise, with nothing changed. Called by the
    /// system calls (the core's `vma_modify` knows no windows).
    pub(super) fn host_file_windows_merged(
        &self,
        st: &mut MmState,
        vma: &Arc<Vma>,
        start: u64,
        end: u64,
        flags: VmFlags,
        policy: Option<&Arc<crate::mempolicy::MemPolicy>>,
    ) -> Arc<Vma> {
        if !crate::fault::host_window::is_host_file_window(vma) {
            return vma.clone();
        }
        let (anon, pgoff, pages) = (vma.anon_vma.get(), vma.pgoff_at(start), (end - start) / PAGE_SIZE);
        let mate = |v: &&Arc<Vma>| Self::same_host_file(v, vma.file.as_ref(), vma.open) && v.same_policy(policy);
        // vma_modify's neighbours: only where the range reaches the edge.
        let prev = st.vmas.prev_of(vma.start).filter(|p| p.end == start && start == vma.start);
        let next = st.vmas.first_starting_at(vma.end).filter(|n| n.start == end && end == vma.end);
        let prev = prev.filter(mate).filter(|p| p.can_merge_after(flags, p.file_id(), anon, pgoff)).cloned();
        let next = next.filter(mate).filter(|n| n.can_merge_before(flags, n.file_id(), anon, pgoff, pages)).cloned();
        if !prev.iter().chain(next.iter()).any(|v| !Self::same_window(v, vma)) {
            return vma.clone();
        }
        let vmas: Vec<&Vma> = [prev.as_deref(), Some(&**vma), next.as_deref()].into_iter().flatten().collect();
        let Some(handle) = self.window_over(&vmas) else { return vma.clone() };
        let window = handle.inode();
        for v in prev.iter().chain(next.iter()) {
            st.vmas.replace(v.start, v.with_file(window.clone()));
        }
        st.vmas.replace(vma.start, vma.with_file(window.clone()))
    }

    /// `mmap` of `open`, a host file, `MAP_SHARED` under
    /// `HostFileCoherence::Shared`: the pages are the host's own shared
    /// mapping of `[offset, offset + len)` of the file, made here and
    /// unmapped (with the file's use put) when the last mapping of it goes,
    /// after the shootdown that leaves no CPU able to reach it
    /// (`crate::host_mem`'s release). Guest and host see each other's
    /// stores at once; `msync(MS_SYNC)` is the host's `fdatasync`; a page
    /// wholly past the file's end is `SIGBUS` on access, checked against
    /// the host's size on every TLB fill. `mmap`'s checks and errnos, then
    /// the host `mmap`'s (`EACCES`, `ENOMEM`, `ENODEV`).
    pub(super) fn mmap_host_file(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        open: &OpenFile,
        offset: u64,
    ) -> Result<u64> {
        // do_mmap's length and offset checks, before the host is asked.
        if len == 0 {
            return Err(Errno::Inval);
        }
        let len = page_align(len);
        if len == 0 {
            return Err(Errno::NoMem);
        }
        if offset.checked_add(len).is_none_or(|end| end > i64::MAX as u64) {
            return Err(Errno::Overflow);
        }
        let inode = open.file.inode().clone();
        let file = self.host_file_window(&inode, offset, len)?;
        // The view keeps the open's identity: mappings through one open merge.
        let view = open.view_of(&file);
        // Refused, the window's only handle drops here and its release
        // unmaps the host mapping.
        let a = self.mmap(addr, len, prot, flags, Some(&view), offset)?;
        // A truncate of the file through softmm shoots this address space
        // down before the host's pages go (`Inode::set_len`).
        inode.has_windows.store(true, crate::sync::Ordering::Release);
        self.link_file(&inode);
        Ok(a)
    }
}
