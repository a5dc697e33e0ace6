//! `set_mempolicy`, `mbind` and `move_pages`' query mode (Linux's
//! `mm/mempolicy.c` and `do_pages_stat`): the system calls around
//! [`crate::mempolicy`].

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::mempolicy::{get_nodes, sanitize_mode, MemPolicy, MPOL_DEFAULT, MPOL_MF_MOVE, MPOL_MF_MOVE_ALL};
use crate::mempolicy::{MPOL_F_ADDR, MPOL_F_MEMS_ALLOWED, MPOL_F_NODE, MPOL_INTERLEAVE, MPOL_WEIGHTED_INTERLEAVE};
use crate::mempolicy::{MPOL_MF_STRICT, MPOL_MF_VALID};
use crate::migrate::Isolated;
use crate::phys::{NodeMask, Placement};
use crate::vma::{VmFlags, Vma};
use crate::{page_align, PAGE_SIZE};

use crate::mm::{AddressSpace, MmState};

/// The start of the page after the one holding `a`: a hugetlb VMA's pages
/// are 2 MiB, so its page is looked at (and counted) once, as Linux's
/// `queue_folios_hugetlb` does per huge entry.
fn next_page(a: u64, huge: bool) -> u64 {
    let size = if huge { crate::hugetlb::HPAGE_SIZE } else { PAGE_SIZE };
    (a & !(size - 1)) + size
}

/// Queues an isolated page for `node`, counts a page that could not be
/// isolated as not moved, and leaves a shared page without
/// `MPOL_MF_MOVE_ALL` out (not a failure): `migrate_pages(2)`'s queue.
fn enqueue<'a>(
    by_node: &mut Vec<(usize, Vec<Isolated<'a>>)>,
    failed: &mut u64,
    node: usize,
    r: std::result::Result<Option<Isolated<'a>>, i32>,
) {
    match r {
        Ok(Some(p)) => match by_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, q)) => q.push(p),
            None => by_node.push((node, vec![p])),
        },
        Ok(None) => {}
        Err(_) => *failed += 1,
    }
}

impl AddressSpace {
    /// `set_mempolicy(mode, nmask, maxnode)`: the policy of every later
    /// allocation outside VMAs with their own (`mbind`) policy. `nmask` is
    /// the user bitmap (`None` for NULL) of which `maxnode - 1` bits are
    /// read.
    ///
    /// In Linux's order: `EINVAL` for an unknown mode or conflicting mode
    /// flags; then the mask: `EINVAL` for more than a page of bits or a bit
    /// set at or above [`crate::MAX_NODES`], `EFAULT` when `nmask` is shorter
    /// than the bits asked for; then `EINVAL` for a mask that does not suit
    /// the mode (non-empty with `MPOL_DEFAULT`/`MPOL_LOCAL`, empty with
    /// `MPOL_BIND`/`MPOL_INTERLEAVE`/`MPOL_PREFERRED_MANY`) or that holds no
    /// node of this arena. Nothing changes on error.
    pub fn set_mempolicy(&self, mode: i32, nmask: Option<&[u64]>, maxnode: u64) -> Result<()> {
        let (mode, flags) = sanitize_mode(mode)?;
        let nodes = get_nodes(nmask, maxnode)?;
        let policy = MemPolicy::new(mode, flags, &nodes, &self.phys.online_nodes())?;
        self.set_mm_policy(policy.map(Arc::new));
        Ok(())
    }

    /// `get_mempolicy(&mode, nmask, maxnode, addr, flags)`: returns the
    /// mode of the address space's policy (with its `MPOL_F_*` mode flags;
    /// `MPOL_DEFAULT` for none), or with [`MPOL_F_ADDR`] of the policy of
    /// the VMA at `addr` (`MPOL_DEFAULT` if it has none: no fall back to the
    /// address space's), and writes its nodes into `nmask` (`None` for
    /// NULL) as a bitmap of `maxnode - 1` bits: the mask the caller gave
    /// under `MPOL_F_STATIC_NODES`/`MPOL_F_RELATIVE_NODES`, else the nodes
    /// in use, empty for the default and `MPOL_LOCAL`. With [`MPOL_F_NODE`]
    /// it returns a node instead of the mode: with `MPOL_F_ADDR`, the node
    /// of the page at `addr`, which is faulted in for reading as
    /// `get_user_pages` does; without, the node the address space's
    /// interleave policy uses next, which in softmm (interleave by page
    /// index, no round-robin state) is the first of its nodes. With
    /// [`MPOL_F_MEMS_ALLOWED`] it returns 0 and the arena's nodes.
    ///
    /// In Linux's order (`kernel_get_mempolicy`, `do_get_mempolicy`,
    /// `copy_nodes_to_user`; the arena's node count is `nr_node_ids`):
    /// `EINVAL` for a mask with `maxnode` below the node count, an unknown
    /// flag, `MPOL_F_MEMS_ALLOWED` with another flag, or an `addr` without
    /// `MPOL_F_ADDR`; `EFAULT` when no VMA contains `addr`; `EINVAL` for
    /// `MPOL_F_NODE` alone unless the address space interleaves; the page's
    /// fault error (`EFAULT`) for `MPOL_F_NODE | MPOL_F_ADDR`; then for the
    /// mask, `EINVAL` when `maxnode - 1` bits are more than a page, and
    /// `EFAULT` (nothing written) when `nmask` is shorter than they are.
    /// The words past the node count are zeroed.
    pub fn get_mempolicy(&self, nmask: Option<&mut [u64]>, maxnode: u64, addr: u64, flags: u32) -> Result<i32> {
        let nr_node_ids = self.phys.nodes() as u64;
        if nmask.is_some() && maxnode < nr_node_ids {
            return Err(Errno::Inval);
        }
        if flags & !(MPOL_F_NODE | MPOL_F_ADDR | MPOL_F_MEMS_ALLOWED) != 0 {
            return Err(Errno::Inval);
        }
        let (mode, nodes) = if flags & MPOL_F_MEMS_ALLOWED != 0 {
            if flags & (MPOL_F_NODE | MPOL_F_ADDR) != 0 {
                return Err(Errno::Inval);
            }
            (0, self.phys.online_nodes())
        } else {
            let (policy, is_mm_policy) = if flags & MPOL_F_ADDR != 0 {
                let st = self.read_lock();
                let vma = st.vmas.find(addr).ok_or(Errno::Fault)?;
                (vma.policy.clone(), false)
            } else if addr != 0 {
                return Err(Errno::Inval);
            } else {
                (self.mm_policy(), true)
            };
            let policy = policy.as_deref();
            let mode = if flags & MPOL_F_NODE != 0 {
                match policy {
                    _ if flags & MPOL_F_ADDR != 0 => self.lookup_node(addr)?,
                    Some(p) if is_mm_policy && matches!(p.mode, MPOL_INTERLEAVE | MPOL_WEIGHTED_INTERLEAVE) => {
                        p.nodes.iter().next().unwrap_or(crate::mempolicy::LOCAL_NODE) as i32
                    }
                    _ => return Err(Errno::Inval),
                }
            } else {
                policy.map_or(MPOL_DEFAULT, |p| p.mode | p.flags)
            };
            (mode, MemPolicy::reported_nodes(policy))
        };
        if let Some(words) = nmask {
            copy_nodes_to_user(words, maxnode, &nodes, nr_node_ids)?;
        }
        Ok(mode)
    }

    /// Linux's `lookup_node`: the node of the page at `addr`, faulted in
    /// for reading by `get_user_pages` (the zero page's for an untouched
    /// private page).
    fn lookup_node(&self, addr: u64) -> Result<i32> {
        let pages = self.get_user_pages(addr & !(PAGE_SIZE - 1), 1, crate::pin::Foll::empty())?;
        let pfn = pages.pfn(0).expect("one page asked for and held");
        Ok(self.phys.node_of(pfn) as i32)
    }

    /// `mbind(start, len, mode, nmask, maxnode, flags)`: gives the VMAs of
    /// `[start, start + len)` their own policy, splitting and merging them
    /// as `mprotect` does.
    ///
    /// In Linux's order: mode and mask as [`AddressSpace::set_mempolicy`];
    /// `EINVAL` for unknown `flags`; `EPERM` for `MPOL_MF_MOVE_ALL` without
    /// [`crate::MmConfig::cap_sys_nice`]; `EINVAL` for an unaligned `start`
    /// or a range that wraps; a zero length succeeds (as does a length whose
    /// page rounding wraps to zero); `EINVAL` for a mask unsuited to the
    /// mode; `EFAULT` if no VMA is in the range, or if a hole is in it and
    /// the mode is not `MPOL_DEFAULT`; with `MPOL_MF_STRICT`, `EIO` if a
    /// page of the range lies outside the mask (the policy is set all the
    /// same). With `MPOL_MF_MOVE` (pages mapped once) or
    /// `MPOL_MF_MOVE_ALL` (shared ones too) the pages outside the mask move
    /// to where the new policy places them, after `mmap_lock` is dropped,
    /// falling back as a fault's allocation does (any node of an
    /// `MPOL_BIND` mask, any node for the other modes): `ENOMEM` only when
    /// all of those are full. With `MPOL_MF_STRICT` any page that did not
    /// move makes it `EIO`.
    pub fn mbind(
        &self,
        start: u64,
        len: u64,
        mode: i32,
        nmask: Option<&[u64]>,
        maxnode: u64,
        flags: u32,
    ) -> Result<()> {
        let (mode, mode_flags) = sanitize_mode(mode)?;
        let nodes = get_nodes(nmask, maxnode)?;
        // do_mbind
        if flags & !MPOL_MF_VALID != 0 {
            return Err(Errno::Inval);
        }
        if flags & MPOL_MF_MOVE_ALL != 0 && !self.config.cap_sys_nice {
            return Err(Errno::Perm);
        }
        if start % PAGE_SIZE != 0 {
            return Err(Errno::Inval);
        }
        let mut flags = flags;
        if mode == MPOL_DEFAULT {
            flags &= !MPOL_MF_STRICT;
        }
        let end = start.wrapping_add(page_align(len));
        if end < start {
            return Err(Errno::Inval);
        }
        if end == start {
            return Ok(());
        }
        let new = MemPolicy::new(mode, mode_flags, &nodes, &self.phys.online_nodes())?.map(Arc::new);
        // The default policy may span holes (MPOL_MF_DISCONTIG_OK).
        let discontig_ok = new.is_none();
        let _q = crate::tlb::QuiescentGuard::enter();
        let mut st = self.write_lock();
        let mut queue = Vec::new();
        let mut failed = self.queue_pages_range(&st, start, end, &nodes, flags, discontig_ok, &mut queue)?;
        let vmas: Vec<Arc<Vma>> = st.vmas.overlapping(start, end).cloned().collect();
        for v in vmas {
            // A VMA merged into its predecessor by the previous step is
            // gone; the merged one already has the policy.
            let Some(cur) = st.vmas.find(v.start.max(start)).cloned() else { continue };
            if cur.same_policy(new.as_ref()) {
                continue;
            }
            let (lo, hi) = (start.max(cur.start), end.min(cur.end));
            let cur = self.host_file_windows_merged(&mut st, &cur, lo, hi, cur.flags, new.as_ref());
            self.vma_modify_policy(&mut st, &cur, lo, hi, new.clone())?;
        }
        drop(st);
        // Migrated after mmap_lock is dropped, each page to where the new
        // policy places it, with the policy's fallback, as a fault would
        // place it (alloc_migration_target_by_mpol: alloc_pages_mpol without
        // __GFP_THISNODE): BIND any node of its mask, its first node
        // first; PREFERRED and INTERLEAVE their node, then any node.
        let mut by_node: Vec<(Placement, Vec<Isolated<'_>>)> = Vec::new();
        for (p, ilx) in queue {
            let at = MemPolicy::placement(new.as_deref(), ilx);
            match by_node.iter_mut().find(|(n, _)| *n == at) {
                Some((_, v)) => v.push(p),
                None => by_node.push((at, vec![p])),
            }
        }
        // migrate_pages' -ENOMEM (no allowed node with a free frame) ends
        // the migration; do_mbind ORs it into its failure count, so it is `EIO`
        // with MPOL_MF_STRICT and success without.
        let mut enomem = false;
        for (at, mut pages) in by_node {
            if enomem {
                crate::migrate::putback_movable_pages(&pages);
                continue;
            }
            let counts = self.migrate_isolated(&mut pages, &at);
            failed += counts.failed;
            enomem = counts.enomem;
        }
        if failed > 0 && flags & MPOL_MF_STRICT != 0 {
            return Err(Errno::Io);
        }
        Ok(())
    }

    /// Linux's `queue_pages_range` for `mbind`: `EFAULT` for a range with
    /// no VMA or (unless `discontig_ok`) a hole; else the number of pages
    /// outside `nodes` that the flags ask to check or move and that stay
    /// where they are.
    #[allow(clippy::too_many_arguments)]
    fn queue_pages_range<'a>(
        &'a self,
        st: &MmState,
        start: u64,
        end: u64,
        nodes: &NodeMask,
        flags: u32,
        discontig_ok: bool,
        queue: &mut Vec<(Isolated<'a>, u64)>,
    ) -> Result<u64> {
        let vmas: Vec<&Arc<Vma>> = st.vmas.overlapping(start, end).collect();
        let Some(first) = vmas.first() else { return Err(Errno::Fault) };
        if !discontig_ok {
            if first.start > start {
                return Err(Errno::Fault);
            }
            for w in vmas.windows(2) {
                if w[0].end < w[1].start {
                    return Err(Errno::Fault);
                }
            }
            if vmas.last().expect("not empty").end < end {
                return Err(Errno::Fault);
            }
        }
        if flags & (MPOL_MF_STRICT | MPOL_MF_MOVE | MPOL_MF_MOVE_ALL) == 0 {
            return Ok(0);
        }
        let mut failed = 0;
        let misplaced = |pfn| (!nodes.contains(self.phys.node_of(pfn))).then_some(());
        for v in vmas {
            let huge = v.flags.contains(VmFlags::HUGETLB);
            let (lo, hi) = (v.start.max(start), v.end.min(end));
            if flags & (MPOL_MF_MOVE | MPOL_MF_MOVE_ALL) == 0 {
                // STRICT without MOVE stops at the first misplaced page
                // (strictly_unmovable): a lock-free look, nothing isolated.
                let guard = crossbeam_epoch::pin();
                let found = self.pgtables.leaves(lo, hi, &guard).any(|leaf| {
                    leaf.iter().any(|(_, pte)| {
                        pte.has_frame() && pte.pfn() != self.phys.zero_pfn() && misplaced(pte.pfn()).is_some()
                    })
                });
                if found {
                    return Ok(failed + 1);
                }
                continue;
            }
            if !huge {
                // One walk, one PTE lock per table (queue_folios_pte_range).
                self.isolate_range(v, lo, hi, flags, misplaced, |a, (), r| match r {
                    Ok(Some(p)) => queue.push((p, v.pgoff_at(a))),
                    // A shared page without MOVE_ALL stays, not an error.
                    Ok(None) => {}
                    Err(_) => failed += 1,
                });
                continue;
            }
            let mut a = lo;
            while a < hi {
                let pte = self.pte_at(a);
                if pte.has_frame() && misplaced(pte.pfn()).is_some() {
                    // queue_folios_hugetlb: a page reached through a shared
                    // PMD table without MOVE_ALL stays, before any isolation.
                    let skip = crate::migrate::hugetlb::hugetlb_queue_skips(&self.pgtables, a, flags);
                    match if skip { Ok(None) } else { self.isolate_at(v, a, flags) } {
                        Ok(Some(p)) => queue.push((p, v.pgoff_at(a))),
                        Ok(None) => {}
                        Err(_) => failed += 1,
                    }
                }
                a = next_page(a, huge);
            }
        }
        Ok(failed)
    }

    /// `move_pages(pid, count, pages, NULL, status, flags)`: the node of the
    /// page at each address of `pages` into `status` (Linux's
    /// `do_pages_stat`): the node number; `-EFAULT` where no VMA covers the
    /// address or it maps the zero page; `-ENOENT` where nothing is mapped.
    /// `EFAULT` (nothing written) when `status` is shorter than `pages`.
    pub fn pages_stat(&self, pages: &[u64], status: &mut [i32]) -> Result<()> {
        let status = status.get_mut(..pages.len()).ok_or(Errno::Fault)?;
        let _q = crate::tlb::QuiescentGuard::enter();
        let st = self.read_lock();
        for (&addr, s) in pages.iter().zip(status.iter_mut()) {
            *s = match st.vmas.find(addr) {
                None => -libc::EFAULT,
                Some(_) => {
                    let pte = self.pte_at(addr & !(PAGE_SIZE - 1));
                    // PROT_NONE pages included, as Linux's folio walk finds them.
                    if !pte.has_frame() {
                        -libc::ENOENT
                    } else if pte.pfn() == self.phys.zero_pfn() {
                        -libc::EFAULT
                    } else {
                        self.phys.node_of(pte.pfn()) as i32
                    }
                }
            };
        }
        Ok(())
    }

    /// `migrate_pages(pid, maxnode, old_nodes, new_nodes)` on this address
    /// space: moves every page on a node of `old_nodes` to the node of
    /// `new_nodes` at the same position (Linux's `do_migrate_pages` with
    /// `nodes_remap`), with `MPOL_MF_MOVE_ALL` if
    /// [`crate::MmConfig::cap_sys_nice`], else `MPOL_MF_MOVE`. Returns the
    /// number of pages that did not move. `EINVAL`/`EFAULT` for the masks
    /// as [`AddressSpace::set_mempolicy`]; `EPERM` for a new node outside
    /// the arena without `cap_sys_nice`; `EINVAL` if no new node is one of
    /// the arena's; `ENOMEM` when a page's new node has no free frame (or,
    /// for a hugetlb page, no free unreserved huge page): the pages moved
    /// before it stay moved, the others where they are.
    pub fn migrate_pages(&self, maxnode: u64, old_nodes: Option<&[u64]>, new_nodes: Option<&[u64]>) -> Result<u64> {
        let old = get_nodes(old_nodes, maxnode)?;
        let new = get_nodes(new_nodes, maxnode)?;
        let online = self.phys.online_nodes();
        if new.and(&online) != new && !self.config.cap_sys_nice {
            return Err(Errno::Perm);
        }
        let new = new.and(&online);
        if new.is_empty() {
            return Err(Errno::Inval);
        }
        let flags = if self.config.cap_sys_nice { MPOL_MF_MOVE_ALL } else { MPOL_MF_MOVE };
        let old_list: Vec<usize> = old.iter().collect();
        let new_list: Vec<usize> = new.iter().collect();
        // nodes_remap: the n-th node of `old` goes to the (n mod |new|)-th of `new`.
        let dest = |src: usize| old_list.iter().position(|&n| n == src).map(|i| new_list[i % new_list.len()]);
        let _q = crate::tlb::QuiescentGuard::enter();
        let mut by_node: Vec<(usize, Vec<Isolated<'_>>)> = Vec::new();
        let mut failed = 0;
        {
            let st = self.read_lock();
            let target = |pfn| {
                let src = self.phys.node_of(pfn);
                dest(src).filter(|&d| d != src)
            };
            for v in st.vmas.iter() {
                if !v.flags.contains(VmFlags::HUGETLB) {
                    // One walk, one PTE lock per table (queue_folios_pte_range).
                    self.isolate_range(v, v.start, v.end, flags, target, |_, d, r| {
                        enqueue(&mut by_node, &mut failed, d, r);
                    });
                    continue;
                }
                let mut a = v.start;
                while a < v.end {
                    let pte = self.pte_at(a);
                    if let Some(d) = pte.has_frame().then(|| target(pte.pfn())).flatten() {
                        // queue_folios_hugetlb, as in mbind.
                        let skip = crate::migrate::hugetlb::hugetlb_queue_skips(&self.pgtables, a, flags);
                        let r = if skip { Ok(None) } else { self.isolate_at(v, a, flags) };
                        enqueue(&mut by_node, &mut failed, d, r);
                    }
                    a = next_page(a, true);
                }
            }
        }
        // do_migrate_pages: a hugetlb page finding no free page on its
        // target node ends the call with ENOMEM (what moved stays moved);
        // the pages not tried yet are put back.
        let mut enomem = false;
        for (node, mut pages) in by_node {
            if enomem {
                crate::migrate::putback_movable_pages(&pages);
                continue;
            }
            // migrate_to_node: alloc_migration_target with __GFP_THISNODE.
            let counts = self.migrate_isolated(&mut pages, &Placement::this_node(node));
            enomem = counts.enomem;
            failed += counts.failed;
        }
        if enomem {
            return Err(Errno::NoMem);
        }
        Ok(failed)
    }
}

/// Linux's `copy_nodes_to_user`: `nodes` into the user bitmap `words` as
/// `maxnode - 1` bits rounded up to whole words (`ALIGN`, wrapping as
/// Linux's unsigned arithmetic does), the words past the `nr_node_ids`
/// bits zeroed. `EINVAL` for more than a page of words past them; `EFAULT`,
/// with nothing written, when `words` is shorter.
fn copy_nodes_to_user(words: &mut [u64], maxnode: u64, nodes: &NodeMask, nr_node_ids: u64) -> Result<()> {
    let copy = maxnode.wrapping_sub(1).wrapping_add(63) & !63;
    let copy_words = copy / 64;
    let node_words = nr_node_ids.div_ceil(64);
    if copy_words > node_words && copy / 8 > PAGE_SIZE {
        return Err(Errno::Inval);
    }
    let out = words.get_mut(..copy_words as usize).ok_or(Errno::Fault)?;
    let kept = node_words.min(copy_words) as usize;
    out[..kept].copy_from_slice(&nodes.words()[..kept]);
    out[kept..].fill(0);
    Ok(())
}
