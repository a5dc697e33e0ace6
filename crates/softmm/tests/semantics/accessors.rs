//! The typed guest accessors of `Cpu`: every width at every offset, across
//! pages, both byte orders, plain-old-data objects, and atomics with every
//! ordering, alone and against other threads.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, SegvCode};

const PAGE: u64 = 4096;
const RW: i32 = PROT_READ | PROT_WRITE;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
const ORDERINGS: [Ordering; 5] =
    [Ordering::Relaxed, Ordering::Release, Ordering::Acquire, Ordering::AcqRel, Ordering::SeqCst];

#[track_caller]
fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
}

fn setup(pages: u64) -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, pages * PAGE, RW, ANON, None, 0).unwrap();
    (phys, mm, a)
}

/// Each width at each offset of the last 16 bytes of a page and the first
/// of the next: the bytes in memory are the value's little-endian (or
/// big-endian) bytes, nothing around them changes, and reads give it back.
#[test]
fn every_width_at_every_offset_around_a_page_boundary() {
    let (phys, mm, a) = setup(2);
    let mut cpu = Cpu::attached(&mm);
    let v: u64 = 0x8877_6655_4433_2211;
    for off in PAGE - 16..PAGE + 8 {
        let at = a + off;
        let check = |cpu: &mut Cpu, n: usize, le: [u8; 8]| {
            let mut around = [0u8; 32];
            cpu.read(at - 12, &mut around).unwrap();
            assert_eq!(&around[12..12 + n], &le[..n], "off {off} n {n}");
            assert!(around[..12].iter().chain(&around[12 + n..]).all(|&b| b == 0xee), "off {off} n {n}: {around:x?}");
        };
        for n in [1usize, 2, 4, 8] {
            cpu.write(at - 12, &[0xee; 32]).unwrap();
            match n {
                1 => cpu.write_u8(at, v as u8).unwrap(),
                2 => cpu.write_u16(at, v as u16).unwrap(),
                4 => cpu.write_u32(at, v as u32).unwrap(),
                _ => cpu.write_u64(at, v).unwrap(),
            }
            check(&mut cpu, n, v.to_le_bytes());
            assert_eq!(cpu.read_u8(at).unwrap(), v as u8);
            assert_eq!(cpu.read_le::<i8>(at).unwrap(), v as i8);
            if n >= 2 {
                assert_eq!(cpu.read_u16(at).unwrap(), v as u16);
                assert_eq!(cpu.read_be::<u16>(at).unwrap(), (v as u16).swap_bytes());
            }
            if n >= 4 {
                assert_eq!(cpu.read_u32(at).unwrap(), v as u32);
                assert_eq!(cpu.read_le::<i32>(at).unwrap(), v as i32);
            }
            if n == 8 {
                assert_eq!(cpu.read_u64(at).unwrap(), v);
                assert_eq!(cpu.read_be::<u64>(at).unwrap(), v.swap_bytes());
            }
            cpu.write(at - 12, &[0xee; 32]).unwrap();
            match n {
                1 => cpu.write_be::<u8>(at, v as u8).unwrap(),
                2 => cpu.write_be::<u16>(at, v as u16).unwrap(),
                4 => cpu.write_be::<i32>(at, v as i32).unwrap(),
                _ => cpu.write_be::<u64>(at, v).unwrap(),
            }
            let mut be = [0u8; 8];
            be[..n].copy_from_slice(&v.to_le_bytes()[..n]);
            be[..n].reverse();
            check(&mut cpu, n, be);
        }
    }
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// A scalar that runs into an unmapped or read-only page faults at that
/// page's first byte; a write stores the bytes before it, as `memcpy`.
#[test]
fn a_scalar_across_into_a_bad_page_faults_at_its_first_byte() {
    let (phys, mm, a) = setup(3);
    let mut cpu = Cpu::attached(&mm);
    mm.munmap(a + PAGE, PAGE).unwrap();
    mm.mprotect(a + 2 * PAGE, PAGE, PROT_READ).unwrap();
    let hole = Err(Fault::Segv { addr: a + PAGE, code: SegvCode::MapErr });
    assert_eq!(cpu.read_u64(a + PAGE - 3).map(drop), hole);
    assert_eq!(cpu.read_u16(a + PAGE - 1).map(drop), hole);
    assert_eq!(cpu.write_u32(a + PAGE - 2, 0xaabb_ccdd), hole);
    assert_eq!(cpu.read_u16(a + PAGE - 2).unwrap(), 0xccdd);
    let ro = Err(Fault::Segv { addr: a + 2 * PAGE, code: SegvCode::AccErr });
    cpu.write_u64(a + 2 * PAGE - 8, 0).unwrap_err(); // the hole: nothing written
    mm.mmap(a + PAGE, PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(cpu.write_u64(a + 2 * PAGE - 4, 0x1122_3344_5566_7788), ro);
    assert_eq!(cpu.read_u32(a + 2 * PAGE - 4).unwrap(), 0x5566_7788);
    assert_eq!(cpu.read_u64(a + 2 * PAGE - 4).unwrap(), 0x5566_7788);
    assert_eq!(cpu.fetch_u32(a + 2 * PAGE - 2), Err(Fault::Segv { addr: a + 2 * PAGE - 2, code: SegvCode::AccErr }));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Header {
    magic: u32,
    flags: u16,
    kind: u16,
    entry: u64,
}

/// `read_obj`/`write_obj` move any `Pod` value, across a page boundary too.
#[test]
fn plain_old_data_objects_roundtrip() {
    let (phys, mm, a) = setup(2);
    let mut cpu = Cpu::attached(&mm);
    let h = Header { magic: 0x464c_457f, flags: 2, kind: 0x3e, entry: 0x40_1000 };
    for at in [a, a + PAGE - 7] {
        cpu.write_obj(at, &h).unwrap();
        assert_eq!(cpu.read_obj::<Header>(at).unwrap(), h);
        assert_eq!(cpu.read_u32(at).unwrap(), 0x464c_457f);
        assert_eq!(cpu.read_u64(at + 8).unwrap(), 0x40_1000);
    }
    cpu.write_obj(a, &[1u16, 2, 3]).unwrap();
    assert_eq!(cpu.read_obj::<[u16; 3]>(a).unwrap(), [1, 2, 3]);
    mm.munmap(a + PAGE, PAGE).unwrap();
    assert_eq!(cpu.read_obj::<Header>(a + PAGE - 4), Err(Fault::Segv { addr: a + PAGE, code: SegvCode::MapErr }));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// Every atomic operation at every width with every ordering: none panics
/// (orderings a load or store cannot have are reduced), each computes
/// what `std`'s does, an unaligned address is `Fault::Unaligned`, and a
/// read-only page allows loads but no store or read-modify-write.
#[test]
fn atomics_at_every_width_and_ordering() {
    let (phys, mm, a) = setup(1);
    let mut cpu = Cpu::attached(&mm);
    macro_rules! width {
        ($t:ty) => {
            let n = std::mem::size_of::<$t>() as u64;
            for o in ORDERINGS {
                let at = a + 8 * n;
                cpu.atomic_store::<$t>(at, 0b1100, o).unwrap();
                assert_eq!(cpu.atomic_load::<$t>(at, o).unwrap(), 0b1100);
                assert_eq!(cpu.atomic_swap::<$t>(at, 0b1010, o).unwrap(), 0b1100);
                assert_eq!(cpu.atomic_fetch_and::<$t>(at, 0b0110, o).unwrap(), 0b1010);
                assert_eq!(cpu.atomic_fetch_or::<$t>(at, 0b1001, o).unwrap(), 0b0010);
                assert_eq!(cpu.atomic_fetch_xor::<$t>(at, 0b0001, o).unwrap(), 0b1011);
                assert_eq!(cpu.atomic_fetch_add::<$t>(at, 1, o).unwrap(), 0b1010);
                assert_eq!(cpu.atomic_fetch_sub::<$t>(at, 3, o).unwrap(), 0b1011);
                for f in ORDERINGS {
                    assert_eq!(cpu.atomic_compare_exchange::<$t>(at, 7, 9, o, f).unwrap(), Err(0b1000));
                    assert_eq!(cpu.atomic_compare_exchange::<$t>(at, 8, 8, o, f).unwrap(), Ok(8));
                }
                // Little-endian in memory.
                assert_eq!(cpu.read_u8(at).unwrap(), 8);
                if n > 1 {
                    assert_eq!(cpu.atomic_load::<$t>(at + 1, o), Err(Fault::Unaligned { addr: at + 1 }));
                    assert_eq!(cpu.atomic_fetch_add::<$t>(at + 1, 1, o), Err(Fault::Unaligned { addr: at + 1 }));
                }
            }
        };
    }
    width!(u8);
    width!(u16);
    width!(u32);
    width!(u64);
    width!(i8);
    width!(i16);
    width!(i32);
    width!(i64);
    assert_eq!(cpu.atomic_fetch_add::<i16>(a, -1, Ordering::SeqCst).unwrap(), 0);
    assert_eq!(cpu.read_u16(a).unwrap(), 0xffff);
    mm.mprotect(a, PAGE, PROT_READ).unwrap();
    assert_eq!(cpu.atomic_load::<u64>(a + 64, Ordering::Acquire).unwrap(), 8);
    let acc = Err(Fault::Segv { addr: a + 64, code: SegvCode::AccErr });
    assert_eq!(cpu.atomic_store::<u64>(a + 64, 1, Ordering::Release), acc);
    assert_eq!(cpu.atomic_compare_exchange::<u64>(a + 64, 1, 2, Ordering::SeqCst, Ordering::SeqCst).map(drop), acc);
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// Two threads add to the same counters through their own CPUs: every
/// width's read-modify-write is atomic; unaligned plain stores by one
/// thread never undo another's atomic updates of neighbouring bytes; and
/// an aligned `u64` store is never seen halfway.
#[test]
fn accessors_are_atomic_where_they_say_so_against_another_thread() {
    // Long enough for the two threads to overlap on a loaded machine.
    const RUN: std::time::Duration = std::time::Duration::from_millis(300);
    let (phys, mm, a) = setup(1);
    let barrier = Barrier::new(2);
    let counts: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (mm, barrier) = (&mm, &barrier);
                s.spawn(move || {
                    let mut cpu = Cpu::attached(mm);
                    barrier.wait();
                    let start = std::time::Instant::now();
                    let mut i = 0u64;
                    while i % 1024 != 0 || start.elapsed() < RUN {
                        cpu.atomic_fetch_add::<u8>(a, 1, Ordering::Relaxed).unwrap();
                        cpu.atomic_fetch_add::<u16>(a + 2, 1, Ordering::Relaxed).unwrap();
                        cpu.atomic_fetch_add::<u32>(a + 4, 1, Ordering::AcqRel).unwrap();
                        cpu.atomic_fetch_add::<u64>(a + 8, 1, Ordering::SeqCst).unwrap();
                        if t == 0 {
                            // Bytes 17..21: between the two counters at 16 and 21.
                            cpu.write_u32(a + 17, i as u32).unwrap();
                            cpu.write_u64(a + 32, if i % 2 == 0 { 0 } else { u64::MAX }).unwrap();
                        } else {
                            cpu.atomic_fetch_add::<u8>(a + 16, 1, Ordering::Relaxed).unwrap();
                            cpu.atomic_fetch_add::<u8>(a + 21, 1, Ordering::Relaxed).unwrap();
                            let w = cpu.read_u64(a + 32).unwrap();
                            assert!(w == 0 || w == u64::MAX, "torn read {w:#x}");
                        }
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let (n0, n1) = (counts[0], counts[1]);
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a).unwrap(), ((n0 + n1) % 256) as u8);
    assert_eq!(cpu.read_u16(a + 2).unwrap(), (n0 + n1) as u16);
    assert_eq!(cpu.read_u32(a + 4).unwrap(), (n0 + n1) as u32);
    assert_eq!(cpu.read_u64(a + 8).unwrap(), n0 + n1);
    assert_eq!(cpu.read_u8(a + 16).unwrap(), (n1 % 256) as u8, "an unaligned store undid an increment");
    assert_eq!(cpu.read_u8(a + 21).unwrap(), (n1 % 256) as u8, "an unaligned store undid an increment");
    assert_eq!(cpu.read_u32(a + 17).unwrap(), (n0 - 1) as u32);
    drop((cpu, mm));
    assert_no_leaks(&phys);
}
