//! The cost of a big reservation's life: `mmap` of a `PROT_NONE` range,
//! an `mprotect` of its first page (one split) and its `munmap`, for
//! ranges of 64 GiB, 1 TiB and 16 TiB. The VMA set stores each VMA once,
//! in the 1 GiB window of its start, so the three cost the same whatever
//! the size (a first design entered a VMA in every window it covers:
//! 415 us, 4.85 ms and 75 ms). Run it in a release build:
//! `cargo run --release -p softmm --example big_vma`.

use std::time::Instant;

use softmm::uapi::*;
use softmm::{AddressSpace, MmConfig, PhysConfig, PhysMem, PAGE_SIZE};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let phys = PhysMem::new(PhysConfig::new(16 << 20))?;
    let mm = AddressSpace::new(&phys, MmConfig::default())?;
    let rounds = 2000;
    for (name, len) in [("64 GiB", 64u64 << 30), ("1 TiB", 1 << 40), ("16 TiB", 16 << 40)] {
        let t = Instant::now();
        for _ in 0..rounds {
            let a = mm.mmap(0, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, None, 0)?;
            mm.mprotect(a, PAGE_SIZE, PROT_READ | PROT_WRITE)?;
            mm.munmap(a, len)?;
        }
        let per = t.elapsed().as_secs_f64() / f64::from(rounds) * 1e6;
        println!("{name:>7} PROT_NONE: mmap + mprotect (one split) + munmap: {per:.2} us");
    }
    Ok(())
}
