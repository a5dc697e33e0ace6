//! A tour of softmm: map memory, fork, fault from two threads, print the maps
//! and the counters.

use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let phys = PhysMem::new(PhysConfig::new(64 << 20))?;
    let mm = AddressSpace::new(&phys, MmConfig::default())?;
    let len = 8 << 20;
    let heap = mm.mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0)?;
    let file = File::create(&phys, "/data/table.bin", 1 << 20)?;
    file.write_at(0, b"softmm")?;
    let shared = mm.mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&OpenFile::read_write(&file)), 0)?;

    // Two threads fault the heap in, each its own half, through their own CPU.
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let mm = Arc::clone(&mm);
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                let half = len / 2;
                for off in (0..half).step_by(4096) {
                    cpu.write_u64(heap + t * half + off, (t + 1) << 32 | off).expect("write");
                }
                cpu.stats()
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        println!("thread {t}: {:?}", h.join().expect("thread"));
    }

    let child = mm.fork()?;
    let mut cpu = Cpu::attached(&child);
    cpu.write_u64(heap, 0xc0ffee)?; // COW: the parent keeps its value
    let mut name = [0u8; 6];
    cpu.read(shared, &mut name)?;
    println!("child reads the shared file: {:?}", std::str::from_utf8(&name)?);
    let mut parent_cpu = Cpu::attached(&mm);
    println!("parent heap[0] = {:#x}, child heap[0] = {:#x}", parent_cpu.read_u64(heap)?, cpu.read_u64(heap)?);

    println!("\nparent maps:\n{}", mm.maps_text());
    println!("parent: {:?}", mm.stats());
    println!("child:  {:?}", child.stats());
    drop((cpu, parent_cpu, child, mm, file));
    println!("after teardown: {:?}", phys.quiesce());
    Ok(())
}
