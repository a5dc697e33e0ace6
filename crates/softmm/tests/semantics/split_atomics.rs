//! Atomics at any alignment (`AtomicAlignment::Split`, x86's split locks):
//! every operation at every offset inside a word, across words and across
//! pages, the bytes around untouched; `Strict` keeps `BUS_ADRALN`; faults
//! in the second page leave the first unchanged; COW is broken as for an
//! aligned atomic; guest threads counting through split atomics reach the
//! exact total, beside a thread that stores to the neighbouring bytes.

use std::sync::atomic::Ordering::{self, SeqCst};
use std::sync::Arc;

use softmm::uapi::*;
use softmm::{Access, AddressSpace, AtomicAlignment, Cpu, Fault, MmConfig, PhysMem, SegvCode};
use softmm_testkit::common::{assert_no_leaks, last_fault, phys, ANON, PAGE, RW};

fn setup(policy: AtomicAlignment) -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let p = phys(1);
    let mm = AddressSpace::new(&p, MmConfig::default().atomic_alignment(policy)).unwrap();
    let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    (p, mm, a)
}

#[test]
fn strict_keeps_bus_adraln_and_split_makes_the_atomic() {
    assert_eq!(AtomicAlignment::default(), AtomicAlignment::Strict);
    for &policy in AtomicAlignment::ALL {
        assert_eq!(AtomicAlignment::from_name(policy.name()), Some(policy));
        let (p, mm, a) = setup(policy);
        let mut cpu = Cpu::attached(&mm);
        let r = cpu.atomic_fetch_add::<u32>(a + 2, 1, SeqCst);
        match policy {
            AtomicAlignment::Strict => {
                assert_eq!(r, Err(Fault::Unaligned { addr: a + 2 }));
                assert_eq!(last_fault(&cpu), (Access::Write, a + 2, 4));
            }
            _ => assert_eq!(r, Ok(0)),
        }
        drop((cpu, mm));
        assert_no_leaks(&p);
    }
}

/// Every operation and width at every offset of a 32-byte window that
/// holds a word boundary and, moved to the page's end, a page boundary:
/// the result a plain read-modify-write gives, and the bytes around it
/// unchanged.
#[test]
fn split_atomics_give_every_result_at_every_offset_and_touch_nothing_else() {
    let (p, mm, a) = setup(AtomicAlignment::Split);
    let mut cpu = Cpu::attached(&mm);
    for base in [a + 8, a + PAGE - 12] {
        for off in 0..16u64 {
            let at = base + off;
            let fill: Vec<u8> = (0..32).map(|i| 0xa0 + i as u8).collect();
            cpu.write(base - 4, &fill).unwrap();
            let raw = |cpu: &mut Cpu| cpu.read_u64(at).unwrap();
            // fetch_add on a u32: the old value, then old + 0x0101_0101.
            let old = cpu.read_u32(at).unwrap();
            assert_eq!(cpu.atomic_fetch_add::<u32>(at, 0x0101_0101, SeqCst), Ok(old), "at {off}");
            assert_eq!(cpu.read_u32(at), Ok(old.wrapping_add(0x0101_0101)));
            // u16 ops.
            let h = cpu.read_u16(at).unwrap();
            assert_eq!(cpu.atomic_fetch_xor::<u16>(at, 0xffff, SeqCst), Ok(h));
            assert_eq!(cpu.atomic_fetch_or::<u16>(at, 1, SeqCst), Ok(!h));
            assert_eq!(cpu.atomic_fetch_and::<u16>(at, 0xff00, SeqCst), Ok(!h | 1));
            assert_eq!(cpu.atomic_fetch_sub::<u16>(at, 1, SeqCst), Ok((!h | 1) & 0xff00));
            // u64: swap, compare-exchange (failing, then succeeding), load, store.
            let w = raw(&mut cpu);
            assert_eq!(cpu.atomic_swap::<u64>(at, 0x1122_3344_5566_7788, SeqCst), Ok(w));
            let cas = |cpu: &mut Cpu, c, n| cpu.atomic_compare_exchange::<u64>(at, c, n, SeqCst, Ordering::Relaxed);
            assert_eq!(cas(&mut cpu, 5, 6), Ok(Err(0x1122_3344_5566_7788)));
            assert_eq!(cas(&mut cpu, 0x1122_3344_5566_7788, 9), Ok(Ok(0x1122_3344_5566_7788)));
            assert_eq!(cpu.atomic_load::<u64>(at, SeqCst), Ok(9));
            cpu.atomic_store::<i16>(at + 1, -2, SeqCst).unwrap();
            assert_eq!(cpu.read_u64(at), Ok(9 | 0xfffe << 8));
            // The bytes around are the fill's.
            let mut all = [0u8; 32];
            cpu.read(base - 4, &mut all).unwrap();
            let o = off as usize + 4;
            assert_eq!(&all[..o], &fill[..o], "before, at {off}");
            assert_eq!(&all[o + 8..], &fill[o + 8..], "after, at {off}");
        }
    }
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// Across pages: a second page not yet faulted in is faulted; an unmapped
/// or read-only second page faults at its first byte with the first page
/// unchanged; a COW page is copied for the child's split atomic only.
#[test]
fn a_split_atomic_across_pages_faults_as_a_store_and_breaks_cow() {
    let (p, mm, a) = setup(AtomicAlignment::Split);
    let mut cpu = Cpu::attached(&mm);
    let at = a + PAGE - 2;
    cpu.write_u16(at, 0x0201).unwrap();
    assert_eq!(cpu.atomic_fetch_add::<u32>(at, 1, SeqCst), Ok(0x0201), "the second page faulted in");
    mm.mprotect(a + PAGE, PAGE, PROT_READ).unwrap();
    let accerr = Err(Fault::Segv { addr: a + PAGE, code: SegvCode::AccErr });
    assert_eq!(cpu.atomic_fetch_add::<u32>(at, 1, SeqCst), accerr);
    assert_eq!(last_fault(&cpu), (Access::Write, at, 4));
    assert_eq!(cpu.atomic_load::<u32>(at, SeqCst), Ok(0x0202), "a load needs read only");
    mm.munmap(a + PAGE, PAGE).unwrap();
    let maperr = Err(Fault::Segv { addr: a + PAGE, code: SegvCode::MapErr });
    assert_eq!(cpu.atomic_swap::<u32>(at, 7, SeqCst), maperr);
    assert_eq!(cpu.read_u16(at), Ok(0x0202), "the first page unchanged");
    // COW: the child's split atomic copies its page; the parent's stays.
    let child = mm.fork().unwrap();
    let mut ccpu = Cpu::attached(&child);
    assert_eq!(ccpu.atomic_fetch_add::<u16>(at - 1, 0x100, SeqCst), Ok(0x0200));
    assert_eq!(ccpu.read_u16(at), Ok(0x0203));
    assert_eq!(cpu.read_u16(at), Ok(0x0202));
    drop((ccpu, child, cpu, mm));
    assert_no_leaks(&p);
}

/// Guest threads count through split atomics (inside a word, across two
/// words, across two pages) and reach the exact total; a thread storing to
/// the bytes beside the in-word counter loses none of its stores.
#[test]
fn threads_counting_through_split_atomics_reach_the_exact_total() {
    const THREADS: u64 = 3;
    let n = softmm_testkit::common::scaled(200_000);
    let start = Arc::new(std::sync::Barrier::new(THREADS as usize + 1));
    let (p, mm, a) = setup(AtomicAlignment::Split);
    let counters = [a + 2, a + 30, a + PAGE - 3];
    let mut hs = Vec::new();
    for _ in 0..THREADS {
        let (mm, start) = (mm.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            start.wait();
            for _ in 0..n {
                cpu.atomic_fetch_add::<u32>(counters[0], 1, SeqCst).unwrap();
                cpu.atomic_fetch_add::<u64>(counters[1], 1, SeqCst).unwrap();
                cpu.atomic_fetch_add::<u32>(counters[2], 1, SeqCst).unwrap();
            }
        }));
    }
    let neighbour = {
        let (mm, start) = (mm.clone(), start.clone());
        std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            start.wait();
            for i in 0..n {
                cpu.write_u16(a, i as u16).unwrap();
                cpu.write_u16(a + 6, !(i as u16)).unwrap();
            }
        })
    };
    hs.into_iter().for_each(|h| h.join().unwrap());
    neighbour.join().unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u32(counters[0]), Ok((THREADS * n) as u32));
    assert_eq!(cpu.read_u64(counters[1]), Ok(THREADS * n));
    assert_eq!(cpu.read_u32(counters[2]), Ok((THREADS * n) as u32));
    assert_eq!(cpu.read_u16(a), Ok((n - 1) as u16), "the neighbour's last store");
    assert_eq!(cpu.read_u16(a + 6), Ok(!((n - 1) as u16)));
    drop((cpu, mm));
    assert_no_leaks(&p);
}

/// Two threads count through one split atomic inside a word while a third
/// stores to the word's other bytes: the word's compare-and-swap loses no
/// count and no store.
#[test]
fn an_in_word_split_atomic_loses_no_count_beside_stores_to_its_word() {
    let n = softmm_testkit::common::scaled(2_000_000);
    let (p, mm, a) = setup(AtomicAlignment::Split);
    let start = Arc::new(std::sync::Barrier::new(3));
    let hs: Vec<_> = (0..3u64)
        .map(|t| {
            let (mm, start) = (mm.clone(), start.clone());
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                start.wait();
                for i in 0..n {
                    if t < 2 {
                        cpu.atomic_fetch_add::<u32>(a + 1, 1, SeqCst).unwrap();
                    } else {
                        cpu.write_u8(a, i as u8).unwrap();
                    }
                }
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u32(a + 1), Ok(2 * n as u32));
    assert_eq!(cpu.read_u8(a), Ok((n - 1) as u8));
    drop((cpu, mm));
    assert_no_leaks(&p);
}
