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

/// N writers on their own windows, a faulter across them and an
/// `mmap_lock` reader and forker: the final maps equal the writers' models,
/// the published set equals `mmap_lock`'s, nothing leaks.
#[test]
fn range_writers_on_their_own_windows_beside_a_faulter_and_fork() {
    let seed = stress_seed(0x7a6e);
    eprintln!("STRESS_SEED={seed}");
    watchdog("range writers", 120, move || {
        let phys = phys(8);
        let mm = AddressSpace::new(&phys, MmConfig::default().writer_policy(WriterPolicy::Range)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let faulter = {
            let (mm, stop) = (mm.clone(), stop.clone());
            spawn("faulter".into(), move || {
                let mut rng = Rng::new(seed);
                let mut cpu = Cpu::attached(&mm);
                let mut ok = 0u64;
                while !stop.load(Relaxed) {
                    let a = base(rng.below(WRITERS)) + rng.below(PAGES) * PAGE + 8 * rng.below(512);
                    // Any outcome but a wrong value: the page may be unmapped,
                    // read-only or PROT_NONE at any moment.
                    ok += u64::from(cpu.read_u64(a).is_ok());
                }
                ok
            })
        };
        let locker = {
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
        };
        let rounds = scaled(1500);
        let writers: Vec<_> = (0..WRITERS)
            .map(|i| {
                let mm = mm.clone();
                spawn(format!("writer {i}"), move || writer(mm, i, seed, rounds))
            })
            .collect();
        let models = join_all(writers);
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
        drop(mm);
        assert_no_leaks(&phys);
    });
}
