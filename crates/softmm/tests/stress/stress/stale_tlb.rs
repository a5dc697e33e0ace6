//! 2. A frame freed by munmap never receives a write after munmap returned

use super::*;

const P2: u64 = 0x1000_0000_0000; // the pages the hammer writes
const P2_MOVED: u64 = 0x1000_4000_0000; // where the mremap variant moves them
const F2: u64 = 0x1100_0000_0000; // fresh memory that reuses the freed frames
const P2_PAGES: u64 = 4;
const F2_PAGES: u64 = 8;
/// Successful writes the hammer makes in a round before the change.
const WRITES_BEFORE_KILL: u64 = 64;

/// How a round takes the hammered pages away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    Munmap,
    DontNeed,
    MapFixed,
    Mremap,
    ProtectRo,
}

const KILLS: [Kill; 5] = [Kill::Munmap, Kill::DontNeed, Kill::MapFixed, Kill::Mremap, Kill::ProtectRo];

struct World2 {
    /// The round whose pages are ready to hammer (`u64::MAX`: no more).
    round: AtomicU64,
    /// The round the hammer has made its first writes in.
    started: AtomicU64,
    /// The round whose change has returned: from then on a write to the
    /// old address must fail (munmap, mremap, mprotect).
    killed: AtomicU64,
    /// The round the hammer must stop writing in, and the one it did.
    stop: AtomicU64,
    stopped: AtomicU64,
    kill: Mutex<Kill>,
    note: Note,
    failed: AtomicBool,
}

impl World2 {
    fn load(&self, x: &AtomicU64) -> u64 {
        if self.failed.load(SeqCst) {
            u64::MAX
        } else {
            x.load(SeqCst)
        }
    }
}

/// Thread A: writes into the pages of each round through its CPU, as fast as
/// it can, in three ways (plain store, atomic RMW, a page-long slice), until
/// told to stop; faults only once the change has taken the pages away.
fn hammer2(mm: Arc<AddressSpace>, world: Arc<World2>) -> u64 {
    let _fail = FailGuard { failed: &world.failed, notes: vec![&world.note] };
    let mut cpu = Cpu::attached(&mm);
    let mut seen = 0;
    let mut total = 0;
    loop {
        world.note.wait(&mut cpu, || world.load(&world.round) > seen);
        let r = world.load(&world.round);
        if r == u64::MAX {
            break;
        }
        let kill = *world.kill.lock().expect("kill");
        let marker = enc(0xa, 0xaaa, r);
        let mut ok = 0;
        let mut i = 0u64;
        while world.load(&world.stop) < r {
            i += 1;
            let pg = P2 + (i % P2_PAGES) * PAGE;
            let dead = world.killed.load(SeqCst) >= r;
            let a8 = pg + (i * 8 * 7) % PAGE;
            let (res, at) = match i % 3 {
                0 => (cpu.write_u64(a8, marker), a8),
                1 => (cpu.fetch_add_u64(a8, 1).map(|_| ()), a8),
                _ => (
                    cpu.with_slice_mut(pg, PAGE as usize, |_, c| {
                        for b in c {
                            b.store(0xa5, Relaxed);
                        }
                    }),
                    pg,
                ),
            };
            match (res, kill) {
                (Ok(()), _) => {
                    assert!(
                        !dead || matches!(kill, Kill::DontNeed | Kill::MapFixed),
                        "round {r}: write to {at:#x} succeeded after {kill:?} returned"
                    );
                    ok += 1;
                    if ok == WRITES_BEFORE_KILL {
                        world.started.store(r, SeqCst);
                        world.note.notify();
                    }
                }
                (Err(e), Kill::Munmap | Kill::Mremap) if e == map_err(at) && dead => {}
                (Err(e), Kill::Munmap | Kill::Mremap) if e == map_err(at) => {
                    // Between the change's PTE update and its return: allowed.
                }
                (Err(e), Kill::ProtectRo) if e == acc_err(at) => {}
                (Err(e), _) => panic!("round {r} ({kill:?}): unexpected {e:?}"),
            }
        }
        total += ok;
        seen = r;
        cpu.park();
        world.stopped.store(r, SeqCst);
        world.note.notify();
        cpu.resume();
    }
    total
}

/// Thread B: each round maps the pages, lets A hammer them, takes them away
/// (munmap, DONTNEED, MAP_FIXED over, mremap away, mprotect read-only) and at
/// once faults in fresh memory, which reuses the freed frames (per-thread
/// LIFO frame cache), fills it and checks it while A is still writing: any
/// word of A's there is a write through a translation that the change
/// should have shot down.
fn stale_tlb_writes(policy: FaultPolicy, shootdown: Shootdown, seed: u64) {
    let rounds = scaled(300);
    let mut rng = Rng::new(seed ^ 2);
    let p = phys(32);
    let mm = mm_with_shootdown(&p, policy, shootdown);
    let world = Arc::new(World2 {
        round: AtomicU64::new(0),
        started: AtomicU64::new(0),
        killed: AtomicU64::new(0),
        stop: AtomicU64::new(0),
        stopped: AtomicU64::new(0),
        kill: Mutex::new(Kill::Munmap),
        note: Note::new(),
        failed: AtomicBool::new(false),
    });
    let hammer = {
        let (mm, world) = (mm.clone(), world.clone());
        spawn(format!("{}-hammer", policy.name()), move || hammer2(mm, world))
    };
    let mut run = || {
        let _fail = FailGuard { failed: &world.failed, notes: vec![&world.note] };
        let mut cpu = Cpu::attached(&mm);
        let pat = |pg: u64, i: usize| enc(0xb, pg, i as u64);
        let len = P2_PAGES * PAGE;
        for r in 1..=rounds {
            let kill = KILLS[rng.below(KILLS.len() as u64) as usize];
            *world.kill.lock().expect("kill") = kill;
            assert_eq!(mm.mmap(P2, len, RW, ANON | MAP_FIXED, None, 0), Ok(P2));
            for k in 0..P2_PAGES {
                cpu.write_u64(P2 + k * PAGE, 1).expect("populate");
            }
            world.round.store(r, SeqCst);
            world.note.notify();
            // A caches writable translations and keeps writing.
            world.note.wait(&mut cpu, || world.load(&world.started) >= r);
            if world.failed.load(SeqCst) {
                return;
            }
            match kill {
                Kill::Munmap => assert_eq!(mm.munmap(P2, len), Ok(())),
                Kill::DontNeed => assert_eq!(mm.madvise(P2, len, MADV_DONTNEED), Ok(())),
                Kill::MapFixed => assert_eq!(mm.mmap(P2, len, RW, ANON | MAP_FIXED, None, 0), Ok(P2)),
                Kill::Mremap => {
                    assert_eq!(mm.mremap(P2, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, P2_MOVED), Ok(P2_MOVED))
                }
                Kill::ProtectRo => assert_eq!(mm.mprotect(P2, len, PROT_READ), Ok(())),
            }
            world.killed.store(r, SeqCst);
            // Fresh memory, faulted in while A is still going.
            assert_eq!(mm.mmap(F2, F2_PAGES * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(F2));
            for k in 0..F2_PAGES {
                let pg = F2 + k * PAGE;
                cpu.write_u64(pg, pat(k, 0)).expect("fault in");
                let got = read_page(&mut cpu, pg).expect("fresh page");
                for (i, &x) in got.iter().enumerate().skip(1) {
                    assert_eq!(x, 0, "round {r} ({kill:?}): fresh page {pg:#x} word {i} = {x:#x}: stale write");
                }
                let bytes: Vec<u8> = (0..WORDS).flat_map(|i| pat(k, i).to_le_bytes()).collect();
                cpu.write(pg, &bytes).expect("fill");
            }
            for pass in 0..3 {
                for k in 0..F2_PAGES {
                    let pg = F2 + k * PAGE;
                    for (i, &x) in read_page(&mut cpu, pg).expect("fresh page").iter().enumerate() {
                        assert_eq!(
                            x,
                            pat(k, i),
                            "round {r} ({kill:?}) pass {pass}: fresh page {pg:#x} word {i}: write through a stale TLB"
                        );
                    }
                }
            }
            world.stop.store(r, SeqCst);
            world.note.wait(&mut cpu, || world.load(&world.stopped) >= r);
            assert_eq!(mm.munmap(F2, F2_PAGES * PAGE), Ok(()));
            assert_eq!(mm.munmap(P2, len), Ok(()));
            assert_eq!(mm.munmap(P2_MOVED, len), Ok(()));
        }
    };
    run();
    world.round.store(u64::MAX, SeqCst);
    world.note.notify();
    let writes = join_all(vec![hammer]);
    eprintln!("  {rounds} rounds; hammer writes {writes:?}; {:?}", mm.stats().tlb);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn freed_frames_never_see_writes_through_stale_translations() {
    for_each_policy("stale-tlb-writes", stale_tlb_writes);
}
