//! Micro-benchmarks of the MMU paths: a TLB hit (against a native load in
//! the same run), a page fault per policy, and an mmap/munmap pair.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use softmm::uapi::*;
use softmm::{
    Access, AddressSpace, AtomicAlignment, Cpu, FaultPolicy, MmConfig, MmioDevice, PhysConfig, PhysMem,
    ShootdownTargets, WatchMode,
};

const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const RW: i32 = PROT_READ | PROT_WRITE;
/// Accesses per section in the section benches (a short basic block).
const BLOCK: usize = 16;

/// Runs `$body` with `$i` bound to `0`, `1`, … `15` ([`BLOCK`] times), in
/// straight-line code: what an emulator's JIT emits for a block of 16
/// accesses, with no loop counter to add and compare per access. The
/// compiler unrolls the native loop of 16 loads by itself, but not a loop
/// of section accesses (the out-of-line miss call makes the body too big
/// for its unroll budget), so the loop form pays two instructions per
/// access that neither the native side nor QEMU's inline hit has.
macro_rules! unroll16 {
    ($i:ident => $body:expr) => {
        unroll16!(@ $i => $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $i:ident => $body:expr; $($n:literal)*) => {
        $({
            let $i: usize = $n;
            $body;
        })*
    };
}

fn translate_hit(c: &mut Criterion) {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, 4096, RW, ANON, None, 0).unwrap();
    let x = mm.mmap(0, 4096, PROT_READ | PROT_EXEC, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(a, 1).unwrap();
    cpu.fetch_u32(x).unwrap();
    // The yardstick: one relaxed 8-byte load from host memory, through a
    // pointer the compiler cannot see through. It and the hits below are
    // measured alike: the input goes through `black_box` (the pointer here,
    // the guest address there), criterion black-boxes the result, and no
    // iteration depends on the one before, so all are throughput figures
    // of one cached location and their ratio compares like with like.
    let native = Box::new(std::sync::atomic::AtomicU64::new(1));
    c.bench_function("native_load", |b| {
        b.iter(|| std::hint::black_box(&*native).load(std::sync::atomic::Ordering::Relaxed))
    });
    // The translation alone: open and close an access section around a hit.
    c.bench_function("translate_hit", |b| {
        b.iter(|| cpu.translate(std::hint::black_box(a + 8), Access::Write).unwrap().as_ptr())
    });
    c.bench_function("read_u64_hit", |b| b.iter(|| cpu.read_u64(std::hint::black_box(a + 8)).unwrap()));
    c.bench_function("read_u32_hit", |b| b.iter(|| cpu.read_u32(std::hint::black_box(a + 8)).unwrap()));
    c.bench_function("read_u32_unaligned_hit", |b| b.iter(|| cpu.read_u32(std::hint::black_box(a + 13)).unwrap()));
    // What an emulator runs: one access section per basic block (here 16
    // accesses), each access paying the TLB lookup only. Compared with 16
    // native loads measured alike: both read their 16 addresses from an
    // array (one location in each of 16 pages) that goes through
    // `black_box` once per iteration, as an emulator's guest registers
    // are loads from its CPU state, so neither pays a black-box per access.
    // Divide by 16 for the per-access cost. These are throughput figures:
    // no access depends on another. The location in page `i` is at byte
    // `256 i + 8`, so that the 16 lines fall in 16 different sets of the L1
    // cache (at one offset they would share one set, more lines than it
    // has ways, and every access would miss it).
    let host_pages: Vec<std::sync::atomic::AtomicU64> =
        (0..BLOCK * 512).map(|_| std::sync::atomic::AtomicU64::new(1)).collect();
    let host: [&std::sync::atomic::AtomicU64; BLOCK] = std::array::from_fn(|i| &host_pages[i * 512 + i * 32 + 1]);
    let g = mm.mmap(0, BLOCK as u64 * 4096, RW, ANON, None, 0).unwrap();
    let gx = mm.mmap(0, BLOCK as u64 * 4096, PROT_READ | PROT_EXEC, ANON, None, 0).unwrap();
    let guest: [u64; BLOCK] = std::array::from_fn(|i| g + i as u64 * (4096 + 256) + 8);
    let guest_x: [u64; BLOCK] = std::array::from_fn(|i| gx + i as u64 * (4096 + 256) + 8);
    for (&a, &x) in guest.iter().zip(&guest_x) {
        cpu.write_u64(a, 1).unwrap();
        cpu.fetch_u32(x).unwrap();
    }
    // Both sides straight-line (`unroll16!`), as a JIT's block is.
    c.bench_function("native_load_x16", |b| {
        b.iter(|| {
            let host = std::hint::black_box(&host);
            let mut sum = 0u64;
            unroll16!(i => sum = sum.wrapping_add(host[i].load(std::sync::atomic::Ordering::Relaxed)));
            sum
        })
    });
    c.bench_function("section_read_u64_hit_x16", |b| {
        b.iter(|| {
            let guest = std::hint::black_box(&guest);
            let mut s = cpu.section();
            let mut sum = 0u64;
            unroll16!(i => sum = sum.wrapping_add(s.read_u64(guest[i]).unwrap()));
            sum
        })
    });
    // The same as a loop, which the compiler does not unroll: the loop's
    // add and compare per access, for comparison in the same run.
    c.bench_function("section_read_u64_hit_x16_loop", |b| {
        b.iter(|| {
            let mut s = cpu.section();
            let mut sum = 0u64;
            for &a in std::hint::black_box(&guest) {
                sum = sum.wrapping_add(s.read_u64(a).unwrap());
            }
            sum
        })
    });
    c.bench_function("section_read_u32_hit_x16", |b| {
        b.iter(|| {
            let guest = std::hint::black_box(&guest);
            let mut s = cpu.section();
            let mut sum = 0u32;
            unroll16!(i => sum = sum.wrapping_add(s.read_u32(guest[i]).unwrap()));
            sum
        })
    });
    c.bench_function("section_fetch_u32_hit_x16", |b| {
        b.iter(|| {
            let guest_x = std::hint::black_box(&guest_x);
            let mut s = cpu.section();
            let mut sum = 0u32;
            unroll16!(i => sum = sum.wrapping_add(s.fetch_u32(guest_x[i]).unwrap()));
            sum
        })
    });
    // Latency: a chain of 16 dependent loads, each value the address of
    // the next (a guest walking a linked list, an interpreter following
    // its own pointers), through the same 16 locations in a scattered
    // order; native and guest memory hold the same chain, host pointers in
    // one, guest addresses in the other. Each iteration goes on from where
    // the one before stopped (the chain is a cycle), so iterations cannot
    // overlap either: the time is 16 load latencies, plus the section's
    // entry and exit for the guest. Divide by 16 for one access.
    let order: [usize; BLOCK] = std::array::from_fn(|i| (i * 7) % BLOCK);
    for k in 0..BLOCK {
        let (from, to) = (order[k], order[(k + 1) % BLOCK]);
        host[from].store(host[to] as *const _ as u64, std::sync::atomic::Ordering::Relaxed);
        cpu.write_u64(guest[from], guest[to]).unwrap();
    }
    let mut p = std::hint::black_box(host[order[0]] as *const std::sync::atomic::AtomicU64);
    c.bench_function("native_load_chain", |b| {
        b.iter(|| {
            for _ in 0..BLOCK {
                // SAFETY: every link of the chain is one of `host`'s
                // atomics, which outlive the benchmark.
                p = unsafe { &*p }.load(std::sync::atomic::Ordering::Relaxed) as *const std::sync::atomic::AtomicU64;
            }
            p
        })
    });
    let mut a = std::hint::black_box(guest[order[0]]);
    c.bench_function("section_read_u64_chain", |b| {
        b.iter(|| {
            let mut s = cpu.section();
            for _ in 0..BLOCK {
                a = s.read_u64(a).unwrap();
            }
            a
        })
    });
    // What read_u32 did before the typed accessors: a 4-byte range copy.
    c.bench_function("read_4_bytes_hit", |b| {
        b.iter(|| {
            let mut v = [0; 4];
            cpu.read(std::hint::black_box(a + 8), &mut v).unwrap();
            u32::from_le_bytes(v)
        })
    });
}

fn fault(c: &mut Criterion) {
    const PAGES: u64 = 256;
    for &policy in FaultPolicy::ALL {
        let phys = PhysMem::new(PhysConfig::new(8 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default().policy(policy).force_speculative(true)).unwrap();
        let mut cpu = Cpu::attached(&mm);
        let a = mm.mmap(0, PAGES * 4096, RW, ANON, None, 0).unwrap();
        // Keep the page tables and the anon_vma: the measured fault is the steady-state one.
        cpu.write_u8(a, 1).unwrap();
        c.bench_function(&format!("anon_write_fault/{}", policy.name()), |b| {
            b.iter_batched(
                || mm.madvise(a, PAGES * 4096, MADV_DONTNEED).unwrap(),
                |()| {
                    for p in 0..PAGES {
                        cpu.write_u8(a + p * 4096, 1).unwrap();
                    }
                },
                BatchSize::PerIteration,
            )
        });
    }
}

fn mmap_munmap(c: &mut Criterion) {
    let phys = PhysMem::new(PhysConfig::new(4 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    c.bench_function("mmap_munmap_64k", |b| {
        b.iter(|| {
            let a = mm.mmap(0, 64 << 10, RW, ANON, None, 0).unwrap();
            mm.munmap(a, 64 << 10).unwrap();
        })
    });
    // The same with a CPU of the calling thread attached: every call marks
    // it quiescent for its length, and gives the mark back at its end.
    let mut cpu = Cpu::new();
    cpu.attach(&mm);
    c.bench_function("mmap_munmap_64k_cpu_attached", |b| {
        b.iter(|| {
            let a = mm.mmap(0, 64 << 10, RW, ANON, None, 0).unwrap();
            mm.munmap(a, 64 << 10).unwrap();
        })
    });
    drop(cpu);
}

/// The cost of atomics by alignment under each `AtomicAlignment` (the
/// aligned one is the same code under both), and of an MMIO register load
/// against a RAM hit, single-threaded.
fn atomics_and_mmio(c: &mut Criterion) {
    struct Reg;
    impl MmioDevice for Reg {
        fn read(&self, offset: u64, _size: usize) -> u64 {
            offset
        }
        fn write(&self, _offset: u64, _size: usize, _value: u64) {}
    }
    for &policy in AtomicAlignment::ALL {
        let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default().atomic_alignment(policy)).unwrap();
        let a = mm.mmap(0, 2 * 4096, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(a, 1).unwrap();
        cpu.write_u8(a + 4096, 1).unwrap();
        let sc = std::sync::atomic::Ordering::SeqCst;
        let name = policy.name();
        c.bench_function(&format!("fetch_add_u32_aligned/{name}"), |b| {
            b.iter(|| cpu.atomic_fetch_add::<u32>(std::hint::black_box(a + 8), 1, sc))
        });
        if policy == AtomicAlignment::Split {
            for (what, at) in [("in_word", a + 9), ("across_words", a + 6), ("across_pages", a + 4094)] {
                c.bench_function(&format!("fetch_add_u32_{what}/{name}"), |b| {
                    b.iter(|| cpu.atomic_fetch_add::<u32>(std::hint::black_box(at), 1, sc).unwrap())
                });
            }
        }
    }
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let io = mm.mmap_io(0, 4096, RW, MAP_SHARED, std::sync::Arc::new(Reg)).unwrap();
    let mut cpu = Cpu::attached(&mm);
    c.bench_function("mmio_read_u32", |b| b.iter(|| cpu.read_u32(std::hint::black_box(io + 8)).unwrap()));
}

/// Arming and removing a write watch on a page no other CPU touched,
/// while another thread's CPU keeps loading from another page, under each
/// shootdown-target policy: `broadcast` sends it a request (and waits for
/// its section) on every arm, the fill-owner policies only run their
/// barrier.
fn watch_arm(c: &mut Criterion) {
    use std::sync::atomic::{AtomicBool, Ordering};
    for &targets in ShootdownTargets::ALL {
        let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default().shootdown_targets(targets)).unwrap();
        let a = mm.mmap(0, 2 * 4096, RW, ANON, None, 0).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (mm2, stop) = (&mm, &stop);
            s.spawn(move || {
                let mut cpu = Cpu::attached(mm2);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        std::hint::black_box(cpu.read_u64(a + 4096).unwrap());
                    }
                }
            });
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u8(a, 1).unwrap();
            c.bench_function(&format!("write_watch_arm/{}", targets.name()), |b| {
                b.iter(|| {
                    mm.write_watch(a, 4096, WatchMode::Notify).unwrap();
                    mm.write_unwatch(a, 4096, WatchMode::Notify).unwrap();
                })
            });
            stop.store(true, Ordering::Relaxed);
        });
    }
}

/// The other side of `watch_arm`: a CPU's loads from its 64-page working
/// set (one `read_u64` per page) while another thread arms and removes a
/// write watch on a page this CPU never touches, over and over, under each
/// shootdown-target policy. Under `broadcast` every arm sends this CPU a
/// request (its TLB is emptied, and a CPU shot down often fences its own
/// sections); under the fill-owner policies it gets none, only the arm's
/// `membarrier`.
fn hit_during_watch_arms(c: &mut Criterion) {
    use std::sync::atomic::{AtomicBool, Ordering};
    for &targets in ShootdownTargets::ALL {
        let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::default().shootdown_targets(targets)).unwrap();
        let a = mm.mmap(0, 65 * 4096, RW, ANON, None, 0).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (mm2, stop) = (&mm, &stop);
            s.spawn(move || {
                let mut cpu = Cpu::attached(mm2);
                cpu.write_u8(a, 1).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    mm2.write_watch(a, 4096, WatchMode::Notify).unwrap();
                    mm2.write_unwatch(a, 4096, WatchMode::Notify).unwrap();
                }
            });
            let mut cpu = Cpu::attached(&mm);
            let pages = (1..65).map(|i| a + i * 4096);
            pages.clone().for_each(|p| cpu.write_u8(p, 1).unwrap());
            c.bench_function(&format!("read_64_pages_during_watch_arms/{}", targets.name()), |b| {
                b.iter(|| pages.clone().map(|p| cpu.read_u64(std::hint::black_box(p + 8)).unwrap()).sum::<u64>())
            });
            stop.store(true, Ordering::Relaxed);
        });
    }
}

criterion_group!(benches, translate_hit, fault, mmap_munmap, atomics_and_mmio, watch_arm, hit_during_watch_arms);
criterion_main!(benches);
