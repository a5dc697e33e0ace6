//! A loader and a debugger on softmm: map a real host file (this program's
//! own executable, or the file named on the command line) as an ELF loader
//! maps its text, read it through a CPU, plant a breakpoint in the
//! read-only text with a forced write (what `PTRACE_POKEDATA` does), and
//! show that the guest sees it, cannot write the text itself, and that the
//! file is untouched.
//!
//! `cargo run --release -p softmm --example loader [FILE]`

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, MmConfig, OpenFile, PhysConfig, PhysMem, PAGE_SIZE};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args_os().nth(1) {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::current_exe()?,
    };
    // Memory on demand: the arena costs the host only what the guest uses.
    let phys = PhysMem::new(PhysConfig::new(256 << 20).on_demand(true))?;
    let mm = AddressSpace::new(&phys, MmConfig::default())?;
    let elf = OpenFile::from_host(&phys, std::fs::File::open(&path)?, &path.to_string_lossy())?;
    let len = elf.file.len().div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let text = mm.mmap(0, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, Some(&elf), 0)?;
    let mut cpu = Cpu::attached(&mm);
    let magic = cpu.fetch_u32(text)?;
    println!("{} mapped at {text:#x}: first word {magic:#010x}", path.display());

    let bp = text + 0x40;
    let mut saved = [0u8; 1];
    mm.access_remote_read(bp, &mut saved, true);
    println!("without FOLL_FORCE: {} bytes written", mm.access_remote_write(bp, &[0xcc], false));
    println!("with FOLL_FORCE:    {} bytes written", mm.access_remote_write(bp, &[0xcc], true));
    println!("the guest fetches {:#04x} (was {:#04x})", cpu.fetch_le::<u8>(bp)?, saved[0]);
    println!("a guest store into the text: {:?}", cpu.write_u8(bp, 0).unwrap_err());
    let on_disk = std::fs::read(&path)?[0x40];
    println!("the file still has {on_disk:#04x}");
    println!("{}", mm.maps_text());
    println!("host memory used by the arena: {} KiB", phys.host_resident_bytes() >> 10);
    Ok(())
}
