//! 1. Writers and mutators
//!
//! W1 writers write tagged values into their own stable pages (never changed:
//! every write must stick, whatever happens next door) and into their own word
//! of every volatile page, and check each outcome; M1 mutators change random
//! ranges of volatile pages (mmap over, munmap, mprotect RO/RW/NONE, DONTNEED,
//! POPULATE_WRITE, mremap shrink/grow/move away and back), next to the stable
//! pages and overlapping each other's ranges, check each call's result against
//! Linux's, then check every page they changed through their own CPU. The
//! per-page version tells a writer whether its access raced with a change:
//! a settled access must match the settled state exactly (SIGSEGV MAPERR after
//! munmap, ACCERR for a write after mprotect RO, our last write otherwise);
//! a racing one may see either side of the change but never lose data unless
//! the change reset the contents.

use super::*;

const W1: usize = 4; // writer threads
const M1: usize = 2; // mutator threads
const SLOTS: u64 = 8; // [stable | volatile] slots in the main area
const S_PAGES: u64 = 2; // stable pages per slot
const GROUP: u64 = 6; // pages per volatile group
const ISLANDS: u64 = 2; // volatile groups alone in their own page tables
const MAIN_BASE: u64 = 0x2000_0000_0000;
const ISLAND_BASE: u64 = 0x3000_0000_0000;
const SCRATCH_BASE: u64 = 0x4000_0000_0000;
/// 64 read-only-used pages, one per slot of the direct-mapped 64-entry TLB:
/// reading the one in a page's slot evicts that page's translation, so that
/// the next access walks the page table (and faults) while changes race.
const EVICT_BASE: u64 = 0x3800_0000_0000;
const TLB_SLOTS: u64 = 64;
/// Each mutator op waits until every writer has done this many more accesses.
const WRITER_ITERS_PER_OP: u64 = 16;

const ST_UNMAPPED: u64 = 0;
const ST_RO: u64 = 1;
const ST_RW: u64 = 2;
const ST_NONE: u64 = 3; // PROT_NONE

fn pack(prot: u64, epoch: u64) -> u64 {
    prot | (epoch << 2)
}
fn prot_of(st: u64) -> u64 {
    st & 3
}
fn epoch_of(st: u64) -> u64 {
    st >> 2
}

/// One volatile page. A mutator holds `lock` across a change and bumps `ver`
/// before (odd: changing) and after (even: settled) it; `st` is the settled
/// state: protection and the version at which the contents were last reset
/// (zeroed). `resets` and `moves` are odd while a change of that kind runs
/// (`moves`: an mremap moving the page out or back), so that an access can
/// tell which kinds of change it raced with.
struct VPage {
    addr: u64,
    ver: AtomicU64,
    st: AtomicU64,
    resets: AtomicU64,
    moves: AtomicU64,
    lock: Mutex<()>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Leaves the contents in place (munmap, mprotect, ...).
    Keep,
    /// Zeroes the contents (mmap over, DONTNEED, growing into the page).
    Reset,
    /// Moves the page away or back, contents included.
    Move,
}

struct World1 {
    pages: Vec<VPage>,
    groups: u64,
    stable: Vec<Vec<u64>>,    // per writer: its stable pages
    progress: Vec<AtomicU64>, // per writer: iterations done
    progress_note: Note,
    done: AtomicBool,
    failed: AtomicBool,
}

impl World1 {
    fn new() -> World1 {
        let slot = S_PAGES + GROUP;
        let mut pages = Vec::new();
        let mut stable = vec![Vec::new(); W1];
        for k in 0..=SLOTS {
            let s = MAIN_BASE + k * slot * PAGE;
            for j in 0..S_PAGES {
                stable[k as usize % W1].push(s + j * PAGE);
            }
            if k < SLOTS {
                for j in 0..GROUP {
                    pages.push(s + (S_PAGES + j) * PAGE);
                }
            }
        }
        for i in 0..ISLANDS {
            for j in 0..GROUP {
                pages.push(ISLAND_BASE + (i << 30) + j * PAGE);
            }
        }
        let pages = pages
            .into_iter()
            .map(|addr| VPage {
                addr,
                ver: AtomicU64::new(0),
                st: AtomicU64::new(pack(ST_RW, 0)),
                resets: AtomicU64::new(0),
                moves: AtomicU64::new(0),
                lock: Mutex::new(()),
            })
            .collect();
        World1 {
            pages,
            groups: SLOTS + ISLANDS,
            stable,
            progress: (0..W1).map(|_| AtomicU64::new(0)).collect(),
            done: AtomicBool::new(false),
            progress_note: Note::new(),
            failed: AtomicBool::new(false),
        }
    }

    fn map_all(&self, mm: &AddressSpace) {
        let len = ((S_PAGES + GROUP) * SLOTS + S_PAGES) * PAGE;
        assert_eq!(mm.mmap(MAIN_BASE, len, RW, ANON | MAP_FIXED, None, 0), Ok(MAIN_BASE));
        for i in 0..ISLANDS {
            let a = ISLAND_BASE + (i << 30);
            assert_eq!(mm.mmap(a, GROUP * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(a));
        }
        assert_eq!(mm.mmap(EVICT_BASE, TLB_SLOTS * PAGE, PROT_READ, ANON | MAP_FIXED, None, 0), Ok(EVICT_BASE));
    }

    fn kind_counter(&self, p: usize, kind: Kind) -> Option<&AtomicU64> {
        match kind {
            Kind::Keep => None,
            Kind::Reset => Some(&self.pages[p].resets),
            Kind::Move => Some(&self.pages[p].moves),
        }
    }

    fn begin(&self, idx: &[usize], kind: Kind) {
        for &p in idx {
            if let Some(c) = self.kind_counter(p, kind) {
                c.fetch_add(1, SeqCst);
            }
            let old = self.pages[p].ver.fetch_add(1, SeqCst);
            assert_eq!(old % 2, 0, "page {p} changed by two mutators at once");
        }
    }

    /// Settles the pages of `idx` in the state `new(position, old state,
    /// version after this change)` returns.
    fn finish(&self, idx: &[usize], kind: Kind, mut new: impl FnMut(usize, u64, u64) -> u64) {
        for (k, &p) in idx.iter().enumerate() {
            let pg = &self.pages[p];
            let old = pg.st.load(SeqCst);
            let settled = pg.ver.load(SeqCst) + 1;
            pg.st.store(new(k, old, settled), SeqCst);
            pg.ver.fetch_add(1, SeqCst);
            if let Some(c) = self.kind_counter(p, kind) {
                c.fetch_add(1, SeqCst);
            }
        }
    }
}

/// What a thread knows about its own word in a volatile page.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// It holds `val`, known at version `ver` (a reset settled later zeroes it).
    Known(u64, u64),
    /// A write raced with a reset (or a move, see the header) still going on
    /// at version `ver`: any value of ours, or zero.
    Unknown(u64),
}

impl Expect {
    /// The exact value a read must return when the page's contents were last
    /// reset at `epoch` and no reset raced with the read; `None` if any value
    /// of ours (or zero) is possible.
    fn want(self, epoch: u64) -> Option<u64> {
        match self {
            Expect::Known(val, ver) => Some(if epoch > ver { 0 } else { val }),
            // Zero if the reset began after the racing write ended.
            Expect::Unknown(ver) => (epoch > ver + 1).then_some(0),
        }
    }
}

/// Zero, or a word that `who` wrote into page `p`.
fn valid_word(x: u64, who: u64, p: usize) -> bool {
    x == 0 || dec(x).is_some_and(|(w, pl, _)| w == who && pl == p as u64)
}

#[derive(Default, Debug, Clone, Copy)]
struct WriterStats {
    iters: u64,
    settled: u64,
    racy_checked: u64,
    racy_loose: u64,
}

fn writer1(mm: Arc<AddressSpace>, world: Arc<World1>, w: usize, seed: u64) -> WriterStats {
    let _fail = FailGuard { failed: &world.failed, notes: vec![&world.progress_note] };
    let mut rng = Rng::new(seed);
    let mut cpu = Cpu::attached(&mm);
    let mine = world.stable[w].clone();
    let mut s_exp = vec![0u64; mine.len() * WORDS];
    let mut exp = vec![Expect::Known(0, 0); world.pages.len()];
    let mut stats = WriterStats::default();
    let who = w as u64;
    let verify_stable = |cpu: &mut Cpu, s_exp: &[u64]| {
        for (k, &a) in mine.iter().enumerate() {
            let got = read_page(cpu, a).unwrap_or_else(|e| panic!("writer {w}: stable page {a:#x}: {e}"));
            for (i, (&g, &e)) in got.iter().zip(&s_exp[k * WORDS..]).enumerate() {
                assert_eq!(g, e, "writer {w}: stable page {a:#x} word {i}: lost write / corruption");
            }
        }
    };
    let mut seq = 0;
    while !world.done.load(Relaxed) && !world.failed.load(Relaxed) {
        seq += 1;
        stats.iters += 1;
        world.progress[w].store(seq, SeqCst);
        if seq % 1024 == 0 {
            // A parked CPU skips shootdowns; resuming must flush what it missed.
            cpu.park();
            std::hint::spin_loop();
            cpu.resume();
        }
        if seq % 16 == 0 {
            world.progress_note.notify();
        }
        if rng.below(4) == 0 {
            // A stable page of ours: never touched by a mutator, so every
            // write sticks, whatever happens to its neighbours.
            let i = rng.below(s_exp.len() as u64) as usize;
            let a = mine[i / WORDS] + (i % WORDS) as u64 * 8;
            let val = enc(who, 4000 + (i / WORDS) as u64, seq);
            cpu.write_u64(a, val).unwrap_or_else(|e| panic!("writer {w}: write to stable {a:#x}: {e}"));
            s_exp[i] = val;
            assert_eq!(cpu.read_u64(a), Ok(val), "writer {w}: stable {a:#x} lost its write");
            if seq % 512 == 0 {
                verify_stable(&mut cpu, &s_exp);
            }
            continue;
        }
        // A volatile page: our own word in it (writer w owns word w).
        let p = rng.below(world.pages.len() as u64) as usize;
        let pg = &world.pages[p];
        let a = pg.addr + who * 8;
        if rng.below(2) == 0 {
            let evict = EVICT_BASE + (a / PAGE % TLB_SLOTS) * PAGE;
            assert_eq!(cpu.read_u64(evict), Ok(0), "writer {w}: evicting page {evict:#x}");
        }
        let r0 = pg.resets.load(SeqCst);
        let v0 = pg.ver.load(SeqCst);
        let st = pg.st.load(SeqCst);
        let (wrote, res, back) = match rng.below(3) {
            0 => {
                let r = cpu.read_u64(a);
                (None, r.map(|_| ()), Some(r))
            }
            k => {
                let val = enc(who, p as u64, seq);
                let r = if k == 1 {
                    cpu.write_u64(a, val)
                } else {
                    let bytes = val.to_le_bytes();
                    cpu.with_slice_mut(a, 8, |off, c| {
                        for (b, &v) in c.iter().zip(&bytes[off..]) {
                            b.store(v, Relaxed);
                        }
                    })
                };
                let back = r.is_ok().then(|| cpu.read_u64(a));
                (Some(val), r, back)
            }
        };
        let v1 = pg.ver.load(SeqCst);
        let r1 = pg.resets.load(SeqCst);
        let (prot, epoch) = (prot_of(st), epoch_of(st));
        let ctx = || format!("writer {w} page {p} ({a:#x}) state {prot} epoch {epoch} ver {v0}..{v1} {:?}", exp[p]);
        if v0 == v1 && v0 % 2 == 0 {
            // Settled: no change ran during the access.
            stats.settled += 1;
            match (prot, wrote) {
                (ST_UNMAPPED, _) => assert_eq!(res, Err(map_err(a)), "access to an unmapped page: {}", ctx()),
                (ST_NONE, _) => assert_eq!(res, Err(acc_err(a)), "access to a PROT_NONE page: {}", ctx()),
                (ST_RO, Some(_)) => assert_eq!(res, Err(acc_err(a)), "write to a read-only page: {}", ctx()),
                (_, None) => {
                    let x = match back {
                        Some(Ok(x)) => x,
                        other => panic!("read of a mapped page failed: {other:?}: {}", ctx()),
                    };
                    match exp[p].want(epoch) {
                        Some(want) => assert_eq!(x, want, "lost write / stale data: {}", ctx()),
                        None => assert!(valid_word(x, who, p), "foreign word {x:#x}: {}", ctx()),
                    }
                    exp[p] = Expect::Known(x, v0);
                }
                (_, Some(val)) => {
                    assert_eq!(res, Ok(()), "write to a read-write page: {}", ctx());
                    assert_eq!(back, Some(Ok(val)), "write not read back: {}", ctx());
                    exp[p] = Expect::Known(val, v0);
                }
            }
            continue;
        }
        // Raced with a change: either outcome of the race is allowed, but
        // unless a reset was involved the
        // contents are ours exactly.
        match res {
            Ok(()) => {}
            Err(Fault::Segv { addr, code: SegvCode::MapErr }) if addr == a => {}
            Err(Fault::Segv { addr, code: SegvCode::AccErr }) if addr == a => {}
            Err(e) => panic!("unexpected fault {e:?}: {}", ctx()),
        }
        let reset_raced = r0 != r1 || r0 % 2 == 1;
        if reset_raced {
            stats.racy_loose += 1;
            if let Some(Ok(x)) = back {
                assert!(valid_word(x, who, p), "foreign word {x:#x} (racing access): {}", ctx());
            }
            if wrote.is_some() && res.is_ok() {
                exp[p] = Expect::Unknown(v1);
            }
            continue;
        }
        stats.racy_checked += 1;
        match (wrote, back) {
            (None, Some(Ok(x))) => {
                match exp[p].want(epoch) {
                    Some(want) => assert_eq!(x, want, "lost write / stale data (racing read): {}", ctx()),
                    None => assert!(valid_word(x, who, p), "foreign word {x:#x}: {}", ctx()),
                }
                exp[p] = Expect::Known(x, v1);
            }
            (Some(val), Some(back)) => {
                // The write landed; the page may have gone since.
                if let Ok(x) = back {
                    assert_eq!(x, val, "write not read back (racing write): {}", ctx());
                }
                exp[p] = Expect::Known(val, v1);
            }
            _ => {}
        }
    }
    verify_stable(&mut cpu, &s_exp);
    stats
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    MmapRw,
    MmapRo,
    MmapNoReplace,
    Munmap,
    ProtectRo,
    ProtectRw,
    ProtectNone,
    DontNeed,
    PopulateWrite,
    MremapShrink,
    MremapGrow,
    MremapMove,
}

const OPS: [Op; 12] = [
    Op::MmapRw,
    Op::MmapRo,
    Op::MmapNoReplace,
    Op::Munmap,
    Op::ProtectRo,
    Op::ProtectRw,
    Op::ProtectNone,
    Op::DontNeed,
    Op::PopulateWrite,
    Op::MremapShrink,
    Op::MremapGrow,
    Op::MremapMove,
];

struct Mutator<'a> {
    m: usize,
    mm: &'a AddressSpace,
    world: &'a World1,
    cpu: Cpu,
    /// Its own word per volatile page: (value, version written).
    own: Vec<(u64, u64)>,
    seq: u64,
}

impl Mutator<'_> {
    fn own_off(&self) -> u64 {
        PAGE - 8 * (self.m as u64 + 1)
    }

    fn own_want(&self, p: usize) -> u64 {
        let (val, ver) = self.own[p];
        if epoch_of(self.world.pages[p].st.load(SeqCst)) > ver {
            0
        } else {
            val
        }
    }

    /// Checks every word of a page's contents found at `at` (the page itself,
    /// or its moved-out copy): the writers' and mutators' words carry their
    /// tags, ours is exact, the rest is zero.
    fn check_words(&self, p: usize, at: u64, got: &[u64]) {
        let own = self.own_want(p);
        for (i, &x) in got.iter().enumerate() {
            if i < W1 {
                assert!(valid_word(x, i as u64, p), "page {p} at {at:#x} word {i}: foreign {x:#x}");
            } else if i >= WORDS - M1 {
                let m = WORDS - 1 - i;
                if m == self.m {
                    assert_eq!(x, own, "mutator {m}: page {p} at {at:#x}: own word lost");
                } else {
                    assert!(valid_word(x, 8 + m as u64, p), "page {p} at {at:#x} word {i}: foreign {x:#x}");
                }
            } else {
                assert_eq!(x, 0, "page {p} at {at:#x} word {i}: nobody writes here");
            }
        }
    }

    /// With the pages locked and settled: every access by this thread agrees
    /// with the state the last change left (its own TLB was shot down too).
    fn self_check(&mut self, idx: &[usize]) {
        for &p in idx {
            let pg = &self.world.pages[p];
            let st = pg.st.load(SeqCst);
            let ver = pg.ver.load(SeqCst);
            let a = pg.addr + self.own_off();
            match prot_of(st) {
                ST_UNMAPPED => {
                    assert_eq!(self.cpu.read_u64(a), Err(map_err(a)), "read after unmap, page {p}");
                    assert_eq!(self.cpu.write_u64(a, 1), Err(map_err(a)), "write after unmap, page {p}");
                }
                ST_NONE => {
                    assert_eq!(self.cpu.read_u64(a), Err(acc_err(a)), "read after mprotect NONE, page {p}");
                    assert_eq!(self.cpu.write_u64(a, 1), Err(acc_err(a)), "write after mprotect NONE, page {p}");
                }
                prot => {
                    let got = read_page(&mut self.cpu, pg.addr).unwrap_or_else(|e| panic!("page {p}: {e}"));
                    self.check_words(p, pg.addr, &got);
                    self.seq += 1;
                    let val = enc(8 + self.m as u64, p as u64, self.seq);
                    if prot == ST_RO {
                        assert_eq!(self.cpu.write_u64(a, val), Err(acc_err(a)), "write after mprotect RO, page {p}");
                    } else {
                        assert_eq!(self.cpu.write_u64(a, val), Ok(()), "write to RW page {p}");
                        assert_eq!(self.cpu.read_u64(a), Ok(val));
                        self.own[p] = (val, ver);
                    }
                }
            }
        }
    }

    /// One random change of a random range of one volatile group, checked
    /// against Linux's outcome, then checked through this thread's CPU.
    fn step(&mut self, rng: &mut Rng) {
        let world = self.world;
        let g = rng.below(world.groups);
        let first = rng.below(GROUP);
        let len = 1 + rng.below(GROUP - first);
        let idx: Vec<usize> = (first..first + len).map(|j| (g * GROUP + j) as usize).collect();
        self.cpu.park();
        let guards: Vec<MutexGuard<'_, ()>> = idx.iter().map(|&p| world.pages[p].lock.lock().expect("lock")).collect();
        self.cpu.resume();
        let addr = world.pages[idx[0]].addr;
        let bytes = len * PAGE;
        let prots: Vec<u64> = idx.iter().map(|&p| prot_of(world.pages[p].st.load(SeqCst))).collect();
        let all_mapped = prots.iter().all(|&p| p != ST_UNMAPPED);
        let any_mapped = prots.iter().any(|&p| p != ST_UNMAPPED);
        let mut op = OPS[rng.below(OPS.len() as u64) as usize];
        let ok = match op {
            Op::MremapShrink => len >= 2 && prots[0] != ST_UNMAPPED,
            Op::MremapGrow => len >= 2 && prots[0] != ST_UNMAPPED && prots[1..].iter().all(|&p| p == ST_UNMAPPED),
            Op::MremapMove => all_mapped,
            _ => true,
        };
        if !ok {
            op = if any_mapped { Op::Munmap } else { Op::MmapRw };
        }
        let mm = self.mm;
        match op {
            Op::MmapRw | Op::MmapRo => {
                let (prot, s) = if op == Op::MmapRw { (RW, ST_RW) } else { (PROT_READ, ST_RO) };
                world.begin(&idx, Kind::Reset);
                assert_eq!(mm.mmap(addr, bytes, prot, ANON | MAP_FIXED, None, 0), Ok(addr));
                world.finish(&idx, Kind::Reset, |_, _, v| pack(s, v));
            }
            Op::MmapNoReplace if any_mapped => {
                world.begin(&idx, Kind::Keep);
                assert_eq!(mm.mmap(addr, bytes, RW, ANON | MAP_FIXED_NOREPLACE, None, 0), Err(Errno::Exist));
                world.finish(&idx, Kind::Keep, |_, old, _| old);
            }
            Op::MmapNoReplace => {
                world.begin(&idx, Kind::Reset);
                assert_eq!(mm.mmap(addr, bytes, RW, ANON | MAP_FIXED_NOREPLACE, None, 0), Ok(addr));
                world.finish(&idx, Kind::Reset, |_, _, v| pack(ST_RW, v));
            }
            Op::Munmap => {
                world.begin(&idx, Kind::Keep);
                assert_eq!(mm.munmap(addr, bytes), Ok(()));
                world.finish(&idx, Kind::Keep, |_, old, _| pack(ST_UNMAPPED, epoch_of(old)));
            }
            Op::ProtectRo | Op::ProtectRw | Op::ProtectNone => {
                let (prot, s) = match op {
                    Op::ProtectRw => (RW, ST_RW),
                    Op::ProtectRo => (PROT_READ, ST_RO),
                    _ => (PROT_NONE, ST_NONE),
                };
                let hole = prots.iter().position(|&p| p == ST_UNMAPPED).unwrap_or(idx.len());
                world.begin(&idx, Kind::Keep);
                let r = mm.mprotect(addr, bytes, prot);
                // Linux: ENOMEM for a hole; the VMAs before it are changed.
                assert_eq!(r, if hole == idx.len() { Ok(()) } else { Err(Errno::NoMem) }, "mprotect {prots:?}");
                world.finish(&idx, Kind::Keep, |k, old, _| if k < hole { pack(s, epoch_of(old)) } else { old });
            }
            Op::DontNeed => {
                world.begin(&idx, Kind::Reset);
                let r = mm.madvise(addr, bytes, MADV_DONTNEED);
                assert_eq!(r, if all_mapped { Ok(()) } else { Err(Errno::NoMem) }, "DONTNEED {prots:?}");
                world.finish(
                    &idx,
                    Kind::Reset,
                    |_, old, v| {
                        if prot_of(old) == ST_UNMAPPED {
                            old
                        } else {
                            pack(prot_of(old), v)
                        }
                    },
                );
            }
            Op::PopulateWrite => {
                let want = match prots.iter().find(|&&p| p != ST_RW) {
                    None => Ok(()),
                    Some(&ST_UNMAPPED) => Err(Errno::NoMem),
                    Some(_) => Err(Errno::Inval),
                };
                world.begin(&idx, Kind::Keep);
                assert_eq!(mm.madvise(addr, bytes, MADV_POPULATE_WRITE), want, "POPULATE_WRITE {prots:?}");
                world.finish(&idx, Kind::Keep, |_, old, _| old);
            }
            Op::MremapShrink => {
                let keep = 1 + rng.below(len - 1);
                world.begin(&idx, Kind::Keep);
                assert_eq!(mm.mremap(addr, bytes, keep * PAGE, 0, 0), Ok(addr));
                world.finish(
                    &idx,
                    Kind::Keep,
                    |k, old, _| if (k as u64) < keep { old } else { pack(ST_UNMAPPED, epoch_of(old)) },
                );
            }
            Op::MremapGrow => {
                world.begin(&idx, Kind::Reset);
                assert_eq!(mm.mremap(addr, PAGE, bytes, 0, 0), Ok(addr), "grow in place {prots:?}");
                let p0 = prots[0];
                world.finish(&idx, Kind::Reset, |k, old, v| if k == 0 { old } else { pack(p0, v) });
            }
            Op::MremapMove => {
                let scratch = SCRATCH_BASE + ((self.m as u64) << 21);
                world.begin(&idx, Kind::Move);
                match mm.mremap(addr, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, scratch) {
                    Ok(a) => {
                        assert_eq!(a, scratch);
                        world.finish(&idx, Kind::Move, |_, old, _| pack(ST_UNMAPPED, epoch_of(old)));
                        self.self_check(&idx);
                        // The contents travelled: check them at the scratch address.
                        for (k, &p) in idx.iter().enumerate() {
                            let at = scratch + k as u64 * PAGE;
                            match read_page(&mut self.cpu, at) {
                                Ok(got) => self.check_words(p, at, &got),
                                Err(e) => assert!(prots[k] == ST_NONE && e == acc_err(at), "moved page {p}: {e}"),
                            }
                        }
                        world.begin(&idx, Kind::Move);
                        assert_eq!(mm.mremap(scratch, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, addr), Ok(addr));
                        world.finish(&idx, Kind::Move, |k, old, _| pack(prots[k], epoch_of(old)));
                    }
                    // The range spans several VMAs (not predictable: merging
                    // depends on anon_vmas); nothing changed.
                    Err(Errno::Fault) if len > 1 => world.finish(&idx, Kind::Move, |_, old, _| old),
                    Err(e) => panic!("mremap move of {len} mapped pages {prots:?}: {e:?}"),
                }
            }
        }
        self.self_check(&idx);
        self.cpu.park();
        drop(guards);
        self.cpu.resume();
    }
}

fn mutator1(mm: Arc<AddressSpace>, world: Arc<World1>, m: usize, ops: u64, seed: u64) {
    let _fail = FailGuard { failed: &world.failed, notes: vec![&world.progress_note] };
    let mut rng = Rng::new(seed);
    let mut mu =
        Mutator { m, mm: &mm, world: &world, cpu: Cpu::attached(&mm), own: vec![(0, 0); world.pages.len()], seq: 0 };
    for i in 0..ops {
        // Keep the writers in the race whatever the scheduler does: each op
        // waits (parked) until every writer has done a few more accesses.
        let need = i * WRITER_ITERS_PER_OP;
        world
            .progress_note
            .wait(&mut mu.cpu, || world.failed.load(SeqCst) || world.progress.iter().all(|p| p.load(SeqCst) >= need));
        if world.failed.load(Relaxed) {
            return;
        }
        mu.step(&mut rng);
    }
}

fn writers_and_mutators(policy: FaultPolicy, shootdown: Shootdown, seed: u64) {
    let ops = scaled(400);
    let p = phys(64);
    let mm = mm_with_shootdown(&p, policy, shootdown);
    let world = Arc::new(World1::new());
    world.map_all(&mm);
    let name = policy.name();
    let writers: Vec<_> = (0..W1)
        .map(|w| {
            let (mm, world) = (mm.clone(), world.clone());
            spawn(format!("{name}-writer-{w}"), move || writer1(mm, world, w, seed ^ ((w as u64 + 1) * 0x1000)))
        })
        .collect();
    let mutators: Vec<_> = (0..M1)
        .map(|m| {
            let (mm, world) = (mm.clone(), world.clone());
            spawn(format!("{name}-mutator-{m}"), move || mutator1(mm, world, m, ops, seed ^ ((m as u64 + 1) << 20)))
        })
        .collect();
    let mutators: Vec<_> = mutators.into_iter().map(|h| h.join()).collect();
    world.done.store(true, SeqCst);
    let stats = join_all(writers);
    mutators.into_iter().for_each(|r| r.unwrap_or_else(|e| std::panic::resume_unwind(e)));
    eprintln!("  {} mutator ops; writers {stats:?}; {:?}", ops * M1 as u64, mm.stats().tlb);
    // The final state, seen by a fresh CPU.
    let mut cpu = Cpu::attached(&mm);
    for (p, pg) in world.pages.iter().enumerate() {
        let got = read_page(&mut cpu, pg.addr);
        match prot_of(pg.st.load(SeqCst)) {
            ST_UNMAPPED => assert_eq!(got, Err(map_err(pg.addr)), "page {p}"),
            ST_NONE => assert_eq!(got, Err(acc_err(pg.addr)), "page {p}"),
            _ => {}
        }
        let Ok(got) = got else { continue };
        for (i, &x) in got.iter().enumerate() {
            let who = if i < W1 { i as u64 } else { 8 + (WORDS - 1 - i) as u64 };
            assert!(((W1..WORDS - M1).contains(&i) && x == 0) || valid_word(x, who, p), "page {p} word {i}: {x:#x}");
        }
    }
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn writers_and_mutators_agree_on_every_access() {
    for_each_policy("writers-and-mutators", writers_and_mutators);
}
