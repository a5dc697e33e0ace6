//! The sequential reference model of Linux's memory-mapping semantics shared
//! by the model-based property test (`tests/models/model.rs`) and the fuzz target
//! (`fuzz/fuzz_targets/ops.rs`, replayed by `tests/models/fuzz_corpus.rs`): one
//! entry per mapped page (protection, backing, private copy, the VMA flags
//! that change what later calls do) plus the contents of every file and
//! shared anonymous object. VMA boundaries are not modelled: where a result
//! depends on them the callers take them from softmm's `maps()`.
#![allow(dead_code)]

use std::collections::BTreeMap;

use softmm::{Fault, MapEntry, MmConfig, SegvCode};

/// The page size, in bytes.
pub const PG: u64 = 4096;
/// The page size, as a length.
pub const P: usize = PG as usize;

/// The access bits of a mapping: `PROT_READ`, `PROT_WRITE`, `PROT_EXEC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prot(pub u8);

impl Prot {
    /// `PROT_NONE`.
    pub const NONE: Prot = Prot(0);
    /// `PROT_READ`.
    pub const R: Prot = Prot(1);
    /// `PROT_READ | PROT_WRITE`.
    pub const RW: Prot = Prot(3);

    /// The access bits of `prot` (other bits ignored).
    pub fn from_bits(prot: i32) -> Prot {
        Prot((prot & 7) as u8)
    }

    /// The `PROT_*` bits.
    pub fn bits(self) -> i32 {
        i32::from(self.0)
    }

    /// Any access bit: x86 cannot refuse a read of a writable or executable page.
    pub fn readable(self) -> bool {
        self.0 != 0
    }

    /// `PROT_READ` itself (what `MADV_POPULATE_READ` checks).
    pub fn has_read(self) -> bool {
        self.0 & 1 != 0
    }

    /// `PROT_WRITE`.
    pub fn writable(self) -> bool {
        self.0 & 2 != 0
    }

    /// The first three characters of a maps line.
    pub fn perms(self) -> String {
        let b = |bit: u8, c: char| if self.0 & bit != 0 { c } else { '-' };
        [b(1, 'r'), b(2, 'w'), b(4, 'x')].iter().collect()
    }
}

/// A file or the object behind a shared anonymous mapping (tmpfs semantics:
/// every page below `ceil(size)` exists, reading zero unless written; the
/// bytes past EOF in the last page may be written through a shared mapping
/// and are exposed when the file grows, as on tmpfs). Pages are stored
/// sparsely, so huge sizes cost nothing.
#[derive(Clone, Debug)]
pub struct Obj {
    /// The inode number softmm reports for it.
    pub inode: u64,
    /// The size in bytes.
    pub size: u64,
    /// The pages written so far (index → contents); a missing page is zero.
    pub data: BTreeMap<u64, Box<[u8]>>,
}

impl Obj {
    /// An object of `size` zero bytes.
    pub fn new(inode: u64, size: u64) -> Obj {
        Obj { inode, size, data: BTreeMap::new() }
    }

    /// Pages below `ceil(size)`.
    pub fn pages(&self) -> u64 {
        self.size.div_ceil(PG)
    }

    /// Page `idx`'s contents.
    pub fn page(&self, idx: u64) -> Vec<u8> {
        self.data.get(&idx).map_or_else(|| vec![0; P], |p| p.to_vec())
    }

    /// Byte `off` of page `idx`.
    pub fn byte(&self, idx: u64, off: usize) -> u8 {
        self.data.get(&idx).map_or(0, |p| p[off])
    }

    /// Sets byte `off` of page `idx`.
    pub fn set_byte(&mut self, idx: u64, off: usize, v: u8) {
        self.data.entry(idx).or_insert_with(|| vec![0; P].into_boxed_slice())[off] = v;
    }

    /// `ftruncate`: shrinking zeroes the tail of the new last page and drops
    /// the pages past it; growing exposes what the last page holds.
    pub fn set_size(&mut self, size: u64) {
        if size < self.size {
            let first = size.div_ceil(PG);
            self.data.retain(|&k, _| k < first);
            if size % PG != 0 {
                if let Some(p) = self.data.get_mut(&(size / PG)) {
                    p[(size % PG) as usize..].fill(0);
                }
            }
        }
        self.size = size;
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` of `[off, off+len)` (saturating):
    /// zeroes, the size stays.
    pub fn punch(&mut self, off: u64, len: u64) {
        let end = off.saturating_add(len).min(self.pages() * PG);
        if off >= end {
            return;
        }
        let keys: Vec<u64> = self.data.range(off / PG..end.div_ceil(PG)).map(|(&k, _)| k).collect();
        for k in keys {
            let (lo, hi) = (off.max(k * PG), end.min((k + 1) * PG));
            if lo < hi {
                self.data.get_mut(&k).expect("listed")[(lo - k * PG) as usize..(hi - k * PG) as usize].fill(0);
            }
        }
    }

    /// `pwrite` (the caller checked the range).
    pub fn write_at(&mut self, off: u64, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let end = off + bytes.len() as u64;
        if end > self.size {
            self.set_size(end);
        }
        let mut done = 0;
        while done < bytes.len() {
            let x = off + done as u64;
            let (idx, in_page) = (x / PG, (x % PG) as usize);
            let n = (P - in_page).min(bytes.len() - done);
            let page = self.data.entry(idx).or_insert_with(|| vec![0; P].into_boxed_slice());
            page[in_page..in_page + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
    }

    /// `pread`: the bytes of `[off, off+len)` below the size.
    pub fn read_at(&self, off: u64, len: u64) -> Vec<u8> {
        let end = self.size.min(off.saturating_add(len));
        let mut out = Vec::with_capacity(end.saturating_sub(off) as usize);
        let mut x = off;
        while x < end {
            let (idx, in_page) = (x / PG, (x % PG) as usize);
            let n = ((PG - x % PG).min(end - x)) as usize;
            match self.data.get(&idx) {
                Some(p) => out.extend_from_slice(&p[in_page..in_page + n]),
                None => out.resize(out.len() + n, 0),
            }
            x += n as u64;
        }
        out
    }
}

/// What a mapped page shows when it has no private copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Private anonymous memory.
    Anon,
    /// Page `idx` of object `obj`, mapped shared or private.
    Obj {
        /// `MAP_SHARED`.
        shared: bool,
        /// Index into [`Model::objs`].
        obj: usize,
        /// The page's index in the object.
        idx: u64,
    },
}

/// The VMA flags of a page that change what later calls do.
pub mod vm {
    /// `VM_LOCKED` (`MAP_LOCKED`): `MADV_DONTNEED` and `MADV_FREE` refuse it.
    pub const LOCKED: u8 = 1;
    /// `VM_DONTCOPY` (`MADV_DONTFORK`): not in a forked child.
    pub const DONTCOPY: u8 = 2;
    /// `VM_WIPEONFORK`: empty in a forked child.
    pub const WIPEONFORK: u8 = 4;
    /// Opened read-only and mapped shared: `mprotect` may not add write (`VM_MAYWRITE` clear).
    pub const NOMAYWRITE: u8 = 8;
    /// `VM_DROPPABLE` (`MAP_DROPPABLE`, which also sets `VM_WIPEONFORK`):
    /// `MADV_KEEPONFORK` and `MADV_DODUMP` refuse it.
    pub const DROPPABLE: u8 = 16;
    /// `VM_GROWSDOWN` (`MAP_GROWSDOWN`): an access below grows it, and no
    /// mapping is placed within `stack_guard_gap` below it.
    pub const GROWSDOWN: u8 = 32;
}

/// A mapped page.
#[derive(Clone, Debug)]
pub struct MPage {
    /// Its protection.
    pub prot: Prot,
    /// Its backing.
    pub kind: Kind,
    /// A private page's own copy, once written (or inherited through fork).
    pub cow: Option<Box<[u8]>>,
    /// [`vm`] flags.
    pub flags: u8,
    /// A guard marker (`MADV_GUARD_INSTALL`) is in its page-table entry: an
    /// access raises `SIGSEGV` (`SEGV_MAPERR`); `MADV_DONTNEED`, `MADV_FREE`,
    /// a hole punch and truncation keep it, `fork` copies it (not into a
    /// `VM_WIPEONFORK` VMA), `mremap` moves it, unmapping drops it.
    pub guard: bool,
}

impl MPage {
    /// A fresh page: no private copy, no flags.
    pub fn new(prot: Prot, kind: Kind) -> MPage {
        MPage { prot, kind, cow: None, flags: 0, guard: false }
    }

    /// Private (a write makes a copy).
    pub fn private(&self) -> bool {
        !matches!(self.kind, Kind::Obj { shared: true, .. })
    }
}

/// An address space: its pages, by page number, and its heap.
#[derive(Clone, Default, Debug)]
pub struct MAs {
    /// Mapped pages.
    pub pages: BTreeMap<u64, MPage>,
    /// The current break (`mm->brk`), in bytes.
    pub brk: u64,
}

/// The reference model: objects and address spaces.
#[derive(Default)]
pub struct Model {
    /// Files (first) and shared anonymous objects.
    pub objs: Vec<Obj>,
    /// Address spaces.
    pub ases: Vec<MAs>,
}

impl Model {
    /// The signal an access to `va` raises, if any: x86-64's general
    /// protection fault (`SI_KERNEL`, address 0) for a non-canonical
    /// address, `SEGV_MAPERR` for an unmapped one (the kernel half included).
    pub fn fault(&self, a: usize, va: u64, write: bool) -> Option<Fault> {
        if !matches!((va as i64) >> 47, 0 | -1) {
            return Some(Fault::Segv { addr: 0, code: SegvCode::Kernel });
        }
        let Some(p) = self.ases[a].pages.get(&(va / PG)) else {
            return Some(Fault::Segv { addr: va, code: SegvCode::MapErr });
        };
        let allowed = if write { p.prot.writable() } else { p.prot.readable() };
        if !allowed {
            return Some(Fault::Segv { addr: va, code: SegvCode::AccErr });
        }
        if p.guard {
            // handle_pte_marker: VM_FAULT_SIGSEGV, after the access check.
            return Some(Fault::Segv { addr: va, code: SegvCode::MapErr });
        }
        if let Kind::Obj { obj, idx, .. } = p.kind {
            if p.cow.is_none() && idx >= self.objs[obj].pages() {
                return Some(Fault::Bus { addr: va });
            }
        }
        None
    }

    /// The current contents of a mapped page (assumed accessible).
    pub fn page_contents(&self, a: usize, pg: u64) -> Vec<u8> {
        let p = &self.ases[a].pages[&pg];
        match (&p.cow, p.kind) {
            (Some(c), _) => c.to_vec(),
            (None, Kind::Anon) => vec![0; P],
            (None, Kind::Obj { obj, idx, .. }) => self.objs[obj].page(idx),
        }
    }

    /// The byte at `va` (its page mapped).
    pub fn read_byte(&self, a: usize, va: u64) -> u8 {
        let p = &self.ases[a].pages[&(va / PG)];
        let off = (va % PG) as usize;
        match (&p.cow, p.kind) {
            (Some(c), _) => c[off],
            (None, Kind::Anon) => 0,
            (None, Kind::Obj { obj, idx, .. }) => self.objs[obj].byte(idx, off),
        }
    }

    /// Makes page `pg` private to the mapping if it is a private page without
    /// a copy (a write fault's COW break, or `MADV_POPULATE_WRITE`).
    pub fn break_cow(&mut self, a: usize, pg: u64) {
        let p = &self.ases[a].pages[&pg];
        if p.private() && p.cow.is_none() {
            let copy = self.page_contents(a, pg).into_boxed_slice();
            self.ases[a].pages.get_mut(&pg).expect("mapped").cow = Some(copy);
        }
    }

    /// Linux's `populate_vma_page_range` on `pages` (mapped): a private
    /// writable page is faulted in for write (`FOLL_WRITE`), so it gets its
    /// own copy, which later file writes do not change; a page past EOF
    /// (SIGBUS) stops the walk of its VMA, and only pages past EOF follow it
    /// there. What `MAP_POPULATE`, `MAP_LOCKED`, growing a locked VMA and
    /// making a locked VMA writable do.
    pub fn populate_write(&mut self, a: usize, pages: impl IntoIterator<Item = u64>) {
        for pg in pages {
            let p = &self.ases[a].pages[&pg];
            let in_file = match p.kind {
                Kind::Obj { obj, idx, .. } => p.cow.is_some() || idx < self.objs[obj].pages(),
                Kind::Anon => true,
            };
            if p.private() && p.prot.writable() && in_file {
                self.break_cow(a, pg);
            }
        }
    }

    /// Stores `v` at `va` (its page mapped and writable).
    pub fn write_byte(&mut self, a: usize, va: u64, v: u8) {
        let pg = va / PG;
        let off = (va % PG) as usize;
        if let Kind::Obj { shared: true, obj, idx } = self.ases[a].pages[&pg].kind {
            self.objs[obj].set_byte(idx, off, v);
            return;
        }
        self.break_cow(a, pg);
        self.ases[a].pages.get_mut(&pg).expect("mapped").cow.as_mut().expect("cow")[off] = v;
    }

    /// `Cpu::read`: page by page, stopping at the first fault.
    pub fn read(&self, a: usize, va: u64, len: usize) -> Result<Vec<u8>, Fault> {
        let mut out = Vec::with_capacity(len);
        let mut done = 0;
        while done < len {
            let x = va + done as u64;
            let n = ((PG - x % PG) as usize).min(len - done);
            if let Some(f) = self.fault(a, x, false) {
                return Err(f);
            }
            out.extend((0..n).map(|i| self.read_byte(a, x + i as u64)));
            done += n;
        }
        Ok(out)
    }

    /// `Cpu::write`: page by page; the pages before a fault are written.
    pub fn write(&mut self, a: usize, va: u64, data: &[u8]) -> Result<(), Fault> {
        let mut done = 0;
        while done < data.len() {
            let x = va + done as u64;
            let n = ((PG - x % PG) as usize).min(data.len() - done);
            if let Some(f) = self.fault(a, x, true) {
                return Err(f);
            }
            for i in 0..n {
                self.write_byte(a, x + i as u64, data[done + i]);
            }
            done += n;
        }
        Ok(())
    }

    /// No page of `[pg, pg+n)` is mapped.
    pub fn is_free(&self, a: usize, pg: u64, n: u64) -> bool {
        self.ases[a].pages.range(pg..pg.saturating_add(n)).next().is_none()
    }

    /// The mapped pages of `[pg, pg+n)`.
    pub fn mapped_in(&self, a: usize, pg: u64, n: u64) -> Vec<u64> {
        self.ases[a].pages.range(pg..pg.saturating_add(n)).map(|(&k, _)| k).collect()
    }

    /// Where a free range ending at page `top` must end instead (pages):
    /// `stack_guard_gap` below a growsdown mapping starting there or, for
    /// the first free page above, wherever it starts (`vm_start_gap`).
    pub fn gap_end(&self, a: usize, top: u64) -> u64 {
        match self.ases[a].pages.range(top..).next() {
            Some((&pg, p)) if p.flags & vm::GROWSDOWN != 0 => {
                top.min(pg.saturating_sub(MmConfig::default().stack_guard_gap / PG))
            }
            _ => top,
        }
    }

    /// `[pg, pg+n)` is free and ends clear of the guard gap of a growsdown
    /// mapping above (a hint `get_unmapped_area` takes).
    pub fn fits(&self, a: usize, pg: u64, n: u64) -> bool {
        self.is_free(a, pg, n) && pg.checked_add(n).is_some_and(|e| self.gap_end(a, e) >= e)
    }

    /// The highest free run of `n` pages within `[low, high)` (pages),
    /// clear of growsdown guard gaps.
    pub fn topdown_in(&self, a: usize, n: u64, low: u64, high: u64) -> Option<u64> {
        let mut top = self.gap_end(a, high);
        for &pg in self.ases[a].pages.range(..high).rev().map(|(k, _)| k) {
            let bottom = (pg + 1).max(low);
            if top >= bottom && top - bottom >= n {
                return Some(top - n);
            }
            top = self.gap_end(a, pg).min(high);
            if pg < low {
                break;
            }
        }
        (top >= low && top - low >= n).then(|| top - n)
    }

    /// The lowest free run of `n` pages within `[low, high)` (pages), clear
    /// of growsdown guard gaps below `high`.
    pub fn bottomup_in(&self, a: usize, n: u64, low: u64, high: u64) -> Option<u64> {
        let mut bottom = low;
        for &pg in self.ases[a].pages.range(low..high).map(|(k, _)| k) {
            let top = self.gap_end(a, pg);
            if top >= bottom && top - bottom >= n {
                return Some(bottom);
            }
            bottom = bottom.max(pg + 1);
        }
        (high >= bottom && high - bottom >= n).then_some(bottom)
    }

    /// Linux's top-down `get_unmapped_area` without a hint: the highest free
    /// range of `n` pages ending at or below `mmap_base`.
    pub fn topdown(&self, a: usize, n: u64) -> u64 {
        let cfg = MmConfig::default();
        self.topdown_in(a, n, cfg.mmap_min_addr.max(PG) / PG, cfg.mmap_base / PG).expect("room")
    }

    /// Linux x86-64's `get_unmapped_area` for `n` pages (not THP-aligned):
    /// `fixed` returns `hint`; a free page-aligned `hint` clear of a growsdown
    /// mapping's guard gap is honoured; else top-down below `mmap_base`,
    /// then bottom-up from `TASK_SIZE / 3`. In pages; `None` is `ENOMEM`.
    pub fn unmapped_area(&self, a: usize, cfg: &MmConfig, hint: u64, n: u64, fixed: bool) -> Option<u64> {
        let (task, min) = (cfg.task_size / PG, cfg.mmap_min_addr / PG);
        if n > task || n > task - min {
            return None;
        }
        let hint_fits = hint != 0 && task - n >= hint && self.fits(a, hint, n);
        let pick = if fixed || hint_fits {
            hint
        } else {
            let low = cfg.mmap_min_addr.max(PG) / PG;
            match self.topdown_in(a, n, low, cfg.mmap_base / PG) {
                Some(x) => x,
                None => {
                    let base = (cfg.task_size / 3).div_ceil(PG).max(low);
                    self.bottomup_in(a, n, base, task)?
                }
            }
        };
        (pick <= task - n).then_some(pick)
    }

    /// Unmaps `[pg, pg+n)`.
    pub fn unmap(&mut self, a: usize, pg: u64, n: u64) {
        for k in self.mapped_in(a, pg, n) {
            self.ases[a].pages.remove(&k);
        }
    }

    /// Moves `[src, src+old)` (all mapped) to `dst`, growing it to
    /// `new` pages that continue the last page's object linearly.
    pub fn move_pages(&mut self, a: usize, src: u64, old: u64, dst: u64, new: u64) {
        let last = self.ases[a].pages[&(src + old - 1)].clone();
        let moved: Vec<MPage> =
            (0..old).map(|i| self.ases[a].pages.remove(&(src + i)).expect("source page mapped")).collect();
        for (i, p) in moved.into_iter().enumerate() {
            self.ases[a].pages.insert(dst + i as u64, p);
        }
        self.extend(a, dst + old - 1, &last, new - old);
    }

    /// Maps `extra` pages after `end_pg`, continuing `last` (its page).
    pub fn extend(&mut self, a: usize, end_pg: u64, last: &MPage, extra: u64) {
        for j in 1..=extra {
            let kind = match last.kind {
                Kind::Anon => Kind::Anon,
                Kind::Obj { shared, obj, idx } => Kind::Obj { shared, obj, idx: idx + j },
            };
            self.ases[a].pages.insert(end_pg + j, MPage { cow: None, ..MPage::new(last.prot, kind) });
            self.ases[a].pages.get_mut(&(end_pg + j)).expect("inserted").flags = last.flags;
        }
    }

    /// `ftruncate` of object `obj`: shrinking also zaps private COW copies
    /// of the pages past the new last page, as Linux does.
    pub fn truncate(&mut self, obj: usize, size: u64) {
        if size < self.objs[obj].size {
            let first = size.div_ceil(PG);
            for m in &mut self.ases {
                for p in m.pages.values_mut() {
                    if let Kind::Obj { shared: false, obj: o, idx } = p.kind {
                        if o == obj && idx >= first {
                            p.cow = None;
                        }
                    }
                }
            }
        }
        self.objs[obj].set_size(size);
    }

    /// `fork`'s `dup_mmap`: the child's pages. `MADV_DONTFORK` pages are left
    /// out, `MADV_WIPEONFORK` pages are empty (their page tables are not
    /// copied, guard markers included), `VM_LOCKED` is not inherited.
    pub fn fork(&self, a: usize) -> MAs {
        let parent = &self.ases[a];
        let pages = parent
            .pages
            .iter()
            .filter(|(_, p)| p.flags & vm::DONTCOPY == 0)
            .map(|(&k, p)| {
                let mut c = p.clone();
                if p.flags & vm::WIPEONFORK != 0 {
                    c.cow = None;
                    c.guard = false;
                }
                c.flags &= !vm::LOCKED;
                (k, c)
            })
            .collect();
        MAs { pages, brk: parent.brk }
    }

    /// Per page: perms (`rw-p`), inode and file page index (0 for anonymous).
    pub fn layout(&self, a: usize) -> BTreeMap<u64, (String, u64, u64)> {
        self.ases[a]
            .pages
            .iter()
            .map(|(&pg, p)| {
                let (s, inode, idx) = match p.kind {
                    Kind::Anon => ('p', 0, 0),
                    Kind::Obj { shared, obj, idx } => (if shared { 's' } else { 'p' }, self.objs[obj].inode, idx),
                };
                (pg, (format!("{}{}", p.prot.perms(), s), inode, idx))
            })
            .collect()
    }
}

/// Per page of softmm's `maps()`: perms, inode and file page index.
pub fn real_layout(maps: &[MapEntry]) -> BTreeMap<u64, (String, u64, u64)> {
    let mut out = BTreeMap::new();
    for e in maps {
        for (i, pg) in (e.start / PG..e.end / PG).enumerate() {
            let idx = if e.inode == 0 { 0 } else { e.offset / PG + i as u64 };
            out.insert(pg, (e.perms.clone(), e.inode, idx));
        }
    }
    out
}

/// How a page read through softmm (`got`) differs from the model's (`want`),
/// for a failure message: the first differing byte, or the two faults.
pub fn describe_difference(got: &Result<Vec<u8>, Fault>, want: &Result<Vec<u8>, Fault>) -> String {
    match (got, want) {
        (Ok(g), Ok(w)) => match (0..g.len().min(w.len())).find(|&i| g[i] != w[i]) {
            Some(i) => format!("byte {i:#x}: softmm {:#04x}, model {:#04x}", g[i], w[i]),
            None => format!("softmm {} bytes, model {}", g.len(), w.len()),
        },
        _ => format!("softmm {:?}, model {:?}", got.as_ref().err(), want.as_ref().err()),
    }
}
