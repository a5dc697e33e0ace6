//! Behaviour of the core calls, checked against what Linux does.

mod common;

use common::*;
use softmm::uapi::*;
use softmm::{Access, Cpu, Errno, Fault, FaultPolicy, File, MmConfig, OpenFile, SegvCode};

fn segv(addr: u64, code: SegvCode) -> Fault {
    Fault::Segv { addr, code }
}

#[test]
fn anonymous_mappings_are_placed_top_down_below_mmap_base() {
    for &policy in FaultPolicy::ALL {
        anonymous_mappings_are_placed_top_down_below_mmap_base_with(policy);
    }
}

fn anonymous_mappings_are_placed_top_down_below_mmap_base_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let base = MmConfig::default().mmap_base;
    let a = mm.mmap(0, 3 * PAGE, RW, ANON, None, 0).unwrap();
    assert_eq!(a, base - 3 * PAGE);
    let b = mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
    assert_eq!(b, a - PAGE);
    // Same flags and adjacent: merges into one VMA.
    let c = mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
    assert_eq!(c, b - PAGE);
    assert_eq!(mm.maps().len(), 2, "{}", mm.maps_text());
    // A 2 MiB multiple is THP-aligned.
    let h = mm.mmap(0, 2 << 20, RW, ANON, None, 0).unwrap();
    assert_eq!(h % (2 << 20), 0);
    assert!(h + (2 << 20) <= c);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn bad_input_gets_linux_errnos_and_changes_nothing() {
    for &policy in FaultPolicy::ALL {
        bad_input_gets_linux_errnos_and_changes_nothing_with(policy);
    }
}

fn bad_input_gets_linux_errnos_and_changes_nothing_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
    let before = mm.maps_text();
    assert_eq!(mm.mmap(0, 0, RW, ANON, None, 0), Err(Errno::Inval));
    assert_eq!(mm.mmap(0, PAGE, RW, ANON, None, 1), Err(Errno::Inval));
    assert_eq!(mm.mmap(0, u64::MAX - 10, RW, ANON, None, 0), Err(Errno::NoMem));
    assert_eq!(mm.mmap(0, PAGE, RW, MAP_ANONYMOUS, None, 0), Err(Errno::Inval));
    assert_eq!(mm.mmap(0, PAGE, RW, MAP_PRIVATE, None, 0), Err(Errno::BadF));
    assert_eq!(mm.mmap(a + 1, PAGE, RW, ANON | MAP_FIXED, None, 0), Err(Errno::Inval));
    assert_eq!(mm.mmap(a, PAGE, RW, ANON | MAP_FIXED_NOREPLACE, None, 0), Err(Errno::Exist));
    assert_eq!(mm.munmap(a + 1, PAGE), Err(Errno::Inval));
    assert_eq!(mm.munmap(a, 0), Err(Errno::Inval));
    assert_eq!(mm.mprotect(a + 1, PAGE, PROT_READ), Err(Errno::Inval));
    assert_eq!(mm.mprotect(a, PAGE, 0x100), Err(Errno::Inval));
    assert_eq!(mm.mprotect(a - PAGE, 2 * PAGE, PROT_READ), Err(Errno::NoMem));
    assert_eq!(mm.mremap(a - PAGE, PAGE, 2 * PAGE, MREMAP_MAYMOVE, 0), Err(Errno::Fault));
    assert_eq!(mm.mremap(a, PAGE, 0, MREMAP_MAYMOVE, 0), Err(Errno::Inval));
    assert_eq!(mm.mremap(a, PAGE, PAGE, MREMAP_FIXED, 0), Err(Errno::Inval));
    assert_eq!(mm.madvise(a, PAGE, 9999), Err(Errno::Inval));
    assert_eq!(mm.mincore(a + 1, PAGE, &mut [0]), Err(Errno::Inval));
    assert_eq!(mm.maps_text(), before);
}

#[test]
fn faults_report_segv_codes_and_cow_after_fork() {
    for &policy in FaultPolicy::ALL {
        faults_report_segv_codes_and_cow_after_fork_with(policy);
    }
}

fn faults_report_segv_codes_and_cow_after_fork_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        assert_eq!(cpu.read_u64(a).unwrap(), 0, "zero page");
        cpu.write_u64(a, 7).unwrap();
        let child = mm.fork().unwrap();
        let mut ccpu = Cpu::attached(&child);
        assert_eq!(ccpu.read_u64(a).unwrap(), 7);
        ccpu.write_u64(a, 9).unwrap();
        assert_eq!(cpu.read_u64(a).unwrap(), 7, "child write must not reach the parent");
        cpu.write_u64(a, 11).unwrap();
        assert_eq!(ccpu.read_u64(a).unwrap(), 9);
        mm.mprotect(a, PAGE, PROT_READ).unwrap();
        assert_eq!(cpu.write_u64(a, 1), Err(segv(a, SegvCode::AccErr)));
        assert_eq!(cpu.read_u64(a).unwrap(), 11);
        mm.munmap(a, PAGE).unwrap();
        assert_eq!(cpu.read_u8(a), Err(segv(a, SegvCode::MapErr)));
        assert_eq!(cpu.compare_exchange_u64(a + PAGE + 1, 0, 1), Err(Fault::Unaligned { addr: a + PAGE + 1 }));
        assert_eq!(cpu.fetch_add_u64(a + PAGE, 5).unwrap(), 0);
        assert_eq!(cpu.compare_exchange_u64(a + PAGE, 5, 6).unwrap(), Ok(5));
        assert!(mm.stats().tlb.flushes > 0);
    }
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn file_mappings_share_cow_and_sigbus_past_eof() {
    for &policy in FaultPolicy::ALL {
        file_mappings_share_cow_and_sigbus_past_eof_with(policy);
    }
}

fn file_mappings_share_cow_and_sigbus_past_eof_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let f = File::create(&p, "/tmp/data", 3 * PAGE).unwrap();
    f.write_at(0, b"hello").unwrap();
    let of = OpenFile::read_write(&f);
    let s = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED, Some(&of), 0).unwrap();
    let pr = mm.mmap(0, 2 * PAGE, RW, MAP_PRIVATE, Some(&of), 0).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        let mut b = [0; 5];
        cpu.read(s, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        cpu.write(s + 1, b"E").unwrap();
        let mut fb = [0; 5];
        f.read_at(0, &mut fb).unwrap();
        assert_eq!(&fb, b"hEllo", "shared write reaches the file");
        cpu.read(pr, &mut b).unwrap();
        assert_eq!(&b, b"hEllo");
        cpu.write(pr, b"J").unwrap();
        f.read_at(0, &mut fb).unwrap();
        assert_eq!(&fb, b"hEllo", "private write stays private");
        assert_eq!(cpu.read_u8(s + 3 * PAGE), Err(Fault::Bus { addr: s + 3 * PAGE }));
        f.set_len(PAGE).unwrap();
        assert_eq!(cpu.read_u8(s + PAGE), Err(Fault::Bus { addr: s + PAGE }));
        assert_eq!(cpu.read_u8(s).unwrap(), b'h');
        // Private COW copy within EOF survives truncate; the page past EOF does not.
        assert_eq!(cpu.read_u8(pr).unwrap(), b'J');
        let mut v = [9; 2];
        mm.mincore(s, 2 * PAGE, &mut v).unwrap();
        assert_eq!(v, [1, 0]);
    }
    let ro = OpenFile::read_only(&f);
    assert_eq!(mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&ro), 0), Err(Errno::Acces));
    let r = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&ro), 0).unwrap();
    assert_eq!(mm.mprotect(r, PAGE, RW), Err(Errno::Acces));
    drop(mm);
    drop(f);
    drop(of);
    drop(ro);
    assert_no_leaks(&p);
}

#[test]
fn mremap_grows_in_place_moves_and_keeps_data() {
    for &policy in FaultPolicy::ALL {
        mremap_grows_in_place_moves_and_keeps_data_with(policy);
    }
}

fn mremap_grows_in_place_moves_and_keeps_data_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + PAGE, 0xfeed).unwrap();
    // Below `a` is free (top-down), above is mmap_base: cannot grow up in place.
    let blocker = mm.mmap(a + 2 * PAGE, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(mm.mremap(a, 2 * PAGE, 4 * PAGE, 0, 0), Err(Errno::NoMem));
    let b = mm.mremap(a, 2 * PAGE, 4 * PAGE, MREMAP_MAYMOVE, 0).unwrap();
    assert_ne!(a, b);
    assert_eq!(cpu.read_u64(b + PAGE).unwrap(), 0xfeed);
    assert_eq!(cpu.read_u8(a), Err(Fault::Segv { addr: a, code: SegvCode::MapErr }));
    let c = mm.mremap(b, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0).unwrap();
    assert_eq!(cpu.read_u64(c + PAGE).unwrap(), 0xfeed);
    assert_eq!(cpu.read_u64(b + PAGE).unwrap(), 0, "DONTUNMAP leaves the source mapped and empty");
    mm.munmap(blocker, PAGE).unwrap();
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn brk_grows_and_shrinks_the_heap() {
    for &policy in FaultPolicy::ALL {
        brk_grows_and_shrinks_the_heap_with(policy);
    }
}

fn brk_grows_and_shrinks_the_heap_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let start = MmConfig::default().start_brk;
    assert_eq!(mm.brk(0), start);
    assert_eq!(mm.brk(start + 10_000), start + 10_000);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(start + 9_999, 1).unwrap();
    assert!(mm.maps_text().contains("[heap]"));
    assert_eq!(mm.brk(start + 100), start + 100);
    assert_eq!(cpu.read_u8(start + 2 * PAGE), Err(Fault::Segv { addr: start + 2 * PAGE, code: SegvCode::MapErr }));
    assert_eq!(mm.brk(start - PAGE), start + 100, "below start_brk is refused");
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn growsdown_stack_expands_on_fault_below_it() {
    for &policy in FaultPolicy::ALL {
        growsdown_stack_expands_on_fault_below_it_with(policy);
    }
}

fn growsdown_stack_expands_on_fault_below_it_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let s = mm.mmap(0x7000_0000_0000, 4 * PAGE, RW, ANON | MAP_GROWSDOWN | MAP_FIXED, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u8(s - 10 * PAGE, 3).unwrap();
    assert_eq!(mm.maps()[0].start, s - 10 * PAGE);
    let t = cpu.translate(s - 10 * PAGE, Access::Read).unwrap();
    assert!(!t.is_null());
}

#[test]
fn out_of_frames_is_an_error_not_a_panic() {
    for &policy in FaultPolicy::ALL {
        out_of_frames_is_an_error_not_a_panic_with(policy);
    }
}

fn out_of_frames_is_an_error_not_a_panic_with(policy: FaultPolicy) {
    let p = phys(1);
    let mm = mm_with(&p, policy);
    let a = mm.mmap(0, 1 << 20, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    let mut oom = None;
    for i in 0..256 {
        if let Err(e) = cpu.write_u8(a + i * PAGE, 1) {
            oom = Some(e);
            break;
        }
    }
    assert!(matches!(oom, Some(Fault::Oom { .. })), "{oom:?}");
    assert_eq!(mm.madvise(a, 1 << 20, MADV_POPULATE_WRITE), Err(Errno::NoMem));
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

#[test]
fn mremap_fixed_moves_several_vmas_and_dontunmap_keeps_the_source() {
    for &policy in FaultPolicy::ALL {
        mremap_fixed_moves_several_vmas_and_dontunmap_keeps_the_source_with(policy);
    }
}

fn mremap_fixed_moves_several_vmas_and_dontunmap_keeps_the_source_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    let mut cpu = Cpu::attached(&mm);
    // DONTUNMAP of the first 8 pages of a 10-page VMA: the pages move, the
    // whole source stays mapped (Linux 6.18 leaves it unsplit).
    let a = 0x7f00_0000_0000;
    assert_eq!(mm.mmap(a, 10 * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(a));
    cpu.write_u64(a, 7).unwrap();
    let to = a + 0x10_0000;
    assert_eq!(mm.mremap(a, 8 * PAGE, 8 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to), Ok(to));
    assert_eq!(cpu.read_u64(to).unwrap(), 7);
    assert_eq!(cpu.read_u64(a).unwrap(), 0);
    let spans: Vec<(u64, u64)> = mm.maps().iter().map(|m| (m.start, m.end)).collect();
    assert_eq!(spans, [(a, a + 10 * PAGE), (to, to + 8 * PAGE)], "{}", mm.maps_text());
    // Without a target, DONTUNMAP of part of a VMA picks a free range.
    let b = mm.mremap(a, 8 * PAGE, 8 * PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0).unwrap();
    assert!(b + 8 * PAGE <= a || b >= a + 10 * PAGE, "{b:#x}");
    // A fixed move of unchanged size spans VMAs and keeps the gap between them
    // (Linux 6.17 remap_move), here over two pieces with one page between.
    let c = 0x7e00_0000_0000;
    assert_eq!(mm.mmap(c, 2 * PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(c));
    assert_eq!(mm.mmap(c + 3 * PAGE, PAGE, PROT_READ, ANON | MAP_FIXED, None, 0), Ok(c + 3 * PAGE));
    cpu.write_u64(c + PAGE, 9).unwrap();
    let d = 0x7d00_0000_0000;
    assert_eq!(mm.mremap(c, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, d), Ok(d));
    assert_eq!(cpu.read_u64(d + PAGE).unwrap(), 9);
    assert_eq!(cpu.read_u8(d + 2 * PAGE), Err(segv(d + 2 * PAGE, SegvCode::MapErr)));
    assert_eq!(cpu.read_u8(d + 3 * PAGE), Ok(0));
    assert_eq!(cpu.read_u8(c), Err(segv(c, SegvCode::MapErr)));
    // With DONTUNMAP too, each source VMA is moved once and stays mapped.
    let e = 0x7c00_0000_0000;
    assert_eq!(mm.mremap(d, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, e), Ok(e));
    assert_eq!(cpu.read_u64(e + PAGE).unwrap(), 9);
    assert_eq!(cpu.read_u64(d + PAGE).unwrap(), 0);
    // A range starting in a hole is EFAULT.
    assert_eq!(
        mm.mremap(d - PAGE, 2 * PAGE, 2 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, e - 0x10_0000),
        Err(Errno::Fault)
    );
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

/// The first byte of each of the first `n` pages of `f`.
fn file_pages(f: &File, n: u64) -> Vec<u8> {
    (0..n)
        .map(|i| {
            let mut b = [0xee];
            f.read_at(i * PAGE, &mut b).unwrap();
            b[0]
        })
        .collect()
}

/// An 8-page file of 7s, opened read-write.
fn file_of_sevens(p: &std::sync::Arc<softmm::PhysMem>) -> (std::sync::Arc<File>, OpenFile) {
    let f = File::create(p, "/memfd:x (deleted)", 0).unwrap();
    f.write_at(0, &[7; 8 * PAGE as usize]).unwrap();
    let of = OpenFile::read_write(&f);
    (f, of)
}

/// `MADV_REMOVE` follows Linux's `madvise_walk_vmas` + `madvise_remove`: each
/// VMA part of the range is punched in turn (`EINVAL` for a locked VMA or one
/// without a file, `EACCES` unless shared and may-write), holes are skipped
/// and reported as `ENOMEM` at the end. Every expectation here was observed on
/// the host (Linux 6.18, memfd and shared anonymous mappings).
#[test]
fn madvise_remove_walks_vmas_and_holes_like_linux() {
    let p = phys(8);
    let mm = mm_with(&p, FaultPolicy::default());
    let w = mm.mmap(0, 64 * PAGE, PROT_NONE, ANON, None, 0).unwrap();
    mm.munmap(w, 64 * PAGE).unwrap();
    let fixed = MAP_SHARED | MAP_FIXED;
    // One file mapping split in two VMAs by mprotect: both parts are punched.
    let (mut f, mut of) = file_of_sevens(&p);
    mm.mmap(w, 4 * PAGE, RW, fixed, Some(&of), 0).unwrap();
    mm.mprotect(w + 2 * PAGE, PAGE, PROT_READ).unwrap();
    assert_eq!(mm.madvise(w, 4 * PAGE, MADV_REMOVE), Ok(()));
    assert_eq!(file_pages(&f, 8), [0, 0, 0, 0, 7, 7, 7, 7]);
    mm.munmap(w, 64 * PAGE).unwrap();
    // A range starting in a hole: the mapped part is punched, then ENOMEM.
    (f, of) = file_of_sevens(&p);
    mm.mmap(w + 2 * PAGE, 2 * PAGE, RW, fixed, Some(&of), PAGE).unwrap();
    assert_eq!(mm.madvise(w, 4 * PAGE, MADV_REMOVE), Err(Errno::NoMem));
    assert_eq!(file_pages(&f, 8), [7, 0, 0, 7, 7, 7, 7, 7]);
    mm.munmap(w, 64 * PAGE).unwrap();
    // A hole in the middle: both sides punched, ENOMEM.
    (f, of) = file_of_sevens(&p);
    mm.mmap(w, 2 * PAGE, RW, fixed, Some(&of), 0).unwrap();
    mm.mmap(w + 3 * PAGE, 2 * PAGE, RW, fixed, Some(&of), 4 * PAGE).unwrap();
    assert_eq!(mm.madvise(w, 5 * PAGE, MADV_REMOVE), Err(Errno::NoMem));
    assert_eq!(file_pages(&f, 8), [0, 0, 7, 7, 0, 0, 7, 7]);
    mm.munmap(w, 64 * PAGE).unwrap();
    // Shared, anonymous private, shared: the first part is punched, then EINVAL.
    (f, of) = file_of_sevens(&p);
    mm.mmap(w, 2 * PAGE, RW, fixed, Some(&of), 0).unwrap();
    mm.mmap(w + 2 * PAGE, 2 * PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
    mm.mmap(w + 4 * PAGE, 2 * PAGE, RW, fixed, Some(&of), 4 * PAGE).unwrap();
    assert_eq!(mm.madvise(w, 6 * PAGE, MADV_REMOVE), Err(Errno::Inval));
    assert_eq!(file_pages(&f, 8), [0, 0, 7, 7, 7, 7, 7, 7]);
    mm.munmap(w, 64 * PAGE).unwrap();
    // Nothing mapped in the range: ENOMEM, whether a VMA follows or not.
    (f, of) = file_of_sevens(&p);
    mm.mmap(w + 4 * PAGE, 2 * PAGE, RW, fixed, Some(&of), 0).unwrap();
    assert_eq!(mm.madvise(w, 2 * PAGE, MADV_REMOVE), Err(Errno::NoMem));
    assert_eq!(mm.madvise(w + 6 * PAGE, 2 * PAGE, MADV_REMOVE), Err(Errno::NoMem));
    assert_eq!(file_pages(&f, 8), [7; 8]);
    // An unaligned length covers the whole page.
    assert_eq!(mm.madvise(w + 4 * PAGE, 100, MADV_REMOVE), Ok(()));
    assert_eq!(file_pages(&f, 8), [0, 7, 7, 7, 7, 7, 7, 7]);
    mm.munmap(w, 64 * PAGE).unwrap();
    // Which VMAs refuse, and with what.
    (f, of) = file_of_sevens(&p);
    mm.mmap(w, 2 * PAGE, RW, MAP_PRIVATE | MAP_FIXED, Some(&of), 0).unwrap();
    assert_eq!(mm.madvise(w, 2 * PAGE, MADV_REMOVE), Err(Errno::Acces), "private file mapping");
    mm.mmap(w, 2 * PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
    assert_eq!(mm.madvise(w, 2 * PAGE, MADV_REMOVE), Err(Errno::Inval), "anonymous private mapping");
    mm.mmap(w, 2 * PAGE, RW, fixed | MAP_LOCKED, Some(&of), 0).unwrap();
    assert_eq!(mm.madvise(w, PAGE, MADV_REMOVE), Err(Errno::Inval), "locked");
    let ro = OpenFile::read_only(&f);
    mm.mmap(w, 2 * PAGE, PROT_READ, fixed, Some(&ro), 0).unwrap();
    assert_eq!(mm.madvise(w, PAGE, MADV_REMOVE), Err(Errno::Acces), "file opened read-only");
    assert_eq!(file_pages(&f, 8), [7; 8], "every refusal changed nothing");
    // A read-only shared mapping of a file opened read-write may write: punched.
    mm.mmap(w, 2 * PAGE, PROT_READ, fixed, Some(&of), 0).unwrap();
    assert_eq!(mm.madvise(w, PAGE, MADV_REMOVE), Ok(()));
    assert_eq!(file_pages(&f, 8), [0, 7, 7, 7, 7, 7, 7, 7]);
    // Shared anonymous memory is shmem: punched, and reads back zero.
    let s = mm.mmap(w, 2 * PAGE, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(s, 5).unwrap();
        assert_eq!(mm.madvise(s, 2 * PAGE, MADV_REMOVE), Ok(()));
        assert_eq!(cpu.read_u8(s), Ok(0));
    }
    drop(mm);
    drop((f, of, ro));
    assert_no_leaks(&p);
}

/// The file offset of a `MADV_REMOVE` is computed as Linux's `loff_t`
/// (`(start - vm_start) + (vm_pgoff << PAGE_SHIFT)`, wrapping) and checked by
/// `vfs_fallocate`: an offset that is negative as an `off_t` is `EINVAL` and
/// punches nothing (it used to overflow: a panic with overflow checks, and in
/// release a punch of file offset 0). Near the largest file size it works.
#[test]
fn madvise_remove_at_huge_file_offsets_is_checked() {
    let p = phys(8);
    let mm = mm_with(&p, FaultPolicy::default());
    let (f, of) = file_of_sevens(&p);
    // Mappings whose offsets Linux's mmap refuses (EOVERFLOW) are refused here
    // too once mmap checks them; the madvise must be safe whatever mmap allows.
    if let Ok(a) = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&of), u64::MAX - PAGE + 1) {
        assert_eq!(mm.madvise(a, PAGE, MADV_REMOVE), Err(Errno::Inval));
        // The second page's file offset is 2^64: it must not wrap to 0.
        assert_eq!(mm.madvise(a + PAGE, PAGE, MADV_REMOVE), Err(Errno::Inval));
        mm.munmap(a, 2 * PAGE).unwrap();
    }
    if let Ok(a) = mm.mmap(0, 2 * PAGE, RW, MAP_SHARED, Some(&of), 1 << 63) {
        assert_eq!(mm.madvise(a, 2 * PAGE, MADV_REMOVE), Err(Errno::Inval));
        mm.munmap(a, 2 * PAGE).unwrap();
    }
    assert_eq!(file_pages(&f, 8), [7; 8], "file offset 0 was punched");
    // The host maps and punches at offset i64::MAX - 8191 (one page).
    let top = (i64::MAX as u64) & !(2 * PAGE - 1);
    let a = mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&of), top).unwrap();
    assert_eq!(mm.madvise(a, PAGE, MADV_REMOVE), Ok(()));
    drop(mm);
    drop((f, of));
    assert_no_leaks(&p);
}
