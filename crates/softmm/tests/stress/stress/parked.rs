//! 4. Parked CPUs are not waited for, and flush on resume
//!
//! A thread caches translations of a page, parks its CPU and blocks; the main
//! thread changes the page (munmap, mprotect RO/NONE, mremap, DONTNEED, MAP_FIXED
//! over). The call must return while the other CPU sleeps (else the watchdog
//! fires), must not have waited for any CPU (flush_waits unchanged: the other is
//! parked, ours is inside the call), and after resume() both CPUs must see the
//! change: SIGSEGV, the moved data, or zeroes.

use super::*;

const P4: u64 = 0x6000_0000_0000;
const Q4: u64 = P4 + 2 * PAGE; // a neighbour that no change touches
const P4_MOVED: u64 = 0x6000_4000_0000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Munmap,
    ProtectRo,
    ProtectNone,
    Mremap,
    DontNeed,
    MapFixed,
}

const CHANGES: [Change; 6] =
    [Change::Munmap, Change::ProtectRo, Change::ProtectNone, Change::Mremap, Change::DontNeed, Change::MapFixed];

/// What any CPU must see at P4 (and the moved copy) after `change`, the page
/// having held `val`.
fn check_after(cpu: &mut Cpu, change: Change, val: u64, who: &str) {
    match change {
        Change::Munmap => {
            assert_eq!(cpu.read_u64(P4), Err(map_err(P4)), "{who}: read after munmap");
            assert_eq!(cpu.write_u64(P4, 1), Err(map_err(P4)), "{who}: write after munmap");
        }
        Change::ProtectRo => {
            assert_eq!(cpu.write_u64(P4, 1), Err(acc_err(P4)), "{who}: write after mprotect RO");
            assert_eq!(cpu.read_u64(P4), Ok(val), "{who}");
        }
        Change::ProtectNone => {
            assert_eq!(cpu.read_u64(P4), Err(acc_err(P4)), "{who}: read after mprotect NONE");
        }
        Change::Mremap => {
            assert_eq!(cpu.write_u64(P4, 1), Err(map_err(P4)), "{who}: write to the old address after mremap");
            assert_eq!(cpu.read_u64(P4_MOVED), Ok(val), "{who}: data at the new address");
        }
        Change::DontNeed | Change::MapFixed => {
            assert_eq!(cpu.read_u64(P4), Ok(0), "{who}: old frame still visible after {change:?}");
        }
    }
}

fn parked_cpus(policy: FaultPolicy, shootdown: Shootdown, seed: u64) {
    let rounds = scaled(1000);
    let mut rng = Rng::new(seed ^ 4);
    let p = phys(16);
    let mm = mm_with_shootdown(&p, policy, shootdown);
    assert_eq!(mm.mmap(Q4, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(Q4));
    let (cmd_tx, cmd_rx) = mpsc::channel::<Option<(u64, Change)>>();
    let (ready_tx, ready_rx) = mpsc::channel::<u64>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<u64>();
    let parked = {
        let mm = mm.clone();
        spawn(format!("{}-parked", policy.name()), move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(Q4, 0x99).expect("neighbour");
            cpu.park();
            while let Some((r, change)) = cmd_rx.recv().expect("cmd") {
                cpu.resume();
                // Cache read and write translations of P4, then sleep parked.
                cpu.write_u64(P4, r).expect("write P4");
                assert_eq!(cpu.read_u64(P4), Ok(r));
                cpu.park();
                ready_tx.send(r).expect("ready");
                go_rx.recv().expect("go"); // blocked outside softmm, parked
                cpu.resume();
                check_after(&mut cpu, change, r, "resumed CPU");
                assert_eq!(cpu.read_u64(Q4), Ok(0x99), "neighbour page");
                cpu.park();
                done_tx.send(r).expect("done");
            }
        })
    };
    let mut cpu = Cpu::attached(&mm);
    for r in 1..=rounds {
        let change = CHANGES[rng.below(CHANGES.len() as u64) as usize];
        assert_eq!(mm.mmap(P4, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(P4));
        cmd_tx.send(Some((r, change))).expect("cmd");
        cpu.park();
        assert_eq!(ready_rx.recv(), Ok(r));
        cpu.resume();
        assert_eq!(cpu.read_u64(P4), Ok(r)); // our TLB holds it too
        cpu.park();
        // Every other CPU is parked: stats() cannot meet a shootdown.
        let t0 = mm.stats().tlb;
        // Must complete while the other CPU sleeps parked (a wait for
        // it would never end: the watchdog reports the hang).
        match change {
            Change::Munmap => assert_eq!(mm.munmap(P4, PAGE), Ok(())),
            Change::ProtectRo => assert_eq!(mm.mprotect(P4, PAGE, PROT_READ), Ok(())),
            Change::ProtectNone => assert_eq!(mm.mprotect(P4, PAGE, PROT_NONE), Ok(())),
            Change::Mremap => {
                assert_eq!(mm.mremap(P4, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, P4_MOVED), Ok(P4_MOVED))
            }
            Change::DontNeed => assert_eq!(mm.madvise(P4, PAGE, MADV_DONTNEED), Ok(())),
            Change::MapFixed => assert_eq!(mm.mmap(P4, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(P4)),
        }
        let t1 = mm.stats().tlb;
        let flushes = t1.flushes - t0.flushes;
        assert!(flushes >= 1, "{change:?} narrowed a cached translation without a shootdown");
        // One request per flush: to the other thread's CPU, not our own.
        assert_eq!(t1.flush_requests - t0.flush_requests, flushes, "requests sent to other threads' CPUs");
        assert_eq!(t1.flush_waits, t0.flush_waits, "{change:?} waited for a parked or syscalling CPU");
        cpu.resume();
        check_after(&mut cpu, change, r, "initiating CPU");
        cpu.park();
        go_tx.send(()).expect("go");
        assert_eq!(done_rx.recv(), Ok(r));
        cpu.resume();
        assert_eq!(mm.munmap(P4, PAGE), Ok(()));
        assert_eq!(mm.munmap(P4_MOVED, PAGE), Ok(()));
    }
    cmd_tx.send(None).expect("stop");
    join_all(vec![parked]);
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn parked_cpus_do_not_block_shootdowns_and_flush_on_resume() {
    for_each_policy("parked-cpus", parked_cpus);
}
