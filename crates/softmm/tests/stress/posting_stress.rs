//! Shootdowns under every [`PostingPolicy`] (issue 26): CPUs writing
//! through cached translations while other threads drop the pages
//! (`MADV_DONTNEED`, `munmap`), shoot down concurrently (so that lock-free
//! initiators overlap and share barriers) and attach and detach CPUs (so
//! that lock-free posting races the CPU list's publication). A freed frame
//! is reused at once by the dropping thread (its frame cache is LIFO), so a
//! write through a translation the shootdown should have removed shows up
//! as a foreign word in fresh memory. A hang detector (a watchdog, not a
//! timing assertion) guards each run; each ends with a leak check.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, FaultPolicy, MmConfig, PostingPolicy};
use softmm_testkit::common::*;

const WATCHDOG_SECS: u64 = 120;
/// The hammered region, and the fresh one that reuses its frames.
const HOT: u64 = 0x4000_0000;
const FRESH: u64 = 0x5000_0000;
const PAGES: u64 = 4;
const LEN: u64 = PAGES * PAGE;
/// What the hammers write: never a word of fresh memory.
const MARK: u64 = 0xdead_beef_0000_0000;

fn mm(phys: &Arc<softmm::PhysMem>, posting: PostingPolicy) -> Arc<AddressSpace> {
    let config = MmConfig::default().policy(FaultPolicy::default()).posting_policy(posting);
    AddressSpace::new(phys, config).expect("valid config")
}

/// A thread that writes `MARK` into the hot pages through its own CPU until
/// `stop`, ignoring the faults of a page that is gone; counts its writes.
fn hammer(mm: Arc<AddressSpace>, stop: Arc<AtomicBool>, writes: Arc<AtomicU64>) {
    let mut cpu = Cpu::attached(&mm);
    let mut i = 0u64;
    while !stop.load(SeqCst) {
        i += 1;
        let a = HOT + (i % PAGES) * PAGE + (i * 8) % PAGE;
        if cpu.write_u64(a, MARK | i).is_ok() {
            writes.fetch_add(1, SeqCst);
        }
    }
}

/// A thread that shoots down the address space over and over (an
/// `mprotect` flip of a page of its own, touched between flips), so that
/// its initiators overlap the main thread's.
fn initiator(mm: Arc<AddressSpace>, stop: Arc<AtomicBool>) {
    const OWN: u64 = 0x6000_0000;
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(mm.mmap(OWN, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0), Ok(OWN));
    while !stop.load(SeqCst) {
        cpu.write_u64(OWN, 1).expect("own page");
        assert_eq!(mm.mprotect(OWN, PAGE, PROT_READ), Ok(()));
        assert_eq!(mm.mprotect(OWN, PAGE, PROT_READ | PROT_WRITE), Ok(()));
    }
}

/// A thread that attaches a CPU, makes one access, and detaches, over and
/// over: the published list changes under the initiators.
fn attacher(mm: Arc<AddressSpace>, stop: Arc<AtomicBool>) {
    let mut cpu = Cpu::new();
    while !stop.load(SeqCst) {
        cpu.attach(&mm);
        let _ = cpu.read_u64(HOT);
        cpu.detach();
    }
}

fn stale_writes(posting: PostingPolicy, seed: u64) {
    let rounds = scaled(50);
    let mut rng = Rng::new(seed);
    let p = phys(16);
    let mm = mm(&p, posting);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for h in 0..2 {
        let (mm, stop, writes) = (mm.clone(), stop.clone(), writes.clone());
        threads.push(spawn(format!("{}-hammer{h}", posting.name()), move || hammer(mm, stop, writes)));
    }
    {
        let (mm, stop) = (mm.clone(), stop.clone());
        threads.push(spawn(format!("{}-initiator", posting.name()), move || initiator(mm, stop)));
    }
    {
        let (mm, stop) = (mm.clone(), stop.clone());
        threads.push(spawn(format!("{}-attacher", posting.name()), move || attacher(mm, stop)));
    }
    let mut cpu = Cpu::attached(&mm);
    let rw = PROT_READ | PROT_WRITE;
    let anon = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
    for r in 0..rounds {
        assert_eq!(mm.mmap(HOT, LEN, rw, anon, None, 0), Ok(HOT));
        (0..PAGES).for_each(|k| cpu.write_u64(HOT + k * PAGE, 1).expect("populate"));
        // Let the hammers cache the pages and write through them.
        let w0 = writes.load(SeqCst);
        while writes.load(SeqCst) < w0 + 64 {
            std::thread::yield_now();
        }
        if rng.one_in(2) {
            assert_eq!(mm.madvise(HOT, LEN, MADV_DONTNEED), Ok(()));
            assert_eq!(mm.munmap(HOT, LEN), Ok(()));
        } else {
            assert_eq!(mm.munmap(HOT, LEN), Ok(()));
        }
        // Fresh memory on the frames just freed, checked while the hammers
        // still run.
        assert_eq!(mm.mmap(FRESH, LEN, rw, anon, None, 0), Ok(FRESH));
        for k in 0..PAGES {
            let pg = FRESH + k * PAGE;
            cpu.write_u64(pg, r).expect("fault in");
        }
        for pass in 0..2 {
            for k in 0..PAGES {
                let pg = FRESH + k * PAGE;
                for w in 0..PAGE / 8 {
                    let x = cpu.read_u64(pg + w * 8).expect("fresh page");
                    let want = if w == 0 { r } else { 0 };
                    assert_eq!(
                        x, want,
                        "{posting:?} round {r} pass {pass}: {pg:#x} word {w}: write through a stale TLB"
                    );
                }
            }
        }
        assert_eq!(mm.munmap(FRESH, LEN), Ok(()));
    }
    stop.store(true, SeqCst);
    join_all(threads);
    let st = mm.stats().tlb;
    eprintln!("  {posting:?}: {rounds} rounds, {} hammer writes; {st:?}", writes.load(SeqCst));
    assert!(st.barriers + st.barriers_joined > 0, "{posting:?}: no shootdown had another CPU to ask");
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn no_write_through_a_stale_translation_under_any_posting() {
    let seed = stress_seed(0x9057);
    for &posting in PostingPolicy::ALL {
        eprintln!("posting [{}] STRESS_SEED={seed}", posting.name());
        watchdog(&format!("posting[{}]", posting.name()), WATCHDOG_SECS, move || stale_writes(posting, seed));
    }
}
