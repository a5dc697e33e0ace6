//! CVE-2016-5195 ("Dirty COW") as the race it was: forced writes (a
//! debugger's, `/proc/pid/mem`'s: `FOLL_FORCE | FOLL_WRITE`) into a private
//! read-only mapping of a file while another thread drops the page with
//! `MADV_DONTNEED` and a third reads it through its TLB. Each forced write
//! must break COW into a private copy; none may reach the file's page
//! cache, whichever order the COW break, the zap and its shootdown, and the
//! write's retry take. Run under every fault policy and every covering
//! shootdown configuration (`Shootdown::COVERING`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, FaultPolicy, File, MmConfig, OpenFile};
use softmm_testkit::common::*;

const ORIGINAL: u8 = b'A';
const EVIL: u8 = b'X';

#[test]
fn forced_writes_racing_dontneed_never_reach_the_file() {
    for (policy, shootdown) in fault_and_shootdown_policies() {
        let name = format!("dirty-cow[{}, {}]", policy.name(), shootdown.name());
        watchdog(&name, 60, move || dirty_cow(policy, shootdown));
    }
}

fn dirty_cow(policy: FaultPolicy, shootdown: Shootdown) {
    let p = phys(16);
    let file = File::create(&p, "/dirty-cow", 2 * PAGE).unwrap();
    assert_eq!(file.write_at(0, &[ORIGINAL; 2 * PAGE as usize]), Ok(2 * PAGE as usize));
    let mm = mm_with_shootdown(&p, policy, shootdown);
    let ro = OpenFile::read_only(&file);
    let a = mm.mmap(0, 2 * PAGE, PROT_READ, MAP_PRIVATE, Some(&ro), 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writes = scaled(100_000);
    std::thread::scope(|s| {
        let (mm, stop) = (&mm, &stop);
        s.spawn(move || {
            for i in 0..writes {
                // Both pages, and a write that crosses from one to the other.
                let at = a + [16, PAGE + 16, PAGE - 8][(i % 3) as usize];
                assert_eq!(mm.access_remote_write(at, &[EVIL; 16], true), 16);
            }
            stop.store(true, Relaxed);
        });
        s.spawn(move || {
            while !stop.load(Relaxed) {
                mm.madvise(a, 2 * PAGE, MADV_DONTNEED).unwrap();
                std::thread::yield_now();
            }
        });
        s.spawn(move || {
            let mut cpu = Cpu::attached(mm);
            while !stop.load(Relaxed) {
                for at in [a, a + PAGE + 16, a + PAGE - 8] {
                    let v = cpu.read_u8(at).unwrap();
                    assert!(v == ORIGINAL || v == EVIL, "{v:#x}");
                }
            }
        });
    });
    // The file holds what it held, through its page cache (read) and
    // through a shared mapping of another address space.
    let mut back = vec![0u8; 2 * PAGE as usize];
    assert_eq!(file.read_at(0, &mut back), Ok(2 * PAGE as usize));
    assert!(back.iter().all(|&b| b == ORIGINAL), "a forced write reached the page cache");
    let other = AddressSpace::new(&p, MmConfig::default()).unwrap();
    let shared = other.mmap(0, 2 * PAGE, PROT_READ, MAP_SHARED, Some(&ro), 0).unwrap();
    let mut cpu = Cpu::attached(&other);
    for off in (0..2 * PAGE).step_by(8) {
        assert_eq!(cpu.read_u64(shared + off).unwrap(), u64::from_ne_bytes([ORIGINAL; 8]), "at {off}");
    }
    drop(cpu);
    drop((mm, other, ro, file));
    assert_no_leaks(&p);
}
