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

mod child;
mod worker;
mod world;

use child::*;
use worker::*;
use world::*;

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
