//! The harness of the `cargo fuzz` target `hugetlb` (`fuzz/fuzz_targets/hugetlb.rs`),
//! replayed by `tests/models/fuzz_corpus.rs`: hugetlb mappings (anonymous
//! `MAP_HUGETLB`, private and shared, with and without `MAP_NORESERVE`) and
//! small private anonymous ones on an arena of two NUMA nodes with a pool of
//! two huge pages each, driven by `munmap`, `MADV_DONTNEED`, `fork`, exit,
//! guest reads and writes, `pin_user_pages` and unpins with the device
//! view's reads and writes, `move_pages` and `mbind(MPOL_BIND,
//! MPOL_MF_MOVE)`. Each call runs on softmm and on this file's model of
//! Linux's hugetlb (`mm/hugetlb.c`: reservations, the pool, private COW with
//! the reservation owner's `unmap_ref_private`, pins, migration), which
//! predicts results, errnos, faults and signals, the data of every page, the
//! node of every page (`move_pages`' query), and after every step the pool's
//! `HugePages_Free` (per node too) and `HugePages_Rsvd` (where Linux's
//! count wraps below zero, after an owner's `MADV_DONTNEED` of a page a
//! child still maps and the owner's exit, softmm shows 0, as documented in
//! `hugetlb/pool.rs`), with `free + used = total`. At the end every mapped page and every pin must
//! read what the model says, and dropping everything must give every frame
//! back to the arena and every huge page back to the pool with no
//! reservation left.
//!
//! The model follows Linux everywhere it models: a hugetlb page for an
//! `MPOL_BIND` mapping comes only from the mask's nodes
//! (`dequeue_hugetlb_folio_nodemask`); `fork` fails with `ENOMEM` whatever
//! `dup_mmap` failed with (`copy_mm`); a moved huge page's source goes back
//! to the pool at once (`unmap_and_move_huge_page`); the reservation
//! owner's COW and unshare take a shared private huge page back from the
//! children when no page is left for the copy (`unmap_ref_private`), and
//! retry; an unshare reuses a small page whose only reference is its entry
//! (`wp_can_reuse_anon_folio`); `MADV_DONTNEED` in the owner restores the
//! reservation of every anonymous page it zaps, whoever else holds it
//! (`__unmap_hugepage_range`); migration keeps `PG_ANON_EXCLUSIVE` (a pin of
//! a migrated page pins it where it is); and the pool's counts are compared
//! right after each call (shared memory is released before `munmap` or the
//! last close returns). No input class is relaxed or skipped for a softmm
//! defect; the inputs once kept for such defects (`fuzz/regressions/hugetlb/`)
//! run as regression tests.
//!
//! Small pages have no zero-page model: `move_pages` on a small page never
//! written may say `-EFAULT` (the zero page) or `-ENOENT` (nothing mapped).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use softmm::uapi::*;
use softmm::{
    AddressSpace, Cpu, Errno, Fault, FaultPolicy, Foll, MmConfig, PhysConfig, PhysMem, PinnedPages, SegvCode,
    MPOL_BIND, MPOL_MF_MOVE,
};

const ENOENT: i32 = 2;
const EACCES: i32 = 13;
const EFAULT: i32 = 14;

/// A huge page.
pub const HP: u64 = 2 << 20;
/// A small page.
pub const SP: u64 = 4096;
/// Nodes of the arena.
pub const NODES: usize = 2;
/// Huge pages in each node's pool.
pub const POOL_PER_NODE: u64 = 2;
/// Most address spaces alive at once.
pub const MAX_AS: usize = 3;
/// Most operations decoded from one input.
pub const MAX_OPS: usize = 48;

/// One operation. `region` picks one of the address space's mappings (in
/// address order), `page` a page of it (modulo its length).
#[derive(Arbitrary, Clone, Debug)]
pub enum HOp {
    /// `mmap` of `pages` huge (1 to 3) or small (1 to 8) pages, private or
    /// shared (huge only), `MAP_NORESERVE`; `tail` passes a length that is
    /// not a multiple of the page size.
    Map { asi: u8, huge: bool, shared: bool, noreserve: bool, pages: u8, tail: bool },
    /// `munmap` of `count` pages of a mapping from `page`; `unaligned`
    /// starts one small page further (inside a huge page: `EINVAL`).
    Unmap { asi: u8, region: u8, page: u8, count: u8, unaligned: bool },
    /// A 64-bit read, or a write of `write`, at word `word` of a page.
    Access { asi: u8, cpu: bool, region: u8, page: u8, word: u16, write: Option<u64> },
    /// `fork`.
    Fork { asi: u8 },
    /// Drop an address space (unless it is the last).
    Exit { asi: u8 },
    /// `MADV_DONTNEED` of `count` pages from `page`.
    DontNeed { asi: u8, region: u8, page: u8, count: u8 },
    /// `pin_user_pages` of `n` (1 to 4) small pages from small page `sub`
    /// of a huge page, or from a small page.
    Pin { asi: u8, region: u8, page: u8, sub: u16, n: u8, write: bool },
    /// Drop a pin handle.
    Unpin { pin: u8 },
    /// The device reads, or writes `write`, word `word` of a pin's pages.
    Device { pin: u8, word: u16, write: Option<u64> },
    /// `move_pages` of one page to a node.
    MovePages { asi: u8, region: u8, page: u8, node: bool },
    /// `mbind(MPOL_BIND, {node}, MPOL_MF_MOVE)` of `count` pages from `page`.
    Mbind { asi: u8, region: u8, page: u8, count: u8, node: bool },
}

/// A whole input: the fault policy and the operations.
#[derive(Clone, Debug)]
pub struct HInput {
    /// The address spaces' fault policy.
    pub policy: FaultPolicy,
    /// The operations.
    pub ops: Vec<HOp>,
}

impl<'a> Arbitrary<'a> for HInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let policy = FaultPolicy::ALL[usize::from(u.arbitrary::<u8>()?) % FaultPolicy::ALL.len()];
        let mut ops = Vec::new();
        while ops.len() < MAX_OPS && !u.is_empty() {
            ops.push(u.arbitrary()?);
        }
        Ok(HInput { policy, ops })
    }
}

/// The arena: two nodes of 8 MiB of small frames and `POOL_PER_NODE` huge
/// pages each.
pub fn arena() -> Arc<PhysMem> {
    let per_node = (8 << 20) + (POOL_PER_NODE + 1) * HP;
    PhysMem::new(PhysConfig::new(NODES as u64 * per_node).nodes(NODES).hugepages(POOL_PER_NODE)).expect("arena")
}

/// Decodes and runs `data` (inputs too short to decode pass).
pub fn run_bytes(data: &[u8], phys: &Arc<PhysMem>) -> Result<(), String> {
    match HInput::arbitrary(&mut Unstructured::new(data)) {
        Ok(input) => run(&input, phys),
        Err(_) => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// The model.

/// A page of memory: its words written so far (offset → value; the rest
/// reads zero), where it is, and what holds it besides page tables.
#[derive(Clone, Debug)]
struct MPage {
    huge: bool,
    data: BTreeMap<u64, u64>,
    node: usize,
    /// Pinned small pages (a huge page counts one per pinned 4 KiB).
    pins: u32,
    /// In its file's page cache (shared hugetlb).
    in_file: bool,
    /// `PG_HUGETLB_RESTORE_RESERVE`: freeing it gives its reservation back.
    restore: bool,
    /// A small page's `PG_ANON_EXCLUSIVE`: set where it is allocated or
    /// reused by a write, cleared by `fork` sharing it (migration keeps
    /// it).
    excl: bool,
}

/// The pseudo-file of one hugetlb `mmap` (`/anon_hugepage`): for a shared
/// mapping its page cache and reserve map; for a private one the owner's
/// unused reservations (Linux's reversed private reserve map).
#[derive(Clone, Debug, Default)]
struct MFile {
    pages: BTreeMap<u64, usize>,
    resv: BTreeSet<u64>,
}

/// One mapped page of an address space.
#[derive(Clone, Debug)]
struct Slot {
    /// Which `mmap` made it (kept by forks).
    map: usize,
    huge: bool,
    shared: bool,
    /// The pseudo-file (hugetlb only).
    file: usize,
    /// Its index in the file.
    idx: u64,
    /// A private hugetlb page of the address space that made the mapping
    /// with reservations (`HPAGE_RESV_OWNER`).
    owner: bool,
    /// The page mapped (`None`: no entry, or the zero page).
    page: Option<usize>,
    /// `HPAGE_RESV_UNMAPPED`: the owner took a page from this mapping.
    marked: bool,
    /// An `MPOL_BIND` node.
    bind: Option<usize>,
}

/// A mapping as made (where its pages were).
#[derive(Clone, Copy, Debug)]
struct MapInfo {
    start: u64,
    size: u64,
    pages: u64,
}

/// A pin handle: per small page, the page and the offset in it.
struct Pin {
    real: PinnedPages,
    write: bool,
    pages: Vec<(Option<usize>, u64)>,
}

#[derive(Default)]
struct Model {
    pages: BTreeMap<usize, MPage>,
    next_page: usize,
    files: Vec<Option<MFile>>,
    maps: Vec<MapInfo>,
    /// Per address space, its slots by address.
    ases: Vec<BTreeMap<u64, Slot>>,
}

/// Why a fault failed.
enum NoPage {
    Bus,
}

impl Model {
    fn mapcount(&self, p: usize) -> usize {
        self.ases.iter().flat_map(|s| s.values()).filter(|s| s.page == Some(p)).count()
    }

    fn node_free(&self, node: usize) -> u64 {
        POOL_PER_NODE - self.pages.values().filter(|p| p.huge && p.node == node).count() as u64
    }

    fn free(&self) -> u64 {
        (0..NODES).map(|n| self.node_free(n)).sum()
    }

    /// `HugePages_Rsvd`: the reservations promised, less those of freed
    /// pages still to come back (`PG_HUGETLB_RESTORE_RESERVE`), as Linux
    /// counts them (signed: Linux's count can dip below the promises).
    fn rsvd(&self) -> i64 {
        let promised: usize = self.files.iter().flatten().map(|f| f.resv.len()).sum();
        promised as i64 - self.pages.values().filter(|p| p.restore).count() as i64
    }

    /// Free pages nobody reserved.
    fn available(&self) -> i64 {
        self.free() as i64 - self.rsvd()
    }

    /// The slot holding `addr` in `a`: a small page's, or a huge page's.
    fn slot_of(&self, a: usize, addr: u64) -> Option<u64> {
        let small = addr & !(SP - 1);
        if self.ases[a].get(&small).is_some_and(|s| !s.huge) {
            return Some(small);
        }
        let huge = addr & !(HP - 1);
        self.ases[a].get(&huge).is_some_and(|s| s.huge).then_some(huge)
    }

    /// Whether `[start, end)` has a hole (a page no slot holds).
    fn has_hole(&self, a: usize, start: u64, end: u64) -> bool {
        let mut x = start;
        while x < end {
            match self.slot_of(a, x) {
                Some(k) => x = k + if self.ases[a][&k].huge { HP } else { SP },
                None => return true,
            }
        }
        false
    }

    /// Whether `x` lies strictly inside a huge page of `a` (a split there is `EINVAL`).
    fn inside_huge(&self, a: usize, x: u64) -> bool {
        self.slot_of(a, x).is_some_and(|k| self.ases[a][&k].huge && k != x)
    }

    /// `alloc_hugetlb_folio`'s dequeue: a reserved allocation takes any
    /// free page, an unreserved one only if more are free than reserved;
    /// node 0 first, else node 1; a page of an `MPOL_BIND` mapping only
    /// from the mask's node (`dequeue_hugetlb_folio_nodemask`: `SIGBUS`, or
    /// `fork`'s `ENOMEM`, when it has none free).
    fn huge_node(&self, bind: Option<usize>, reserved: bool) -> Option<usize> {
        if !reserved && self.available() <= 0 {
            return None;
        }
        match bind {
            Some(n) => (self.node_free(n) > 0).then_some(n),
            None => (0..NODES).find(|&n| self.node_free(n) > 0),
        }
    }

    fn new_page(&mut self, huge: bool, node: usize, data: BTreeMap<u64, u64>) -> usize {
        let id = self.next_page;
        self.next_page += 1;
        let p = MPage { huge, data, node, pins: 0, in_file: false, restore: false, excl: true };
        self.pages.insert(id, p);
        id
    }

    /// Frees `p` if nothing holds it any more.
    fn maybe_free(&mut self, p: usize) {
        let held = self.pages.get(&p).is_none_or(|pg| pg.pins > 0 || pg.in_file) || self.mapcount(p) > 0;
        if !held {
            self.pages.remove(&p);
        }
    }

    /// A file dies with its last mapping: its reservations go back, its
    /// pages leave the page cache.
    fn maybe_kill_file(&mut self, f: usize) {
        if self.ases.iter().flat_map(|s| s.values()).any(|s| s.huge && s.file == f) {
            return;
        }
        if let Some(file) = self.files[f].take() {
            for (_, p) in file.pages {
                self.pages.get_mut(&p).expect("cached").in_file = false;
                self.maybe_free(p);
            }
        }
    }

    /// Removes the slot at `va` of address space `a` (munmap, exit): its
    /// page's mapping and, for the owner, the reservation of its index.
    fn remove_slot(&mut self, a: usize, va: u64) {
        let s = self.ases[a].remove(&va).expect("slot");
        if s.owner {
            if let Some(f) = self.files[s.file].as_mut() {
                f.resv.remove(&s.idx);
            }
        }
        if let Some(p) = s.page {
            self.maybe_free(p);
        }
        if s.huge {
            self.maybe_kill_file(s.file);
        }
    }

    /// A fault on slot `va` of `a`: a write, an unshare (a read pin of a
    /// page shared with another mapping) or a read. `Err` is `SIGBUS`.
    /// `vma_of` gives softmm's VMA bounds (for the owner's marks).
    fn fault(
        &mut self,
        a: usize,
        va: u64,
        write: bool,
        unshare: bool,
        vma_of: &dyn Fn(usize, u64) -> (u64, u64),
    ) -> Result<(), NoPage> {
        let s = self.ases[a][&va].clone();
        match s.page {
            Some(p) => {
                if !(write || unshare) || s.shared {
                    return Ok(());
                }
                // A small page: a write or an unshare reuses a page only this
                // entry holds (`wp_can_reuse_anon_folio`). A huge page: reused
                // if only this entry maps it (`hugetlb_wp`).
                let pg = &self.pages[&p];
                let reuse = if s.huge {
                    self.mapcount(p) == 1
                } else {
                    // An exclusive page is mapped writable: no fault at all.
                    pg.excl || (self.mapcount(p) == 1 && pg.pins == 0)
                };
                if reuse {
                    self.pages.get_mut(&p).expect("page").excl = true;
                    return Ok(());
                }
                // Copy on write (or unshare): never from a reservation.
                let node = if s.huge { self.huge_node(s.bind, false) } else { Some(s.bind.unwrap_or(0)) };
                if let Some(node) = node {
                    let data = self.pages[&p].data.clone();
                    let q = self.new_page(s.huge, node, data);
                    self.ases[a].get_mut(&va).expect("slot").page = Some(q);
                    self.maybe_free(p);
                    return Ok(());
                }
                if !s.owner {
                    return Err(NoPage::Bus);
                }
                // unmap_ref_private (a write or an unshare): the owner takes
                // the page from every other private mapping of the file that
                // maps it, marks their VMAs, and retries: the page is now
                // mapped only here, and reused.
                for b in 0..self.ases.len() {
                    let hits: Vec<u64> = self.ases[b]
                        .iter()
                        .filter(|(&v, t)| (b, v) != (a, va) && t.page == Some(p) && !t.owner && !t.shared)
                        .map(|(&v, _)| v)
                        .collect();
                    for v in hits {
                        let (lo, hi) = vma_of(b, v);
                        for (_, t) in self.ases[b].range_mut(lo..hi) {
                            if t.huge && t.file == s.file {
                                t.marked = true;
                            }
                        }
                        self.ases[b].get_mut(&v).expect("slot").page = None;
                    }
                }
                Ok(())
            }
            None if !s.huge => {
                if write {
                    let q = self.new_page(false, s.bind.unwrap_or(0), BTreeMap::new());
                    self.ases[a].get_mut(&va).expect("slot").page = Some(q);
                }
                Ok(())
            }
            None => {
                if s.marked {
                    return Err(NoPage::Bus);
                }
                if s.shared {
                    if let Some(&p) = self.files[s.file].as_ref().expect("file").pages.get(&s.idx) {
                        self.ases[a].get_mut(&va).expect("slot").page = Some(p);
                        return Ok(());
                    }
                }
                let file = self.files[s.file].as_ref().expect("file");
                let reserved = (s.shared || s.owner) && file.resv.contains(&s.idx);
                let node = self.huge_node(s.bind, reserved).ok_or(NoPage::Bus)?;
                let q = self.new_page(true, node, BTreeMap::new());
                let file = self.files[s.file].as_mut().expect("file");
                if reserved {
                    file.resv.remove(&s.idx);
                }
                if s.shared {
                    file.pages.insert(s.idx, q);
                    self.pages.get_mut(&q).expect("new").in_file = true;
                }
                self.ases[a].get_mut(&va).expect("slot").page = Some(q);
                Ok(())
            }
        }
    }

    /// Whether a migration to `node` finds a page: a free huge page of the
    /// node that nobody reserved (`alloc_hugetlb_folio_nodemask`), or a
    /// small frame.
    fn migration_target(&self, huge: bool, node: usize) -> bool {
        !huge || (self.node_free(node) > 0 && self.available() > 0)
    }
}

// ---------------------------------------------------------------------------
// The run.

struct Real {
    cpus: [Cpu; 2],
    mm: Arc<AddressSpace>,
}

struct World<'a> {
    phys: &'a Arc<PhysMem>,
    policy: FaultPolicy,
    m: Model,
    real: Vec<Real>,
    pins: Vec<Pin>,
    log: Vec<String>,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

mod calls;

/// Runs `input` on softmm and on the model; `Err` describes the first
/// disagreement or leak, with the operations that led to it. `phys` must
/// be [`arena`]'s with nothing allocated; it is left so.
pub fn run(input: &HInput, phys: &Arc<PhysMem>) -> Result<(), String> {
    let mut w =
        World { phys, policy: input.policy, m: Model::default(), real: Vec::new(), pins: Vec::new(), log: Vec::new() };
    let r = w.run(input);
    let log = std::mem::take(&mut w.log);
    drop(w);
    let leak = {
        let s = phys.quiesce();
        let h = phys.huge_page_stats();
        if (s.frames_used, s.page_tables, s.vmas) != (0, 0, 0) {
            Some(format!("leak after dropping everything: {s:?}"))
        } else if h.free != h.total || h.rsvd != 0 || h.surp != 0 {
            Some(format!("the pool is not whole after dropping everything: {h:?}"))
        } else {
            None
        }
    };
    match (r, leak) {
        (Ok(()), None) => Ok(()),
        (Err(e), _) | (Ok(()), Some(e)) => Err(format!("{e}\n--- ops ({:?}):\n{}", input.policy, log.join("\n"))),
    }
}

impl World<'_> {
    fn run(&mut self, input: &HInput) -> Result<(), String> {
        let mm = AddressSpace::new(self.phys, MmConfig::default().policy(self.policy))
            .map_err(|e| format!("AddressSpace::new: {e:?}"))?;
        self.real.push(Real { cpus: [Cpu::attached(&mm), Cpu::attached(&mm)], mm });
        self.m.ases.push(BTreeMap::new());
        for (step, op) in input.ops.iter().enumerate() {
            self.log.push(format!("{step:2}: {op:?}"));
            let line = self.apply(op).map_err(|e| format!("step {step}: {e}"))?;
            *self.log.last_mut().expect("pushed") = format!("{step:2}: {line}");
            self.check_pool().map_err(|e| format!("after step {step}: {e}"))?;
            self.check_nodes().map_err(|e| format!("after step {step}: {e}"))?;
        }
        self.check_contents()
    }

    fn asi(&self, asi: u8) -> usize {
        usize::from(asi) % self.real.len()
    }

    /// The address of page `page` of the `region`-th mapping of `a` (in
    /// address order of what is left of each), with its mapping.
    fn region(&self, a: usize, region: u8, page: u8) -> Option<(MapInfo, u64)> {
        let mut ids: Vec<(u64, usize)> = Vec::new();
        for (&va, s) in &self.m.ases[a] {
            if !ids.iter().any(|&(_, m)| m == s.map) {
                ids.push((va, s.map));
            }
        }
        if ids.is_empty() {
            return None;
        }
        let (_, id) = ids[usize::from(region) % ids.len()];
        let info = self.m.maps[id];
        Some((info, info.start + u64::from(page) % info.pages * info.size))
    }

    /// softmm's VMA bounds around `va` in `a`.
    fn vma_bounds(real: &[Real]) -> impl Fn(usize, u64) -> (u64, u64) + '_ {
        move |b, va| {
            real[b]
                .mm
                .maps()
                .into_iter()
                .find(|e| e.start <= va && va < e.end)
                .map_or((va, va + HP), |e| (e.start, e.end))
        }
    }

    /// The pool's counts against the model's, right away.
    fn check_pool(&self) -> Result<(), String> {
        // Linux's `resv_huge_pages` wraps where the model's count is
        // negative (an owner's `MADV_DONTNEED` of a page a child still maps,
        // then the owner's exit); softmm shows 0 there.
        let want = (self.m.free(), self.m.rsvd().max(0), (0..NODES).map(|n| self.m.node_free(n)).collect::<Vec<_>>());
        let got = || {
            let h = self.phys.huge_page_stats();
            let nodes: Vec<u64> = self.phys.huge_page_node_stats().iter().map(|n| n.free).collect();
            (h, (h.free, h.rsvd as i64, nodes))
        };
        let (h, g) = got();
        ensure!(h.total == NODES as u64 * POOL_PER_NODE && h.surp == 0, "pool total {h:?}");
        ensure!(h.rsvd <= h.free, "more reserved than free: {h:?}");
        ensure!(
            g == want,
            "pool (free, rsvd, free per node): softmm {g:?}, model {want:?} ({} huge pages used)",
            h.total - h.free
        );
        Ok(())
    }

    /// Every mapped page's node (`move_pages` without nodes) against the model's.
    fn check_nodes(&self) -> Result<(), String> {
        for (a, slots) in self.m.ases.iter().enumerate() {
            for (&va, s) in slots {
                let Some(p) = s.page else { continue };
                let mut st = [i32::MIN];
                let r = self.real[a].mm.move_pages(&[va], None, &mut st, 0);
                let want = self.m.pages[&p].node as i32;
                ensure!(r == Ok(0) && st[0] == want, "as{a} page {va:#x}: node {r:?} {st:?}, model {want}");
            }
        }
        Ok(())
    }

    fn check_contents(&mut self) -> Result<(), String> {
        for a in 0..self.real.len() {
            let slots: Vec<(u64, Option<usize>)> = self.m.ases[a].iter().map(|(&v, s)| (v, s.page)).collect();
            for (va, p) in slots {
                let Some(p) = p else { continue };
                let words: Vec<(u64, u64)> = self.m.pages[&p].data.iter().map(|(&o, &v)| (o, v)).collect();
                for (off, v) in words.into_iter().chain([(0, self.word(p, 0))]) {
                    let got = self.real[a].cpus[0].read_u64(va + off);
                    ensure!(got == Ok(v), "final contents of as{a} {:#x}: softmm {got:x?}, model {v:#x}", va + off);
                }
            }
        }
        for (i, pin) in self.pins.iter().enumerate() {
            for (k, &(p, base)) in pin.pages.iter().enumerate() {
                let mut offs: Vec<u64> = match p {
                    Some(p) => self.m.pages[&p].data.range(base..base + SP).map(|(&o, _)| o - base).collect(),
                    None => Vec::new(),
                };
                offs.push(SP - 8);
                for off in offs {
                    let want = p.map_or(0, |p| self.word(p, base + off));
                    let mut b = [0; 8];
                    let r = pin.real.read(k as u64 * SP + off, &mut b);
                    let got = u64::from_le_bytes(b);
                    ensure!(
                        r == Ok(()) && got == want,
                        "final device read of pin {i} page {k} +{off:#x}: {r:?} {got:#x}, model {want:#x}"
                    );
                }
            }
        }
        Ok(())
    }

    fn word(&self, p: usize, off: u64) -> u64 {
        self.m.pages[&p].data.get(&off).copied().unwrap_or(0)
    }

    fn apply(&mut self, op: &HOp) -> Result<String, String> {
        match *op {
            HOp::Map { asi, huge, shared, noreserve, pages, tail } => {
                self.map(asi, huge, shared, noreserve, pages, tail)
            }
            HOp::Unmap { asi, region, page, count, unaligned } => {
                let a = self.asi(asi);
                let Some((info, va)) = self.region(a, region, page) else {
                    return Ok(format!("as{a} munmap: nothing mapped"));
                };
                let count = 1 + u64::from(count) % info.pages;
                let start = va + if unaligned { SP } else { 0 };
                let len = count * info.size;
                let r = self.real[a].mm.munmap(start, len);
                let line = format!("as{a} munmap({start:#x}, {len:#x}) = {r:?}");
                let end = start + len;
                let want =
                    if self.m.inside_huge(a, start) || self.m.inside_huge(a, end) { Err(Errno::Inval) } else { Ok(()) };
                ensure!(r == want, "{line}: model {want:?}");
                if want.is_ok() {
                    let gone: Vec<u64> = self.m.ases[a].range(start..end).map(|(&v, _)| v).collect();
                    for v in gone {
                        self.m.remove_slot(a, v);
                    }
                }
                Ok(line)
            }
            HOp::Access { asi, cpu, region, page, word, write } => {
                let a = self.asi(asi);
                let Some((info, va)) = self.region(a, region, page) else {
                    return Ok(format!("as{a} access: nothing mapped"));
                };
                let addr = va + if info.size == HP { u64::from(word) * 32 % HP } else { u64::from(word) * 8 % SP };
                let r = match write {
                    Some(v) => self.real[a].cpus[usize::from(cpu)].write_u64(addr, v).map(|()| v),
                    None => self.real[a].cpus[usize::from(cpu)].read_u64(addr),
                };
                let line = format!(
                    "as{a}.{} {} {addr:#x} = {r:x?}",
                    u8::from(cpu),
                    if write.is_some() { "write" } else { "read" }
                );
                let want = if let Some(va) = self.m.slot_of(a, addr) {
                    let off = addr - va;
                    let bounds = Self::vma_bounds(&self.real);
                    match self.m.fault(a, va, write.is_some(), false, &bounds) {
                        Err(NoPage::Bus) => Err(Fault::Bus { addr }),
                        Ok(()) => {
                            let p = self.m.ases[a][&va].page;
                            match (write, p) {
                                (Some(v), Some(p)) => {
                                    self.m.pages.get_mut(&p).expect("page").data.insert(off, v);
                                    Ok(v)
                                }
                                (Some(_), None) => unreachable!("a write maps a page"),
                                (None, p) => Ok(p.map_or(0, |p| self.word(p, off))),
                            }
                        }
                    }
                } else {
                    Err(Fault::Segv { addr, code: SegvCode::MapErr })
                };
                ensure!(r == want, "{line}: model {want:x?}");
                Ok(line)
            }
            HOp::Fork { asi } => self.fork(asi),
            HOp::Exit { asi } => {
                if self.real.len() == 1 {
                    return Ok("exit: last address space, skipped".into());
                }
                let a = self.asi(asi);
                self.real.remove(a);
                let slots: Vec<u64> = self.m.ases[a].keys().copied().collect();
                for v in slots {
                    self.m.remove_slot(a, v);
                }
                self.m.ases.remove(a);
                Ok(format!("as{a} exit"))
            }
            HOp::DontNeed { asi, region, page, count } => {
                let a = self.asi(asi);
                let Some((info, va)) = self.region(a, region, page) else {
                    return Ok(format!("as{a} madvise: nothing mapped"));
                };
                let len = (1 + u64::from(count) % info.pages) * info.size;
                let line = format!("as{a} madvise({va:#x}, {len:#x}, MADV_DONTNEED)");
                if self.m.inside_huge(a, va) || self.m.inside_huge(a, va + len) {
                    return Ok(line + ": part of a huge page of another mapping, skipped");
                }
                let r = self.real[a].mm.madvise(va, len, MADV_DONTNEED);
                let line = format!("{line} = {r:?}");
                let hole = self.m.has_hole(a, va, va + len);
                let slots: Vec<u64> = self.m.ases[a].range(va..va + len).map(|(&v, _)| v).collect();
                for v in slots {
                    let s = self.m.ases[a].get_mut(&v).expect("slot");
                    let Some(p) = s.page.take() else { continue };
                    if s.owner {
                        // __unmap_hugepage_range: the owner's anonymous page,
                        // shared or not, has its index in the reserve map
                        // again at once, and gives its reservation back to
                        // the pool when it is freed (now or by its last holder).
                        let (file, idx) = (s.file, s.idx);
                        self.m.files[file].as_mut().expect("file").resv.insert(idx);
                        self.m.pages.get_mut(&p).expect("page").restore = true;
                    }
                    self.m.maybe_free(p);
                }
                let want = if hole { Err(Errno::NoMem) } else { Ok(()) };
                ensure!(r == want, "{line}: model {want:?}");
                Ok(line)
            }
            HOp::Pin { asi, region, page, sub, n, write } => self.pin(asi, region, page, sub, n, write),
            HOp::Unpin { pin } => {
                if self.pins.is_empty() {
                    return Ok("unpin: no pin".into());
                }
                let i = usize::from(pin) % self.pins.len();
                let p = self.pins.remove(i);
                drop(p.real);
                for (pg, _) in p.pages {
                    if let Some(pg) = pg {
                        self.m.pages.get_mut(&pg).expect("pinned").pins -= 1;
                        self.m.maybe_free(pg);
                    }
                }
                Ok(format!("unpin {i}"))
            }
            HOp::Device { pin, word, write } => {
                if self.pins.is_empty() {
                    return Ok("device: no pin".into());
                }
                let i = usize::from(pin) % self.pins.len();
                let pin = &self.pins[i];
                let off = u64::from(word) * 8 % (pin.pages.len() as u64 * SP);
                let (pg, base) = pin.pages[(off / SP) as usize];
                let at = base + off % SP;
                match write {
                    Some(v) => {
                        let r = pin.real.write(off, &v.to_le_bytes());
                        let line = format!("pin {i} device write +{off:#x} = {r:?}");
                        let want = if pin.write { Ok(()) } else { Err(Errno::Perm) };
                        ensure!(r == want, "{line}: model {want:?}");
                        if want.is_ok() {
                            let pg = pg.expect("a write pin holds a page");
                            self.m.pages.get_mut(&pg).expect("pinned").data.insert(at, v);
                        }
                        Ok(line)
                    }
                    None => {
                        let mut b = [0; 8];
                        let r = pin.real.read(off, &mut b);
                        let got = u64::from_le_bytes(b);
                        let want = pg.map_or(0, |p| self.word(p, at));
                        let line = format!("pin {i} device read +{off:#x} = {r:?} {got:#x}");
                        ensure!(r == Ok(()) && got == want, "{line}: model {want:#x}");
                        Ok(line)
                    }
                }
            }
            HOp::MovePages { asi, region, page, node } => self.move_pages(asi, region, page, node),
            HOp::Mbind { asi, region, page, count, node } => self.mbind(asi, region, page, count, node),
        }
    }
}

/// Formats a failure for a panic message (the fuzzer's crash report).
pub fn report(e: &str) -> String {
    format!("softmm disagrees with the hugetlb model: {e}")
}
