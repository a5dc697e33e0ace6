//! Minimal reproducers of softmm bugs found by `tests/stress/stress.rs`. A bug not
//! yet fixed is `#[ignore]`d (run it with `cargo test --release --test
//! stress_regressions -- --ignored`); a fixed one stays as a regression test.
//!
//! Hangs are caught by a watchdog (a hang detector, not a timing assertion);
//! the sleeps only order the threads so that the race is hit every run.

use softmm_testkit::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use common::*;
use softmm::uapi::*;
use softmm::{Cpu, FaultPolicy, File, OpenFile};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fixed in 770f4a4 (was a deadlock): `Cpu::drop` (and `Cpu::attach`/`detach`)
/// took the TLB domain's CPU-list lock without making the CPU quiescent. A
/// shootdown holds that lock while it waits for the CPU's acknowledgement, so
/// a thread that dropped (or switched) its running CPU while another thread's
/// munmap waited for it deadlocked.
#[test]
fn dropping_a_running_cpu_while_a_munmap_waits_for_it() {
    watchdog("drop-during-shootdown", 20, || {
        let p = phys(8);
        let mm = mm_with(&p, FaultPolicy::MmapLock);
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let (tx, rx) = mpsc::channel();
        let t = {
            let mm = mm.clone();
            thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.write_u64(a, 1).unwrap();
                tx.send(()).unwrap();
                // Guest code running without an MMU call: the munmap below
                // rightly waits for this CPU's acknowledgement meanwhile.
                thread::sleep(ms(300));
                // Detaching must acknowledge (it used to block on the CPU list
                // that the waiting shootdown holds).
                drop(cpu);
            })
        };
        rx.recv().unwrap();
        mm.munmap(a, PAGE).unwrap();
        t.join().unwrap();
        drop(mm);
        assert_no_leaks(&p);
    });
}

/// Fixed in 770f4a4 (was a deadlock; also in `model_regressions.rs`):
/// `File::set_len` (and `punch_hole`) zapped the file's mappings and shot down
/// the TLBs without marking the calling thread's CPUs quiescent, so the
/// shootdown waited for the caller's own CPU, which never acknowledges.
#[test]
fn truncating_a_mapped_file_from_a_thread_with_a_cpu() {
    watchdog("truncate-self-shootdown", 20, || {
        let p = phys(8);
        let mm = mm_with(&p, FaultPolicy::MmapLock);
        let f = File::create(&p, "/tmp/t", 2 * PAGE).unwrap();
        let of = OpenFile::read_write(&f);
        let s = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&of), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(s + PAGE, 1).unwrap();
        f.set_len(PAGE).unwrap(); // used to wait forever for `cpu`
        assert_eq!(cpu.read_u8(s + PAGE), Err(softmm::Fault::Bus { addr: s + PAGE }));
        drop(cpu);
        drop(mm);
        drop(of);
        drop(f);
        assert_no_leaks(&p);
    });
}

/// Fixed in 770f4a4 (was a deadlock): `AddressSpace::maps` (also `stats`,
/// `mincore`) took `mmap_lock` for read without marking the caller's CPUs
/// quiescent. A COW fault shoots down TLBs while holding `mmap_lock` for read;
/// with a writer (here a munmap) queued behind it, the task-fair rwlock
/// blocked `maps()`, the caller's CPU never acknowledged: three-way deadlock.
#[test]
fn reading_maps_during_a_cow_shootdown_with_a_queued_writer() {
    watchdog("maps-vs-cow-shootdown", 20, || {
        let p = phys(8);
        let mm = mm_with(&p, FaultPolicy::MmapLock);
        let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
        {
            let mut c = Cpu::attached(&mm);
            c.write_u64(a, 1).unwrap();
        }
        let child = mm.fork().unwrap(); // `a` is now COW-shared
        let (tx, rx) = mpsc::channel();
        let reader = {
            let mm = mm.clone();
            thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.read_u64(a + PAGE).unwrap();
                tx.send(()).unwrap();
                thread::sleep(ms(400)); // guest code, no MMU call: the COW shootdown waits for us
                let n = mm.maps().len(); // used to block behind the queued munmap, unacknowledged
                cpu.read_u64(a + PAGE).unwrap();
                cpu.park();
                n
            })
        };
        rx.recv().unwrap();
        let cow = {
            let mm = mm.clone();
            thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.write_u64(a, 2).unwrap(); // COW: flush under mmap_lock(read) waits for the reader's CPU
                cpu.park();
                drop(cpu);
            })
        };
        thread::sleep(ms(150));
        mm.munmap(a + 3 * PAGE, PAGE).unwrap(); // queues for mmap_lock(write)
        assert!(reader.join().unwrap() >= 1);
        cow.join().unwrap();
        drop(child);
        drop(mm);
        assert_no_leaks(&p);
    });
}

/// Fixed in 770f4a4 (was a lost write): `fork` write-protected the parent's
/// PTEs under `mmap_lock` but dropped the lock before the TLB shootdown (Linux
/// flushes before `mmap_write_unlock`). A COW fault by another thread could
/// then copy the page while a CPU still wrote through its stale writable
/// translation: the write landed in the child's frame only, and the parent's
/// writer read back the old value.
#[test]
fn fork_keeps_a_write_made_through_a_stale_tlb_entry_during_a_concurrent_cow() {
    for (policy, shootdown) in fault_and_shootdown_policies() {
        watchdog("fork-cow-lost-write", 20, move || fork_vs_cow(policy, shootdown));
    }
}

fn fork_vs_cow(policy: FaultPolicy, shootdown: Shootdown) {
    const X: u64 = 0xabab_abab_abab_abab;
    let p = phys(8);
    let mm = mm_with_shootdown(&p, policy, shootdown);
    let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    let in_slice = Arc::new(AtomicBool::new(false));
    let b_ready = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    // A: holds a writable translation of `a` (inside with_slice, like a
    // memcpy in progress) across the fork, then writes X through it.
    let writer = {
        let (mm, in_slice, go) = (mm.clone(), in_slice.clone(), go.clone());
        thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a, 1).unwrap();
            cpu.with_slice_mut(a, PAGE as usize, |_, chunk| {
                in_slice.store(true, Ordering::SeqCst);
                while !go.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                for b in &chunk[8..16] {
                    b.store(0xab, Ordering::Relaxed);
                }
            })
            .unwrap();
            // The write completed before this CPU's next MMU call, and
            // program order says we must read it back.
            let back = cpu.read_u64(a + 8).unwrap();
            cpu.park();
            back
        })
    };
    // B: attached (and parked) before the fork; later write-faults on the
    // read-only page: its COW copy is made before X is written.
    let (btx, brx) = mpsc::channel::<()>();
    let cow = {
        let (mm, b_ready) = (mm.clone(), b_ready.clone());
        thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.park();
            b_ready.store(true, Ordering::SeqCst);
            brx.recv().unwrap();
            cpu.resume();
            cpu.write_u64(a + 16, 3).unwrap();
            cpu.park();
        })
    };
    while !(in_slice.load(Ordering::SeqCst) && b_ready.load(Ordering::SeqCst)) {
        thread::yield_now();
    }
    let forker = {
        let mm = mm.clone();
        thread::spawn(move || mm.fork().unwrap()) // its shootdown waits for A
    };
    thread::sleep(ms(150));
    btx.send(()).unwrap();
    thread::sleep(ms(150));
    go.store(true, Ordering::SeqCst);
    let back = writer.join().unwrap();
    let child = forker.join().unwrap();
    cow.join().unwrap();
    let in_child = {
        let mut c = Cpu::attached(&child);
        c.read_u64(a + 8).unwrap()
    };
    assert_eq!(back, X, "{policy:?}: parent lost its own write (child's copy holds {in_child:#x})");
    drop(child);
    drop(mm);
    assert_no_leaks(&p);
}

/// `mremap` moving a mapping (`move_vma`) once moved the page-table entries
/// before it detached the source VMA, so a lock-free fault (`PerVma`,
/// `PerVmaSeq`) on the source address validated against a still-attached
/// VMA, installed a fresh page where an entry had just moved away, and the
/// write through it "succeeded" — then the page was zapped with the source
/// range. Like Linux (`vma_start_write`), the source is now detached first.
#[test]
fn mremap_move_loses_a_racing_lock_free_write() {
    // The lock-free fault policies, in turn under each covering shootdown
    // configuration: the race is the fault's, the stale entries the move
    // leaves are the shootdown's.
    for (i, &shootdown) in Shootdown::COVERING.iter().enumerate() {
        let policy = [FaultPolicy::PerVmaSeq, FaultPolicy::PerVma][i % 2];
        watchdog("mremap-vs-lock-free-fault", 60, move || mremap_move_vs_write(policy, shootdown));
    }
}

fn mremap_move_vs_write(policy: FaultPolicy, shootdown: Shootdown) {
    const X: u64 = 0x7000_0000_0000;
    const Y: u64 = 0x7000_4000_0000;
    // Same TLB slot as X (direct mapped): touching it makes every access to X
    // a TLB miss, so that it walks the page table and can fault.
    const Z: u64 = 0x7100_0000_0000;
    // Many populated pages: moving them keeps the first one's window open.
    const LEN: u64 = 256 * PAGE;
    const MOVES: u64 = 20_000;
    let p = phys(64);
    let mm = mm_with_shootdown(&p, policy, shootdown);
    assert_eq!(mm.mmap(X, LEN, RW, ANON | MAP_FIXED, None, 0), Ok(X));
    assert_eq!(mm.mmap(Z, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(Z));
    assert_eq!(mm.madvise(X, LEN, MADV_POPULATE_WRITE), Ok(()));
    let stop = Arc::new(AtomicBool::new(false));
    // The only writer of the first word of the moving page: a successful
    // write must be what the page holds next, wherever it has moved.
    let writer = {
        let (mm, stop) = (mm.clone(), stop.clone());
        thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            let mut lost = None;
            let mut seq = 0u64;
            while lost.is_none() && !stop.load(Ordering::SeqCst) {
                seq += 1;
                cpu.write_u64(Z, seq).unwrap();
                let at = if cpu.write_u64(X, seq).is_ok() {
                    X
                } else if cpu.write_u64(Y, seq).is_ok() {
                    Y
                } else {
                    continue; // moved twice meanwhile
                };
                cpu.write_u64(Z, seq).unwrap();
                let back = loop {
                    if let Ok(v) = cpu.read_u64(X).or_else(|_| cpu.read_u64(Y)) {
                        break v;
                    }
                };
                if back != seq {
                    lost = Some(format!("{policy:?}: wrote {seq} at {at:#x}, the page then held {back}"));
                }
            }
            cpu.park();
            lost
        })
    };
    let mut cur = X;
    for _ in 0..MOVES {
        if writer.is_finished() {
            break;
        }
        let to = if cur == X { Y } else { X };
        assert_eq!(mm.mremap(cur, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, to), Ok(to));
        cur = to;
    }
    stop.store(true, Ordering::SeqCst);
    if let Some(lost) = writer.join().unwrap() {
        panic!("lost write: {lost}");
    }
    drop(mm);
    assert_no_leaks(&p);
}
