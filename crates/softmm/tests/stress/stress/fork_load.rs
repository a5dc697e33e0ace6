//! 3. Fork under load
//!
//! Two writers write sequence-numbered values into interleaved words of the
//! same pages (so each COW-faults pages the other is writing) while the main
//! thread forks. Each child must hold, per writer, exactly a prefix of its
//! writes that ends while fork ran; child writes must never reach the parent
//! (the writers verify their words) nor parent writes the child (children are
//! re-verified on later rounds); MAP_SHARED stays shared both ways,
//! WIPEONFORK reads zero and DONTFORK is unmapped in the child.

use super::*;

const W3: usize = 2; // parent writer threads, their words interleaved in the same pages
const PAGES3: u64 = 2;
const NW3: u64 = PAGES3 * WORDS as u64 / W3 as u64; // words per writer
const BASE3: u64 = 0x5000_0000_0000;
const SPECIAL3: u64 = 0x5100_0000_0000; // [wipe-on-fork | dont-fork | shared]

/// Word `i` of writer `w`: every `W3`-th word of the pages, so that the
/// writers COW-fault the same pages while the other still writes to them.
fn word3(w: usize, i: u64) -> u64 {
    BASE3 + (i * W3 as u64 + w as u64) * 8
}

/// Word `i` of writer `w` after the writer's writes `1..=cut` (write `s` goes
/// to word `s % NW3`).
fn cut_value(w: usize, i: u64, cut: u64) -> u64 {
    match cut.checked_sub((cut % NW3 + NW3 - i) % NW3) {
        Some(s) if s > 0 => enc(w as u64, i, s),
        _ => 0,
    }
}

/// Every writer's words, as `cpu` sees them.
fn read_words3(cpu: &mut Cpu) -> Vec<Vec<u64>> {
    let mut all = Vec::new();
    for k in 0..PAGES3 {
        all.extend(read_page(cpu, BASE3 + k * PAGE).expect("writer page"));
    }
    (0..W3).map(|w| all.iter().skip(w).step_by(W3).copied().collect()).collect()
}

struct World3 {
    published: Vec<AtomicU64>,
    progress_note: Note,
    done: AtomicBool,
    failed: AtomicBool,
}

fn writer3(mm: Arc<AddressSpace>, world: Arc<World3>, w: usize) -> u64 {
    let _fail = FailGuard { failed: &world.failed, notes: vec![&world.progress_note] };
    let mut cpu = Cpu::attached(&mm);
    let mut seq = 0;
    while !world.done.load(Relaxed) && !world.failed.load(Relaxed) {
        seq += 1;
        let i = seq % NW3;
        let a = word3(w, i);
        let val = enc(w as u64, i, seq);
        cpu.write_u64(a, val).unwrap_or_else(|e| panic!("writer {w}: {e}"));
        world.published[w].store(seq, SeqCst);
        if seq % 64 == 0 {
            world.progress_note.notify();
        }
        if seq % 61 == 0 {
            assert_eq!(cpu.read_u64(a), Ok(val), "writer {w}: lost write at seq {seq}");
        }
        if seq % 4099 == 0 {
            // Nothing a child wrote, and nothing lost to a COW copy.
            for (i, x) in read_words3(&mut cpu).swap_remove(w).into_iter().enumerate() {
                assert_eq!(x, cut_value(w, i as u64, seq), "writer {w}: word {i} at seq {seq}");
            }
        }
    }
    seq
}

struct Child3 {
    mm: Arc<AddressSpace>,
    cpu: Cpu,
    /// Its expected writer words, child writes included.
    words: Vec<Vec<u64>>,
    round: u64,
}

impl Child3 {
    fn verify(&mut self) {
        for (w, (got, want)) in read_words3(&mut self.cpu).iter().zip(&self.words).enumerate() {
            for (i, (&g, &e)) in got.iter().zip(want).enumerate() {
                assert_eq!(g, e, "child of round {}: writer {w} word {i} changed after fork", self.round);
            }
        }
    }
}

fn fork_under_load(policy: FaultPolicy, shootdown: Shootdown, seed: u64) {
    let rounds = scaled(100);
    let mut rng = Rng::new(seed ^ 3);
    let p = phys(64);
    let mm = mm_with_shootdown(&p, policy, shootdown);
    assert_eq!(mm.mmap(BASE3, PAGES3 * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(BASE3));
    let (wipe, dontfork, shared) = (SPECIAL3, SPECIAL3 + 2 * PAGE, SPECIAL3 + 4 * PAGE);
    assert_eq!(mm.mmap(wipe, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(wipe));
    assert_eq!(mm.mmap(dontfork, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(dontfork));
    assert_eq!(mm.mmap(shared, PAGE, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, None, 0), Ok(shared));
    assert_eq!(mm.madvise(wipe, PAGE, MADV_WIPEONFORK), Ok(()));
    assert_eq!(mm.madvise(dontfork, PAGE, MADV_DONTFORK), Ok(()));
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(wipe, 0x11).expect("wipe page");
    cpu.write_u64(dontfork, 0x22).expect("dontfork page");
    cpu.park();
    let world = Arc::new(World3 {
        published: (0..W3).map(|_| AtomicU64::new(0)).collect(),
        progress_note: Note::new(),
        done: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    });
    let _fail = FailGuard { failed: &world.failed, notes: vec![&world.progress_note] };
    let writers: Vec<_> = (0..W3)
        .map(|w| {
            let (mm, world) = (mm.clone(), world.clone());
            spawn(format!("{}-writer-{w}", policy.name()), move || writer3(mm, world, w))
        })
        .collect();
    let published = |w: usize| world.published[w].load(SeqCst);
    let mut children: Vec<Child3> = Vec::new();
    for round in 1..=rounds {
        let before: Vec<u64> = (0..W3).map(published).collect();
        let child = mm.fork().expect("fork");
        let after: Vec<u64> = (0..W3).map(published).collect();
        let mut ccpu = Cpu::attached(&child);
        let mut snap = read_words3(&mut ccpu);
        for (w, got) in snap.iter().enumerate() {
            // A prefix of each writer's writes, ending while fork ran.
            let mut cut = 0;
            for (i, &x) in got.iter().enumerate() {
                if x != 0 {
                    let (who, place, s) = dec(x).unwrap_or_else(|| panic!("round {round}: foreign word {x:#x}"));
                    assert_eq!((who, place, s % NW3), (w as u64, i as u64, i as u64), "round {round}: {x:#x}");
                    cut = cut.max(s);
                }
            }
            assert!(
                before[w] <= cut && cut <= after[w] + 1,
                "round {round}: writer {w}: child holds writes up to {cut}, fork ran during {}..={}",
                before[w],
                after[w]
            );
            for (i, &x) in got.iter().enumerate() {
                assert_eq!(x, cut_value(w, i as u64, cut), "round {round}: writer {w} word {i}: torn snapshot");
            }
        }
        assert_eq!(ccpu.read_u64(wipe), Ok(0), "MADV_WIPEONFORK");
        assert_eq!(ccpu.read_u64(dontfork), Err(map_err(dontfork)), "MADV_DONTFORK");
        // Child writes, on every other round only (so that the parent also
        // COW-copies pages still shared): the parent's writers must never
        // see them (they verify their words).
        if round % 2 == 0 {
            for (w, words) in snap.iter_mut().enumerate() {
                for _ in 0..4 {
                    let i = rng.below(NW3);
                    let val = enc(0xf, i, round);
                    ccpu.write_u64(word3(w, i), val).expect("child write");
                    words[i as usize] = val;
                }
            }
        }
        // The shared mapping stays shared both ways.
        ccpu.write_u64(shared, round).expect("shared write");
        cpu.resume();
        assert_eq!(cpu.read_u64(shared), Ok(round), "child's write to MAP_SHARED memory");
        cpu.write_u64(shared + 8, round).expect("parent shared write");
        assert_eq!(cpu.read_u64(wipe), Ok(0x11));
        cpu.park();
        assert_eq!(ccpu.read_u64(shared + 8), Ok(round), "parent's write to MAP_SHARED memory");
        children.push(Child3 { mm: child, cpu: ccpu, words: snap, round });
        // Every child must stay as it was while the parent keeps writing.
        for c in &mut children {
            c.verify();
        }
        if children.len() > 2 {
            let old = children.remove(0);
            drop(old.cpu);
            drop(old.mm);
        }
        // Let every writer get through all its words (COW-faulting the pages
        // and caching writable translations) before the next fork.
        world
            .progress_note
            .wait(&mut cpu, || (0..W3).all(|w| published(w) >= after[w] + NW3) || world.failed.load(SeqCst));
        cpu.park();
    }
    world.done.store(true, SeqCst);
    let seqs = join_all(writers);
    for c in &mut children {
        c.verify();
    }
    drop(children);
    eprintln!("  {rounds} forks; writer seqs {seqs:?}; {:?}", mm.stats().tlb);
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn fork_under_load_gives_consistent_isolated_snapshots() {
    for_each_policy("fork-under-load", fork_under_load);
}
