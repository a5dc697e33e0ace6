//! The calls of the hugetlb target: `mmap` of a region, `fork`, pins,
//! `move_pages` and `mbind`, each on softmm against the model.

use super::*;

impl World<'_> {
    pub(super) fn map(
        &mut self,
        asi: u8,
        huge: bool,
        shared: bool,
        noreserve: bool,
        pages: u8,
        tail: bool,
    ) -> Result<String, String> {
        let a = self.asi(asi);
        let shared = huge && shared;
        let size = if huge { HP } else { SP };
        let n = 1 + u64::from(pages) % if huge { 3 } else { 8 };
        let len = n * size - if tail { size / 2 } else { 0 };
        let mut flags = MAP_ANONYMOUS | if shared { MAP_SHARED } else { MAP_PRIVATE };
        if huge {
            flags |= MAP_HUGETLB;
        }
        if noreserve {
            flags |= MAP_NORESERVE;
        }
        let r = self.real[a].mm.mmap(0, len, PROT_READ | PROT_WRITE, flags, None, 0);
        let line = format!(
            "as{a} mmap({len:#x}, {}{}{}) = {r:x?}",
            if shared { "shared" } else { "private" },
            if huge { " hugetlb" } else { "" },
            if noreserve { " noreserve" } else { "" }
        );
        let reserve = huge && !noreserve;
        if reserve && n as i64 > self.m.available() {
            ensure!(r == Err(Errno::NoMem), "{line}: model Err(NoMem) (the pool cannot cover it)");
            return Ok(line);
        }
        let at = r.map_err(|e| format!("{line}: model Ok, got {e:?}"))?;
        ensure!(at % size == 0, "{line}: not aligned to the page size");
        let overlap = self.m.ases[a].range(at.saturating_sub(HP) + 1..at + n * size).any(|(&v, s)| {
            let end = v + if s.huge { HP } else { SP };
            end > at
        });
        ensure!(!overlap, "{line}: over a mapping the model has");
        let id = self.m.maps.len();
        self.m.maps.push(MapInfo { start: at, size, pages: n });
        let file = self.m.files.len();
        let mut f = MFile::default();
        if reserve {
            f.resv.extend(0..n);
        }
        self.m.files.push(Some(f));
        for i in 0..n {
            let s = Slot {
                map: id,
                huge,
                shared,
                file,
                idx: i,
                owner: huge && !shared && !noreserve,
                page: None,
                marked: false,
                bind: None,
            };
            self.m.ases[a].insert(at + i * size, s);
        }
        Ok(line)
    }

    pub(super) fn fork(&mut self, asi: u8) -> Result<String, String> {
        let a = self.asi(asi);
        let r = self.real[a].mm.fork();
        // copy_hugetlb_page_range and copy_present_page: a pinned private
        // page is copied for the child (a huge one from outside the
        // reservations, from the mask's node under MPOL_BIND; none left:
        // copy_mm's ENOMEM, whatever dup_mmap failed with); every other
        // private page is shared; shared mappings are not copied.
        let mut child = BTreeMap::new();
        let mut copies = Vec::new();
        let mut shared = Vec::new();
        let mut want = Ok(());
        let parent: Vec<(u64, Slot)> = self.m.ases[a].iter().map(|(&v, s)| (v, s.clone())).collect();
        for (va, s) in parent {
            let mut c = Slot { owner: false, marked: false, ..s.clone() };
            if s.shared {
                c.page = None;
            } else if let Some(p) = s.page {
                if self.m.pages[&p].pins > 0 {
                    let node = if s.huge { self.m.huge_node(s.bind, false) } else { Some(s.bind.unwrap_or(0)) };
                    let Some(node) = node else {
                        want = Err(Errno::NoMem);
                        break;
                    };
                    let data = self.m.pages[&p].data.clone();
                    let q = self.m.new_page(s.huge, node, data);
                    copies.push(q);
                    c.page = Some(q);
                } else {
                    shared.push(p);
                }
            }
            child.insert(va, c);
        }
        let line = format!("as{a} fork = {:?}", r.as_ref().map(|_| ()));
        if want.is_err() {
            for q in copies {
                self.m.pages.remove(&q);
            }
        }
        match (r, want) {
            (Ok(mm), Ok(())) => {
                for p in shared {
                    self.m.pages.get_mut(&p).expect("page").excl = false;
                }
                let real = Real { cpus: [Cpu::attached(&mm), Cpu::attached(&mm)], mm };
                let c = if self.real.len() < MAX_AS {
                    self.real.push(real);
                    self.m.ases.push(child);
                    self.real.len() - 1
                } else {
                    self.real[MAX_AS - 1] = real;
                    let old: Vec<u64> = self.m.ases[MAX_AS - 1].keys().copied().collect();
                    // The replaced child exits after the new one exists.
                    self.m.ases.push(child);
                    for v in old {
                        self.m.remove_slot(MAX_AS - 1, v);
                    }
                    self.m.ases.swap_remove(MAX_AS - 1);
                    MAX_AS - 1
                };
                Ok(format!("{line} -> as{c}"))
            }
            (Err(e), Err(w)) if e == w => Ok(line),
            (r, w) => Err(format!("{line}: model {w:?}, softmm {:?}", r.map(|_| ()))),
        }
    }

    pub(super) fn pin(
        &mut self,
        asi: u8,
        region: u8,
        page: u8,
        sub: u16,
        n: u8,
        write: bool,
    ) -> Result<String, String> {
        let a = self.asi(asi);
        let Some((info, va)) = self.region(a, region, page) else { return Ok(format!("as{a} pin: nothing mapped")) };
        let n = 1 + u64::from(n) % 4;
        // Small pages from `start`, inside one huge page or the mapping.
        let (start, n) = if info.size == HP {
            (va + u64::from(sub) % (512 - n + 1) * SP, n)
        } else {
            (va, n.min(info.pages - (va - info.start) / SP))
        };
        let line = format!("as{a} pin_user_pages({start:#x}, {n}, {})", if write { "WRITE" } else { "0" });
        let addrs: Vec<u64> = (0..n).map(|i| start + i * SP).collect();
        let flags = if write { Foll::WRITE } else { Foll::empty() };
        let r = self.real[a].mm.pin_user_pages(start, n as usize, flags);
        let line = format!("{line} = {:?}", r.as_ref().map(|p| p.len()));
        // Page by page, as the slow path faults: a write breaks COW, a read
        // pin of a private page mapped elsewhere too unshares it.
        let mut want = Ok(());
        let bounds = Self::vma_bounds(&self.real);
        let mut done = None;
        for &x in &addrs {
            let Some(k) = self.m.slot_of(a, x) else {
                want = Err(Errno::Fault);
                break;
            };
            if done == Some(k) {
                continue;
            }
            done = Some(k);
            let s = &self.m.ases[a][&k];
            let unshare = !write
                && !s.shared
                && s.page.is_some_and(|p| if s.huge { self.m.mapcount(p) > 1 } else { !self.m.pages[&p].excl });
            if self.m.fault(a, k, write, unshare, &bounds).is_err() {
                want = Err(Errno::Fault);
                break;
            }
        }
        let real = match (r, want) {
            (Ok(p), Ok(())) => p,
            (Err(e), Err(w)) if e == w => return Ok(line),
            (r, w) => return Err(format!("{line}: model {w:?}, softmm {:?}", r.map(|p| p.len()))),
        };
        let mut held = Vec::new();
        for &x in &addrs {
            let k = self.m.slot_of(a, x).expect("faulted");
            let p = self.m.ases[a][&k].page;
            if let Some(p) = p {
                self.m.pages.get_mut(&p).expect("page").pins += 1;
            }
            held.push((p, x - k));
        }
        self.pins.push(Pin { real, write, pages: held });
        Ok(line + &format!(" -> pin {}", self.pins.len() - 1))
    }

    pub(super) fn move_pages(&mut self, asi: u8, region: u8, page: u8, node: bool) -> Result<String, String> {
        let a = self.asi(asi);
        let Some((_, va)) = self.region(a, region, page) else {
            return Ok(format!("as{a} move_pages: nothing mapped"));
        };
        let node = usize::from(node);
        let mut status = [i32::MIN];
        let r = self.real[a].mm.move_pages(&[va], Some(&[node as i32]), &mut status, MPOL_MF_MOVE);
        let line = format!("as{a} move_pages([{va:#x}], [{node}]) = {r:?} {status:?}");
        let Some(s) = self.m.slot_of(a, va).map(|k| self.m.ases[a][&k].clone()) else {
            ensure!(r == Ok(0) && status[0] == -EFAULT, "{line}: model Ok(0) [-EFAULT]");
            return Ok(line);
        };
        let Some(p) = s.page else {
            let ok = r == Ok(0) && (status[0] == -ENOENT || (!s.huge && status[0] == -EFAULT));
            ensure!(ok, "{line}: model Ok(0) [-ENOENT]");
            return Ok(line);
        };
        let (want, st) = if self.m.pages[&p].node == node {
            (Ok(0), Some(node as i32))
        } else if self.m.mapcount(p) > 1 {
            (Ok(0), Some(-EACCES))
        } else if !self.m.migration_target(s.huge, node) {
            (Err(Errno::NoMem), None)
        } else if self.m.pages[&p].pins > 0 {
            (Ok(1), None)
        } else {
            self.m.pages.get_mut(&p).expect("page").node = node;
            (Ok(0), Some(node as i32))
        };
        ensure!(r == want && st.is_none_or(|st| st == status[0]), "{line}: model {want:?} {st:?}");
        Ok(line)
    }

    pub(super) fn mbind(&mut self, asi: u8, region: u8, page: u8, count: u8, node: bool) -> Result<String, String> {
        let a = self.asi(asi);
        let Some((info, va)) = self.region(a, region, page) else { return Ok(format!("as{a} mbind: nothing mapped")) };
        let node = usize::from(node);
        let len = (1 + u64::from(count) % info.pages) * info.size;
        let mask = [1u64 << node];
        let r = self.real[a].mm.mbind(va, len, MPOL_BIND, Some(&mask), NODES as u64 + 1, MPOL_MF_MOVE);
        let line = format!("as{a} mbind({va:#x}, {len:#x}, MPOL_BIND, {{{node}}}, MPOL_MF_MOVE) = {r:?}");
        let end = va + len;
        let slots: Vec<u64> = self.m.ases[a].range(va..end).map(|(&v, _)| v).collect();
        let want = if self.m.has_hole(a, va, end) {
            Err(Errno::Fault)
        } else if self.m.inside_huge(a, va) || self.m.inside_huge(a, end) {
            Err(Errno::Inval)
        } else {
            for v in &slots {
                self.m.ases[a].get_mut(v).expect("slot").bind = Some(node);
            }
            // Huge pages first, each alone, then the small ones; a page
            // mapped more than once is left out; a pinned one stays; the
            // first with no page to move to ends the migration (migrate_pages'
            // -ENOMEM, which do_mbind only reports with MPOL_MF_STRICT).
            let mut stop = Ok(());
            // A moved huge page's source goes back to the pool at once
            // (unmap_and_move_huge_page), so the next can move into its room.
            for huge in [true, false] {
                for v in &slots {
                    let s = &self.m.ases[a][v];
                    let Some(p) = s.page else { continue };
                    if s.huge != huge || self.m.pages[&p].node == node || self.m.mapcount(p) > 1 {
                        continue;
                    }
                    if !self.m.migration_target(huge, node) {
                        stop = Err(());
                        break;
                    }
                    if self.m.pages[&p].pins == 0 {
                        self.m.pages.get_mut(&p).expect("page").node = node;
                    }
                }
                if stop.is_err() {
                    break;
                }
            }
            Ok(())
        };
        ensure!(r == want, "{line}: model {want:?}");
        Ok(line)
    }
}
