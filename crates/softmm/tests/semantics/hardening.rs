//! Regression tests for the defects an adversarial review found in the safe
//! API (one test or more per defect, named after what must hold). Each failed
//! before its fix.

use softmm_testkit::common;

use common::*;
use softmm::uapi::*;
use softmm::{Errno, FaultPolicy};

/// `mincore` over a huge valid range used to allocate a result byte per page
/// up front (25 GiB here: the process aborted). It now works a bounded round
/// at a time into the caller's buffer and fails with `EFAULT` where the
/// buffer ends, as Linux's `copy_to_user` does.
#[test]
fn mincore_of_a_huge_range_uses_bounded_memory() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::default());
    let len = 100 << 40;
    let a = mm.mmap(0, len, PROT_NONE, ANON | MAP_NORESERVE, None, 0).unwrap();
    let mut vec = [7u8; 10_000];
    assert_eq!(mm.mincore(a, len, &mut vec), Err(Errno::Fault));
    assert!(vec.iter().all(|&b| b == 0), "the bytes that fit are written");
    // A hole after a valid part: ENOMEM, the valid part's bytes written.
    mm.munmap(a + 2 * PAGE, PAGE).unwrap();
    let mut vec = [7u8; 4];
    assert_eq!(mm.mincore(a, 4 * PAGE, &mut vec), Err(Errno::NoMem));
    assert_eq!(vec, [0, 0, 7, 7]);
    mm.munmap(a, len).unwrap();
    drop(mm);
    assert_no_leaks(&p);
}

/// Defect 6: `munmap` (and `mremap`, `mprotect`, `madvise`, `MAP_FIXED`)
/// shot down the TLBs only after releasing `mmap_lock`, so another thread
/// could map a new page at the address (and write it) while a third CPU still
/// translated the address to the old frame: stale reads, and writes landing
/// in the moved page after `mremap`. As on Linux, the flush now completes
/// before the lock is released, so a mapping call that waited for the lock
/// returns only after every CPU that was inside an access has left it. The
/// reader's CPU holds a translation (an access section) through a sleep
/// while the munmap waits for it; the mapper, blocked on `mmap_lock`, must
/// not get the range back before the reader's access ends. Every mapping
/// call that unmaps is checked.
#[test]
fn a_range_is_not_reused_before_every_cpu_has_dropped_its_translation() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;
    type Unmap = fn(&softmm::AddressSpace, u64);
    let unmappers: [(&str, Unmap); 5] = [
        ("munmap", |mm, a| mm.munmap(a, PAGE).unwrap()),
        ("mremap", |mm, a| {
            mm.mremap(a, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a + 64 * PAGE).unwrap();
        }),
        ("mmap MAP_FIXED", |mm, a| {
            mm.mmap(a, PAGE, PROT_NONE, ANON | MAP_FIXED | MAP_NORESERVE, None, 0).unwrap();
        }),
        ("madvise", |mm, a| mm.madvise(a, PAGE, MADV_DONTNEED).unwrap()),
        ("mprotect", |mm, a| mm.mprotect(a, PAGE, PROT_NONE).unwrap()),
    ];
    for (name, unmap) in unmappers {
        let p = phys(4);
        let mm = mm_with(&p, FaultPolicy::default());
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let woke = Arc::new(AtomicBool::new(false));
        let (cached_tx, cached_rx) = mpsc::channel();
        let reader = {
            let (mm, woke) = (mm.clone(), woke.clone());
            std::thread::spawn(move || {
                let mut cpu = softmm::Cpu::attached(&mm);
                cpu.write_u64(a, 1).unwrap();
                // Inside an access (a held translation) for the whole sleep:
                // the shootdown must wait for its end.
                let t = cpu.translate(a, softmm::Access::Read).unwrap();
                cached_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                woke.store(true, SeqCst);
                // The access ends: the shootdown may complete.
                drop(t);
            })
        };
        cached_rx.recv().unwrap();
        let mapper = {
            let (mm, woke) = (mm.clone(), woke.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                // Waits for mmap_lock, held by the unmapper below.
                let _q = mm.mprotect(a, PAGE, PROT_READ);
                woke.load(SeqCst)
            })
        };
        unmap(&mm, a);
        let reader_had_acknowledged = mapper.join().unwrap();
        reader.join().unwrap();
        assert!(reader_had_acknowledged, "{name}: mmap_lock was released before the reader's TLB was flushed");
        drop(mm);
        assert_no_leaks(&p);
    }
}

/// Defect 1: `with_slice` with a read translation handed out writable
/// atomics, so a store through a read-only (even PROT_READ, or zero-page)
/// translation changed the shared zero page or a read-only file's page
/// cache. Reads now get a [`softmm::GuestBytes`], which has no store (see
/// the `compile_fail` example on `Cpu::with_slice`); this checks that what
/// it reads is the guest's data and that the zero page stays zero.
#[test]
fn read_slices_see_guest_bytes_and_cannot_change_the_zero_page() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::default());
    let a = mm.mmap(0, 2 * PAGE, PROT_READ, ANON, None, 0).unwrap();
    let mut cpu = softmm::Cpu::attached(&mm);
    let mut seen = Vec::new();
    cpu.with_slice(a + PAGE - 2, 4, |off, s| {
        let mut b = vec![0xee; s.len()];
        s.copy_to_slice(&mut b);
        seen.push((off, b, s.get(0)));
    })
    .unwrap();
    assert_eq!(seen, vec![(0, vec![0, 0], 0), (2, vec![0, 0], 0)]);
    let other = mm_with(&p, FaultPolicy::default());
    let b = other.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu2 = softmm::Cpu::attached(&other);
    assert_eq!(cpu2.read_u64(b).unwrap(), 0);
    drop((cpu, cpu2, mm, other));
    assert_no_leaks(&p);
}

/// Defect 2: a `File` of one `PhysMem` could be mapped into an address space
/// of another; a fault then used the foreign frame number with this arena's
/// base (out-of-bounds pointer arithmetic in safe code). `mmap` refuses it.
#[test]
fn a_file_of_another_arena_cannot_be_mapped() {
    let p1 = phys(4);
    let p2 = phys(4);
    let f = softmm::File::create(&p1, "f", PAGE).unwrap();
    f.write_at(0, b"x").unwrap();
    let mm = mm_with(&p2, FaultPolicy::default());
    for flags in [MAP_SHARED, MAP_PRIVATE] {
        assert_eq!(mm.mmap(0, PAGE, PROT_READ, flags, Some(&softmm::OpenFile::read_write(&f)), 0), Err(Errno::Inval));
    }
    assert_eq!(mm.stats().map_count, 0);
    drop((mm, f));
    assert_no_leaks(&p1);
    assert_no_leaks(&p2);
}

/// Defect 3: a `with_slice_mut` callback that unmapped its own page kept
/// writing into the freed frame after the page cache of a file reused it
/// (the calling thread's CPUs are quiescent during its munmap, so the
/// shootdown did not wait for the CPU that lent the slice). The slice now
/// holds a reference to its frame until the callback returns.
#[test]
fn a_slice_outlives_the_unmap_of_its_page_without_corrupting_the_reuser() {
    for &policy in FaultPolicy::ALL {
        let p = phys(1);
        let mm = mm_with(&p, policy);
        let f = softmm::File::create(&p, "f", 0).unwrap();
        let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = softmm::Cpu::attached(&mm);
        cpu.write_u8(a, 1).unwrap();
        cpu.with_slice_mut(a, PAGE as usize, |_, s| {
            mm.munmap(a, PAGE).unwrap();
            // The most recently freed frame is the first one reused.
            f.write_at(0, &[0x11; PAGE as usize]).unwrap();
            s.iter().for_each(|b| b.store(0x41, std::sync::atomic::Ordering::Relaxed));
        })
        .unwrap();
        let mut back = [0u8; PAGE as usize];
        assert_eq!(f.read_at(0, &mut back), Ok(PAGE as usize));
        assert!(back.iter().all(|&b| b == 0x11), "{policy:?}: the file's page was written through a stale slice");
        assert!(matches!(cpu.read_u8(a), Err(softmm::Fault::Segv { .. })));
        drop((cpu, mm, f));
        assert_no_leaks(&p);
    }
}

/// Defect 4: addresses at or above 2^48, and non-canonical ones, aliased the
/// low 48 bits once the page was present. Linux raises SIGSEGV: `SI_KERNEL`
/// with address 0 for a non-canonical address (a general protection fault),
/// `SEGV_MAPERR` at the address for a canonical one outside user space.
#[test]
fn addresses_outside_user_space_fault_as_on_x86_64() {
    use softmm::{Fault, SegvCode};
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::default());
    let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = softmm::Cpu::attached(&mm);
    cpu.write_u64(a, 42).unwrap();
    let gp = Fault::Segv { addr: 0, code: SegvCode::Kernel };
    for bad in [a | 1 << 48, a | 0xffff_0000_0000_0000 & !(1 << 63), a | 1 << 47, a ^ 1 << 62] {
        assert_eq!(cpu.read_u64(bad), Err(gp), "{bad:#x}");
        assert_eq!(cpu.write_u8(bad, 1), Err(gp), "{bad:#x}");
    }
    for bad in [a | 0xffff_8000_0000_0000, softmm::TASK_SIZE, 0xffff_ffff_ff60_0000] {
        let segv = Fault::Segv { addr: bad, code: SegvCode::MapErr };
        assert_eq!(cpu.read_u8(bad), Err(segv), "{bad:#x}");
        assert_eq!(cpu.write_u8(bad, 1), Err(segv), "{bad:#x}");
    }
    assert_eq!(cpu.read_u64(a).unwrap(), 42);
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// Defect 5 (deadlock): attaching or dropping a second `Cpu` on a thread
/// whose first CPU a shootdown is waiting for took the domain's CPU-list
/// lock, which the waiting shootdown holds, without making the thread's CPUs
/// quiescent. Each case must finish (the watchdog catches a hang).
#[test]
fn a_thread_attaches_and_drops_cpus_while_another_shoots_down() {
    use std::sync::mpsc;
    use std::time::Duration;
    for case in ["attach", "drop", "detach"] {
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let p = phys(4);
            let mm = mm_with(&p, FaultPolicy::default());
            let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
            let (ready_tx, ready_rx) = mpsc::channel();
            let vcpus = {
                let mm = mm.clone();
                std::thread::spawn(move || {
                    let mut first = softmm::Cpu::attached(&mm);
                    first.write_u64(a, 1).unwrap();
                    let mut second = softmm::Cpu::attached(&mm);
                    ready_tx.send(()).unwrap();
                    // `first` runs guest code (no MMU call): the munmap below
                    // waits for it. Meanwhile the thread switches vCPUs.
                    std::thread::sleep(Duration::from_millis(200));
                    match case {
                        "attach" => second.attach(&mm),
                        "detach" => second.detach(),
                        _ => drop(second),
                    }
                    assert!(first.read_u64(a).is_err(), "the page was unmapped");
                })
            };
            ready_rx.recv().unwrap();
            mm.munmap(a, PAGE).unwrap();
            vcpus.join().unwrap();
            drop(mm);
            assert_no_leaks(&p);
            done_tx.send(()).unwrap();
        });
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{case}: deadlock"));
    }
}

/// Defect 7: `fork` racing `ftruncate`. Truncate read the file's reverse map
/// once, before taking each address space's `mmap_lock`; a fork in between
/// copied page-cache entries into a child that truncate never zapped, and
/// the child then read old data past the new end of file instead of getting
/// SIGBUS. To open the window every run, another address space mapping the
/// file comes first in the reverse map and its zap waits (the shootdown) for
/// a CPU that runs without MMU calls; the fork happens meanwhile.
#[test]
fn a_child_forked_during_truncate_gets_sigbus_past_the_new_end() {
    use std::sync::mpsc;
    use std::time::Duration;
    for &policy in FaultPolicy::ALL {
        let p = phys(4);
        let f = softmm::File::create(&p, "f", 0).unwrap();
        f.write_at(0, &[7u8; 4 * PAGE as usize]).unwrap();
        let of = softmm::OpenFile::read_write(&f);
        // First in the file's reverse map.
        let other = mm_with(&p, policy);
        let o = other.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&of), 0).unwrap();
        let mm = mm_with(&p, policy);
        let a = mm.mmap(0, 4 * PAGE, RW, MAP_PRIVATE, Some(&of), 0).unwrap();
        let mut cpu = softmm::Cpu::attached(&mm);
        // Page 0 a private COW copy (so fork copies this VMA's entries), the
        // others page-cache pages mapped read-only.
        cpu.write_u8(a, 1).unwrap();
        for i in 1..4 {
            assert_eq!(cpu.read_u8(a + i * PAGE).unwrap(), 7);
        }
        let (cached_tx, cached_rx) = mpsc::channel();
        let runner = {
            let other = other.clone();
            std::thread::spawn(move || {
                let mut ocpu = softmm::Cpu::attached(&other);
                assert_eq!(ocpu.read_u8(o).unwrap(), 7);
                cached_tx.send(()).unwrap();
                // Guest code without MMU calls: the truncate waits for it.
                std::thread::sleep(Duration::from_millis(300));
                assert!(ocpu.read_u8(o).is_err());
            })
        };
        cached_rx.recv().unwrap();
        let truncater = {
            let f = f.clone();
            std::thread::spawn(move || f.set_len(0).unwrap())
        };
        // Parked: this thread's waits below must not hold up the truncate's
        // shootdown of `mm`.
        cpu.park();
        std::thread::sleep(Duration::from_millis(100));
        let child = mm.fork().unwrap();
        truncater.join().unwrap();
        runner.join().unwrap();
        cpu.resume();
        let mut ccpu = softmm::Cpu::attached(&child);
        for i in 1..4 {
            let r = ccpu.read_u8(a + i * PAGE);
            assert_eq!(r, Err(softmm::Fault::Bus { addr: a + i * PAGE }), "{policy:?}: page {i} past the end of file");
        }
        drop((ccpu, child, cpu, mm, other, f, of));
        assert_no_leaks(&p);
    }
}

/// Defect 11: a file's reverse map kept an entry per dead address space that
/// had mapped it (until the next truncate): heap growing with every fork and
/// exit, invisible to the leak checks. An address space now removes itself
/// when it dies, and `PhysStats::rmap_entries` counts what is left.
#[test]
fn dead_address_spaces_leave_no_reverse_map_entries() {
    let p = phys(4);
    let f = softmm::File::create(&p, "f", PAGE).unwrap();
    let mm = mm_with(&p, FaultPolicy::default());
    let a = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&softmm::OpenFile::read_write(&f)), 0).unwrap();
    for _ in 0..100 {
        drop(mm.fork().unwrap());
    }
    assert_eq!(p.stats().rmap_entries, 1);
    // Unmapped but alive: the entry stays until the address space dies.
    mm.munmap(a, PAGE).unwrap();
    drop(mm);
    assert_eq!(p.stats().rmap_entries, 0);
    drop(f);
    assert_no_leaks(&p);
}

/// A 2 MiB page.
const HP: u64 = 2 << 20;

/// An arena with `huge` 2 MiB pages in its pool and 8 MiB of small frames.
fn pool(huge: u64) -> std::sync::Arc<softmm::PhysMem> {
    softmm::PhysMem::new(softmm::PhysConfig::new((8 << 20) + huge * HP + HP).hugepages(huge)).expect("arena")
}

/// `(free, rsvd)` of the pool.
fn huge_counts(p: &softmm::PhysMem) -> (u64, u64) {
    let s = p.huge_page_stats();
    (s.free, s.rsvd)
}

/// The pages, reservations and commit charge of shared anonymous memory
/// belong to its object, which the VMA tree versions that lock-free readers
/// may still hold kept alive until an epoch grace period ended: without
/// other epoch activity `munmap` returned with all of it still held, and the
/// next `mmap` of a pool of one huge page failed (`ENOMEM`). Linux releases
/// them before `munmap` returns; so must softmm, round after round, with no
/// `quiesce` in between.
#[test]
fn shared_anonymous_hugetlb_memory_returns_to_the_pool_at_munmap() {
    let p = pool(1);
    let mm = mm_with(&p, FaultPolicy::default());
    let mut cpu = softmm::Cpu::attached(&mm);
    for round in 0..200 {
        let a = mm
            .mmap(0, HP, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0)
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!(huge_counts(&p), (1, 1), "round {round}: reserved at mmap");
        cpu.write_u64(a + HP - 8, round).unwrap();
        assert_eq!(huge_counts(&p), (0, 0), "round {round}: the fault took the reservation");
        mm.munmap(a, HP).unwrap();
        assert_eq!(huge_counts(&p), (1, 0), "round {round}: the page is back in the pool");
    }
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// As above for the small pages of shared anonymous memory: 1.5 MiB of it,
/// every page written, in an arena of 2 MiB, fits only if each round's
/// pages are freed by its `munmap`.
#[test]
fn shared_anonymous_pages_are_freed_at_munmap() {
    let p = phys(2);
    let mm = mm_with(&p, FaultPolicy::default());
    let mut cpu = softmm::Cpu::attached(&mm);
    let len = 3 << 19;
    let (frames, committed) = (p.stats().frames_used, p.committed_pages());
    for round in 0..100 {
        let a = mm.mmap(0, len, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
        for va in (a..a + len).step_by(PAGE as usize) {
            cpu.write_u64(va, va ^ round).unwrap_or_else(|f| panic!("round {round}: {f:?} at {va:#x}"));
        }
        mm.munmap(a, len).unwrap();
        assert_eq!(p.stats().frames_used, frames, "round {round}: pages left after munmap");
        assert_eq!(p.committed_pages(), committed, "round {round}: charge left after munmap");
    }
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// Every unmap policy puts the object's last use after its zap, whether the
/// zap runs under the write lock, under the downgraded read lock or with no
/// lock (a span above 2 MiB): the pages and the charge are gone when
/// `munmap` returns.
#[test]
fn every_unmap_policy_releases_shared_anonymous_memory() {
    for &unmap in softmm::UnmapPolicy::ALL {
        let p = phys(8);
        let config = softmm::MmConfig::default().unmap_policy(unmap);
        let mm = softmm::AddressSpace::new(&p, config).unwrap();
        let mut cpu = softmm::Cpu::attached(&mm);
        let len = 4 << 20;
        let committed = p.committed_pages();
        for round in 0..4 {
            let a = mm.mmap(0, len, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
            for va in (a..a + len).step_by(64 * PAGE as usize) {
                cpu.write_u64(va, va).unwrap();
            }
            mm.munmap(a, len).unwrap();
            assert_eq!(p.stats().frames_used, 0, "{unmap:?} round {round}: pages left after munmap");
            assert_eq!(p.committed_pages(), committed, "{unmap:?} round {round}: charge left after munmap");
        }
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// As above for the commit charge: under `OVERCOMMIT_NEVER` a shared
/// anonymous mapping of most of the commit limit can be made again only if
/// the last one's charge went with its `munmap`.
#[test]
fn shared_anonymous_charge_is_returned_at_munmap() {
    let p = phys(8);
    p.set_overcommit(p.overcommit().mode(softmm::OvercommitMode::Never));
    let mm = mm_with(&p, FaultPolicy::default());
    let mut cpu = softmm::Cpu::attached(&mm);
    // Three quarters of the limit: two would not fit.
    let len = p.overcommit().commit_limit() * 3 / 4 * PAGE;
    let committed = p.committed_pages();
    for round in 0..100 {
        let a =
            mm.mmap(0, len, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!(p.committed_pages(), committed + len / PAGE, "round {round}");
        cpu.write_u64(a, round).unwrap();
        mm.munmap(a, len).unwrap();
        assert_eq!(p.committed_pages(), committed, "round {round}: charge left after munmap");
    }
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// A hugetlbfs file keeps its pages while it exists (a linked file on
/// Linux), mapped or not, and loses them, with their reservations, when the
/// last of its handles and mappings goes, whichever goes last: its close
/// after its last `munmap`, or that `munmap` after its close. Both used to
/// wait for the grace period of the VMA tree versions that held it.
#[test]
fn a_hugetlbfs_file_releases_its_pages_at_its_last_close_or_munmap() {
    let p = pool(1);
    let mm = mm_with(&p, FaultPolicy::default());
    let mut cpu = softmm::Cpu::attached(&mm);
    for round in 0..100 {
        let close_last = round % 2 == 0;
        let f = softmm::File::create_hugetlbfs(&p, "h", HP).unwrap();
        let of = softmm::OpenFile::read_write(&f);
        let a = mm.mmap(0, HP, RW, MAP_SHARED, Some(&of), 0).unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        cpu.write_u64(a, round).unwrap();
        assert_eq!(huge_counts(&p), (0, 0), "round {round}");
        if close_last {
            mm.munmap(a, HP).unwrap();
            assert_eq!(huge_counts(&p), (0, 0), "round {round}: the file keeps its page");
            let mut back = [0; 8];
            f.read_at(0, &mut back).unwrap();
            assert_eq!(u64::from_le_bytes(back), round, "round {round}");
            drop((of, f));
        } else {
            drop((of, f));
            assert_eq!(huge_counts(&p), (0, 0), "round {round}: the mapping keeps the page");
            assert_eq!(cpu.read_u64(a), Ok(round), "round {round}");
            mm.munmap(a, HP).unwrap();
        }
        assert_eq!(huge_counts(&p), (1, 0), "round {round} (close last: {close_last}): the page is back in the pool");
    }
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// The object lives as long as any mapping of it, whatever made the mapping:
/// a split (`mprotect`), a move (`mremap`), a fork. Its pages keep their
/// contents through each, and go only with the last mapping.
#[test]
fn pieces_of_a_shared_anonymous_mapping_keep_its_pages_until_the_last_goes() {
    let p = phys(4);
    let mm = mm_with(&p, FaultPolicy::default());
    let mut cpu = softmm::Cpu::attached(&mm);
    let a = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
    for i in 0..4 {
        cpu.write_u64(a + i * PAGE, 100 + i).unwrap();
    }
    let frames = p.stats().frames_used;
    assert_eq!(frames, 4);
    // Three pieces: [a, a+1) [a+1, a+2) read-only [a+2, a+4).
    mm.mprotect(a + PAGE, PAGE, PROT_READ).unwrap();
    // The last two pages moved away.
    let b = mm.mremap(a + 2 * PAGE, 2 * PAGE, 2 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a + 64 * PAGE).unwrap();
    let child = mm.fork().unwrap();
    let mut ccpu = softmm::Cpu::attached(&child);
    mm.munmap(a, PAGE).unwrap();
    mm.munmap(b, 2 * PAGE).unwrap();
    assert_eq!(p.stats().frames_used, frames, "the read-only piece and the child map the object");
    assert_eq!(cpu.read_u64(a + PAGE), Ok(101));
    mm.munmap(a + PAGE, PAGE).unwrap();
    assert_eq!(p.stats().frames_used, frames, "the child maps the object");
    // The child sees the parent's writes, and writes for the parent's past pieces.
    assert_eq!(ccpu.read_u64(a), Ok(100));
    assert_eq!(ccpu.read_u64(b + PAGE), Ok(103));
    drop((ccpu, child));
    assert_eq!(p.stats().frames_used, 0, "the child's exit was the last mapping");
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// A lock-free fault may still find a shared anonymous VMA in the tree
/// version it loaded after `munmap` removed it and released its object. It
/// must not leave a page in the released object: a page it adds before the
/// release goes with the others, and after the release it adds none (its
/// VMA is detached, so it falls back and finds no mapping). Threads fault
/// every page of a mapping under each policy while this thread unmaps it;
/// each round, once the faulting thread stopped, no page may be left.
#[test]
fn faults_racing_the_munmap_of_shared_anonymous_memory_leave_no_page() {
    use std::sync::mpsc;
    for &policy in FaultPolicy::ALL {
        let p = phys(4);
        let mm = mm_with(&p, policy);
        // Keeps the page table of the range, which the lock-free paths do
        // not allocate, after the munmap.
        let keep = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
        let mut cpu = softmm::Cpu::attached(&mm);
        cpu.write_u64(keep, 1).unwrap();
        let frames = p.stats().frames_used;
        let len = 64 * PAGE;
        for round in 0..50 {
            let a = mm.mmap(keep - len, len, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
            let (started_tx, started_rx) = mpsc::channel();
            let faulter = {
                let mm = mm.clone();
                std::thread::spawn(move || {
                    let mut cpu = softmm::Cpu::attached(&mm);
                    started_tx.send(()).unwrap();
                    for va in (0..len / PAGE).rev().map(|i| a + i * PAGE) {
                        if cpu.write_u64(va, va).is_err() {
                            break;
                        }
                    }
                })
            };
            started_rx.recv().unwrap();
            mm.munmap(a, len).unwrap();
            faulter.join().unwrap();
            assert_eq!(p.stats().frames_used, frames, "{policy:?} round {round}: a page outlived its object");
        }
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}
