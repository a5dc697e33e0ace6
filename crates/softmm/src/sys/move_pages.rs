//! `move_pages(2)` (Linux's `kernel_move_pages`, `do_pages_move`): moves
//! pages of this address space to the nodes asked, reporting each page's
//! status, through [`crate::migrate`].

use std::sync::Arc;

use crate::error::{Errno, Result};
use crate::mempolicy::{MPOL_MF_MOVE, MPOL_MF_MOVE_ALL};
use crate::migrate::{migrate_pages, page_mapcount, putback_movable_pages, Isolated, MigrateCounts, Outcome, Owner};
use crate::phys::{Placement, PG_ANON, PG_FILE, PG_ISOLATED};
use crate::sync::Ordering;
use crate::PAGE_SIZE;

use crate::mm::AddressSpace;

impl AddressSpace {
    /// `move_pages(pid, count, pages, nodes, status, flags)` on this
    /// address space, with its [`crate::MmConfig::migrate_policy`].
    ///
    /// In Linux's order: `EINVAL` for flags other than `MPOL_MF_MOVE` and
    /// `MPOL_MF_MOVE_ALL`; `EPERM` for `MPOL_MF_MOVE_ALL` without
    /// [`crate::MmConfig::cap_sys_nice`]; `nodes == None` is the query of
    /// [`AddressSpace::pages_stat`] (returns 0); `EFAULT` if `status` (or
    /// `nodes`) is shorter than `pages`. Then per entry, in order: a node
    /// that is not one of this arena's ends the call with `ENODEV` (pages
    /// queued before it are moved first); else the page's status: `-EFAULT`
    /// (no VMA, or the zero page), `-ENOENT` (nothing mapped, or a page
    /// being migrated), the node itself when the page is there already,
    /// `-EACCES` for a page mapped more than once without
    /// `MPOL_MF_MOVE_ALL`, `-EBUSY` when another migration holds it. Runs of
    /// queued entries for one node, up to an entry for another node or one
    /// that is not queued, are migrated together; their statuses become the
    /// node. If some pages of a run fail to move (pinned, referenced
    /// elsewhere), the call stops and returns their number plus the number
    /// of entries not looked at yet, as a positive value, leaving that run's
    /// statuses unwritten; else 0. A page whose target node has no free
    /// frame (or, for a hugetlb page, no free unreserved huge page) ends the
    /// call with `ENOMEM` instead, as Linux's `migrate_pages` returns
    /// `-ENOMEM` (the pages of the run moved before it stay moved), that
    /// run's statuses unwritten too. `ENODEV` stands even if the run queued
    /// before the bad node fails to move.
    pub fn move_pages(&self, pages: &[u64], nodes: Option<&[i32]>, status: &mut [i32], flags: u32) -> Result<u64> {
        if flags & !(MPOL_MF_MOVE | MPOL_MF_MOVE_ALL) != 0 {
            return Err(Errno::Inval);
        }
        if flags & MPOL_MF_MOVE_ALL != 0 && !self.config.cap_sys_nice {
            return Err(Errno::Perm);
        }
        let Some(nodes) = nodes else {
            self.pages_stat(pages, status)?;
            return Ok(0);
        };
        if status.len() < pages.len() || nodes.len() < pages.len() {
            return Err(Errno::Fault);
        }
        let _q = crate::tlb::QuiescentGuard::enter();
        let phys = &self.phys;
        let mut run: Vec<(usize, Isolated<'_>)> = Vec::new();
        let mut run_node = None;
        for i in 0..pages.len() {
            let node = nodes[i];
            if node < 0 || node as usize >= phys.nodes() {
                // out_flush: the queued run still moves, but the error
                // stands whatever the flush returns (`if (err >= 0)`).
                let _ = self.move_run(&mut run, run_node, status, pages.len() - i);
                return Err(Errno::NoDev);
            }
            let node = node as usize;
            if run_node.is_some_and(|n| n != node) {
                let left = self.move_run(&mut run, run_node, status, pages.len() - i)?;
                if left > 0 {
                    return Ok(left);
                }
            }
            run_node = Some(node);
            let code = match self.isolate(pages[i], node, flags) {
                Ok(Some(p)) => {
                    run.push((i, p));
                    continue;
                }
                Ok(None) => node as i32,
                Err(code) => code,
            };
            status[i] = code;
            // An entry not queued ends the run: Linux migrates the pages
            // queued before it now (so a failure among them leaves the
            // entries after it untried, counted in the positive return, this
            // one excepted: its status is written) and starts a new run.
            let left = self.move_run(&mut run, run_node, status, pages.len() - i - 1)?;
            if left > 0 {
                return Ok(left);
            }
            run_node = None;
        }
        self.move_run(&mut run, run_node, status, 0)
    }

    /// `add_folio_for_migration`: the page at `addr` isolated for a move to
    /// `node`, `None` if it is there already, or its negative status.
    fn isolate(&self, addr: u64, node: usize, flags: u32) -> std::result::Result<Option<Isolated<'_>>, i32> {
        let st = self.read_lock();
        let vma = st.vmas.find(addr).ok_or(-libc::EFAULT)?;
        let pte = self.pte_at(addr & !(PAGE_SIZE - 1));
        if pte.has_frame() && pte.pfn() != self.phys.zero_pfn() && self.phys.node_of(pte.pfn()) == node {
            return Ok(None);
        }
        match self.isolate_at(vma, addr, flags) {
            Ok(None) => Err(-libc::EACCES),
            r => r,
        }
    }

    /// Isolates the page mapped at `addr` of `vma` (the caller holds
    /// `mmap_lock`): `-ENOENT` for nothing mapped, `-EFAULT` for the zero
    /// page, `Ok(None)` for a page mapped more than once without
    /// `MPOL_MF_MOVE_ALL`, `-EBUSY` if another migration holds it.
    pub(crate) fn isolate_at(
        &self,
        vma: &crate::vma::Vma,
        addr: u64,
        flags: u32,
    ) -> std::result::Result<Option<Isolated<'_>>, i32> {
        if vma.flags.contains(crate::vma::VmFlags::HUGETLB) {
            // Never migrated: reported as Linux reports an unmovable page.
            return crate::migrate::hugetlb::hugetlb_isolate(self, vma, addr, flags);
        }
        let va = addr & !(PAGE_SIZE - 1);
        let guard = crossbeam_epoch::pin();
        let leaf = self.pgtables.leaf(va, &guard).ok_or(-libc::ENOENT)?;
        let ptl = leaf.lock();
        self.counters.migrate_ptl_locks.fetch_add(1, Ordering::Relaxed);
        let pte = ptl.get(va);
        // A PROT_NONE page is mapped too (x86-64's entry is present to
        // `folio_walk_start`): it moves like any other.
        if !pte.has_frame() {
            return Err(-libc::ENOENT);
        }
        let pfn = pte.pfn();
        if pfn == self.phys.zero_pfn() {
            return Err(-libc::EFAULT);
        }
        // Our reference keeps the frame (not its mappings) once the lock
        // is dropped for the reverse walk.
        let page = ptl.page(va, &self.phys).expect("the entry holds a frame");
        drop(ptl);
        self.isolate_page(vma, page, flags)
    }

    /// `queue_folios_pte_range` for `mbind` and `migrate_pages(2)`: calls
    /// `put(addr, target, result)` for every page mapped in `[start, end)`
    /// of the small-page VMA `vma` (the caller holds `mmap_lock`) whose
    /// frame `want` gives a target for, the zero page left out, with the
    /// result of isolating it as [`AddressSpace::isolate_at`] would.
    ///
    /// One walk down the tree for the range (`walk_page_range`, empty
    /// directories skipped) and one PTE lock per page table, under which
    /// the table's pages are picked and referenced; each is then isolated
    /// with the lock dropped (the shared-mapping count reads the reverse
    /// map). `isolate_at` per page walked the tree from the root and took
    /// the table's lock once per page, after a lock-free walk per page to
    /// read the entry.
    pub(crate) fn isolate_range<'a, T>(
        &'a self,
        vma: &crate::vma::Vma,
        start: u64,
        end: u64,
        flags: u32,
        mut want: impl FnMut(crate::phys::Pfn) -> Option<T>,
        mut put: impl FnMut(u64, T, std::result::Result<Option<Isolated<'a>>, i32>),
    ) {
        debug_assert!(!vma.flags.contains(crate::vma::VmFlags::HUGETLB));
        let guard = crossbeam_epoch::pin();
        let mut picked = Vec::new();
        for leaf in self.pgtables.leaves(start, end, &guard) {
            if leaf.entry_size() != PAGE_SIZE {
                continue;
            }
            let ptl = leaf.lock();
            self.counters.migrate_ptl_locks.fetch_add(1, Ordering::Relaxed);
            for (va, _) in leaf.iter() {
                let pte = ptl.get(va);
                // PROT_NONE pages included, as in `isolate_at`.
                if !pte.has_frame() || pte.pfn() == self.phys.zero_pfn() {
                    continue;
                }
                if let Some(target) = want(pte.pfn()) {
                    picked.push((va, target, ptl.page(va, &self.phys).expect("the entry holds a frame")));
                }
            }
            drop(ptl);
            for (va, target, page) in picked.drain(..) {
                put(va, target, self.isolate_page(vma, page, flags));
            }
        }
    }

    /// The rest of `isolate_at` for a page the caller found mapped in
    /// `vma` and holds a reference on: `Ok(None)` for a page mapped more
    /// than once without `MPOL_MF_MOVE_ALL`, `-EBUSY` if another migration
    /// holds it, else the page isolated with its owner and index.
    fn isolate_page<'a>(
        &'a self,
        vma: &crate::vma::Vma,
        page: crate::phys::FrameRef<'a>,
        flags: u32,
    ) -> std::result::Result<Option<Isolated<'a>>, i32> {
        let pfn = page.pfn();
        let d = self.phys.desc(pfn);
        let file = vma.file.as_ref().filter(|_| d.flags.load(Ordering::Relaxed) & PG_FILE != 0);
        let owner = match (vma.anon_vma.get(), file) {
            (_, Some(f)) => Owner::File(f.clone()),
            (Some(a), None) if d.flags.load(Ordering::Relaxed) & PG_ANON != 0 => Owner::Anon(a.family.clone()),
            // Neither (no page of softmm's is): queued, so that it counts as
            // not moved rather than vanishing from the statuses.
            _ => Owner::Anon(Arc::new(crate::vma::AnonFamily::empty())),
        };
        let index = d.index.load(Ordering::Relaxed);
        // folio_likely_mapped_shared: mapped more than once, counted through
        // the reverse map (a reference taken for a moment is no mapping).
        if flags & MPOL_MF_MOVE_ALL == 0 && page_mapcount(&owner, index, pfn) > 1 {
            return Ok(None);
        }
        if d.flags.fetch_or(PG_ISOLATED, Ordering::AcqRel) & PG_ISOLATED != 0 {
            return Err(-libc::EBUSY);
        }
        Ok(Some(Isolated { page, owner, index }))
    }

    /// Migrates the queued run to `node` (Linux's `move_pages_and_store_status`):
    /// 0 and the run's statuses set to the node, or the number of pages not
    /// moved plus `rest` with the statuses left unwritten; `ENOMEM` (the
    /// statuses unwritten too) when a page found no free frame or huge page
    /// on the node, as Linux's `migrate_pages` returns it. Releases the run.
    fn move_run(
        &self,
        run: &mut Vec<(usize, Isolated<'_>)>,
        node: Option<usize>,
        status: &mut [i32],
        rest: usize,
    ) -> Result<u64> {
        let (Some(node), false) = (node, run.is_empty()) else { return Ok(0) };
        let (idx, mut isolated): (Vec<usize>, Vec<Isolated<'_>>) = std::mem::take(run).into_iter().unzip();
        let counts = self.migrate_isolated(&mut isolated, &Placement::this_node(node));
        if counts.enomem {
            return Err(Errno::NoMem);
        }
        if counts.failed == 0 {
            for i in idx {
                status[i] = node as i32;
            }
        }
        if counts.failed > 0 {
            return Ok(counts.failed + rest as u64);
        }
        Ok(0)
    }

    /// Migrates isolated pages to frames allocated where `at` says (see
    /// [`migrate_pages`]) with this address space's migration policy, then
    /// releases their isolation (Linux's `putback_movable_pages`).
    pub(crate) fn migrate_isolated<'p>(&'p self, isolated: &mut [Isolated<'p>], at: &Placement) -> MigrateCounts {
        let (_, counts): (Vec<Outcome>, MigrateCounts) =
            migrate_pages(&self.phys, isolated, at, self.config.migrate_policy);
        putback_movable_pages(isolated);
        self.counters.pages_migrated.fetch_add(counts.moved, Ordering::Relaxed);
        self.counters.migrate_ptl_locks.fetch_add(counts.ptl_locks, Ordering::Relaxed);
        counts
    }
}
