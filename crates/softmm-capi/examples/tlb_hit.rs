//! The Rust accessor's half of `scripts/bench-c-tlb.sh`: the loops of
//! `benches/c_tlb.c` (16 independent guest loads per block, a section per
//! block or one held open, best of 7 runs of 2M blocks), through
//! `Section::read_u64`, beside a native load measured the same way in
//! this process. Not a test: it prints figures.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem};

const BLOCK: usize = 16;
const ITERS: u32 = 2_000_000;
const REPEATS: usize = 7;
const PAGE: u64 = 4096;

/// The best time of [`REPEATS`] runs of `f` over [`ITERS`] blocks, in ns
/// per block.
fn best(mut f: impl FnMut()) -> f64 {
    (0..REPEATS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / f64::from(ITERS)
        })
        .fold(f64::INFINITY, f64::min)
}

fn row(name: &str, block: f64) {
    println!("rust   {name:<22} {block:8.2} ns/block {:7.3} ns/access", block / BLOCK as f64);
}

fn main() {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let g =
        mm.mmap(0, BLOCK as u64 * (PAGE + 256) + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0);
    let g = g.unwrap();
    let host_pages: Vec<AtomicU64> = (0..BLOCK * 512).map(|_| AtomicU64::new(1)).collect();
    let host: [&AtomicU64; BLOCK] = std::array::from_fn(|i| &host_pages[(i * (PAGE as usize + 256) + 8) / 8]);
    let guest: [u64; BLOCK] = std::array::from_fn(|i| g + i as u64 * (PAGE + 256) + 8);
    let mut cpu = Cpu::attached(&mm);
    guest.iter().for_each(|&a| cpu.write_u64(a, 1).unwrap());
    let native = best(|| {
        for _ in 0..ITERS {
            let sum = black_box(&host).iter().fold(0u64, |s, p| s.wrapping_add(p.load(Relaxed)));
            black_box(sum);
        }
    });
    row("native", native);
    let per_block = best(|| {
        for _ in 0..ITERS {
            let mut s = cpu.section();
            let sum = black_box(&guest).iter().fold(0u64, |sum, &a| sum.wrapping_add(s.read_u64(a).unwrap()));
            black_box(sum);
        }
    });
    row("accessor section/block", per_block);
    let open = best(|| {
        let mut s = cpu.section();
        for _ in 0..ITERS {
            let sum = black_box(&guest).iter().fold(0u64, |sum, &a| sum.wrapping_add(s.read_u64(a).unwrap()));
            black_box(sum);
        }
    });
    row("accessor open", open);
    println!(
        "rust   accessor open / native {:.2}x; accessor section/block / native {:.2}x",
        open / native,
        per_block / native
    );
}
