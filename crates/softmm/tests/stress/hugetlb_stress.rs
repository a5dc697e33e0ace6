//! Randomized hugetlb stress: a small pool of 2 MiB pages on two NUMA nodes,
//! several long-lived processes on threads of their own, each running a
//! random schedule per `STRESS_SEED` of private and shared `MAP_HUGETLB`
//! mappings (anonymous, and of hugetlbfs files), writes and reads through a
//! `Cpu`, `fork` (a child on a thread of its own that reads, writes, drops
//! and unmaps, then exits while its parent goes on), copy-on-write,
//! `move_pages` with `MPOL_MF_MOVE_ALL` between the nodes, pins (read,
//! write, long-term; kept across rounds and past their process's exit) and
//! unpins, `MADV_DONTNEED`, `munmap`, and a process exiting and another
//! taking its place; meanwhile one more thread reads
//! `PhysMem::huge_page_stats()` in a loop.
//!
//! After every round (its threads joined) the pool is checked against a
//! model (see [`World::check`]): pages in use counted independently of the
//! pool, `HugePages_Rsvd` against the reservations Linux's rules leave,
//! every process's data, and that reading it allocated nothing; at the end
//! nothing is leaked. A hang is a failure (a watchdog per round), timing is
//! never asserted.
//!
//! `STRESS_SEED=<n>` changes the schedule, `STRESS_SCALE=<n>` multiplies the
//! rounds, `HUGETLB_STRESS_LOG=1` adds each process's recent operations to
//! a failure's message. The failures this test found have minimal
//! reproducers in `hugetlb_stress_regressions.rs` (and `hugetlb/cow.rs`).

use softmm_testkit::common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use common::*;
use softmm::uapi::*;
use softmm::{
    AddressSpace, Cpu, Errno, Fault, FaultPolicy, File, Foll, HugetlbPolicy, MigratePolicy, MmConfig, OpenFile,
    PhysConfig, PhysMem, PinPolicy, PinnedPages, UnmapPolicy, MPOL_MF_MOVE_ALL,
};

const HP: u64 = 2 << 20;
const NODES: usize = 2;
const HUGE_PER_NODE: u64 = 5;
const TOTAL: u64 = NODES as u64 * HUGE_PER_NODE;
/// Long-lived processes, one worker thread each.
const PROCS: usize = 3;
/// hugetlbfs files the rounds map (replaced now and then).
const FILES: usize = 2;
const FILE_PAGES: u64 = 3;
/// Live mappings per process at most.
const MAX_MAPS: usize = 4;
/// Words of a shared page: one per process slot and one per its child,
/// each written by one thread at a time.
const LANES: usize = 2 * PROCS;
/// The word private pages are tagged in (never written in a shared page,
/// so a page-cache page always holds 0 there).
const PRIV_LANE: u64 = LANES as u64;
/// The 4 KiB subpages each tag is written to.
const SUBPAGES: [u64; 3] = [0, 257, 511];
const ROUNDS: u64 = 500;
/// Operations per process and round.
const OPS: u64 = 16;
/// Hang detector: a round (with its check) not done after this long is a deadlock.
const WATCHDOG_SECS: u64 = 120;

/// Runs the pending grace periods (`PhysMem::quiesce` waits for every VMA
/// to go, which live processes never let happen): epochs advanced until
/// the counts stop changing.
fn grace_periods(phys: &PhysMem) {
    let snapshot = || {
        let (s, h) = (phys.stats(), phys.huge_page_stats());
        (s.frames_used, s.page_tables, s.vmas, s.rmap_entries, h.free, h.rsvd)
    };
    let (mut last, mut same) = (snapshot(), 0);
    for i in 0..100_000 {
        crossbeam_epoch::pin().flush();
        let now = snapshot();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        // Each flush runs a few of the collector's queued bags, oldest
        // first: a long queue keeps the counts still for a while.
        if i >= 256 && same >= 256 {
            return;
        }
    }
}

fn word(base: u64, sub: u64, lane: u64) -> u64 {
    base + sub * 4096 + lane * 8
}

/// Writes `v` at `lane` of every subpage of [`SUBPAGES`] of the huge page at `base`.
fn wr(cpu: &mut Cpu, base: u64, lane: u64, v: u64) -> Result<(), Fault> {
    for sub in SUBPAGES {
        cpu.write_u64(word(base, sub, lane), v)?;
    }
    Ok(())
}

/// Reads `lane` of every subpage of [`SUBPAGES`]; they must agree.
fn rd(cpu: &mut Cpu, base: u64, lane: u64, what: &dyn Fn() -> String) -> Result<u64, Fault> {
    let first = cpu.read_u64(word(base, 0, lane))?;
    for sub in &SUBPAGES[1..] {
        let v = cpu.read_u64(word(base, *sub, lane))?;
        assert_eq!(v, first, "{}: subpage {sub} lane {lane} differs from subpage 0", what());
    }
    Ok(first)
}

fn is_bus(e: &Fault) -> bool {
    matches!(e, Fault::Bus { .. })
}

/// The model's name for one private anonymous page of a long-lived process.
type Uid = u64;

/// A private huge page slot of a long-lived process (the owner of its
/// mapping's reservations).
#[derive(Clone, Copy, Debug, PartialEq)]
enum PState {
    /// Nothing mapped; the mapping's reservation for it is unused.
    Empty,
    /// The file's page-cache page, mapped read-only by a read fault; the
    /// reservation is still unused (Linux consumes it at the COW).
    Cache,
    /// An anonymous page of this mapping (the reservation consumed),
    /// holding `tag` in [`PRIV_LANE`] (0: never written).
    Anon { uid: Uid, tag: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    PrivAnon,
    PrivFile,
    SharedAnon,
    SharedFile,
}

impl Kind {
    fn private(self) -> bool {
        matches!(self, Kind::PrivAnon | Kind::PrivFile)
    }
}

struct Mapping {
    addr: u64,
    kind: Kind,
    /// The file's key ([`Model::files`]): the pseudo-file of a shared
    /// anonymous mapping, the hugetlbfs file of a file mapping, 0 otherwise.
    file: u64,
    /// First huge page index in the file.
    pgoff: u64,
    /// Per huge page: `None` once unmapped; for shared mappings the state
    /// stays `Empty` (the file's model has it).
    slots: Vec<Option<PState>>,
}

impl Mapping {
    fn base(&self, i: usize) -> u64 {
        self.addr + i as u64 * HP
    }
    fn what(&self, i: usize) -> String {
        format!(
            "{:?} mapping at {:#x} page {i} (file {} index {})",
            self.kind,
            self.addr,
            self.file,
            self.pgoff + i as u64
        )
    }
}

/// A hugetlbfs file or an anonymous shared mapping's pseudo-file.
struct FileModel {
    /// The test's handle of a hugetlbfs file; `None` for a pseudo-file.
    file: Option<Arc<File>>,
    /// Indices reserved or instantiated (Linux's region map of the inode).
    region: BTreeSet<u64>,
    /// Indices in the page cache.
    inst: BTreeSet<u64>,
    /// The last value written to each lane of each page.
    lanes: HashMap<u64, [u64; LANES]>,
    /// Index 0 was allocated at creation (`fallocate`): a private mapping's
    /// read of it maps the page-cache page.
    precached: bool,
    /// Still handed out to new mappings (hugetlbfs files only).
    current: bool,
}

struct Model {
    files: HashMap<u64, FileModel>,
    current: [u64; FILES],
}

#[derive(Default)]
struct Counters {
    writes: AtomicU64,
    reads: AtomicU64,
    maps: AtomicU64,
    map_enomem: AtomicU64,
    munmaps: AtomicU64,
    dontneeds: AtomicU64,
    forks: AtomicU64,
    fork_enomem: AtomicU64,
    child_ops: AtomicU64,
    child_bus: AtomicU64,
    owner_bus: AtomicU64,
    move_calls: AtomicU64,
    moved: AtomicU64,
    move_enomem: AtomicU64,
    move_unmoved: AtomicU64,
    pins: AtomicU64,
    pin_eagain: AtomicU64,
    pin_efault: AtomicU64,
    unpins: AtomicU64,
    respawns: AtomicU64,
    stats_reads: AtomicU64,
    remap_probes: AtomicU64,
    owed_bounded: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

struct Shared {
    model: Mutex<Model>,
    /// Reservations owed to the pool: an owner zapped an anonymous page
    /// that something else still held (a child's mapping, a pin), so its
    /// map has the reservation back at once but the pool only when that
    /// page is freed (Linux's restore flag). Meanwhile the pool's count is
    /// short, other allocations may take the page promised, and any
    /// reserved fault may find the pool empty: `SIGBUS`. The number owed now
    /// (an upper bound: a child may have freed its page already) and a
    /// count of changes, so that an access can tell whether one was owed at
    /// any time while it ran ([`Shared::owed_since`]).
    owed_active: AtomicI64,
    owed_events: AtomicU64,
    /// Pages of zapped private mappings that pins hold and that owe a
    /// reservation until the last of those pins goes.
    owing: Mutex<HashSet<Uid>>,
    next_id: AtomicU64,
    c: Counters,
}

impl Shared {
    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Relaxed)
    }
    fn owed_now(&self) -> (u64, i64) {
        (self.owed_events.load(SeqCst), self.owed_active.load(SeqCst))
    }
    /// Whether a reservation may have been owed at any time since `before`
    /// ([`Shared::owed_now`]).
    fn owed_since(&self, before: (u64, i64)) -> bool {
        let now = self.owed_now();
        before.1 > 0 || now.1 > 0 || now.0 != before.0
    }
    fn owe(&self) {
        self.owed_active.fetch_add(1, SeqCst);
        self.owed_events.fetch_add(1, SeqCst);
    }
    fn repay(&self) {
        self.owed_events.fetch_add(1, SeqCst);
        self.owed_active.fetch_sub(1, SeqCst);
    }
    /// Drops `pin`, taken out of `rest`: the last pin of a page that owes
    /// its reservation frees it, and the pool has the reservation again.
    fn unpin(&self, rest: &[Pin], pin: Pin, make_dirty: Option<bool>) {
        let target = pin.target;
        match make_dirty {
            Some(dirty) => pin.pages.unpin(dirty),
            None => drop(pin),
        }
        if let Target::Anon(uid) = target {
            if !rest.iter().any(|p| p.target == target) && self.owing.lock().unwrap().remove(&uid) {
                self.repay();
            }
        }
    }
    /// Records an access to page `idx` of file `key` (in the page cache
    /// from now on), and a write of `v` to `lane`.
    fn touch(&self, key: u64, idx: u64, write: Option<(usize, u64)>) {
        let mut m = self.model.lock().unwrap();
        let f = m.files.get_mut(&key).expect("file model");
        f.inst.insert(idx);
        if let Some((lane, v)) = write {
            f.lanes.entry(idx).or_default()[lane] = v;
        }
    }
    fn lane(&self, key: u64, idx: u64, lane: usize) -> u64 {
        let m = self.model.lock().unwrap();
        m.files[&key].lanes.get(&idx).map_or(0, |l| l[lane])
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Target {
    /// A private anonymous page.
    Anon(Uid),
    /// Page `idx` of file `key`'s page cache.
    Cache(u64, u64),
}

struct Pin {
    pages: PinnedPages,
    target: Target,
}

struct Proc {
    slot: usize,
    mm: Arc<AddressSpace>,
    /// Tags are `writer << 32 | seq`, unique per write.
    writer: u64,
    seq: u64,
    maps: Vec<Mapping>,
    pins: Vec<Pin>,
    /// What it did lately (its children included), for a failure's message.
    log: Vec<String>,
}

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[rng.below(xs.len() as u64) as usize]
}

impl Proc {
    fn new(phys: &Arc<PhysMem>, slot: usize, sh: &Shared, rng: &mut Rng) -> Proc {
        let config = MmConfig::default()
            .policy(pick(rng, FaultPolicy::ALL))
            .force_speculative(rng.one_in(2))
            .hugetlb_policy(pick(rng, HugetlbPolicy::ALL))
            .pin_policy(pick(rng, PinPolicy::ALL))
            .migrate_policy(pick(rng, &MigratePolicy::ALL))
            .unmap_policy(pick(rng, UnmapPolicy::ALL))
            .cap_sys_nice(true)
            .cap_ipc_lock(true);
        let mm = AddressSpace::new(phys, config).expect("valid config");
        Proc { slot, mm, writer: sh.id(), seq: 0, maps: Vec::new(), pins: Vec::new(), log: Vec::new() }
    }

    fn tag(&mut self) -> u64 {
        self.seq += 1;
        self.writer << 32 | self.seq
    }

    fn pinned(&self, uid: Uid) -> bool {
        self.pins.iter().any(|p| p.target == Target::Anon(uid))
    }

    /// A pin of a private anonymous page still mapped here: `fork` must
    /// copy it for the child, from outside the reservations.
    fn has_private_pins(&self) -> bool {
        let live = self.live_uids();
        self.pins.iter().any(|p| matches!(p.target, Target::Anon(u) if live.contains(&u)))
    }

    fn live_uids(&self) -> HashSet<Uid> {
        let mut s = HashSet::new();
        for m in &self.maps {
            for st in m.slots.iter().flatten() {
                if let PState::Anon { uid, .. } = st {
                    s.insert(*uid);
                }
            }
        }
        s
    }
}

// ---------------------------------------------------------------------------
// The worker of a long-lived process

struct Worker {
    p: Proc,
    cpu: Cpu,
    rng: Rng,
    sh: Arc<Shared>,
    phys: Arc<PhysMem>,
    child: Option<JoinHandle<Vec<String>>>,
    /// Reservations owed while the child lives ([`Shared::owe`]).
    child_owed: u64,
    /// Pins of processes that exited, for the coordinator.
    strays: Vec<Pin>,
}

impl Worker {
    /// Runs `ops` random operations, then waits for the child; with
    /// `HUGETLB_STRESS_LOG` set, a failure prints what the process did.
    fn run(mut self, ops: u64) -> (Proc, Vec<Pin>) {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.ops(ops)));
        if let Err(e) = res {
            if std::env::var_os("HUGETLB_STRESS_LOG").is_some() {
                eprintln!("proc {} log:\n{}", self.p.slot, self.p.log.join("\n"));
            }
            std::panic::resume_unwind(e);
        }
        self.join_child();
        drop(self.cpu);
        let n = self.p.log.len();
        self.p.log.drain(..n.saturating_sub(300));
        (self.p, self.strays)
    }

    fn ops(&mut self, ops: u64) {
        for _ in 0..ops {
            let maps: Vec<String> =
                self.p.maps.iter().map(|m| format!("{:?}@{:#x} f{} {:?}", m.kind, m.addr, m.file, m.slots)).collect();
            let owed = self.sh.owed_now();
            let pins: Vec<Target> = self.p.pins.iter().map(|p| p.target).collect();
            self.p.log.push(format!("maps {maps:?} pins {pins:?} owed {owed:?}"));
            let (name, op): (&str, fn(&mut Worker)) = match self.rng.below(100) {
                0..=21 => ("write", Worker::write),
                22..=31 => ("read", Worker::read),
                32..=45 => ("map", Worker::map),
                46..=52 => ("munmap", Worker::munmap),
                53..=60 => ("dontneed", Worker::dontneed),
                61..=68 => ("fork", Worker::fork),
                69..=79 => ("move_pages", Worker::move_pages),
                80..=89 => ("pin", Worker::pin),
                90..=97 => ("unpin", Worker::unpin),
                _ => ("respawn", Worker::respawn),
            };
            self.p.log.push(format!("{name}:"));
            op(self);
        }
    }

    fn join_child(&mut self) {
        if let Some(h) = self.child.take() {
            let log = join_all(vec![h]).pop().unwrap();
            self.p.log.extend(log);
            self.p.log.push("  child joined".into());
        }
        for _ in 0..std::mem::take(&mut self.child_owed) {
            self.sh.repay();
        }
    }

    /// A random mapped slot: (mapping, page).
    fn slot(&mut self) -> Option<(usize, usize)> {
        let all: Vec<(usize, usize)> = self
            .p
            .maps
            .iter()
            .enumerate()
            .flat_map(|(mi, m)| m.slots.iter().enumerate().filter_map(move |(i, s)| s.map(|_| (mi, i))))
            .collect();
        if all.is_empty() {
            return None;
        }
        Some(all[self.rng.below(all.len() as u64) as usize])
    }

    /// A zap by the owner of `uid`'s page: its reservation is owed to the
    /// pool while a child may still map the page or a pin holds it.
    fn zapped(&mut self, st: PState) {
        if let PState::Anon { uid, .. } = st {
            if self.child.as_ref().is_some_and(|h| !h.is_finished()) {
                self.sh.owe();
                self.child_owed += 1;
            }
            if self.p.pinned(uid) && self.sh.owing.lock().unwrap().insert(uid) {
                self.sh.owe();
            }
        }
    }

    fn write(&mut self) {
        let Some((mi, i)) = self.slot() else { return };
        bump(&self.sh.c.writes);
        let t = self.p.tag();
        let m = &self.p.maps[mi];
        let (base, what) = (m.base(i), m.what(i));
        let owed = self.sh.owed_now();
        if m.kind.private() {
            let st = m.slots[i].unwrap();
            let res = wr(&mut self.cpu, base, PRIV_LANE, t);
            self.p.log.push(format!("  write {what} ({st:?}): {res:?}"));
            let failed = res.is_err();
            match res {
                Ok(()) => {
                    let uid = match st {
                        PState::Anon { uid, .. } => uid,
                        _ => self.sh.id(),
                    };
                    self.p.maps[mi].slots[i] = Some(PState::Anon { uid, tag: t });
                }
                // A reserved fault finds the pool short only while a
                // reservation is owed back to it.
                Err(e) if is_bus(&e) && !matches!(st, PState::Anon { .. }) && self.sh.owed_since(owed) => {
                    bump(&self.sh.c.owner_bus)
                }
                Err(e) => panic!("{what}: owner's write ({st:?}): {e}"),
            }
            if failed {
                self.faulted_in(mi, i, true);
            }
        } else {
            let (key, idx) = (m.file, m.pgoff + i as u64);
            match wr(&mut self.cpu, base, self.p.slot as u64, t) {
                Ok(()) => self.sh.touch(key, idx, Some((self.p.slot, t))),
                Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.owner_bus),
                Err(e) => panic!("{what}: shared write: {e}"),
            }
        }
    }

    fn read(&mut self) {
        let Some((mi, i)) = self.slot() else { return };
        bump(&self.sh.c.reads);
        let m = &self.p.maps[mi];
        let (base, what, kind, key, idx, st) =
            (m.base(i), m.what(i), m.kind, m.file, m.pgoff + i as u64, m.slots[i].unwrap());
        let w = || what.clone();
        if !kind.private() {
            let want = self.sh.lane(key, idx, self.p.slot);
            let owed = self.sh.owed_now();
            match rd(&mut self.cpu, base, self.p.slot as u64, &w) {
                Ok(v) => {
                    assert_eq!(v, want, "{what}: this process's lane of a shared page");
                    self.sh.touch(key, idx, None);
                }
                Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.owner_bus),
                Err(e) => panic!("{what}: shared read: {e}"),
            }
            return;
        }
        let precached = kind == Kind::PrivFile && self.precached(key) && idx == 0;
        let owed = self.sh.owed_now();
        match st {
            PState::Anon { tag, .. } => {
                let v = rd(&mut self.cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(v, tag, "{what}: a private page reads back what its process wrote last");
                if kind == Kind::PrivAnon {
                    self.zeroes(base, &what);
                }
            }
            PState::Cache => {
                let v = rd(&mut self.cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(v, 0, "{what}: the page-cache page mapped privately");
            }
            // A read of a page the file may or may not have in its cache
            // (another process's shared mapping may add it any time)
            // either maps that page or allocates: not modelled.
            PState::Empty if kind == Kind::PrivFile && !precached => {}
            PState::Empty => match rd(&mut self.cpu, base, PRIV_LANE, &w) {
                Ok(v) => {
                    assert_eq!(v, 0, "{what}: a new page is zeroed");
                    let new = if precached { PState::Cache } else { PState::Anon { uid: self.sh.id(), tag: 0 } };
                    if kind == Kind::PrivAnon {
                        self.zeroes(base, &what);
                    }
                    self.p.maps[mi].slots[i] = Some(new);
                }
                Err(e) if is_bus(&e) && !precached && self.sh.owed_since(owed) => bump(&self.sh.c.owner_bus),
                Err(e) => panic!("{what}: owner's read fault: {e}"),
            },
        }
    }

    /// The lanes of a private anonymous mapping's page are never written:
    /// zero, as the pool zeroes what it hands out.
    fn zeroes(&mut self, base: u64, what: &str) {
        for lane in 0..LANES as u64 {
            let v = self.cpu.read_u64(word(base, 0, lane)).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(v, 0, "{what}: lane {lane} of a private anonymous page");
        }
    }

    fn precached(&self, key: u64) -> bool {
        self.sh.model.lock().unwrap().files[&key].precached
    }

    fn map(&mut self) {
        if self.p.maps.len() >= MAX_MAPS {
            return self.munmap();
        }
        bump(&self.sh.c.maps);
        let kind = pick(&mut self.rng, &[Kind::PrivAnon, Kind::PrivFile, Kind::SharedAnon, Kind::SharedFile]);
        let mm = &self.p.mm;
        let (res, key, pgoff, n) = match kind {
            Kind::PrivAnon | Kind::SharedAnon => {
                let n = 1 + self.rng.below(2);
                let share = if kind == Kind::PrivAnon { MAP_PRIVATE } else { MAP_SHARED };
                (mm.mmap(0, n * HP, RW, share | MAP_ANONYMOUS | MAP_HUGETLB, None, 0), 0, 0, n)
            }
            Kind::PrivFile | Kind::SharedFile => {
                let (key, file) = {
                    let m = self.sh.model.lock().unwrap();
                    let key = m.current[self.rng.below(FILES as u64) as usize];
                    (key, m.files[&key].file.clone().expect("a hugetlbfs file"))
                };
                let pgoff = self.rng.below(FILE_PAGES);
                let n = 1 + self.rng.below(FILE_PAGES - pgoff);
                let share = if kind == Kind::PrivFile { MAP_PRIVATE } else { MAP_SHARED };
                let huge = if self.rng.one_in(2) { MAP_HUGETLB } else { 0 };
                let open = OpenFile::read_write(&file);
                (mm.mmap(0, n * HP, RW, share | huge, Some(&open), pgoff * HP), key, pgoff, n)
            }
        };
        let addr = match res {
            Ok(a) => a,
            Err(Errno::NoMem) => return bump(&self.sh.c.map_enomem),
            Err(e) => panic!("mmap {kind:?} of {n} pages: {e}"),
        };
        let file = match kind {
            Kind::PrivAnon => 0,
            Kind::SharedAnon => {
                let key = self.sh.id();
                let f = FileModel {
                    file: None,
                    region: (0..n).collect(),
                    inst: BTreeSet::new(),
                    lanes: HashMap::new(),
                    precached: false,
                    current: false,
                };
                self.sh.model.lock().unwrap().files.insert(key, f);
                key
            }
            Kind::SharedFile => {
                self.sh.model.lock().unwrap().files.get_mut(&key).unwrap().region.extend(pgoff..pgoff + n);
                key
            }
            Kind::PrivFile => key,
        };
        let slots = vec![Some(PState::Empty); n as usize];
        self.p.maps.push(Mapping { addr, kind, file, pgoff, slots });
    }

    /// A random range `[i, j)` of pages of mapping `mi` that are all
    /// mapped (a hole may hold another mapping since), or with `whole` the
    /// longest such range around a random mapped page.
    fn range(&mut self, mi: usize, whole: bool) -> (usize, usize) {
        let slots = &self.p.maps[mi].slots;
        let mapped: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].is_some()).collect();
        let k = mapped[self.rng.below(mapped.len() as u64) as usize];
        let lo = (0..=k).rev().take_while(|&x| slots[x].is_some()).last().unwrap();
        let hi = (k..slots.len()).take_while(|&x| slots[x].is_some()).last().unwrap() + 1;
        if whole {
            return (lo, hi);
        }
        let i = lo + self.rng.below((hi - lo) as u64) as usize;
        let j = i + 1 + self.rng.below((hi - i) as u64) as usize;
        (i, j)
    }

    fn munmap(&mut self) {
        if self.p.maps.is_empty() {
            return;
        }
        bump(&self.sh.c.munmaps);
        let mi = self.rng.below(self.p.maps.len() as u64) as usize;
        let whole = self.rng.one_in(2);
        let (i, j) = self.range(mi, whole);
        let m = &self.p.maps[mi];
        self.p.log.push(format!("  munmap {} pages [{i}, {j})", m.what(i)));
        self.p.mm.munmap(m.base(i), (j - i) as u64 * HP).unwrap_or_else(|e| panic!("munmap {}: {e}", m.what(i)));
        for k in i..j {
            if let Some(st) = self.p.maps[mi].slots[k].take() {
                self.zapped(st);
            }
        }
        if self.p.maps[mi].slots.iter().all(Option::is_none) {
            self.p.maps.remove(mi);
        }
    }

    fn dontneed(&mut self) {
        if self.p.maps.is_empty() {
            return;
        }
        let mi = self.rng.below(self.p.maps.len() as u64) as usize;
        let (i, j) = self.range(mi, false);
        bump(&self.sh.c.dontneeds);
        let m = &self.p.maps[mi];
        let len = (j - i) as u64 * HP;
        self.p.mm.madvise(m.base(i), len, MADV_DONTNEED).unwrap_or_else(|e| panic!("MADV_DONTNEED {}: {e}", m.what(i)));
        if !m.kind.private() {
            return;
        }
        for k in i..j {
            let st = self.p.maps[mi].slots[k].unwrap();
            self.zapped(st);
            self.p.maps[mi].slots[k] = Some(PState::Empty);
        }
    }

    fn fork(&mut self) {
        self.join_child();
        bump(&self.sh.c.forks);
        let child = match self.p.mm.fork() {
            Ok(c) => c,
            // copy_hugetlb_page_range copies a pinned page for the child
            // from outside the reservations: the pool may have none.
            Err(Errno::NoMem) if self.p.has_private_pins() => return bump(&self.sh.c.fork_enomem),
            Err(e) => panic!("fork: {e}"),
        };
        let maps: Vec<CMap> = self
            .p
            .maps
            .iter()
            .map(|m| CMap {
                addr: m.addr,
                kind: m.kind,
                file: m.file,
                pgoff: m.pgoff,
                slots: m
                    .slots
                    .iter()
                    .map(|s| {
                        s.map(|st| match st {
                            PState::Empty => CState::Empty,
                            PState::Cache => CState::Seen(0),
                            PState::Anon { tag, .. } => CState::Seen(tag),
                        })
                    })
                    .collect(),
            })
            .collect();
        let c = Child {
            mm: child,
            maps,
            lane: PROCS + self.p.slot,
            writer: self.sh.id(),
            seq: 0,
            sh: self.sh.clone(),
            rng: Rng::new(self.rng.next()),
        };
        self.child = Some(spawn(format!("child of {}", self.p.slot), move || c.run()));
    }

    fn move_pages(&mut self) {
        let n = 1 + self.rng.below(3) as usize;
        let mut picked = Vec::new();
        for _ in 0..n {
            if let Some(s) = self.slot() {
                if !picked.contains(&s) {
                    picked.push(s);
                }
            }
        }
        if picked.is_empty() {
            return;
        }
        bump(&self.sh.c.move_calls);
        let addrs: Vec<u64> =
            picked.iter().map(|&(mi, i)| self.p.maps[mi].base(i) + self.rng.below(512) * 4096).collect();
        let nodes: Vec<i32> = picked.iter().map(|_| self.rng.below(NODES as u64) as i32).collect();
        let mut status = vec![i32::MIN; picked.len()];
        let res = self.p.mm.move_pages(&addrs, Some(&nodes), &mut status, MPOL_MF_MOVE_ALL);
        match res {
            Ok(0) => {}
            // Pinned or referenced meanwhile: left where they are.
            Ok(_) => bump(&self.sh.c.move_unmoved),
            // No free unreserved page on a target node.
            Err(Errno::NoMem) => bump(&self.sh.c.move_enomem),
            Err(e) => panic!("move_pages: {e}"),
        }
        for (k, &(mi, i)) in picked.iter().enumerate() {
            let m = &self.p.maps[mi];
            let st = m.slots[i].unwrap();
            let (s, node) = (status[k], nodes[k]);
            let what = m.what(i);
            match (m.kind.private(), st) {
                // Nothing mapped there: nothing to move.
                (true, PState::Empty) => assert!(s == -libc::ENOENT || s == i32::MIN, "{what}: empty, status {s}"),
                // Only this thread reaches its private anonymous pages.
                (true, PState::Anon { .. }) if res == Ok(0) => assert_eq!(s, node, "{what}: moved"),
                // A page-cache page: another process may add it, or be
                // moving it too.
                _ => assert!(
                    s == node || s == -libc::ENOENT || s == -libc::EBUSY || s == i32::MIN,
                    "{what}: status {s} for node {node}"
                ),
            }
            if s == node {
                bump(&self.sh.c.moved);
            }
            if let PState::Anon { tag, .. } = st {
                let w = || what.clone();
                let v = rd(&mut self.cpu, m.base(i), PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(v, tag, "{what}: data after move_pages");
                if s == node {
                    let mut q = [i32::MIN];
                    self.p.mm.move_pages(&[m.base(i)], None, &mut q, 0).unwrap();
                    assert_eq!(q[0], node, "{what}: the node move_pages reported");
                }
            }
        }
    }

    fn pin(&mut self) {
        let Some((mi, i)) = self.slot() else { return };
        let flags = pick(&mut self.rng, &[Foll::empty(), Foll::WRITE, Foll::WRITE | Foll::LONGTERM, Foll::LONGTERM]);
        let npages = 1 + self.rng.below(3) as usize;
        let m = &self.p.maps[mi];
        let (base, what, kind, key, idx) = (m.base(i), m.what(i), m.kind, m.file, m.pgoff + i as u64);
        let st = m.slots[i].unwrap();
        let write = flags.contains(Foll::WRITE);
        let long = flags.contains(Foll::LONGTERM);
        let precached = kind == Kind::PrivFile && self.precached(key) && idx == 0;
        // A read of a private file page the cache may or may not hold: not modelled.
        if kind == Kind::PrivFile && st == PState::Empty && !write && !precached {
            return;
        }
        bump(&self.sh.c.pins);
        let owed = self.sh.owed_now();
        let res = self.p.mm.pin_user_pages(base, npages, flags);
        self.p.log.push(format!("  pin {what} ({st:?}) {npages} {flags:?}: {:?}", res.as_ref().map(|_| ())));
        let failed = match &res {
            Ok(_) => None,
            Err(Errno::Again) => Some(&self.sh.c.pin_eagain),
            // The fault's SIGBUS: a reserved fault while a reservation is owed.
            Err(Errno::Fault) if !matches!(st, PState::Anon { .. }) && self.sh.owed_since(owed) => {
                Some(&self.sh.c.pin_efault)
            }
            Err(e) => panic!("{what}: pin_user_pages({npages}, {flags:?}) ({st:?}): {e}"),
        };
        // A pin that failed may have faulted the page in first (a read
        // fault of a page-cache page whose unshare then found no page, a
        // fault before EAGAIN).
        let Ok(pin) = res else {
            bump(failed.expect("an expected failure"));
            return self.faulted_in(mi, i, write);
        };
        assert_eq!(pin.len(), npages);
        let mut buf = [0u8; 8];
        let w = || what.clone();
        if !kind.private() {
            let lane = self.p.slot as u64;
            if write {
                let t = self.p.tag();
                pin.write(lane * 8, &t.to_le_bytes()).unwrap();
                for sub in &SUBPAGES[1..] {
                    self.cpu.write_u64(word(base, *sub, lane), t).unwrap_or_else(|e| panic!("{what}: {e}"));
                }
                self.sh.touch(key, idx, Some((self.p.slot, t)));
            } else {
                self.sh.touch(key, idx, None);
            }
            let want = self.sh.lane(key, idx, self.p.slot);
            pin.read(lane * 8, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), want, "{what}: the device reads the page's lane");
            let v = rd(&mut self.cpu, base, lane, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(v, want, "{what}: the CPU reads what the device sees");
            self.p.pins.push(Pin { pages: pin, target: Target::Cache(key, idx) });
            return;
        }
        // Private: a write pin breaks COW, a long-term read pin of a
        // page-cache page unshares it (an anonymous copy), a short read pin
        // of one pins the cache's page.
        let (new, target) = match st {
            PState::Anon { uid, tag } if !write => (PState::Anon { uid, tag }, Target::Anon(uid)),
            PState::Cache | PState::Empty if !write && !long && kind == Kind::PrivFile => {
                (PState::Cache, Target::Cache(key, idx))
            }
            PState::Anon { uid, .. } => {
                let t = self.p.tag();
                (PState::Anon { uid, tag: t }, Target::Anon(uid))
            }
            _ => {
                let uid = self.sh.id();
                let tag = if write { self.p.tag() } else { 0 };
                (PState::Anon { uid, tag }, Target::Anon(uid))
            }
        };
        let want = match new {
            PState::Anon { tag, .. } => tag,
            _ => 0,
        };
        if write {
            pin.write(PRIV_LANE * 8, &want.to_le_bytes()).unwrap();
            for sub in &SUBPAGES[1..] {
                self.cpu
                    .write_u64(word(base, *sub, PRIV_LANE), want)
                    .unwrap_or_else(|e| panic!("{what}: write beside a write pin: {e}"));
            }
        }
        pin.read(PRIV_LANE * 8, &mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), want, "{what}: the device reads the pinned page ({st:?} -> {new:?})");
        let v = rd(&mut self.cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(v, want, "{what}: the CPU reads the pinned page ({st:?} -> {new:?}, {flags:?})");
        self.p.maps[mi].slots[i] = Some(new);
        self.p.pins.push(Pin { pages: pin, target });
    }

    /// After a failed access or pin of page `i` of mapping `mi`: whatever
    /// it faulted in before failing, now in the model (the page-cache page
    /// of a shared mapping; a private mapping's page-cache page for a read
    /// of a page the file holds for good, else an anonymous page, zeroed
    /// or a copy of the cache's, whose private lane is 0 either way).
    fn faulted_in(&mut self, mi: usize, i: usize, write: bool) {
        let m = &self.p.maps[mi];
        let (key, idx) = (m.file, m.pgoff + i as u64);
        let mut vec = [0u8; 1];
        self.p.mm.mincore(m.base(i), 4096, &mut vec).unwrap();
        if vec[0] & 1 == 0 {
            return;
        }
        if !m.kind.private() {
            return self.sh.touch(key, idx, None);
        }
        if m.slots[i] == Some(PState::Empty) {
            let cache = m.kind == Kind::PrivFile && !write && idx == 0 && self.precached(key);
            let new = if cache { PState::Cache } else { PState::Anon { uid: self.sh.id(), tag: 0 } };
            self.p.log.push(format!("  faulted in before failing: {new:?}"));
            self.p.maps[mi].slots[i] = Some(new);
        }
    }

    fn unpin(&mut self) {
        if self.p.pins.is_empty() {
            return;
        }
        bump(&self.sh.c.unpins);
        let k = self.rng.below(self.p.pins.len() as u64) as usize;
        let pin = self.p.pins.swap_remove(k);
        let how = if self.rng.one_in(2) { None } else { Some(self.rng.one_in(2)) };
        self.sh.unpin(&self.p.pins, pin, how);
    }

    /// The process exits (its pins live on) and a new one takes its slot.
    fn respawn(&mut self) {
        self.join_child();
        bump(&self.sh.c.respawns);
        let all: Vec<PState> = self.p.maps.iter().flat_map(|m| m.slots.iter().flatten().copied()).collect();
        for st in all {
            self.zapped(st);
        }
        let new = Proc::new(&self.phys, self.p.slot, &self.sh, &mut self.rng);
        let old = std::mem::replace(&mut self.p, new);
        self.strays.extend(old.pins);
        self.cpu = Cpu::attached(&self.p.mm);
        drop(old.mm);
    }
}

// ---------------------------------------------------------------------------
// Children

#[derive(Clone, Copy, Debug)]
enum CState {
    /// Nothing mapped here in the child.
    Empty,
    /// Inherited (or first faulted in) holding this tag; the owner may take
    /// an inherited page back (`unmap_ref_private`): `SIGBUS`.
    Seen(u64),
    /// Written by the child itself: its own page.
    Own(u64),
}

struct CMap {
    addr: u64,
    kind: Kind,
    file: u64,
    pgoff: u64,
    slots: Vec<Option<CState>>,
}

struct Child {
    mm: Arc<AddressSpace>,
    maps: Vec<CMap>,
    lane: usize,
    writer: u64,
    seq: u64,
    sh: Arc<Shared>,
    rng: Rng,
}

impl Child {
    fn run(mut self) -> Vec<String> {
        let mut log = Vec::new();
        let mut cpu = Cpu::attached(&self.mm);
        let ops = 2 + self.rng.below(6);
        for _ in 0..ops {
            let all: Vec<(usize, usize)> = self
                .maps
                .iter()
                .enumerate()
                .flat_map(|(mi, m)| m.slots.iter().enumerate().filter_map(move |(i, s)| s.map(|_| (mi, i))))
                .collect();
            if all.is_empty() {
                break;
            }
            bump(&self.sh.c.child_ops);
            let (mi, i) = all[self.rng.below(all.len() as u64) as usize];
            let m = &self.maps[mi];
            let base = m.addr + i as u64 * HP;
            let what =
                format!("child: {:?} mapping at {base:#x} (file {} index {})", m.kind, m.file, m.pgoff + i as u64);
            let w = || what.clone();
            let st = m.slots[i].unwrap();
            let op = self.rng.below(10);
            log.push(format!("  child op {op} (0-3 read, 4-7 write, 8 dontneed, 9 munmap) {what} {st:?}"));
            match op {
                0..=3 => {
                    if !m.kind.private() {
                        let (key, idx) = (m.file, m.pgoff + i as u64);
                        let want = self.sh.lane(key, idx, self.lane);
                        let owed = self.sh.owed_now();
                        match rd(&mut cpu, base, self.lane as u64, &w) {
                            Ok(v) => {
                                assert_eq!(v, want, "{what}: the child's lane of a shared page");
                                self.sh.touch(key, idx, None);
                            }
                            Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.child_bus),
                            Err(e) => panic!("{what}: {e}"),
                        }
                        continue;
                    }
                    match (rd(&mut cpu, base, PRIV_LANE, &w), st) {
                        (Ok(v), CState::Seen(t) | CState::Own(t)) => {
                            assert_eq!(v, t, "{what}: the child reads its page ({st:?})")
                        }
                        (Ok(v), CState::Empty) => {
                            assert_eq!(v, 0, "{what}: the child's new page");
                            self.maps[mi].slots[i] = Some(CState::Seen(0));
                        }
                        // No unreserved page for the child, or its parent took
                        // the page back.
                        (Err(e), CState::Seen(_) | CState::Empty) if is_bus(&e) => bump(&self.sh.c.child_bus),
                        (Err(e), _) => panic!("{what}: child's read ({st:?}): {e}"),
                    }
                }
                4..=7 => {
                    self.seq += 1;
                    let t = self.writer << 32 | self.seq;
                    if !m.kind.private() {
                        let (key, idx) = (m.file, m.pgoff + i as u64);
                        let owed = self.sh.owed_now();
                        match wr(&mut cpu, base, self.lane as u64, t) {
                            Ok(()) => self.sh.touch(key, idx, Some((self.lane, t))),
                            Err(e) if is_bus(&e) && self.sh.owed_since(owed) => bump(&self.sh.c.child_bus),
                            Err(e) => panic!("{what}: {e}"),
                        }
                        continue;
                    }
                    match (wr(&mut cpu, base, PRIV_LANE, t), st) {
                        (Ok(()), _) => self.maps[mi].slots[i] = Some(CState::Own(t)),
                        (Err(e), CState::Seen(_) | CState::Empty) if is_bus(&e) => bump(&self.sh.c.child_bus),
                        (Err(e), _) => panic!("{what}: child's write ({st:?}): {e}"),
                    }
                }
                8 => {
                    self.mm.madvise(base, HP, MADV_DONTNEED).unwrap_or_else(|e| panic!("{what}: {e}"));
                    if m.kind.private() {
                        self.maps[mi].slots[i] = Some(CState::Empty);
                    }
                }
                _ => {
                    self.mm.munmap(base, HP).unwrap_or_else(|e| panic!("{what}: {e}"));
                    self.maps[mi].slots[i] = None;
                }
            }
        }
        drop(cpu);
        log
    }
}

// ---------------------------------------------------------------------------
// The world and its checks

struct World {
    phys: Arc<PhysMem>,
    sh: Arc<Shared>,
    seed: u64,
    procs: Vec<Proc>,
    /// Pins whose process exited.
    strays: Vec<Pin>,
    rng: Rng,
}

/// The stats reader: the pool's counts are consistent at every instant.
fn watch_stats(phys: Arc<PhysMem>, stop: Arc<AtomicBool>, sh: Arc<Shared>) {
    let mut allocations = 0;
    loop {
        let done = stop.load(Relaxed);
        let s = phys.huge_page_stats();
        assert_eq!(s.total, TOTAL, "{s:?}");
        assert!(s.free <= s.total, "free > total: {s:?}");
        assert!(s.rsvd <= s.free, "rsvd > free: {s:?}");
        assert_eq!(s.surp, 0, "{s:?}");
        assert!(s.allocations >= allocations, "allocations went back: {s:?}");
        allocations = s.allocations;
        bump(&sh.c.stats_reads);
        if done {
            return;
        }
        thread::sleep(Duration::from_micros(200));
    }
}

impl World {
    fn new(seed: u64) -> World {
        let small = 24 << 20;
        let bytes = NODES as u64 * (small + (HUGE_PER_NODE + 1) * HP);
        let phys = PhysMem::new(PhysConfig::new(bytes).nodes(NODES).hugepages(HUGE_PER_NODE)).expect("arena");
        let sh = Arc::new(Shared {
            model: Mutex::new(Model { files: HashMap::new(), current: [0; FILES] }),
            owed_active: AtomicI64::new(0),
            owed_events: AtomicU64::new(0),
            owing: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(1),
            c: Counters::default(),
        });
        let mut rng = Rng::new(seed);
        let procs = (0..PROCS).map(|slot| Proc::new(&phys, slot, &sh, &mut rng)).collect();
        let mut w = World { phys, sh, seed, procs, strays: Vec::new(), rng };
        for k in 0..FILES {
            w.new_file(k);
        }
        w
    }

    /// A new hugetlbfs file for slot `k` of the files rounds map; the old
    /// one lives on while mapped.
    fn new_file(&mut self, k: usize) {
        let key = self.sh.id();
        let file = File::create_hugetlbfs(&self.phys, &format!("/stress-{key}"), FILE_PAGES * HP).unwrap();
        let mut f = FileModel {
            file: Some(file.clone()),
            region: BTreeSet::new(),
            inst: BTreeSet::new(),
            lanes: HashMap::new(),
            precached: false,
            current: true,
        };
        if self.rng.one_in(2) {
            match file.fallocate(0, 0, HP) {
                Ok(()) => {
                    f.precached = true;
                    f.region.insert(0);
                    f.inst.insert(0);
                }
                Err(Errno::NoSpc) => {}
                Err(e) => panic!("fallocate: {e}"),
            }
        }
        let mut m = self.sh.model.lock().unwrap();
        let old = m.current[k];
        if let Some(o) = m.files.get_mut(&old) {
            o.current = false;
        }
        m.current[k] = key;
        m.files.insert(key, f);
    }

    fn round(&mut self, r: u64) {
        // Between rounds: replace a file now and then, let some pins of
        // exited processes go.
        for k in 0..FILES {
            if self.rng.one_in(4) {
                self.new_file(k);
            }
        }
        for k in (0..self.strays.len()).rev() {
            if self.rng.one_in(2) {
                let pin = self.strays.swap_remove(k);
                self.sh.unpin(&self.strays, pin, None);
            }
        }
        // Now and then, every pin of a page nothing maps goes: the pool
        // has every reservation back and the next check is exact.
        if self.rng.one_in(3) {
            self.strays.clear();
            for p in &mut self.procs {
                let live = p.live_uids();
                p.pins.retain(|pin| !matches!(pin.target, Target::Anon(u) if !live.contains(&u)));
            }
            let mut owing = self.sh.owing.lock().unwrap();
            for _ in owing.drain() {
                self.sh.repay();
            }
        }

        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (phys, stop, sh) = (self.phys.clone(), stop.clone(), self.sh.clone());
            spawn("stats".into(), move || watch_stats(phys, stop, sh))
        };
        let workers: Vec<_> = std::mem::take(&mut self.procs)
            .into_iter()
            .map(|p| {
                let rng = Rng::new(self.seed ^ (r << 20) ^ (p.slot as u64) << 8 ^ 0x9e37);
                let (sh, phys) = (self.sh.clone(), self.phys.clone());
                spawn(format!("proc {} round {r}", p.slot), move || {
                    let cpu = Cpu::attached(&p.mm);
                    Worker { p, cpu, rng, sh, phys, child: None, child_owed: 0, strays: Vec::new() }.run(OPS)
                })
            })
            .collect();
        let results = join_all(workers);
        stop.store(true, Relaxed);
        join_all(vec![watcher]);
        for (p, strays) in results {
            self.procs.push(p);
            self.strays.extend(strays);
        }
        self.check(r);
    }

    /// The model, for a failure's message.
    fn dump(&self) -> String {
        let mut out = String::new();
        let live = self.live_uids();
        for p in &self.procs {
            out += &format!("proc {} (writer {}):\n", p.slot, p.writer);
            for m in &p.maps {
                out += &format!("  {:?} at {:#x} file {} pgoff {}: {:?}\n", m.kind, m.addr, m.file, m.pgoff, m.slots);
            }
            for pin in &p.pins {
                out += &format!(
                    "  pin {:?} live {}\n",
                    pin.target,
                    matches!(pin.target, Target::Anon(u) if live.contains(&u))
                );
            }
            if std::env::var_os("HUGETLB_STRESS_LOG").is_some() {
                out += &format!("  log:\n    {}\n", p.log.join("\n    "));
            }
        }
        for pin in &self.strays {
            out += &format!(
                "stray pin {:?} live {}\n",
                pin.target,
                matches!(pin.target, Target::Anon(u) if live.contains(&u))
            );
        }
        let model = self.sh.model.lock().unwrap();
        let mut keys: Vec<_> = model.files.keys().collect();
        keys.sort();
        for k in keys {
            let f = &model.files[k];
            out += &format!(
                "file {k} ({}): region {:?} inst {:?} precached {} current {}\n",
                if f.file.is_some() { "hugetlbfs" } else { "pseudo" },
                f.region,
                f.inst,
                f.precached,
                f.current
            );
        }
        out
    }

    fn live_uids(&self) -> HashSet<Uid> {
        self.procs.iter().flat_map(|p| p.live_uids()).collect()
    }

    fn pins(&self) -> impl Iterator<Item = &Pin> {
        self.procs.iter().flat_map(|p| p.pins.iter()).chain(self.strays.iter())
    }

    /// Drops the models (and handles) of files nothing maps any more, but
    /// the hugetlbfs files still handed out.
    fn collect_files(&mut self) {
        let mapped: HashSet<u64> = self
            .procs
            .iter()
            .flat_map(|p| p.maps.iter())
            .filter(|m| m.kind != Kind::PrivAnon)
            .map(|m| m.file)
            .collect();
        let mut model = self.sh.model.lock().unwrap();
        model.files.retain(|k, f| f.current || mapped.contains(k));
    }

    /// After a round, its threads joined: the pool (`free <= total`, the
    /// nodes' sums, and free + pages in use == total, the pages in use
    /// counted without the pool), `HugePages_Rsvd` against the model's
    /// reservations (exact, or bounded while pins hold pages whose
    /// reservations the pool is owed), every mapping's data, that reading
    /// it allocated nothing, and the remap probe.
    fn check(&mut self, r: u64) {
        let ctx = format!("round {r} (STRESS_SEED={})", self.seed);
        self.collect_files();
        // Deferred frees (page tables, old VMA trees) run at grace periods;
        // pages and reservations go before the calls that drop them return.
        grace_periods(&self.phys);
        let s = self.phys.huge_page_stats();
        assert!(s.free <= s.total && s.total == TOTAL, "{ctx}: {s:?}");
        let nodes = self.phys.huge_page_node_stats();
        assert_eq!(nodes.iter().map(|n| n.total).sum::<u64>(), s.total, "{ctx}: node totals");
        assert_eq!(nodes.iter().map(|n| n.free).sum::<u64>(), s.free, "{ctx}: node free pages");

        // Pages in use, counted without the pool: the page caches of live
        // files (File::cached_pages for hugetlbfs files; a pseudo-file has
        // no handle: its pages are the model's, checked below by mincore
        // and by reading them back without an allocation), the private
        // anonymous pages mapped (mincore), and the pages only pins hold
        // (no public API reaches a page nothing maps: the model's count).
        let dump = self.dump();
        let model = self.sh.model.lock().unwrap();
        let mut cached = 0;
        let mut rsvd = 0;
        for (key, f) in &model.files {
            if let Some(file) = &f.file {
                assert_eq!(file.cached_pages() as u64, f.inst.len() as u64, "{ctx}: file {key}'s page cache");
                for idx in 0..FILE_PAGES {
                    assert_eq!(file.is_cached(idx), f.inst.contains(&idx), "{ctx}: file {key} index {idx} cached");
                }
            }
            assert!(f.inst.is_subset(&f.region), "{ctx}: file {key}: an instantiated page outside the region map");
            cached += f.inst.len() as u64;
            rsvd += (f.region.len() - f.inst.len()) as u64;
        }
        let mut private = 0;
        for p in &self.procs {
            let mut hugetlb_pages = 0;
            for m in &p.maps {
                for (i, st) in m.slots.iter().enumerate() {
                    let Some(st) = st else { continue };
                    let mut vec = vec![0u8; 512];
                    p.mm.mincore(m.base(i), HP, &mut vec).unwrap();
                    let present = vec[0] & 1 == 1;
                    assert!(
                        vec.iter().all(|&b| b & 1 == vec[0] & 1),
                        "{ctx}: {}: mincore of part of a huge page",
                        m.what(i)
                    );
                    hugetlb_pages += present as u64 * 512;
                    let what = m.what(i);
                    if m.kind.private() {
                        let want = !matches!(st, PState::Empty);
                        assert_eq!(present, want, "{ctx}: proc {} {what}: mapped ({st:?})\n{dump}", p.slot);
                        match st {
                            PState::Anon { .. } => private += 1,
                            // The reservation of a page not (privately) allocated.
                            _ => rsvd += 1,
                        }
                    } else if present {
                        let idx = m.pgoff + i as u64;
                        assert!(
                            model.files[&m.file].inst.contains(&idx),
                            "{ctx}: proc {} {what}: mapped, not instantiated",
                            p.slot
                        );
                    }
                }
            }
            assert_eq!(
                p.mm.stats().hugetlb_pages,
                hugetlb_pages,
                "{ctx}: proc {}: HugetlbPages against mincore",
                p.slot
            );
        }
        let live = self.live_uids();
        let orphans: HashSet<Target> = self
            .pins()
            .map(|p| p.target)
            .filter(|t| match *t {
                Target::Anon(u) => !live.contains(&u),
                Target::Cache(key, _) => !model.files.contains_key(&key),
            })
            .collect();
        let pending = orphans.iter().filter(|t| matches!(t, Target::Anon(_))).count() as u64;
        let in_use = cached + private + orphans.len() as u64;
        assert_eq!(
            s.free + in_use,
            s.total,
            "{ctx}: free {} + in use {in_use} (cached {cached}, private {private}, only pinned {}) != total: {s:?}\n{dump}",
            s.free,
            orphans.len()
        );
        // HugePages_Rsvd: exact, but for the reservations an owner's zap
        // gave back to its map while a pin still holds the page: the pool
        // has them only when the page is freed (Linux's restore flag), and
        // whether a zap by munmap or exit owes one (Linux: yes, the close
        // unreserves first) is not asserted: a bound.
        if pending == 0 {
            assert_eq!(s.rsvd, rsvd, "{ctx}: HugePages_Rsvd against the model: {s:?}\n{dump}");
        } else {
            bump(&self.sh.c.owed_bounded);
            assert!(
                s.rsvd <= rsvd && s.rsvd >= rsvd.saturating_sub(pending),
                "{ctx}: HugePages_Rsvd {} outside [{} - {pending}, {rsvd}]: {s:?}\n{dump}",
                s.rsvd,
                rsvd
            );
        }
        drop(model);

        self.check_data(&ctx);
        let after = self.phys.huge_page_stats();
        assert_eq!((after.free, after.rsvd), (s.free, s.rsvd), "{ctx}: reading the data allocated: {s:?} -> {after:?}");
        // With a reservation owed, the pool promises more than it holds.
        if pending == 0 {
            self.remap_probe(&ctx);
        }
    }

    /// Every private page reads back its process's last tag (so no two
    /// private mappings share a frame after a write, and no child's write
    /// shows in its parent), every shared page every lane's last write,
    /// through the mappings and, for hugetlbfs files, `File::read_at`.
    fn check_data(&self, ctx: &str) {
        let model = self.sh.model.lock().unwrap();
        for p in &self.procs {
            let mut cpu = Cpu::attached(&p.mm);
            for m in &p.maps {
                for (i, st) in m.slots.iter().enumerate() {
                    let Some(st) = st else { continue };
                    let what = format!("{ctx}: proc {} {}", p.slot, m.what(i));
                    let w = || what.clone();
                    let base = m.base(i);
                    if m.kind.private() {
                        let want = match st {
                            PState::Anon { tag, .. } => *tag,
                            PState::Cache => 0,
                            PState::Empty => continue,
                        };
                        let v = rd(&mut cpu, base, PRIV_LANE, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(v, want, "{what}: private data ({st:?})");
                        if m.kind == Kind::PrivAnon {
                            for lane in 0..LANES as u64 {
                                assert_eq!(cpu.read_u64(word(base, 0, lane)), Ok(0), "{what}: lane {lane}");
                            }
                        }
                        let mut q = [i32::MIN];
                        p.mm.move_pages(&[base], None, &mut q, 0).unwrap();
                        assert!((0..NODES as i32).contains(&q[0]), "{what}: node {}", q[0]);
                        continue;
                    }
                    let f = &model.files[&m.file];
                    let idx = m.pgoff + i as u64;
                    if !f.inst.contains(&idx) {
                        continue;
                    }
                    let lanes = f.lanes.get(&idx).copied().unwrap_or_default();
                    for (lane, want) in lanes.iter().enumerate() {
                        let v = rd(&mut cpu, base, lane as u64, &w).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(v, *want, "{what}: shared lane {lane}");
                    }
                    assert_eq!(cpu.read_u64(word(base, 0, PRIV_LANE)), Ok(0), "{what}: a shared page's private lane");
                }
            }
        }
        for (key, f) in model.files.iter() {
            let Some(file) = &f.file else { continue };
            for &idx in &f.inst {
                let lanes = f.lanes.get(&idx).copied().unwrap_or_default();
                for (lane, want) in lanes.iter().enumerate() {
                    for sub in SUBPAGES {
                        let mut buf = [0u8; 8];
                        file.read_at(word(idx * HP, sub, lane as u64), &mut buf).unwrap();
                        assert_eq!(
                            u64::from_le_bytes(buf),
                            *want,
                            "{ctx}: file {key} index {idx} lane {lane} (read_at)"
                        );
                    }
                }
            }
        }
    }

    /// What the pool can still promise is mapped shared and anonymous,
    /// touched, unmapped, and mapped again: the second `mmap` needs what
    /// the first `munmap` released, before it returned.
    fn remap_probe(&mut self, ctx: &str) {
        let s = self.phys.huge_page_stats();
        let n = s.free - s.rsvd;
        if n == 0 {
            return;
        }
        bump(&self.sh.c.remap_probes);
        let mm = self.procs[0].mm.clone();
        let flags = MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB;
        let a = mm.mmap(0, n * HP, RW, flags, None, 0).unwrap_or_else(|e| panic!("{ctx}: {n} pages of {s:?}: {e}"));
        let mut cpu = Cpu::attached(&mm);
        for i in 0..n {
            cpu.write_u64(a + i * HP, i + 1).unwrap();
        }
        mm.munmap(a, n * HP).unwrap();
        let now = self.phys.huge_page_stats();
        assert_eq!((now.free, now.rsvd), (s.free, s.rsvd), "{ctx}: munmap released the probe's pages");
        match mm.mmap(0, n * HP, RW, flags, None, 0) {
            Ok(b) => {
                for i in 0..n {
                    assert_eq!(cpu.read_u64(b + i * HP), Ok(0), "{ctx}: a new shared anonymous mapping is zeroed");
                }
                mm.munmap(b, n * HP).unwrap();
            }
            Err(e) => panic!("{ctx}: {n} shared anonymous pages mapped again after munmap: {e}"),
        }
        drop(cpu);
        grace_periods(&self.phys);
        let now = self.phys.huge_page_stats();
        assert_eq!((now.free, now.rsvd), (s.free, s.rsvd), "{ctx}: the probe left pages behind");
    }

    fn finish(mut self) {
        // Exit in a random order, some pins going before their process.
        while !self.procs.is_empty() {
            let k = self.rng.below(self.procs.len() as u64) as usize;
            let p = self.procs.swap_remove(k);
            if self.rng.one_in(2) {
                drop(p.pins);
                drop(p.mm);
            } else {
                drop(p.mm);
                drop(p.pins);
            }
        }
        self.strays.clear();
        self.sh.model.lock().unwrap().files.clear();
        let c = &self.sh.c;
        let g = |x: &AtomicU64| x.load(Relaxed);
        eprintln!(
            "hugetlb_stress: writes {} reads {} maps {} (ENOMEM {}) munmaps {} dontneeds {} forks {} (ENOMEM {}) \
             child ops {} (SIGBUS {}) owner SIGBUS {} move_pages {} (moved {}, ENOMEM {}, unmoved {}) pins {} \
             (EAGAIN {}, EFAULT {}) unpins {} respawns {} stats reads {} remap probes {} rsvd bounded {}",
            g(&c.writes),
            g(&c.reads),
            g(&c.maps),
            g(&c.map_enomem),
            g(&c.munmaps),
            g(&c.dontneeds),
            g(&c.forks),
            g(&c.fork_enomem),
            g(&c.child_ops),
            g(&c.child_bus),
            g(&c.owner_bus),
            g(&c.move_calls),
            g(&c.moved),
            g(&c.move_enomem),
            g(&c.move_unmoved),
            g(&c.pins),
            g(&c.pin_eagain),
            g(&c.pin_efault),
            g(&c.unpins),
            g(&c.respawns),
            g(&c.stats_reads),
            g(&c.remap_probes),
            g(&c.owed_bounded),
        );
        assert_no_leaks(&self.phys);
    }
}

#[test]
fn hugetlb_pool_reservations_and_data_stay_consistent_under_a_random_schedule() {
    let seed = stress_seed(0x4875_6765);
    let rounds = scaled(ROUNDS);
    eprintln!("hugetlb_stress: STRESS_SEED={seed} rounds {rounds}");
    let mut world = World::new(seed);
    for r in 0..rounds {
        world = watchdog(&format!("hugetlb_stress round {r} STRESS_SEED={seed}"), WATCHDOG_SECS, move || {
            world.round(r);
            world
        });
    }
    eprintln!("hugetlb_stress: {rounds} rounds done");
    world.finish();
}
