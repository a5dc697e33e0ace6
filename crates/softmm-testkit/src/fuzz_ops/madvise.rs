//! `madvise`, `mincore` and `brk`: softmm's calls against the model's
//! predictions.

use super::*;

impl World<'_> {
    pub(super) fn madvise(&mut self, asi: u8, addr: Addr, len: Len, advice: Advice) -> Result<String, String> {
        let a = self.asi(asi);
        let (addr, len) = (self.addr(a, addr), len_val(len));
        let advice = match advice {
            Advice::Known(i) => ADVICES[usize::from(i) % ADVICES.len()],
            Advice::Raw(v) => v,
        };
        let line = format!("as{a} madvise({addr:#x}, {len:#x}, {advice})");
        if matches!(advice, 100 | 101) {
            return Ok(line + ": poison advice, skipped (outside the model)");
        }
        let alen = page_align(len);
        let range_ok = addr % PG == 0 && !(len != 0 && alen == 0) && addr.checked_add(alen).is_some();
        let populate = matches!(advice, MADV_POPULATE_READ | MADV_POPULATE_WRITE | MADV_WILLNEED);
        if range_ok && populate && alen > MAX_POPULATE {
            return Ok(line + ": populating a large range, skipped (speed)");
        }
        if range_ok
            && matches!(advice, MADV_KEEPONFORK | MADV_DODUMP)
            && self
                .model
                .mapped_in(a, addr / PG, alen / PG)
                .iter()
                .any(|k| self.model.ases[a].pages[k].flags & vm::DROPPABLE != 0)
        {
            return Ok(line + ": over a droppable mapping, skipped (softmm defect: Ok, Linux EINVAL)");
        }
        let before = self.model.ases[a].clone();
        let objs_before = self.model.objs.clone();
        let want = self.predict_madvise(a, addr, len, advice);
        let r = self.real[a].mm.madvise(addr, len, advice);
        let line = format!("{line} = {r:?}");
        if advice == MADV_COLLAPSE {
            // Relaxed: which blocks collapse is not modelled.
            self.model.ases[a] = before;
            self.model.objs = objs_before;
            return Ok(line + " (relaxed)");
        }
        ensure!(r == want, "{line}: model {want:?}");
        Ok(line)
    }

    /// Linux's `madvise`, applied to the model.
    pub(super) fn predict_madvise(&mut self, a: usize, addr: u64, len: u64, advice: i32) -> Result<(), Errno> {
        let known = ADVICES.contains(&advice);
        if !known || addr % PG != 0 {
            return Err(Errno::Inval);
        }
        let alen = page_align(len);
        if len != 0 && alen == 0 {
            return Err(Errno::Inval);
        }
        let end = addr.checked_add(alen).ok_or(Errno::Inval)?;
        if end == addr {
            return Ok(());
        }
        let (pg, n) = (addr / PG, alen / PG);
        if advice == MADV_REMOVE {
            return self.predict_remove(a, addr, end);
        }
        let m = &mut self.model;
        if matches!(advice, MADV_POPULATE_READ | MADV_POPULATE_WRITE) {
            let write = advice == MADV_POPULATE_WRITE;
            for k in pg..pg + n {
                let Some(p) = m.ases[a].pages.get(&k) else { return Err(Errno::NoMem) };
                // Linux 6.18 (seen on the host): a permission failure is EINVAL,
                // SIGBUS and a guard marker's SIGSEGV are EFAULT.
                if (write && !p.prot.writable()) || (!write && !p.prot.has_read()) {
                    return Err(Errno::Inval);
                }
                if p.guard {
                    return Err(Errno::Fault);
                }
                if let Kind::Obj { obj, idx, .. } = p.kind {
                    if p.cow.is_none() && idx >= m.objs[obj].pages() {
                        return Err(Errno::Fault);
                    }
                }
                if write {
                    m.break_cow(a, k);
                }
            }
            return Ok(());
        }
        let mapped = m.mapped_in(a, pg, n);
        if mapped.is_empty() && m.ases[a].pages.range(pg..).next().is_none() {
            return Err(Errno::NoMem);
        }
        for &k in &mapped {
            let p = m.ases[a].pages.get_mut(&k).expect("mapped");
            let locked = p.flags & vm::LOCKED != 0;
            match advice {
                MADV_DONTNEED | MADV_DONTNEED_LOCKED => {
                    if locked && advice == MADV_DONTNEED {
                        return Err(Errno::Inval);
                    }
                    if p.private() {
                        p.cow = None;
                    }
                }
                // MADV_FREE: private anonymous memory only; it is kept (softmm never reclaims).
                MADV_FREE if locked || p.kind != Kind::Anon => return Err(Errno::Inval),
                // can_madv_lru_vma: no locked VMAs.
                MADV_COLD | MADV_PAGEOUT if locked => return Err(Errno::Inval),
                MADV_DONTFORK => p.flags |= vm::DONTCOPY,
                MADV_DOFORK => p.flags &= !vm::DONTCOPY,
                MADV_WIPEONFORK => {
                    if p.kind != Kind::Anon {
                        return Err(Errno::Inval);
                    }
                    p.flags |= vm::WIPEONFORK;
                }
                // A droppable mapping stays wiped on fork and out of dumps.
                MADV_KEEPONFORK | MADV_DODUMP if p.flags & vm::DROPPABLE != 0 => return Err(Errno::Inval),
                MADV_KEEPONFORK => p.flags &= !vm::WIPEONFORK,
                // madvise_guard_install: not on a locked VMA; the page is
                // zapped (a private copy is lost) and its entry marked.
                MADV_GUARD_INSTALL if locked => return Err(Errno::Inval),
                MADV_GUARD_INSTALL => {
                    if p.private() {
                        p.cow = None;
                    }
                    p.guard = true;
                }
                MADV_GUARD_REMOVE => p.guard = false,
                _ => {} // NORMAL, RANDOM, SEQUENTIAL, WILLNEED, (UN)MERGEABLE, (NO)HUGEPAGE, DONTDUMP, DODUMP, COLLAPSE
            }
        }
        if mapped.len() as u64 != n {
            return Err(Errno::NoMem);
        }
        Ok(())
    }

    /// `MADV_REMOVE` of `[start, end)` (not empty), VMA by VMA as
    /// `madvise_walk_vmas` visits them (the boundaries from softmm's maps):
    /// each punches its part of its file, the first that cannot stops the
    /// walk (`EINVAL` locked or without a file, `EACCES` not shared
    /// writable), and a hole anywhere makes the result `ENOMEM`.
    pub(super) fn predict_remove(&mut self, a: usize, start: u64, end: u64) -> Result<(), Errno> {
        let maps = self.real[a].mm.maps();
        let mut cur = start;
        let mut hole = false;
        for e in maps.iter().filter(|e| e.end > start && e.start < end) {
            if cur < e.start {
                hole = true;
                cur = e.start;
            }
            let stop = e.end.min(end);
            let p = &self.model.ases[a].pages[&(cur / PG)];
            if p.flags & vm::LOCKED != 0 {
                return Err(Errno::Inval);
            }
            match p.kind {
                Kind::Anon => return Err(Errno::Inval),
                Kind::Obj { shared: true, obj, idx } if p.flags & vm::NOMAYWRITE == 0 => {
                    self.model.objs[obj].punch(idx * PG, stop - cur);
                }
                Kind::Obj { .. } => return Err(Errno::Acces),
            }
            cur = stop;
        }
        if hole || cur < end {
            return Err(Errno::NoMem);
        }
        Ok(())
    }

    pub(super) fn mincore(&mut self, asi: u8, addr: Addr, len: Len, short: u8) -> Result<String, String> {
        let a = self.asi(asi);
        let cfg = cfg();
        let (addr, len) = (self.addr(a, addr), len_val(len));
        let pages = len.div_ceil(PG);
        let buflen = pages.min(1 << 16).saturating_sub(u64::from(short % 4) * u64::from(short / 4 % 64));
        let mut buf = vec![0xaa_u8; buflen as usize];
        let r = self.real[a].mm.mincore(addr, len, &mut buf);
        let line = format!("as{a} mincore({addr:#x}, {len:#x}, [{buflen}]) = {r:?}");
        let (want, written) = if addr % PG != 0 {
            (Err(Errno::Inval), 0)
        } else if addr > cfg.task_size || len > cfg.task_size - addr {
            (Err(Errno::NoMem), 0)
        } else {
            let pg = addr / PG;
            let mut h = 0;
            while h < pages && self.model.ases[a].pages.contains_key(&(pg + h)) {
                h += 1;
            }
            if h < pages {
                if buflen < h {
                    (Err(Errno::Fault), buflen)
                } else {
                    (Err(Errno::NoMem), h)
                }
            } else if buflen < pages {
                (Err(Errno::Fault), buflen)
            } else {
                (Ok(()), pages)
            }
        };
        ensure!(r == want, "{line}: model {want:?}");
        for i in 0..written {
            let b = buf[i as usize];
            let p = &self.model.ases[a].pages[&(addr / PG + i)];
            ensure!(b <= 1, "{line}: byte {i} is {b:#x}");
            ensure!(b == 1 || p.cow.is_none(), "{line}: page {i} has a private copy but is not resident");
        }
        Ok(line)
    }

    pub(super) fn brk(&mut self, asi: u8, to: Addr) -> Result<String, String> {
        let a = self.asi(asi);
        let cfg = cfg();
        let x = self.addr(a, to);
        let orig = self.model.ases[a].brk;
        let before = self.model.ases[a].clone();
        let mut growth = 0;
        let want = (|| {
            if x < cfg.start_brk || x > cfg.task_size {
                return orig;
            }
            let (newbrk, oldbrk) = (page_align(x), page_align(orig));
            let m = &mut self.model;
            if newbrk == oldbrk {
                m.ases[a].brk = x;
                return x;
            }
            if x <= orig {
                if m.is_free(a, newbrk / PG, (oldbrk - newbrk) / PG) {
                    return orig;
                }
                m.unmap(a, newbrk / PG, (oldbrk - newbrk) / PG);
                m.ases[a].brk = x;
                return x;
            }
            // The first mapping above the old break, up to the new one plus a
            // page and the guard gap, must start (a growsdown one's gap
            // included) above the new break's page.
            let gap = cfg.stack_guard_gap / PG;
            let first = m.ases[a].pages.range(oldbrk / PG..(newbrk + PG) / PG + gap).next();
            if first.is_some_and(|(&pg, _)| m.gap_end(a, pg) < (newbrk + PG) / PG) {
                return orig;
            }
            growth = newbrk - oldbrk;
            if growth / PG <= MAX_MODEL_PAGES {
                for pg in oldbrk / PG..newbrk / PG {
                    m.ases[a].pages.insert(pg, MPage::new(Prot::RW, Kind::Anon));
                }
            }
            m.ases[a].brk = x;
            x
        })();
        if want != orig && (growth > MAX_WALK || x < orig && page_align(orig) - page_align(x) > MAX_WALK) {
            self.model.ases[a] = before;
            return Ok(format!("as{a} brk({x:#x}): valid but huge, skipped (speed)"));
        }
        let r = self.real[a].mm.brk(x);
        let line = format!("as{a} brk({x:#x}) = {r:#x}");
        if r == orig && want != orig && growth >= COMMIT_SLACK {
            self.model.ases[a] = before;
            return Ok(line + " (commit limit, accepted)");
        }
        ensure!(r == want, "{line}: model {want:#x}");
        if growth / PG > MAX_MODEL_PAGES {
            let back = self.real[a].mm.brk(orig);
            ensure!(back == orig, "{line}; brk back to {orig:#x} = {back:#x}");
            self.model.ases[a].brk = orig;
            return Ok(line + " (large: shrunk back)");
        }
        Ok(line)
    }
}
