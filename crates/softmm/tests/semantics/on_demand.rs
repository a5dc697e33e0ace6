//! Memory on demand (`PhysConfig::on_demand`): a large arena costs the host
//! little until its frames are used, and freed frames go back to the host.
//! It measures the process's RSS, which every other test of this binary
//! moves while it runs (their arenas are prefaulted: 1 failure in 3 runs of
//! the whole binary, the process 10 MiB larger), so it is ignored there and
//! scripts/test.sh runs it by itself (`--ignored`, its own process). (The
//! semantics are the same as a prefaulted arena's:
//! `SOFTMM_ON_DEMAND=1` runs the other test binaries on such arenas, see
//! scripts/test.sh.)

use softmm_testkit::common;

use common::{assert_no_leaks, ANON, PAGE, RW};
use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem};

const MIB: u64 = 1 << 20;

/// The process's resident set in bytes (`/proc/self/statm`, second field).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * PAGE
}

#[test]
#[ignore = "measures the process's RSS: scripts/test.sh runs it alone (--ignored)"]
fn an_on_demand_arena_costs_what_it_uses() {
    let before = rss();
    let phys = PhysMem::new(PhysConfig::new(1024 * MIB).on_demand(true)).unwrap();
    // Reserved: no frame is resident, and the process grew by the free
    // lists (8 bytes a frame: 2 MiB), not by the arena or the 8 MiB of
    // descriptors.
    assert_eq!(phys.host_resident_bytes(), 0);
    let grown = rss().saturating_sub(before);
    eprintln!("1 GiB arena on demand: process RSS +{} KiB, arena resident 0 KiB", grown >> 10);
    assert!(grown < 6 * MIB, "a 1 GiB arena on demand made the process {grown} bytes larger");

    // Used: 32 MiB of guest memory is backed.
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let len = 32 * MIB;
    let a = mm.mmap(0, len, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    for p in (a..a + len).step_by(PAGE as usize) {
        cpu.write_u64(p, p).unwrap();
    }
    let used = phys.host_resident_bytes();
    eprintln!("after 32 MiB of guest writes: arena resident {} KiB", used >> 10);
    assert!((len..len + 4 * MIB).contains(&used), "{used} bytes resident for 32 MiB used");
    for p in (a..a + len).step_by(PAGE as usize * 97) {
        assert_eq!(cpu.read_u64(p).unwrap(), p);
    }

    // Freed: given back, but for what this thread's frame cache holds.
    mm.munmap(a, len).unwrap();
    let left = phys.host_resident_bytes();
    eprintln!("after the unmap: arena resident {} KiB", left >> 10);
    assert!(left < 2 * MIB, "{left} bytes still resident after the unmap");

    // Used again: the frames come back zeroed.
    let b = mm.mmap(0, len, RW, ANON, None, 0).unwrap();
    for p in (b..b + len).step_by(PAGE as usize * 31) {
        assert_eq!(cpu.read_u64(p).unwrap(), 0);
        cpu.write_u64(p, 1).unwrap();
    }
    drop((cpu, mm));
    assert_no_leaks(&phys);

    drop(phys);

    // A prefaulted arena (the default) is resident from the start.
    let before = rss();
    let pre = PhysMem::new(PhysConfig::new(64 * MIB)).unwrap();
    let grown = rss().saturating_sub(before);
    eprintln!("64 MiB arena prefaulted: process RSS +{} KiB", grown >> 10);
    assert_eq!(pre.host_resident_bytes(), 64 * MIB);
    assert!(grown >= 64 * MIB, "{grown}");
}
