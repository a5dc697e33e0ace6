//! Forced access (`AddressSpace::access_remote_read`/`_write`, Linux's
//! `access_remote_vm` with and without `FOLL_FORCE`): its rules on softmm
//! alone, and the same layout run against the host kernel through
//! `/proc/<child>/mem` (`FOLL_FORCE`) and `process_vm_readv`/`writev`
//! (no `FOLL_FORCE`) on a forked child.

use softmm_testkit::common;

use std::sync::Arc;

use common::{assert_no_leaks, phys, ANON, PAGE, RW};
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Fault, File, MmConfig, OpenFile, SegvCode};

fn mm(phys: &Arc<softmm::PhysMem>) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default()).unwrap()
}

mod rules;

/// The host side: a forked child lays out the same mappings and waits; the
/// parent reads and writes them through `/proc/<pid>/mem` and
/// `process_vm_readv`/`writev`, then the child reports what it sees.
mod host;

/// The same layout and ops on softmm, with `/proc/pid/mem`'s and
/// `process_vm_*`'s errno for nothing done (`EIO`, `EFAULT`).
fn run_on_softmm() -> host::Trace {
    use host::*;
    let phys = phys(8);
    let file = File::create(&phys, "memfd", FILE_PAGES * PAGE).unwrap();
    let content: Vec<u8> = (0..FILE_PAGES * PAGE).map(file_byte).collect();
    file.write_at(0, &content).unwrap();
    let (rw, ro) = (OpenFile::read_write(&file), OpenFile::read_only(&file));
    let mm = mm(&phys);
    let n = REGIONS.len() as u64;
    let base = mm.mmap(0, n * PAGE, PROT_NONE, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    for (i, r) in REGIONS.iter().enumerate() {
        let at = base + i as u64 * PAGE;
        let Some((prot, flags, f, page, filled)) = layout(*r) else {
            mm.munmap(at, PAGE).unwrap();
            continue;
        };
        let of = f.map(|w| if w { &rw } else { &ro });
        let first = if filled { RW } else { prot };
        assert_eq!(mm.mmap(at, PAGE, first, flags | MAP_FIXED, of, page * PAGE), Ok(at));
        if filled {
            cpu.write(at, &[fill(i); PAGE as usize]).unwrap();
            mm.mprotect(at, PAGE, prot).unwrap();
        }
    }
    let outcomes = ops()
        .iter()
        .map(|op| {
            let addr = base + op.at;
            let nothing = if op.force { libc::EIO } else { libc::EFAULT };
            let mut buf = vec![op.write.unwrap_or(0); op.len];
            let done = match op.write {
                Some(_) => mm.access_remote_write(addr, &buf, op.force),
                None => mm.access_remote_read(addr, &mut buf, op.force),
            };
            if op.write.is_some() {
                buf.clear();
            } else {
                buf.truncate(done);
            }
            (if done == 0 { Err(nothing) } else { Ok(done) }, buf)
        })
        .collect();
    let snapshot = REGIONS
        .iter()
        .enumerate()
        .filter(|(_, r)| readable(**r))
        .map(|(i, _)| {
            let mut b = vec![0u8; PAGE as usize];
            cpu.read(base + i as u64 * PAGE, &mut b).unwrap();
            b
        })
        .collect();
    let mut f = vec![0u8; content.len()];
    file.read_at(0, &mut f).unwrap();
    drop((cpu, mm, rw, ro, file));
    assert_no_leaks(&phys);
    Trace { outcomes, snapshot, file: f }
}

#[test]
fn forced_access_matches_the_host() {
    let host = host::run();
    let soft = run_on_softmm();
    let ops = host::ops();
    let mut diffs = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if host.outcomes[i] != soft.outcomes[i] {
            let region = host::REGIONS[(op.at / PAGE) as usize];
            diffs.push(format!("{op:?} in {region:?}: host {:?}, softmm {:?}", host.outcomes[i], soft.outcomes[i]));
        }
    }
    let readable: Vec<_> = host::REGIONS.iter().filter(|r| host::readable(**r)).collect();
    for (i, r) in readable.iter().enumerate() {
        if host.snapshot[i] != soft.snapshot[i] {
            let first = (0..PAGE as usize).find(|&k| host.snapshot[i][k] != soft.snapshot[i][k]).unwrap();
            diffs.push(format!(
                "child's view of {r:?} differs at +{first}: host {:#x}, softmm {:#x}",
                host.snapshot[i][first], soft.snapshot[i][first]
            ));
        }
    }
    if host.file != soft.file {
        let first = (0..host.file.len()).find(|&k| host.file[k] != soft.file[k]).unwrap();
        diffs.push(format!("file differs at {first}: host {:#x}, softmm {:#x}", host.file[first], soft.file[first]));
    }
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

/// Forced writes race with guest reads, `fork`, `mprotect`, `MADV_DONTNEED`
/// and `munmap`/`mmap` of the same range: no panic, no hang, every write
/// reports a count it could have done, and nothing leaks.
#[test]
fn forced_access_races_with_mapping_changes() {
    let phys = phys(16);
    let mm = mm(&phys);
    let len = 16 * PAGE;
    let a = mm.mmap(0, len, PROT_READ, ANON, None, 0).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    common::watchdog("forced access races", 60, move || {
        std::thread::scope(|s| {
            let (mm, stop) = (&mm, &stop);
            s.spawn(move || {
                let mut done = 0;
                for i in 0..20_000u64 {
                    let at = a + (i * 61) % len;
                    let n = mm.access_remote_write(at, &[i as u8; 100], true);
                    assert!(n == 0 || n == 100 || n == (PAGE - at % PAGE) as usize, "{n}");
                    done += n;
                    let mut b = [0u8; 64];
                    mm.access_remote_read(at, &mut b, true);
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                assert!(done > 0);
            });
            s.spawn(move || {
                let mut cpu = Cpu::attached(mm);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for p in (a..a + len).step_by(PAGE as usize) {
                        let _ = cpu.read_u8(p);
                    }
                }
            });
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match i % 4 {
                    0 => drop(mm.fork().unwrap()),
                    1 => mm.mprotect(a, len / 2, if i % 8 == 1 { PROT_NONE } else { PROT_READ }).unwrap(),
                    2 => mm.madvise(a + len / 2, len / 4, MADV_DONTNEED).unwrap(),
                    _ => {
                        mm.munmap(a + 3 * len / 4, len / 4).unwrap();
                        let r = mm.mmap(a + 3 * len / 4, len / 4, PROT_READ, ANON | MAP_FIXED, None, 0);
                        assert_eq!(r, Ok(a + 3 * len / 4));
                    }
                }
                i += 1;
            }
        });
        drop(mm);
        assert_no_leaks(&phys);
    });
}

/// Forced access to hugetlb pages (gup's `follow_huge_pmd`): reads and
/// writes reach the 4 KiB subpage of the address inside the 2 MiB page;
/// a forced read of a hugetlb VMA without `PROT_READ` works; a forced write
/// to a private one without `PROT_WRITE` (`PROT_NONE` included) breaks COW
/// as the host kernel (6.18) does, and to a shared one fails (Linux 6.12's
/// `check_vma_flags` refused both: "hugetlb does not support
/// FOLL_FORCE|FOLL_WRITE").
mod hugetlb;
