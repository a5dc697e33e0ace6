//! What a translating emulator layers on its TLB: faults that say what
//! access they came from (`Cpu::last_fault`), write watches kept outside
//! the guest's protections and the dirty log (`AddressSpace::write_watch`,
//! `dirty_log`), and what fork, mremap, munmap and COW do to them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{Access, AddressSpace, Cpu, Errno, Fault, MmConfig, PhysConfig, PhysMem, SegvCode, WatchMode};
use softmm_testkit::common::{assert_no_leaks, last_fault};

const PAGE: u64 = 4096;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>) {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    (phys, mm)
}

/// Every accessor records its access beside the fault it returns: loads,
/// stores and fetches of each width, accesses across a page boundary
/// (whose fault is at the second page), copies, atomics (a write, even a
/// failed compare-exchange), unaligned atomics, a held translation, a
/// slice, and the accesses of a section.
#[test]
fn a_fault_says_what_access_it_came_from() {
    let (phys, mm) = setup();
    // [a, a+P) read-write, [a+P, a+2P) read-only, [a+2P, a+3P) a hole.
    let a = mm.mmap(0, 3 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    mm.mprotect(a + PAGE, PAGE, PROT_READ).unwrap();
    mm.munmap(a + 2 * PAGE, PAGE).unwrap();
    let (ro, hole) = (a + PAGE, a + 2 * PAGE);
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.last_fault(), None);

    let acc = |addr| Fault::Segv { addr, code: SegvCode::AccErr };
    let map = |addr| Fault::Segv { addr, code: SegvCode::MapErr };
    assert_eq!(cpu.write_u64(ro + 8, 1), Err(acc(ro + 8)));
    assert_eq!(last_fault(&cpu), (Access::Write, ro + 8, 8));
    assert_eq!(cpu.last_fault().unwrap().fault, acc(ro + 8));
    assert_eq!(cpu.read_u16(hole + 2), Err(map(hole + 2)));
    assert_eq!(last_fault(&cpu), (Access::Read, hole + 2, 2));
    assert_eq!(cpu.fetch_u32(a), Err(acc(a)));
    assert_eq!(last_fault(&cpu), (Access::Execute, a, 4));
    // Across a page boundary: the fault is at the first byte of the page
    // that refused, the access starts before it.
    assert_eq!(cpu.write_le::<u32>(ro - 2, 7), Err(acc(ro)));
    assert_eq!(last_fault(&cpu), (Access::Write, ro - 2, 4));
    assert_eq!(cpu.read_le::<u64>(hole - 3), Err(map(hole)));
    assert_eq!(last_fault(&cpu), (Access::Read, hole - 3, 8));
    let mut buf = [0; 100];
    assert_eq!(cpu.read(hole - 10, &mut buf), Err(map(hole)));
    assert_eq!(last_fault(&cpu), (Access::Read, hole - 10, 100));
    assert_eq!(cpu.write(ro - 1, &[1; 3]), Err(acc(ro)));
    assert_eq!(last_fault(&cpu), (Access::Write, ro - 1, 3));
    assert_eq!(cpu.fetch(a + 5, &mut buf[..9]), Err(acc(a + 5)));
    assert_eq!(last_fault(&cpu), (Access::Execute, a + 5, 9));
    // Atomics: a read-modify-write is a write, even one that changes nothing.
    assert_eq!(cpu.atomic_compare_exchange::<u32>(ro, 1, 2, Ordering::SeqCst, Ordering::SeqCst), Err(acc(ro)));
    assert_eq!(last_fault(&cpu), (Access::Write, ro, 4));
    assert_eq!(cpu.atomic_load::<u64>(hole, Ordering::Acquire), Err(map(hole)));
    assert_eq!(last_fault(&cpu), (Access::Read, hole, 8));
    assert_eq!(cpu.atomic_fetch_add::<u16>(a + 1, 1, Ordering::SeqCst), Err(Fault::Unaligned { addr: a + 1 }));
    assert_eq!(last_fault(&cpu), (Access::Write, a + 1, 2));
    // A translation and a slice.
    assert!(cpu.translate(ro + 3, Access::Write).is_err());
    assert_eq!(last_fault(&cpu), (Access::Write, ro + 3, 1));
    assert_eq!(cpu.with_slice_mut(ro - 4, 20, |_, _| ()), Err(acc(ro)));
    assert_eq!(last_fault(&cpu), (Access::Write, ro - 4, 20));
    // A section's accesses record on its CPU, and a success changes nothing.
    {
        let mut s = cpu.section();
        assert_eq!(s.write_u8(ro, 1), Err(acc(ro)));
        assert_eq!(s.last_fault().map(|i| (i.access, i.size)), Some((Access::Write, 1)));
        s.write_u16(a, 1).unwrap();
        assert_eq!(s.read_be::<u32>(hole - 1), Err(map(hole)));
    }
    assert_eq!(last_fault(&cpu), (Access::Read, hole - 1, 4));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

const RW: i32 = PROT_READ | PROT_WRITE;
const RWX: i32 = PROT_READ | PROT_WRITE | PROT_EXEC;

/// The pages of `[a, a + pages * PAGE)` the dirty log names, cleared or not.
fn dirty(mm: &AddressSpace, a: u64, pages: u64, clear: bool) -> Vec<u64> {
    let mut bits = vec![0u64; pages.div_ceil(64) as usize];
    mm.dirty_log(a, pages * PAGE, &mut bits, clear).unwrap();
    (0..pages).filter(|&i| bits[i as usize / 64] >> (i % 64) & 1 != 0).collect()
}

/// A notify watch stops the store before it is made, on every CPU (one
/// on another thread had the page cached writable), and changes nothing
/// the guest can see: its maps, its loads and fetches, `mprotect`, and the
/// `SIGSEGV` of a store its own protection refuses, which comes first.
#[test]
fn a_notify_watch_stops_stores_and_the_guest_sees_nothing_else() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, 2 * PAGE, RWX, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 0x1111).unwrap();
    let maps = mm.maps();
    let (to_other, from_main) = std::sync::mpsc::channel::<()>();
    let mm2 = &mm;
    let (to_main, from_other) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut other = Cpu::attached(mm2);
            // Cached writable (a store filled the entry).
            other.write_u64(a + 8, 1).unwrap();
            to_main.send(Ok(())).unwrap();
            from_main.recv().unwrap();
            to_main.send(other.write_u64(a + 8, 2)).unwrap();
        });
        from_other.recv().unwrap().unwrap();
        mm.write_watch(a, PAGE, WatchMode::Notify).unwrap();
        to_other.send(()).unwrap();
        assert_eq!(from_other.recv().unwrap(), Err(Fault::WriteWatch { addr: a + 8 }));
    });
    assert_eq!(cpu.write_u16(a + 6, 3), Err(Fault::WriteWatch { addr: a + 6 }));
    assert_eq!(cpu.last_fault().map(|i| (i.access, i.size)), Some((Access::Write, 2)));
    assert_eq!(cpu.atomic_fetch_add::<u64>(a, 1, Ordering::SeqCst), Err(Fault::WriteWatch { addr: a }));
    // Nothing stored; loads, fetches and the other page are as before.
    assert_eq!((cpu.read_u64(a), cpu.fetch_le::<u64>(a + 8)), (Ok(0x1111), Ok(1)));
    assert_eq!(mm.maps(), maps);
    cpu.write_u64(a + PAGE, 5).unwrap();
    assert_eq!(mm.write_watched_pages(), 1);
    // The guest's protection first.
    mm.mprotect(a, PAGE, PROT_READ).unwrap();
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    mm.mprotect(a, PAGE, RWX).unwrap();
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::WriteWatch { addr: a }));
    // Unwatched, the store is made; a second unwatch is harmless.
    mm.write_unwatch(a, PAGE, WatchMode::Notify).unwrap();
    mm.write_unwatch(a, PAGE, WatchMode::Notify).unwrap();
    assert_eq!(mm.write_watched_pages(), 0);
    cpu.write_u8(a, 1).unwrap();
    assert_eq!(cpu.read_u64(a), Ok(0x1101));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// The dirty log of a workload is exactly the set of pages it stored to
/// (checked against a model), through any accessor and any CPU; loads and
/// fetches mark nothing; a clear re-arms every page, including those
/// another CPU had cached writable, and a log that is not cleared reads
/// the same again. A notify watch on a logged page stops the store, which
/// is then not logged.
#[test]
fn a_dirty_log_is_exactly_the_pages_written() {
    const PAGES: u64 = 150;
    let (phys, mm) = setup();
    let a = mm.mmap(0, PAGES * PAGE, RW, ANON, None, 0).unwrap();
    mm.write_watch(a, PAGES * PAGE, WatchMode::Log).unwrap();
    let mut cpus = [Cpu::attached(&mm), Cpu::attached(&mm)];
    let mut seed = 12345u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    };
    for round in 0..4 {
        let mut model = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let (page, off, c) = (next() % PAGES, next() % (PAGE - 8), next() as usize % 2);
            let at = a + page * PAGE + off;
            let op = next() % 6;
            if op >= 2 {
                model.insert(page);
            }
            match op {
                // Loads and fetches mark nothing.
                0 => {
                    cpus[c].read_u64(at).unwrap();
                }
                1 => assert!(cpus[c].fetch(at, &mut [0; 8]).is_err(), "not executable"),
                2 => cpus[c].write_u8(at, 1).unwrap(),
                3 => {
                    cpus[c].atomic_fetch_add::<u8>(at, 1, Ordering::Relaxed).unwrap();
                }
                4 => cpus[c].section().write_u32(at, 2).unwrap(),
                _ => cpus[c].with_slice_mut(at, 8, |_, b| b[0].store(3, Ordering::Relaxed)).unwrap(),
            }
        }
        let got = dirty(&mm, a, PAGES, false);
        assert_eq!(got, model.into_iter().collect::<Vec<_>>(), "round {round}");
        assert_eq!(dirty(&mm, a, PAGES, true), got, "round {round}: a log not cleared reads the same");
        assert_eq!(dirty(&mm, a, PAGES, false), Vec::<u64>::new(), "round {round}: cleared");
    }
    // Exactly: one store to each of three pages, both CPUs having them
    // cached writable from before the clear.
    for p in [3, 64, 149] {
        cpus[(p % 2) as usize].write_u8(a + p * PAGE, 1).unwrap();
    }
    let _ = dirty(&mm, a, PAGES, true);
    for c in &mut cpus {
        c.read_u64(a + 3 * PAGE).unwrap();
        assert!(c.fetch(a, &mut [0; 4]).is_err());
    }
    assert_eq!(dirty(&mm, a, PAGES, false), Vec::<u64>::new());
    cpus[1].write_u8(a + 3 * PAGE, 1).unwrap();
    cpus[0].write_u8(a + 149 * PAGE + 7, 1).unwrap();
    assert_eq!(dirty(&mm, a, PAGES, true), vec![3, 149]);
    // Notify and log on one page: the store is stopped, and not logged.
    mm.write_watch(a + 5 * PAGE, PAGE, WatchMode::Notify).unwrap();
    assert_eq!(cpus[0].write_u8(a + 5 * PAGE, 1), Err(Fault::WriteWatch { addr: a + 5 * PAGE }));
    assert_eq!(dirty(&mm, a, PAGES, false), Vec::<u64>::new());
    mm.write_unwatch(a + 5 * PAGE, PAGE, WatchMode::Notify).unwrap();
    cpus[0].write_u8(a + 5 * PAGE, 1).unwrap();
    assert_eq!(dirty(&mm, a, PAGES, false), vec![5]);
    // Unlogging drops the marks; a sub-range is reported from its start.
    mm.write_unwatch(a, PAGES * PAGE, WatchMode::Log).unwrap();
    assert_eq!(mm.write_watched_pages(), 0);
    cpus[0].write_u8(a + 6 * PAGE, 1).unwrap();
    mm.write_watch(a + 4 * PAGE, 4 * PAGE, WatchMode::Log).unwrap();
    cpus[1].write_u8(a + 7 * PAGE, 1).unwrap();
    assert_eq!(dirty(&mm, a + 4 * PAGE, 4, false), vec![3]);
    drop((cpus, mm));
    assert_no_leaks(&phys);
}

/// Watches and dirty bits are on addresses, as a hardware watchpoint is:
/// `munmap` and a new mapping there keep them, `mremap` does not carry
/// them to the new address, a `fork`'s child starts with none, and a COW
/// break is made for a stopped store (its bytes unchanged in both) and
/// logged in the address space that stored.
#[test]
fn watches_stay_on_their_addresses_across_munmap_mremap_and_fork() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
    mm.write_watch(a, PAGE, WatchMode::Notify).unwrap();
    mm.write_watch(a + PAGE, PAGE, WatchMode::Log).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(a + PAGE, 1).unwrap();
    // munmap, then a new mapping at the same place: still watched, the
    // mark of the store before the munmap still there.
    mm.munmap(a, 2 * PAGE).unwrap();
    assert_eq!(mm.mmap(a, 2 * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(a));
    assert_eq!(dirty(&mm, a, 2, false), vec![1]);
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::WriteWatch { addr: a }));
    // mremap moves the pages, not the watch.
    let b = mm.mremap(a, PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a + 3 * PAGE).unwrap();
    cpu.write_u8(b, 2).unwrap();
    assert_eq!(mm.mmap(a, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(a));
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::WriteWatch { addr: a }));
    // fork: the child has no watch and no log; the parent keeps its own.
    let _ = dirty(&mm, a, 2, true);
    cpu.write_u8(a + PAGE, 7).unwrap();
    cpu.write_u8(b, 3).unwrap();
    let child = mm.fork().unwrap();
    assert_eq!(child.write_watched_pages(), 0);
    let mut ccpu = Cpu::attached(&child);
    ccpu.write_u8(a, 4).unwrap();
    ccpu.write_u8(a + PAGE, 8).unwrap();
    assert_eq!(dirty(&mm, a, 2, false), vec![1], "the child's stores are not the parent's");
    assert_eq!(dirty(&child, a, 2, false), Vec::<u64>::new());
    // COW: the parent's stopped store leaves both copies as they were; its
    // logged store breaks COW and is logged.
    let _ = dirty(&mm, a, 2, true);
    assert_eq!(cpu.write_u8(a, 5), Err(Fault::WriteWatch { addr: a }));
    assert_eq!((cpu.read_u8(a), ccpu.read_u8(a)), (Ok(0), Ok(4)));
    cpu.write_u8(a + PAGE, 9).unwrap();
    assert_eq!((cpu.read_u8(a + PAGE), ccpu.read_u8(a + PAGE)), (Ok(9), Ok(8)));
    assert_eq!(dirty(&mm, a, 2, false), vec![1]);
    drop((cpu, ccpu, mm, child));
    assert_no_leaks(&phys);
}

/// Bad arguments: an unaligned address, a range past the user address
/// space or wrapping, a log shorter than the range. Nothing changes; a
/// zero length does nothing.
#[test]
fn watch_calls_refuse_bad_ranges_and_change_nothing() {
    let (phys, mm) = setup();
    let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    let task = MmConfig::default().task_size;
    for (addr, len) in [(a + 1, PAGE), (task - PAGE, 2 * PAGE), (a, u64::MAX), (task + PAGE, PAGE)] {
        assert_eq!(mm.write_watch(addr, len, WatchMode::Notify), Err(Errno::Inval), "{addr:#x}+{len:#x}");
        assert_eq!(mm.write_unwatch(addr, len, WatchMode::Log), Err(Errno::Inval));
        assert_eq!(mm.dirty_log(addr, len, &mut [0; 4], false), Err(Errno::Inval));
    }
    assert_eq!(mm.write_watched_pages(), 0);
    // Past the bound on watched pages: ENOMEM, nothing watched (the whole
    // user address space would be 2^35 pages).
    assert_eq!(mm.write_watch(0, task, WatchMode::Log), Err(Errno::NoMem));
    mm.write_watch(a, PAGE, WatchMode::Log).unwrap();
    let over = softmm::MAX_WATCHED_PAGES * PAGE;
    assert_eq!(mm.write_watch(0x10000, over, WatchMode::Notify), Err(Errno::NoMem));
    assert_eq!(mm.write_watched_pages(), 1);
    mm.write_unwatch(0, task, WatchMode::Log).unwrap();
    assert_eq!(mm.write_watched_pages(), 0);
    mm.write_watch(a, 0, WatchMode::Notify).unwrap();
    mm.write_watch(task - PAGE, 1, WatchMode::Log).unwrap();
    assert_eq!(mm.write_watched_pages(), 1);
    assert_eq!(mm.dirty_log(a, 65 * PAGE, &mut [0; 1], false), Err(Errno::Inval));
    let mut bits = [u64::MAX; 2];
    mm.dirty_log(a, 65 * PAGE, &mut bits, false).unwrap();
    assert_eq!(bits, [0, 0]);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(a, 1).unwrap();
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// The emulator's translation cache: one translated code page, shared by
/// its guest threads (as QEMU's TB cache is).
#[derive(Default)]
struct TranslationCache {
    /// The page and its instruction words, while valid.
    page: Option<(u64, Vec<u32>)>,
    translations: u32,
}

/// `op | rd << 8 | imm16 << 16` of the toy ISA's `LI r5, imm`, the one
/// instruction the runner executes.
const fn li_r5(imm: u16) -> u32 {
    1 | 5 << 8 | (imm as u32) << 16
}

/// Runs the instruction at `pc` (a `LI r5, imm`) from the translation
/// cache, translating its page if needed: the watch is armed before the
/// page is read, so a store after the read is reported, and one before it
/// is in what was read. Returns `r5`.
fn run_translated(mm: &AddressSpace, cpu: &mut Cpu, cache: &std::sync::Mutex<TranslationCache>, pc: u64) -> u16 {
    let page = pc & !(PAGE - 1);
    let mut c = cache.lock().unwrap();
    if c.page.as_ref().map(|(p, _)| *p) != Some(page) {
        mm.write_watch(page, PAGE, WatchMode::Notify).unwrap();
        let mut bytes = vec![0; PAGE as usize];
        cpu.fetch(page, &mut bytes).unwrap();
        c.page = Some((page, bytes.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect()));
        c.translations += 1;
    }
    let (_, insn) = c.page.as_ref().unwrap();
    (insn[((pc - page) / 4) as usize] >> 16) as u16
}

/// A store by the guest: a write-watch event drops the translation of the
/// page, unwatches it and retries the store, as the emulator's loop does.
/// Returns the number of events.
fn guest_store(mm: &AddressSpace, cpu: &mut Cpu, cache: &std::sync::Mutex<TranslationCache>, at: u64, v: u32) -> u32 {
    let mut events = 0;
    loop {
        match cpu.write_u32(at, v) {
            Ok(()) => return events,
            Err(Fault::WriteWatch { addr }) => {
                events += 1;
                let page = addr & !(PAGE - 1);
                let mut c = cache.lock().unwrap();
                if c.page.as_ref().is_some_and(|(p, _)| *p == page) {
                    c.page = None;
                }
                mm.write_unwatch(page, PAGE, WatchMode::Notify).unwrap();
            }
            Err(f) => panic!("guest fault {f:?}"),
        }
    }
}

/// An emulator with two guest threads: a runner executes code from a
/// translation cache (its page watched for notify), a writer stores to
/// data pages and then rewrites the runner's code. Meanwhile the main
/// thread munmaps and maps again a logged scratch range and forks. The
/// runner's next run after the rewrite executes the new code (the event
/// dropped the translation), and the dirty log of the whole range is
/// exactly the pages the writer stored to (a model), the code page among
/// them, the scratch range not.
#[test]
fn an_emulator_sees_its_guest_rewrite_code_and_logs_exactly_the_pages_written() {
    const DATA: u64 = 64;
    const SCRATCH: u64 = 8;
    let (phys, mm) = setup();
    // [code | data pages | scratch pages], all logged.
    let pages = 1 + DATA + SCRATCH;
    let code = mm.mmap(0, pages * PAGE, RWX, ANON, None, 0).unwrap();
    let (data, scratch) = (code + PAGE, code + (1 + DATA) * PAGE);
    let mut loader = Cpu::attached(&mm);
    loader.write_u32(code, li_r5(1)).unwrap();
    mm.write_watch(code, pages * PAGE, WatchMode::Log).unwrap();
    let cache = std::sync::Mutex::new(TranslationCache::default());
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mm_ref, cache, done) = (&mm, &cache, &done);
    let (model, events, runs, last) = std::thread::scope(|s| {
        let runner = s.spawn(move || {
            let mut cpu = Cpu::attached(mm_ref);
            let mut runs = 0u64;
            while !done.load(Ordering::Acquire) {
                assert!(matches!(run_translated(mm_ref, &mut cpu, cache, code), 1 | 2));
                runs += 1;
            }
            // After the writer is done: the code it wrote.
            (runs, run_translated(mm_ref, &mut cpu, cache, code))
        });
        let writer = s.spawn(move || {
            let mut cpu = Cpu::attached(mm_ref);
            let mut model = std::collections::BTreeSet::new();
            let mut seed = 7u64;
            for i in 0..2000u32 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let page = (seed >> 33) % DATA;
                model.insert(1 + page);
                cpu.write_u32(data + page * PAGE + 4 * (i as u64 % 1000), i).unwrap();
            }
            let events = guest_store(mm_ref, &mut cpu, cache, code, li_r5(2));
            model.insert(0);
            (model, events)
        });
        for _ in 0..20 {
            mm_ref.munmap(scratch, SCRATCH * PAGE).unwrap();
            assert_eq!(mm_ref.mmap(scratch, SCRATCH * PAGE, RWX, ANON | MAP_FIXED, None, 0), Ok(scratch));
            let child = mm_ref.fork().unwrap();
            assert_eq!(child.write_watched_pages(), 0);
        }
        let (model, events) = writer.join().unwrap();
        done.store(true, Ordering::Release);
        let (runs, last) = runner.join().unwrap();
        (model, events, runs, last)
    });
    assert_eq!(last, 2, "the runner executed a stale translation ({runs} runs before)");
    // The writer's store met the watch at least once, unless the runner
    // had not translated the page yet (then its store was not watched).
    assert!(events >= 1 || cache.lock().unwrap().translations == 1, "{events} events");
    assert_eq!(dirty(&mm, code, pages, true), model.into_iter().collect::<Vec<_>>());
    drop((loader, mm));
    assert_no_leaks(&phys);
}

/// A write watch on part of a 2 MiB hugetlb page: the page was cached
/// writable in the 2 MiB TLB before the watch, arming drops it, and then
/// a notify store to a watched 4 KiB page is stopped while the rest of the
/// huge page (read, and written outside the watched pages) goes on; a
/// logged store marks exactly its 4 KiB page.
#[test]
fn a_write_watch_inside_a_hugetlb_page() {
    const HP: u64 = 2 << 20;
    let phys = PhysMem::new(PhysConfig::new((8 << 20) + 2 * HP).hugepages(1)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, HP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 3 * PAGE, 1).unwrap();
    cpu.write_u64(a + 100 * PAGE, 2).unwrap();
    mm.write_watch(a + 3 * PAGE, PAGE, WatchMode::Notify).unwrap();
    assert_eq!(cpu.write_u64(a + 3 * PAGE + 8, 3), Err(Fault::WriteWatch { addr: a + 3 * PAGE + 8 }));
    assert_eq!(cpu.read_u64(a + 3 * PAGE + 8), Ok(0), "not stored");
    cpu.write_u64(a + 100 * PAGE, 4).unwrap();
    assert_eq!(cpu.read_u64(a + 3 * PAGE), Ok(1));
    mm.write_unwatch(a + 3 * PAGE, PAGE, WatchMode::Notify).unwrap();
    cpu.write_u64(a + 3 * PAGE + 8, 3).unwrap();
    // The log of 8 of its 4 KiB pages.
    mm.write_watch(a, 8 * PAGE, WatchMode::Log).unwrap();
    cpu.write_u8(a + 5 * PAGE + 1, 1).unwrap();
    cpu.write_u8(a + 100 * PAGE, 1).unwrap();
    let mut bits = [0u64; 1];
    mm.dirty_log(a, 8 * PAGE, &mut bits, true).unwrap();
    assert_eq!(bits[0], 1 << 5);
    cpu.write_u8(a + 5 * PAGE + 1, 2).unwrap();
    mm.dirty_log(a, 8 * PAGE, &mut bits, false).unwrap();
    assert_eq!(bits[0], 1 << 5, "marked again after the clear");
    drop((cpu, mm));
    assert_no_leaks(&phys);
}
