//! Micro-benchmarks of the MMU paths: a TLB hit (against a native load in
//! the same run), a page fault per policy, and an mmap/munmap pair.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use softmm::uapi::*;
use softmm::{Access, AddressSpace, Cpu, FaultPolicy, MmConfig, PhysConfig, PhysMem};

const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const RW: i32 = PROT_READ | PROT_WRITE;
/// Accesses per section in the section benches (a short basic block).
const BLOCK: usize = 16;

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
    // accesses), each access paying the generation check and the TLB
    // lookup only. Compared with 16 native loads measured alike; divide
    // both by 16 for the per-access cost.
    c.bench_function("native_load_x16", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for _ in 0..BLOCK {
                sum = sum.wrapping_add(std::hint::black_box(&*native).load(std::sync::atomic::Ordering::Relaxed));
            }
            sum
        })
    });
    c.bench_function("section_read_u64_hit_x16", |b| {
        b.iter(|| {
            let mut s = cpu.section();
            let mut sum = 0u64;
            for _ in 0..BLOCK {
                sum = sum.wrapping_add(s.read_u64(std::hint::black_box(a + 8)).unwrap());
            }
            sum
        })
    });
    c.bench_function("section_read_u32_hit_x16", |b| {
        b.iter(|| {
            let mut s = cpu.section();
            let mut sum = 0u32;
            for _ in 0..BLOCK {
                sum = sum.wrapping_add(s.read_u32(std::hint::black_box(a + 8)).unwrap());
            }
            sum
        })
    });
    c.bench_function("section_fetch_u32_hit_x16", |b| {
        b.iter(|| {
            let mut s = cpu.section();
            let mut sum = 0u32;
            for _ in 0..BLOCK {
                sum = sum.wrapping_add(s.fetch_u32(std::hint::black_box(x + 8)).unwrap());
            }
            sum
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
}

criterion_group!(benches, translate_hit, fault, mmap_munmap);
criterion_main!(benches);
