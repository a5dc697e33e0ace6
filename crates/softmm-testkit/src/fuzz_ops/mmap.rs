//! `mmap` and `mprotect`: softmm's call against the model's prediction.

use super::*;

impl World<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mmap(
        &mut self,
        asi: u8,
        addr: Addr,
        len: Len,
        prot: ProtArg,
        flags: MapFlags,
        file: FileArg,
        off: Off,
    ) -> Result<String, String> {
        let a = self.asi(asi);
        let addr = self.addr(a, addr);
        let len = len_val(len);
        let prot = prot_val(prot);
        let mut fl = match flags.ty % 8 {
            0 | 1 => MAP_PRIVATE,
            2 | 3 => MAP_SHARED,
            4 => MAP_SHARED_VALIDATE,
            5 => 0,
            6 => MAP_DROPPABLE,
            _ => i32::from(flags.ty >> 4),
        };
        for (i, b) in MAP_BITS.iter().enumerate() {
            if flags.bits & (1 << i) != 0 {
                fl |= b;
            }
        }
        if flags.raw_on {
            fl |= flags.raw as i32;
        }
        let alen = page_align(len);
        if alen > MAX_POPULATE || alen == 0 {
            fl &= !(MAP_POPULATE | MAP_LOCKED);
        }
        let offset = off_val(off);
        let anon = fl & MAP_ANONYMOUS != 0;
        let fi = usize::from(file.file) % self.files.len();
        let mode = file.mode % 4;
        let open = (!file.none).then(|| {
            let f = &self.files[fi];
            self.opens.entry((fi, mode)).or_insert_with(|| OpenFile::new(f, mode <= 1, mode % 2 == 0)).clone()
        });
        let what = if anon {
            "anon".to_string()
        } else if file.none {
            "no file".into()
        } else {
            format!("file{fi} mode {}", file.mode % 4)
        };
        let line = format!("as{a} mmap({addr:#x}, {len:#x}, {prot:#x}, {fl:#x}, {what}, {offset:#x})");
        if fl & MAP_HUGETLB != 0 && anon {
            return Ok(line + ": anonymous MAP_HUGETLB, skipped (no pool here: the hugetlb target's)");
        }
        let ty = fl & MAP_TYPE;
        let want = self.predict_mmap(a, addr, len, prot, fl, open.as_ref(), offset);
        if want.is_ok() && alen > MAX_WALK {
            return Ok(line + ": valid but huge, skipped (speed)");
        }
        let r = self.real[a].mm.mmap(addr, len, prot, fl, open.as_ref(), offset);
        let line = format!("{line} = {r:x?}");
        // What Linux charges to the commit total: private writable memory
        // (`accountable_mapping`), and a shared anonymous object whole
        // (`shmem_acct_size`) unless MAP_NORESERVE.
        let shared = matches!(ty, MAP_SHARED | MAP_SHARED_VALIDATE);
        let charged = if shared { anon && fl & MAP_NORESERVE == 0 } else { prot & PROT_WRITE != 0 };
        let at: u64 = match (&want, r) {
            (Ok(_), Err(Errno::NoMem)) if alen >= COMMIT_SLACK && charged => {
                return Ok(line + " (commit limit, accepted)")
            }
            (Ok(_), Err(Errno::Again)) if fl & MAP_LOCKED != 0 => return Ok(line + " (memlock limit, accepted)"),
            (Ok((w, _)), Ok(at)) => {
                ensure!(*w == at, "{line}: model {w:#x}");
                at
            }
            (Err(e), Err(g)) => {
                ensure!(*e == g, "{line}: model {e:?}");
                return Ok(line);
            }
            (w, _) => return Err(format!("{line}: model {:x?}", w.as_ref().map(|x| x.0))),
        };
        // Apply to the model.
        let n = alen / PG;
        let pg = at / PG;
        self.model.unmap(a, pg, n);
        if n > MAX_MODEL_PAGES {
            let u = self.real[a].mm.munmap(at, alen);
            ensure!(u == Ok(()), "{line}; unmapping the large mapping again: {u:?}");
            return Ok(line + " (large: unmapped again)");
        }
        let mut pflags = 0;
        if fl & MAP_LOCKED != 0 {
            pflags |= vm::LOCKED;
        }
        if fl & MAP_GROWSDOWN != 0 {
            pflags |= vm::GROWSDOWN;
        }
        if ty == MAP_DROPPABLE {
            // Wiped in a forked child.
            pflags |= vm::DROPPABLE | vm::WIPEONFORK;
        }
        let kind = |obj: usize, shared: bool, i: u64| Kind::Obj { shared, obj, idx: i };
        let shared = matches!(ty, MAP_SHARED | MAP_SHARED_VALIDATE);
        let mut kinds: Vec<Kind> = Vec::new();
        if anon && shared {
            let inode = self.vma_at(a, at).map(|e| e.inode).ok_or_else(|| format!("{line}: not in maps"))?;
            self.model.objs.push(Obj::new(inode, alen));
            let o = self.model.objs.len() - 1;
            kinds.extend((0..n).map(|i| kind(o, true, i)));
        } else if anon {
            kinds.extend((0..n).map(|_| Kind::Anon));
        } else {
            let o = fi;
            kinds.extend((0..n).map(|i| kind(o, shared, offset / PG + i)));
            if shared && !open.as_ref().expect("file").writable {
                pflags |= vm::NOMAYWRITE;
            }
        }
        for (i, k) in kinds.into_iter().enumerate() {
            let mut p = MPage::new(Prot::from_bits(prot), k);
            p.flags = pflags;
            self.model.ases[a].pages.insert(pg + i as u64, p);
        }
        if fl & MAP_LOCKED != 0 || fl & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE {
            self.model.populate_write(a, pg..pg + n);
        }
        Ok(line)
    }

    /// Linux's `do_mmap` checks in order; `Ok((address, _))`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn predict_mmap(
        &self,
        a: usize,
        mut addr: u64,
        len: u64,
        prot: i32,
        mut fl: i32,
        file: Option<&OpenFile>,
        offset: u64,
    ) -> Result<(u64, ()), Errno> {
        let cfg = cfg();
        if offset % PG != 0 {
            return Err(Errno::Inval);
        }
        let anon = fl & MAP_ANONYMOUS != 0;
        if !anon && file.is_none() {
            return Err(Errno::BadF);
        }
        if !anon && fl & MAP_HUGETLB != 0 {
            // ksys_mmap_pgoff: MAP_HUGETLB with a file not on hugetlbfs.
            return Err(Errno::Inval);
        }
        if len == 0 {
            return Err(Errno::Inval);
        }
        if fl & MAP_FIXED_NOREPLACE != 0 {
            fl |= MAP_FIXED;
        }
        let fixed = fl & MAP_FIXED != 0;
        if !fixed {
            addr &= !(PG - 1);
            if addr != 0 && addr < cfg.mmap_min_addr {
                addr = page_align(cfg.mmap_min_addr);
            }
        }
        let alen = page_align(len);
        if alen == 0 {
            return Err(Errno::NoMem);
        }
        let pgoff = offset / PG;
        if pgoff.checked_add(alen / PG).is_none() {
            return Err(Errno::Overflow);
        }
        // get_unmapped_area
        let task = cfg.task_size;
        if alen > task || alen > task - cfg.mmap_min_addr {
            return Err(Errno::NoMem);
        }
        let at = if fixed {
            if addr > task - alen {
                return Err(Errno::NoMem);
            }
            if addr % PG != 0 {
                return Err(Errno::Inval);
            }
            addr
        } else if fl & MAP_32BIT != 0 {
            // arch_get_unmapped_area with find_start_end's MAP_32BIT window:
            // the hint if it fits below the window's end, else bottom-up.
            let (begin, end) = MAP_32BIT_AREA;
            if alen > end {
                return Err(Errno::NoMem);
            }
            let n = alen / PG;
            if addr != 0 && end - alen >= addr && self.model.fits(a, addr / PG, n) {
                addr
            } else {
                let low = begin.max(cfg.mmap_min_addr) / PG;
                self.model.bottomup_in(a, n, low, end / PG).ok_or(Errno::NoMem)? * PG
            }
        } else {
            self.model.unmapped_area(a, &cfg, addr / PG, alen / PG, false).ok_or(Errno::NoMem)? * PG
        };
        if fixed && at < cfg.mmap_min_addr {
            return Err(Errno::Perm);
        }
        if fl & MAP_FIXED_NOREPLACE != 0 && !self.model.is_free(a, at / PG, alen / PG) {
            return Err(Errno::Exist);
        }
        let ty = fl & MAP_TYPE;
        match file.filter(|_| !anon) {
            Some(f) => {
                // file_mmap_ok: the mapping's end past the largest file offset.
                if alen > MAX_FILE || pgoff > (MAX_FILE - alen) / PG {
                    return Err(Errno::Overflow);
                }
                match ty {
                    MAP_SHARED | MAP_SHARED_VALIDATE => {
                        if ty == MAP_SHARED_VALIDATE && fl & !LEGACY_MAP_MASK != 0 {
                            return Err(Errno::OpNotSupp);
                        }
                        if prot & PROT_WRITE != 0 && !f.writable {
                            return Err(Errno::Acces);
                        }
                    }
                    MAP_PRIVATE => {}
                    _ => return Err(Errno::Inval),
                }
                if !f.readable {
                    return Err(Errno::Acces);
                }
                if fl & MAP_GROWSDOWN != 0 {
                    return Err(Errno::Inval);
                }
            }
            None => match ty {
                MAP_SHARED if fl & MAP_GROWSDOWN != 0 => return Err(Errno::Inval),
                MAP_SHARED | MAP_PRIVATE => {}
                // A locked or stack area makes no sense droppable (hugetlb
                // is skipped).
                MAP_DROPPABLE if fl & (MAP_LOCKED | MAP_GROWSDOWN) != 0 => return Err(Errno::Inval),
                MAP_DROPPABLE => {}
                _ => return Err(Errno::Inval),
            },
        }
        Ok((at, ()))
    }

    pub(super) fn mprotect(&mut self, asi: u8, addr: Addr, len: Len, prot: ProtArg) -> Result<String, String> {
        let a = self.asi(asi);
        let (addr, len, prot) = (self.addr(a, addr), len_val(len), prot_val(prot));
        let r = self.real[a].mm.mprotect(addr, len, prot);
        let line = format!("as{a} mprotect({addr:#x}, {len:#x}, {prot:#x}) = {r:?}");
        // PROT_GROWSDOWN on a growsdown VMA extends the range down to its
        // start (the first VMA of the range, from softmm's maps).
        let stack_start = (addr % PG == 0)
            .then(|| self.model.mapped_in(a, addr / PG, page_align(len) / PG).first().copied())
            .flatten()
            .filter(|k| self.model.ases[a].pages[k].flags & vm::GROWSDOWN != 0)
            .and_then(|k| self.vma_at(a, k * PG))
            .map(|v| v.start / PG);
        // The model, page by page (see the module doc of reference.rs for why
        // pages suffice: every error is a property of a whole VMA).
        let want = (|| {
            let grows = prot & (PROT_GROWSDOWN | PROT_GROWSUP);
            let prot = prot & !grows;
            if grows == PROT_GROWSDOWN | PROT_GROWSUP {
                return Err(Errno::Inval);
            }
            if addr % PG != 0 {
                return Err(Errno::Inval);
            }
            if len == 0 {
                return Ok(());
            }
            let alen = page_align(len);
            let end = addr.wrapping_add(alen);
            if alen == 0 || end <= addr {
                return Err(Errno::NoMem);
            }
            if prot & !(PROT_READ | PROT_WRITE | PROT_EXEC | PROT_SEM) != 0 {
                return Err(Errno::Inval);
            }
            let (mut pg, mut n) = (addr / PG, alen / PG);
            // The first VMA of the range: with PROT_GROWSDOWN it must be a
            // growsdown one (x86-64 has no VM_GROWSUP, so PROT_GROWSUP is
            // EINVAL once a VMA is found where it must be).
            if grows == PROT_GROWSDOWN && !self.model.is_free(a, pg, n) {
                let start = stack_start.ok_or(Errno::Inval)?;
                n += pg - start;
                pg = start;
            }
            if !self.model.ases[a].pages.contains_key(&pg) {
                return Err(Errno::NoMem);
            }
            if grows == PROT_GROWSUP {
                return Err(Errno::Inval);
            }
            let p = Prot::from_bits(prot);
            let mut next = pg;
            for k in self.model.mapped_in(a, pg, n) {
                if k != next {
                    return Err(Errno::NoMem);
                }
                let mp = self.model.ases[a].pages.get_mut(&k).expect("mapped");
                if p.writable() && mp.flags & vm::NOMAYWRITE != 0 {
                    return Err(Errno::Acces);
                }
                // mprotect_fixup populates a locked private VMA made writable.
                let populate = mp.flags & vm::LOCKED != 0 && mp.private() && !mp.prot.writable() && p.writable();
                mp.prot = p;
                if populate {
                    self.model.populate_write(a, [k]);
                }
                next = k + 1;
            }
            if next < pg + n {
                return Err(Errno::NoMem);
            }
            Ok(())
        })();
        if r == Err(Errno::NoMem) && want.is_ok() && page_align(len) >= COMMIT_SLACK && prot & PROT_WRITE != 0 {
            self.resync_prot(a);
            return Ok(line + " (commit limit, accepted)");
        }
        ensure!(r == want, "{line}: model {want:?}");
        Ok(line)
    }
}
