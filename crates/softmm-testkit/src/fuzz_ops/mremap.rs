//! `mremap`: softmm's call against the model's prediction.

use super::*;

impl World<'_> {
    pub(super) fn mremap(
        &mut self,
        asi: u8,
        addr: Addr,
        old: Len,
        new: Len,
        flags: i32,
        new_addr: Addr,
    ) -> Result<String, String> {
        let a = self.asi(asi);
        let (addr, old_len, new_len, new_addr) =
            (self.addr(a, addr), len_val(old), len_val(new), self.addr(a, new_addr));
        let line = format!("as{a} mremap({addr:#x}, {old_len:#x}, {new_len:#x}, {flags:#x}, {new_addr:#x})");
        let (old, new) = (page_align(old_len), page_align(new_len));
        let maps = self.real[a].mm.maps();
        let before = self.model.ases[a].clone();
        let want = self.predict_mremap(a, &maps, addr, old, new, flags, new_addr);
        if want.is_ok() && (new > MAX_WALK || old > MAX_WALK) {
            self.model.ases[a] = before;
            return Ok(line + ": valid but huge, skipped (speed)");
        }
        let r = self.real[a].mm.mremap(addr, old_len, new_len, flags, new_addr);
        let line = format!("{line} = {r:x?}");
        let want = match want {
            Ok((dst, unmap_again)) => {
                if r == Err(Errno::NoMem) && new > old && new - old >= COMMIT_SLACK {
                    self.model.ases[a] = before;
                    return Ok(line + " (commit limit, accepted)");
                }
                ensure!(r == Ok(dst), "{line}: model {:x?}", Ok::<u64, Errno>(dst));
                if let Some((at, n)) = unmap_again {
                    let u = self.real[a].mm.munmap(at * PG, n * PG);
                    ensure!(u == Ok(()), "{line}; unmapping the large result again: {u:?}");
                    return Ok(line + " (large: unmapped again)");
                }
                return Ok(line);
            }
            Err(e) => Err(e),
        };
        // A failed call keeps what it did before failing (a fixed move's
        // unmapped target), as `predict_mremap` left it.
        ensure!(r == want.map(|()| 0), "{line}: model {want:?}");
        Ok(line)
    }

    /// Linux 6.17's `mremap`, applied to the model; returns the new address
    /// and, for a result too large to model, the pages to unmap again on
    /// softmm (already unmapped in the model). A failure leaves the model as
    /// Linux leaves the address space (a fixed move unmaps its target before
    /// the checks that follow). VMA boundaries come from softmm's `maps`
    /// before the call.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn predict_mremap(
        &mut self,
        a: usize,
        maps: &[MapEntry],
        addr: u64,
        old: u64,
        new: u64,
        flags: i32,
        new_addr: u64,
    ) -> Result<(u64, Option<(u64, u64)>), Errno> {
        let cfg = cfg();
        let task = cfg.task_size;
        if flags & !(MREMAP_FIXED | MREMAP_MAYMOVE | MREMAP_DONTUNMAP) != 0 || addr % PG != 0 {
            return Err(Errno::Inval);
        }
        if new == 0 || new > task {
            return Err(Errno::Inval);
        }
        let fixed = flags & MREMAP_FIXED != 0;
        let dontunmap = flags & MREMAP_DONTUNMAP != 0;
        if fixed || dontunmap {
            if new_addr > task - new || new_addr % PG != 0 || flags & MREMAP_MAYMOVE == 0 {
                return Err(Errno::Inval);
            }
            if dontunmap && old != new {
                return Err(Errno::Inval);
            }
            // vrm_overlaps, for a fixed target and a hint alike, with the
            // old range's unsigned (wrapping) end.
            if addr.wrapping_add(old) > new_addr && new_addr + new > addr {
                return Err(Errno::Inval);
            }
        }
        let vma = |x: u64| maps.iter().find(|e| e.start <= x && x < e.end);
        let (src, o, n, dst_hint) = (addr / PG, old / PG, new / PG, new_addr / PG);
        if fixed && old == new {
            // remap_move: every VMA part of the range, the gaps kept; may not
            // start in a hole, and finds no VMA below a wrapped end.
            if vma(addr).is_none() || addr.checked_add(old).is_none() {
                return Err(Errno::Fault);
            }
            if new_addr < cfg.mmap_min_addr {
                // get_unmapped_area's security_mmap_addr, after the first
                // VMA's target was unmapped.
                let first = vma(addr).map_or(0, |v| (v.end.min(addr + old) - addr) / PG);
                self.model.unmap(a, dst_hint, first);
                return Err(Errno::Perm);
            }
            let pages = self.model.mapped_in(a, src, o);
            for &p in &pages {
                self.model.unmap(a, dst_hint + (p - src), 1);
            }
            for &p in &pages {
                let mp = if dontunmap {
                    let mp = self.model.ases[a].pages[&p].clone();
                    let left = self.model.ases[a].pages.get_mut(&p).expect("mapped");
                    (left.cow, left.guard) = (None, false);
                    mp
                } else {
                    self.model.ases[a].pages.remove(&p).expect("mapped")
                };
                self.model.ases[a].pages.insert(dst_hint + (p - src), mp);
            }
            return Ok((new_addr, None));
        }
        let v = vma(addr).ok_or(Errno::Fault)?;
        let private = v.perms.as_bytes()[3] == b'p';
        if new > old || fixed || dontunmap {
            if old == 0 && private {
                return Err(Errno::Inval);
            }
            if old.min(new) > v.end - addr {
                return Err(Errno::Fault);
            }
        }
        let big = |m: &mut Model, dst: u64| -> Option<(u64, u64)> {
            (n > MAX_MODEL_PAGES).then(|| {
                m.unmap(a, dst, n);
                (dst, n)
            })
        };
        if fixed || dontunmap {
            if fixed {
                self.model.unmap(a, dst_hint, n);
            }
            let mut o = o;
            if n < o {
                shrink_tail(task, addr, new, old)?;
                self.model.unmap(a, src + n, o - n);
                o = n;
            }
            let dst = self.model.unmapped_area(a, &cfg, dst_hint, n, fixed).ok_or(Errno::NoMem)?;
            if dst * PG < cfg.mmap_min_addr {
                // security_mmap_addr (a DONTUNMAP hint is taken as it is).
                return Err(Errno::Perm);
            }
            self.move_or_dup(a, src, o, dst, n, dontunmap);
            return Ok((dst * PG, big(&mut self.model, dst)));
        }
        if n == o {
            return Ok((addr, None));
        }
        if n < o {
            shrink_tail(task, addr, new, old)?;
            self.model.unmap(a, src + n, o - n);
            return Ok((addr, None));
        }
        let delta = n - o;
        let vend = v.end / PG;
        if src + o == vend
            && vend.checked_add(delta).is_some_and(|e| e <= task / PG)
            && self.model.is_free(a, vend, delta)
        {
            if n > MAX_MODEL_PAGES {
                self.model.unmap(a, src, o);
                return Ok((addr, Some((src, n))));
            }
            let last = self.model.ases[a].pages[&(vend - 1)].clone();
            self.model.extend(a, vend - 1, &last, delta);
            if last.flags & vm::LOCKED != 0 {
                self.model.populate_write(a, vend..vend + delta);
            }
            return Ok((addr, None));
        }
        if flags & MREMAP_MAYMOVE == 0 {
            return Err(Errno::NoMem);
        }
        let dst = self.model.unmapped_area(a, &cfg, 0, n, false).ok_or(Errno::NoMem)?;
        self.move_or_dup(a, src, o, dst, n, false);
        Ok((dst * PG, big(&mut self.model, dst)))
    }

    /// `move_vma`: `[src, src+o)` to `dst` grown to `n` pages; `o == 0` (a
    /// shared mapping) maps the same object pages again instead.
    pub(super) fn move_or_dup(&mut self, a: usize, src: u64, o: u64, dst: u64, n: u64, dontunmap: bool) {
        let m = &mut self.model;
        if o == 0 {
            let first = m.ases[a].pages[&src].clone();
            for j in 0..n.min(MAX_MODEL_PAGES + 1) {
                let mut p = MPage { cow: None, guard: false, ..first.clone() };
                if let Kind::Obj { idx, .. } = &mut p.kind {
                    *idx += j;
                }
                m.ases[a].pages.insert(dst + j, p);
            }
            return;
        }
        let left: Vec<(u64, MPage)> = if dontunmap {
            // The source keeps its VMA, but its entries (markers too) moved.
            (src..src + o).map(|pg| (pg, MPage { cow: None, guard: false, ..m.ases[a].pages[&pg].clone() })).collect()
        } else {
            Vec::new()
        };
        let n = n.min(MAX_MODEL_PAGES + 1);
        let locked = m.ases[a].pages[&src].flags & vm::LOCKED != 0;
        m.move_pages(a, src, o, dst, n.max(o));
        m.ases[a].pages.extend(left);
        if locked && n > o {
            // move_vma of a locked VMA populates what it grew by.
            m.populate_write(a, dst + o..dst + n);
        }
    }
}
