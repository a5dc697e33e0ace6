//! Range-parallel writers (`WriterPolicy::Range`) under load: threads each
//! mapping, unmapping and reprotecting pages of their own 1 GiB window
//! without `mmap_lock`, beside a thread faulting across all the windows and
//! one taking `mmap_lock` now and then (`maps`, `fork`); at the end the
//! address space maps exactly what each thread's model says.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, MmConfig, WriterPolicy};
use softmm_testkit::common::*;

const GIB: u64 = 1 << 30;
const PAGES: u64 = 48;
const WRITERS: u64 = 3;

/// The first page of writer `i`'s pages: away from its window's bounds.
fn base(i: u64) -> u64 {
    (0x100 + i) * GIB + 64 * PAGE
}

fn perms(prot: i32) -> &'static str {
    match prot {
        PROT_READ => "r--p",
        p if p == PROT_READ | PROT_WRITE => "rw-p",
        _ => "---p",
    }
}

/// One writer: random calls on its pages, checked against its model (page
/// to protection); returns the model.
fn writer(mm: Arc<AddressSpace>, i: u64, seed: u64, rounds: u64) -> BTreeMap<u64, i32> {
    let mut rng = Rng::new(seed ^ (i + 1).wrapping_mul(0x9e37_79b9));
    let mut model: BTreeMap<u64, i32> = BTreeMap::new();
    let mut cpu = Cpu::attached(&mm);
    let prots = [PROT_READ, PROT_READ | PROT_WRITE, PROT_NONE];
    for _ in 0..rounds {
        let first = rng.below(PAGES);
        let n = 1 + rng.below((PAGES - first).min(8));
        let (a, len) = (base(i) + first * PAGE, n * PAGE);
        let prot = prots[rng.below(3) as usize];
        match rng.below(3) {
            0 => {
                let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
                assert_eq!(mm.mmap(a, len, prot, flags, None, 0), Ok(a));
                for p in first..first + n {
                    model.insert(p, prot);
                }
            }
            1 => {
                mm.munmap(a, len).unwrap();
                for p in first..first + n {
                    model.remove(&p);
                }
            }
            _ => {
                let whole = (first..first + n).all(|p| model.contains_key(&p));
                let r = mm.mprotect(a, len, prot);
                if whole {
                    assert_eq!(r, Ok(()));
                    for p in first..first + n {
                        model.insert(p, prot);
                    }
                } else {
                    // Linux changes what lies below the first hole, then fails.
                    assert_eq!(r, Err(softmm::Errno::NoMem));
                    for p in first..first + n {
                        match model.get_mut(&p) {
                            Some(old) => *old = prot,
                            None => break,
                        }
                    }
                }
            }
        }
        // A store to a writable page of its own lands.
        if let Some((&p, _)) = model.iter().find(|(_, &prot)| prot & PROT_WRITE != 0) {
            let at = base(i) + p * PAGE;
            cpu.write_u64(at, i).unwrap();
            assert_eq!(cpu.read_u64(at), Ok(i));
        }
    }
    model
}

/// The `mmap_lock` side of the stress tests: a thread that reads the maps
/// (checking that no two entries overlap) and forks, until `stop`; it
/// returns how many forks it made.
fn spawn_locker(mm: &Arc<AddressSpace>, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let (mm, stop) = (mm.clone(), stop.clone());
    spawn("locker".into(), move || {
        let mut forks = 0u64;
        while !stop.load(Relaxed) {
            let maps = mm.maps();
            assert!(maps.windows(2).all(|w| w[0].end <= w[1].start), "overlapping maps");
            drop(mm.fork().unwrap());
            forks += 1;
        }
        forks
    })
}

/// Runs a stress test of range writers under a 120 s watchdog: `body` gets
/// the seed (`STRESS_SEED`, else `default_seed`; printed), an address space
/// under `WriterPolicy::Range` and a stop flag for its helper threads, and
/// must join every thread it starts; nothing may leak once the address
/// space is dropped.
fn range_stress(
    name: &'static str,
    default_seed: u64,
    body: impl FnOnce(u64, &Arc<AddressSpace>, &Arc<AtomicBool>) + Send + 'static,
) {
    let seed = stress_seed(default_seed);
    eprintln!("STRESS_SEED={seed}");
    watchdog(name, 120, move || {
        let phys = phys(8);
        let mm = AddressSpace::new(&phys, MmConfig::default().writer_policy(WriterPolicy::Range)).unwrap();
        body(seed, &mm, &Arc::new(AtomicBool::new(false)));
        drop(mm);
        assert_no_leaks(&phys);
    });
}

/// Starts a thread with a CPU of its own in `mm` that runs `step` until
/// `stop`.
fn spawn_faulter(
    mm: &Arc<AddressSpace>,
    stop: &Arc<AtomicBool>,
    seed: u64,
    mut step: impl FnMut(&mut Cpu, &mut Rng) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let (mm, stop) = (mm.clone(), stop.clone());
    spawn("faulter".into(), move || {
        let mut rng = Rng::new(seed);
        let mut cpu = Cpu::attached(&mm);
        while !stop.load(Relaxed) {
            step(&mut cpu, &mut rng);
        }
    })
}

/// Runs `writer(mm, i)` for each of the `WRITERS` writers on a thread of
/// its own; returns what each returned, in order.
fn run_writers<M: Send + 'static>(
    mm: &Arc<AddressSpace>,
    writer: impl Fn(Arc<AddressSpace>, u64) -> M + Send + Sync + 'static,
) -> Vec<M> {
    let writer = Arc::new(writer);
    let threads: Vec<_> = (0..WRITERS)
        .map(|i| {
            let (mm, writer) = (mm.clone(), writer.clone());
            spawn(format!("writer {i}"), move || writer(mm, i))
        })
        .collect();
    join_all(threads)
}

/// N writers on their own windows, a faulter across them and an
/// `mmap_lock` reader and forker: the final maps equal the writers' models,
/// the published set equals `mmap_lock`'s, nothing leaks.
#[test]
fn range_writers_on_their_own_windows_beside_a_faulter_and_fork() {
    range_stress("range writers", 0x7a6e, |seed, mm, stop| {
        let faulter = spawn_faulter(mm, stop, seed, |cpu, rng| {
            let a = base(rng.below(WRITERS)) + rng.below(PAGES) * PAGE + 8 * rng.below(512);
            // Any outcome but a wrong value: the page may be unmapped,
            // read-only or PROT_NONE at any moment.
            let _ = cpu.read_u64(a);
        });
        let locker = spawn_locker(mm, stop);
        let rounds = scaled(1500);
        let models = run_writers(mm, move |mm, i| writer(mm, i, seed, rounds));
        stop.store(true, Relaxed);
        faulter.join().unwrap();
        assert!(locker.join().unwrap() > 0);
        // Page by page, what the maps say against the models.
        let mut got: BTreeMap<u64, String> = BTreeMap::new();
        for e in mm.maps() {
            for a in (e.start..e.end).step_by(PAGE as usize) {
                got.insert(a, e.perms.clone());
            }
        }
        let mut want: BTreeMap<u64, String> = BTreeMap::new();
        for (i, model) in models.iter().enumerate() {
            for (&p, &prot) in model {
                want.insert(base(i as u64) + p * PAGE, perms(prot).to_string());
            }
        }
        assert_eq!(got, want);
        let s = mm.stats();
        assert!(s.range.writes > rounds, "range writers ran: {:?}", s.range);
    });
}

/// Writers mapping shared anonymous memory in their own windows (each
/// call a new object, made and linked by the range writer in the thread's
/// own list of linked files), storing into it and unmapping it, beside a
/// faulter across the windows and an `mmap_lock` reader and forker whose
/// children share the objects: every store reads back, the final maps are
/// the writers' last mappings, and once the address space is dropped
/// nothing leaks (the objects' pages, their reverse-map links, the charge).
#[test]
fn shared_anonymous_range_mmaps_beside_a_faulter_and_fork() {
    range_stress("shared anonymous range mmaps", 0x5a11, |seed, mm, stop| {
        let faulter = spawn_faulter(mm, stop, seed, |cpu, rng| {
            let _ = cpu.read_u64(base(rng.below(WRITERS)) + rng.below(PAGES) * PAGE);
        });
        let locker = spawn_locker(mm, stop);
        let rounds = scaled(500);
        let last = run_writers(mm, move |mm, i| {
            let mut rng = Rng::new(seed ^ (i + 3).wrapping_mul(0x9e37_79b9));
            let mut cpu = Cpu::attached(&mm);
            let mut mapped = None;
            for round in 0..rounds {
                if let Some((a, len)) = mapped.take() {
                    mm.munmap(a, len).unwrap();
                }
                let (first, n) = (rng.below(PAGES - 8), 1 + rng.below(8));
                let (a, len) = (base(i) + first * PAGE, n * PAGE);
                let flags = MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED;
                assert_eq!(mm.mmap(a, len, PROT_READ | PROT_WRITE, flags, None, 0), Ok(a));
                let at = a + rng.below(n) * PAGE;
                cpu.write_u64(at, round).unwrap();
                assert_eq!(cpu.read_u64(at), Ok(round));
                mapped = Some((a, len));
            }
            mapped
        });
        stop.store(true, Relaxed);
        faulter.join().unwrap();
        assert!(locker.join().unwrap() > 0);
        let got: Vec<(u64, u64)> = mm.maps().iter().map(|e| (e.start, e.end)).collect();
        let want: Vec<(u64, u64)> = last.iter().flatten().map(|&(a, len)| (a, a + len)).collect();
        assert_eq!(got, want);
        let s = mm.stats();
        assert!(s.range.writes > rounds, "range writers ran: {:?}", s.range);
    });
}

/// A page of an advising writer's model: whether `MADV_DONTFORK` is on it,
/// and the value last stored in it.
#[derive(Clone, Copy)]
struct Page {
    dontfork: bool,
    value: u64,
}

/// One writer of `madvise` and `mremap` (besides `mmap` and `munmap`) on
/// its own read-write pages, storing a value in each page it maps and
/// checking every page's value after each call: a moved page keeps its
/// value at its new address. Returns the model.
fn advising_writer(mm: Arc<AddressSpace>, i: u64, seed: u64, rounds: u64) -> BTreeMap<u64, Page> {
    let mut rng = Rng::new(seed ^ (i + 7).wrapping_mul(0x9e37_79b9));
    let mut model: BTreeMap<u64, Page> = BTreeMap::new();
    let mut cpu = Cpu::attached(&mm);
    let at = |p: u64| base(i) + p * PAGE;
    for round in 0..rounds {
        let first = rng.below(PAGES);
        let n = 1 + rng.below((PAGES - first).min(8));
        let (a, len) = (at(first), n * PAGE);
        match rng.below(4) {
            0 => {
                let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
                assert_eq!(mm.mmap(a, len, PROT_READ | PROT_WRITE, flags, None, 0), Ok(a));
                for p in first..first + n {
                    let value = (i << 48) | (round << 8) | p;
                    cpu.write_u64(at(p), value).unwrap();
                    model.insert(p, Page { dontfork: false, value });
                }
            }
            1 => {
                mm.munmap(a, len).unwrap();
                for p in first..first + n {
                    model.remove(&p);
                }
            }
            2 => {
                let dontfork = rng.below(2) == 0;
                let r = mm.madvise(a, len, if dontfork { MADV_DONTFORK } else { MADV_DOFORK });
                // Every mapped part is advised; a hole makes it ENOMEM after.
                let mut hole = false;
                for p in first..first + n {
                    match model.get_mut(&p) {
                        Some(page) => page.dontfork = dontfork,
                        None => hole = true,
                    }
                }
                assert_eq!(r, if hole { Err(softmm::Errno::NoMem) } else { Ok(()) });
            }
            _ => {
                // One mapped page moved to another of its own pages.
                let Some(&p) = model.keys().nth(rng.below(model.len().max(1) as u64) as usize) else { continue };
                let q = (p + 1 + rng.below(PAGES - 1)) % PAGES;
                let r = mm.mremap(at(p), PAGE, PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, at(q));
                assert_eq!(r, Ok(at(q)));
                let page = model.remove(&p).unwrap();
                model.insert(q, page);
            }
        }
        for (&p, page) in &model {
            assert_eq!(cpu.read_u64(at(p)), Ok(page.value), "writer {i} page {p} round {round}");
        }
    }
    model
}

/// `madvise` and `mremap` as range writers on their own windows, beside a
/// faulter and an `mmap_lock` reader and forker: every page keeps its
/// value through the moves, the final maps equal the models, a child of
/// the final address space maps exactly the pages without `MADV_DONTFORK`,
/// nothing leaks.
#[test]
fn range_madvise_and_mremap_beside_a_faulter_and_fork() {
    range_stress("range madvise and mremap", 0x7a6f, |seed, mm, stop| {
        let faulter = spawn_faulter(mm, stop, seed, |cpu, rng| {
            let i = rng.below(WRITERS);
            let a = base(i) + rng.below(PAGES) * PAGE;
            // Unmapped at any moment, or holding its writer's value.
            if let Ok(v) = cpu.read_u64(a) {
                assert!(v == 0 || v >> 48 == i, "a value of another writer at {a:#x}: {v:#x}");
            }
        });
        let locker = spawn_locker(mm, stop);
        let rounds = scaled(1000);
        let models = run_writers(mm, move |mm, i| advising_writer(mm, i, seed, rounds));
        stop.store(true, Relaxed);
        faulter.join().unwrap();
        assert!(locker.join().unwrap() > 0);
        let pages = |mm: &AddressSpace| -> Vec<u64> {
            mm.maps().iter().flat_map(|e| (e.start..e.end).step_by(PAGE as usize)).collect()
        };
        let all = |keep: fn(&Page) -> bool| -> Vec<u64> {
            let mut v: Vec<u64> = models
                .iter()
                .enumerate()
                .flat_map(|(i, m)| m.iter().filter(|(_, pg)| keep(pg)).map(move |(&p, _)| base(i as u64) + p * PAGE))
                .collect();
            v.sort_unstable();
            v
        };
        assert_eq!(pages(mm), all(|_| true));
        let child = mm.fork().unwrap();
        assert_eq!(pages(&child), all(|pg| !pg.dontfork));
        drop(child);
        // Every call stays inside its window, away from the bounds: each
        // is a range write, or refused by an `mmap_lock` holder (the
        // locker's forks and maps, as many as the schedule makes).
        let s = mm.stats();
        let r = s.range;
        assert!(r.writes > 0 && r.writes + r.conflicts > 2 * rounds, "range writers ran: {r:?}");
    });
}

/// Pages of the file the truncate test maps, and how many a truncate keeps.
const FILE_PAGES: u64 = 32;
const KEPT_PAGES: u64 = 8;

/// The value the truncate test stores at the start of file page `p` in
/// generation `gen` (the truncates done before the store).
fn file_value(p: u64, gen: u64) -> u64 {
    (1 << 63) | (gen << 16) | p
}

/// Checks a read of file page `p` through a mapping of the truncate test
/// made `done` truncates after the start: a kept page holds its first
/// value; a page a truncate dropped holds zero (extended, not yet
/// written) or a value stored after the last truncate seen done (a page
/// an earlier generation stored would be one the truncate's zap missed);
/// past the end, SIGBUS.
fn check_file_read(r: Result<u64, softmm::Fault>, p: u64, done: u64, at: u64) {
    match r {
        Ok(v) if p < KEPT_PAGES => assert_eq!(v, file_value(p, 0), "kept page {p} at {at:#x}"),
        Ok(0) => {}
        Ok(v) => {
            assert_eq!(v & 0xffff, p, "page {p} at {at:#x} holds another page's value {v:#x}");
            assert!((v >> 16) & 0xffff_ffff >= done, "page {p} at {at:#x}: {v:#x} from before truncate {done}");
        }
        Err(softmm::Fault::Bus { .. }) => assert!(p >= KEPT_PAGES, "SIGBUS on kept page {p} at {at:#x}"),
        // Unmapped meanwhile (the faulter's reads).
        Err(softmm::Fault::Segv { .. }) => {}
        Err(e) => panic!("page {p} at {at:#x}: {e:?}"),
    }
}

/// Range writers mapping (`MAP_SHARED` and `MAP_PRIVATE`) and unmapping
/// (a range write) parts of one file in their own windows, at the
/// addresses its offsets give, beside a thread that truncates the file to
/// `KEPT_PAGES` and extends and rewrites it again, and a faulter reading
/// across the windows: every read gives the page's value of a generation
/// no truncate has dropped yet, zero, or SIGBUS past the end (Linux's
/// results for a truncate racing `mmap`/`munmap`); nothing leaks.
///
/// Its reads fault beside the truncates: it found the deadlock of a
/// truncate parked for `mmap_lock` behind a writer while a fault holding
/// it for read waited for the truncate's `invalidate_lock` (under every
/// writer policy; `AddressSpace::read_lock_recursive` now retries a parked
/// wait).
#[test]
fn range_munmaps_of_a_file_beside_truncate_and_a_faulter() {
    use std::sync::atomic::AtomicU64;
    range_stress("range file munmaps beside truncate", 0x7a70, |seed, mm, stop| {
        let file = softmm::File::create(mm.phys(), "f", FILE_PAGES * PAGE).unwrap();
        for p in 0..FILE_PAGES {
            file.write_at(p * PAGE, &file_value(p, 0).to_le_bytes()).unwrap();
        }
        let open = Arc::new(softmm::OpenFile::new(&file, true, true));
        // Truncates done: a read that starts after `done` of them must not
        // see what an earlier generation stored in a dropped page.
        let done = Arc::new(AtomicU64::new(0));
        let truncator = {
            let (file, done, stop) = (file.clone(), done.clone(), stop.clone());
            spawn("truncator".into(), move || {
                let mut gen = 0;
                while !stop.load(Relaxed) {
                    file.set_len(KEPT_PAGES * PAGE).unwrap();
                    gen += 1;
                    done.store(gen, std::sync::atomic::Ordering::SeqCst);
                    file.set_len(FILE_PAGES * PAGE).unwrap();
                    for p in KEPT_PAGES..FILE_PAGES {
                        file.write_at(p * PAGE, &file_value(p, gen).to_le_bytes()).unwrap();
                    }
                }
                gen
            })
        };
        let faulter = {
            let done = done.clone();
            spawn_faulter(mm, stop, seed, move |cpu, rng| {
                let (i, p) = (rng.below(WRITERS), rng.below(FILE_PAGES));
                let at = base(i) + p * PAGE;
                let d = done.load(std::sync::atomic::Ordering::SeqCst);
                check_file_read(cpu.read_u64(at), p, d, at);
            })
        };
        let rounds = scaled(1500);
        let writer = {
            let (open, done) = (open.clone(), done.clone());
            move |mm: Arc<AddressSpace>, i: u64| {
                let mut rng = Rng::new(seed ^ (i + 11).wrapping_mul(0x9e37_79b9));
                let mut cpu = Cpu::attached(&mm);
                let mut mapped = [false; FILE_PAGES as usize];
                for _ in 0..rounds {
                    let first = rng.below(FILE_PAGES);
                    let n = 1 + rng.below((FILE_PAGES - first).min(8));
                    let (a, len) = (base(i) + first * PAGE, n * PAGE);
                    if rng.below(2) == 0 {
                        let flags = if rng.below(2) == 0 { MAP_SHARED } else { MAP_PRIVATE };
                        let r = mm.mmap(a, len, PROT_READ, flags | MAP_FIXED, Some(&open), first * PAGE);
                        assert_eq!(r, Ok(a));
                        mapped[first as usize..(first + n) as usize].fill(true);
                    } else {
                        mm.munmap(a, len).unwrap();
                        mapped[first as usize..(first + n) as usize].fill(false);
                    }
                    for p in (0..FILE_PAGES).filter(|&p| mapped[p as usize]) {
                        let at = base(i) + p * PAGE;
                        let d = done.load(std::sync::atomic::Ordering::SeqCst);
                        let r = cpu.read_u64(at);
                        assert!(!matches!(r, Err(softmm::Fault::Segv { .. })), "page {p} mapped at {at:#x}");
                        check_file_read(r, p, d, at);
                    }
                }
            }
        };
        run_writers(mm, writer);
        stop.store(true, Relaxed);
        faulter.join().unwrap();
        assert!(truncator.join().unwrap() > 0);
        let s = mm.stats();
        assert!(s.range.writes > 0, "range writers ran: {:?}", s.range);
        drop((open, file));
    });
}
