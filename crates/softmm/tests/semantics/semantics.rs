//! Behaviour of the core calls, checked against what Linux does.

use softmm_testkit::common;

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
    assert!(!t.as_ptr().is_null());
    assert_eq!(t.len(), PAGE as usize);
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

/// The number of VMAs in `[a, a + len)`.
fn vmas_in(mm: &softmm::AddressSpace, a: u64, len: u64) -> usize {
    mm.maps().iter().filter(|e| e.start >= a && e.start < a + len).count()
}

/// `MADV_MERGEABLE`/`UNMERGEABLE` set and clear `VM_MERGEABLE` as KSM's
/// `ksm_madvise` does: the advice is silently ignored on shared mappings, and
/// the flag splits a VMA and is cleared back into one. Host-confirmed (Linux
/// 6.18) VMA counts.
#[test]
fn madvise_mergeable_sets_a_flag_as_ksm_does() {
    let p = phys(8);
    let mm = mm_with(&p, FaultPolicy::default());
    let f = File::create(&p, "/memfd:x (deleted)", 8 * PAGE).unwrap();
    let of = OpenFile::read_write(&f);
    let cases: [(&str, i32, i32, Option<&OpenFile>, usize); 5] = [
        ("anonymous private", RW, ANON, None, 3),
        ("shared anonymous", RW, MAP_SHARED | MAP_ANONYMOUS, None, 1),
        ("shared file", RW, MAP_SHARED, Some(&of), 1),
        ("private file", RW, MAP_PRIVATE, Some(&of), 3),
        ("PROT_NONE", PROT_NONE, ANON, None, 3),
    ];
    for (what, prot, flags, file, vmas) in cases {
        let a = mm.mmap(0, 4 * PAGE, prot, flags, file, 0).unwrap();
        assert_eq!(mm.madvise(a + PAGE, PAGE, MADV_MERGEABLE), Ok(()), "{what}");
        assert_eq!(vmas_in(&mm, a, 4 * PAGE), vmas, "{what}: VMAs after MADV_MERGEABLE");
        assert_eq!(mm.madvise(a + PAGE, PAGE, MADV_MERGEABLE), Ok(()), "{what}: again");
        assert_eq!(mm.madvise(a, 4 * PAGE, MADV_UNMERGEABLE), Ok(()), "{what}");
        assert_eq!(vmas_in(&mm, a, 4 * PAGE), 1, "{what}: MADV_UNMERGEABLE merges back");
        mm.munmap(a, 4 * PAGE).unwrap();
    }
    // A hole: the mapped parts are advised, then ENOMEM.
    let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
    mm.munmap(a + 2 * PAGE, PAGE).unwrap();
    assert_eq!(mm.madvise(a, 4 * PAGE, MADV_MERGEABLE), Err(Errno::NoMem));
    assert_eq!(vmas_in(&mm, a, 4 * PAGE), 2);
    // The flag keeps the advised VMA apart from a new neighbour without it.
    assert_eq!(mm.mmap(a + 2 * PAGE, PAGE, RW, ANON | MAP_FIXED, None, 0), Ok(a + 2 * PAGE));
    assert_eq!(vmas_in(&mm, a, 4 * PAGE), 3);
    drop(mm);
    drop((f, of));
    assert_no_leaks(&p);
}

/// `MADV_COLLAPSE` of anonymous memory, with the outcomes the host
/// (Linux 6.18, THP `madvise` mode) gives: `EINVAL` for a
/// VMA that holds no aligned 2 MiB block, for read-only,
/// `PROT_NONE` and `MADV_NOHUGEPAGE` mappings, and for a block with no
/// anonymous page, a guard marker or no page table; `Ok` when every block of
/// the range collapses, and for a range holding no whole block. softmm has
/// no huge pages: a collapsed block has all its pages present (the host's
/// huge page: mincore shows every page resident, data kept, the rest zero).
#[test]
fn madvise_collapse_returns_what_linux_returns() {
    let p = phys(16);
    let mm = mm_with(&p, FaultPolicy::default());
    let pmd = 2 << 20;
    let mut cpu = Cpu::attached(&mm);
    let small = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
    assert_eq!(mm.madvise(small, PAGE, MADV_COLLAPSE), Err(Errno::Inval), "no 2 MiB block fits");
    let big = |prot: i32, flags: i32| {
        let a = mm.mmap(0, 2 * pmd, prot, flags, None, 0).unwrap();
        assert_eq!(a % pmd, 0);
        a
    };
    let a = big(RW, ANON);
    assert_eq!(mm.madvise(a, pmd, MADV_COLLAPSE), Err(Errno::Inval), "untouched: no page table");
    cpu.write_u8(a + 5 * PAGE, 1).unwrap();
    assert_eq!(mm.madvise(a, pmd, MADV_COLLAPSE), Ok(()));
    assert_eq!(mm.madvise(a, 2 * pmd, MADV_COLLAPSE), Err(Errno::Inval), "the second block is empty");
    assert_eq!(mm.madvise(a, pmd / 2, MADV_COLLAPSE), Ok(()), "no whole block in the range");
    assert_eq!(mm.madvise(a + PAGE, pmd, MADV_COLLAPSE), Ok(()), "no whole block in the range");
    let mut v = vec![0u8; 1024];
    mm.mincore(a, 2 * pmd, &mut v).unwrap();
    assert_eq!(v.iter().filter(|&&b| b == 1).count(), 512, "the collapsed block is resident, not the next");
    assert!(v[..512].iter().all(|&b| b == 1));
    assert_eq!((cpu.read_u8(a + 5 * PAGE), cpu.read_u8(a + 6 * PAGE)), (Ok(1), Ok(0)));
    assert_eq!(mm.maps().iter().find(|e| e.start == a).unwrap().rss, pmd);
    cpu.write_u8(a + pmd + 5 * PAGE, 1).unwrap();
    assert_eq!(mm.madvise(a, 2 * pmd, MADV_COLLAPSE), Ok(()));
    // A guard marker in the block.
    assert_eq!(mm.madvise(a + 7 * PAGE, PAGE, MADV_GUARD_INSTALL), Ok(()));
    assert_eq!(mm.madvise(a, pmd, MADV_COLLAPSE), Err(Errno::Inval));
    // Only the zero page: nothing to collapse.
    let z = big(RW, ANON);
    cpu.read_u8(z + 5 * PAGE).unwrap();
    assert_eq!(mm.madvise(z, pmd, MADV_COLLAPSE), Err(Errno::Inval));
    let ro = big(PROT_READ, ANON);
    cpu.read_u8(ro + 5 * PAGE).unwrap();
    assert_eq!(mm.madvise(ro, pmd, MADV_COLLAPSE), Err(Errno::Inval), "read-only");
    let none = big(PROT_NONE, ANON);
    assert_eq!(mm.madvise(none, pmd, MADV_COLLAPSE), Err(Errno::Inval), "PROT_NONE");
    let nh = big(RW, ANON);
    cpu.write_u8(nh + 5 * PAGE, 1).unwrap();
    mm.madvise(nh, 2 * pmd, MADV_NOHUGEPAGE).unwrap();
    assert_eq!(mm.madvise(nh, pmd, MADV_COLLAPSE), Err(Errno::Inval), "MADV_NOHUGEPAGE");
    drop(cpu);
    drop(mm);
    assert_no_leaks(&p);
}

/// `MADV_COLLAPSE` of shmem (memfds, `File::create`'s files, shared
/// anonymous memory) as Linux 6.12 does it (`madvise_collapse` ->
/// `hpage_collapse_scan_file` -> `collapse_file`, then
/// `collapse_pte_mapped_thp` installing the PMD; a forced collapse ignores
/// `shmem_enabled` but `deny`): `EINVAL` where `thp_vma_allowable_order`
/// refuses (the VMA's start and file offset not congruent modulo 2 MiB,
/// `MADV_NOHUGEPAGE`), for a 2 MiB extent of the file with no page cached
/// (`SCAN_TRUNCATED`, which ends the walk) and for a private mapping whose
/// block maps a private copy (the PMD is not installed); otherwise every
/// block collapses: every page of the extent is in the page cache (holes
/// zero) and mapped, which is what the huge page shows to mincore, `Rss`
/// and the program. (Linux 6.18, this repository's host, returns `EINVAL`
/// for a block that had holes while collapsing its page cache all the
/// same; a fully populated block collapses on both.)
#[test]
fn madvise_collapse_of_shmem_as_linux_6_12() {
    let p = phys(32);
    let mm = mm_with(&p, FaultPolicy::default());
    let pmd = 2 << 20;
    let mut cpu = Cpu::attached(&mm);
    let resident = |a: u64| {
        let mut v = vec![0u8; 512];
        mm.mincore(a, pmd, &mut v).unwrap();
        v.iter().filter(|&&b| b == 1).count()
    };
    // `len` bytes at a 2 MiB boundary (over a reservation).
    let at = |len: u64, prot: i32, flags: i32, file: Option<&OpenFile>, off: u64| {
        let r = mm.mmap(0, len + pmd, PROT_NONE, ANON, None, 0).unwrap();
        let a = (r + pmd - 1) & !(pmd - 1);
        mm.mmap(a, len, prot, flags | MAP_FIXED, file, off).unwrap()
    };
    let sh = at(2 * pmd, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0);
    assert_eq!(mm.madvise(sh, pmd, MADV_COLLAPSE), Err(Errno::Inval), "nothing cached: SCAN_TRUNCATED");
    cpu.write_u8(sh + 5 * PAGE, 7).unwrap();
    assert_eq!(mm.madvise(sh, pmd, MADV_COLLAPSE), Ok(()), "shared anonymous");
    assert_eq!(resident(sh), 512, "the whole block is in the page cache");
    assert_eq!((cpu.read_u8(sh + 5 * PAGE), cpu.read_u8(sh + 6 * PAGE)), (Ok(7), Ok(0)));
    assert_eq!(mm.maps().iter().find(|e| e.start == sh).unwrap().rss, pmd);
    assert_eq!(mm.madvise(sh, 2 * pmd, MADV_COLLAPSE), Err(Errno::Inval), "the second extent is empty");
    let f = File::create(&p, "/memfd:x (deleted)", 4 * pmd).unwrap();
    let of = OpenFile::read_write(&f);
    let m = at(2 * pmd, RW, MAP_SHARED, Some(&of), 0);
    cpu.write_u8(m + pmd + 9 * PAGE, 1).unwrap();
    assert_eq!(mm.madvise(m + pmd, pmd, MADV_COLLAPSE), Ok(()), "memfd, shared");
    assert_eq!(f.cached_pages(), 512);
    // A second mapping of the file sees the collapsed page cache.
    let r = at(2 * pmd, PROT_READ, MAP_SHARED, Some(&of), 0);
    assert_eq!(resident(r + pmd), 512);
    // A private mapping: collapses while it maps the file's pages, not
    // once a block holds a private copy.
    let pv = at(2 * pmd, RW, MAP_PRIVATE, Some(&of), 0);
    cpu.read_u8(pv + pmd + 3 * PAGE).unwrap();
    assert_eq!(mm.madvise(pv + pmd, pmd, MADV_COLLAPSE), Ok(()), "memfd, private, no copy");
    cpu.write_u8(pv + pmd + 3 * PAGE, 2).unwrap();
    assert_eq!(mm.madvise(pv + pmd, pmd, MADV_COLLAPSE), Err(Errno::Inval), "a private copy in the block");
    // The file offset must be congruent with the address modulo 2 MiB.
    let odd = at(2 * pmd, RW, MAP_SHARED, Some(&of), PAGE);
    assert_eq!(mm.madvise(odd, pmd, MADV_COLLAPSE), Err(Errno::Inval), "offset not aligned");
    let nh = at(2 * pmd, RW, MAP_SHARED, Some(&of), 0);
    mm.madvise(nh, 2 * pmd, MADV_NOHUGEPAGE).unwrap();
    assert_eq!(mm.madvise(nh + pmd, pmd, MADV_COLLAPSE), Err(Errno::Inval), "MADV_NOHUGEPAGE");
    drop(cpu);
    drop(mm);
    drop((f, of));
    assert_no_leaks(&p);
}

/// The shmem collapses on which Linux 6.12 and the host's 6.18 agree, run
/// on both sides: a fully written 2 MiB block of a memfd collapses (every
/// page resident), an extent with nothing cached, an offset not congruent
/// with the address and `MADV_NOHUGEPAGE` are `EINVAL`. Skipped where the
/// host has no THP (`MADV_COLLAPSE` is `EINVAL` for everything there) or
/// shmem THP is `deny`.
#[test]
fn madvise_collapse_of_shmem_agrees_with_the_host() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
    if thp.as_deref().map_or(true, |t| t.contains("[deny]")) {
        eprintln!("no shmem THP on the host ({thp:?}): skipped");
        return;
    }
    let pmd = 2u64 << 20;
    // The cases: (what, file offset of the mapping, write the first block
    // fully, MADV_NOHUGEPAGE first).
    let cases = [("full", 0, true, false), ("empty", 2 * pmd, false, false), ("offset", PAGE, true, false)];
    let cases = cases.into_iter().chain([("nohugepage", 4 * pmd, true, true)]);
    // The host: one memfd, each case at a 2 MiB boundary.
    // SAFETY: a memfd and mappings of this test's own, unmapped at the end.
    let host: Vec<(i32, usize)> = unsafe {
        let fd = libc::memfd_create(c"collapse".as_ptr(), 0);
        assert!(fd >= 0 && libc::ftruncate(fd, (8 * pmd) as i64) == 0);
        let out = cases
            .clone()
            .map(|(_, off, fill, nohuge)| {
                let r = libc::mmap(
                    std::ptr::null_mut(),
                    (3 * pmd) as usize,
                    0,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                let a = ((r as u64 + pmd - 1) & !(pmd - 1)) as *mut libc::c_void;
                let m = libc::mmap(a, pmd as usize, 3, libc::MAP_SHARED | libc::MAP_FIXED, fd, off as i64);
                assert_eq!(m, a);
                if fill {
                    std::ptr::write_bytes(m.cast::<u8>(), 1, pmd as usize);
                }
                if nohuge {
                    libc::madvise(m, pmd as usize, libc::MADV_NOHUGEPAGE);
                }
                let rc = libc::madvise(m, pmd as usize, 25);
                let e = if rc == 0 { 0 } else { *libc::__errno_location() };
                let mut v = vec![0u8; 512];
                libc::mincore(m, pmd as usize, v.as_mut_ptr());
                libc::munmap(r, (3 * pmd) as usize);
                (e, v.iter().filter(|&&b| b & 1 == 1).count())
            })
            .collect();
        libc::close(fd);
        out
    };
    let p = phys(64);
    let mm = mm_with(&p, FaultPolicy::default());
    let f = File::create(&p, "/memfd:collapse (deleted)", 8 * pmd).unwrap();
    let of = OpenFile::read_write(&f);
    let mut cpu = Cpu::attached(&mm);
    for ((what, off, fill, nohuge), host) in cases.zip(host) {
        let r = mm.mmap(0, 3 * pmd, PROT_NONE, ANON, None, 0).unwrap();
        let a = (r + pmd - 1) & !(pmd - 1);
        mm.mmap(a, pmd, RW, MAP_SHARED | MAP_FIXED, Some(&of), off).unwrap();
        if fill {
            for pg in 0..512 {
                cpu.write_u8(a + pg * PAGE, 1).unwrap();
            }
        }
        if nohuge {
            mm.madvise(a, pmd, MADV_NOHUGEPAGE).unwrap();
        }
        let e = mm.madvise(a, pmd, MADV_COLLAPSE).err().map_or(0, |e| e.code());
        let mut v = vec![0u8; 512];
        mm.mincore(a, pmd, &mut v).unwrap();
        assert_eq!((e, v.iter().filter(|&&b| b == 1).count()), host, "{what}: softmm against the host");
        mm.munmap(r, 3 * pmd).unwrap();
    }
    drop(cpu);
    drop(mm);
    drop((f, of));
    assert_no_leaks(&p);
}

#[test]
fn guard_regions_behave_as_linux_6_18() {
    for &policy in FaultPolicy::ALL {
        guard_regions_behave_as_linux_6_18_with(policy);
    }
}

/// `MADV_GUARD_INSTALL`/`REMOVE` (Linux 6.13+): a guard marker makes any
/// access in an accessible VMA raise SIGSEGV with `SEGV_MAPERR` (an
/// inaccessible VMA still gives `SEGV_ACCERR` first); installing zaps the
/// pages there; markers survive `MADV_DONTNEED`, `MADV_FREE`, `mprotect`
/// and truncation, move with `mremap`, are copied by `fork` (not into a
/// `MADV_WIPEONFORK` VMA), make `MADV_POPULATE_*` fail with `EFAULT`, count
/// neither as resident in mincore nor in `Rss`, and go with `munmap` and
/// `MADV_GUARD_REMOVE`. Installing is refused on locked VMAs (`EINVAL`),
/// removing is not. Each expectation was observed on the host (Linux 6.18).
fn guard_regions_behave_as_linux_6_18_with(policy: FaultPolicy) {
    let p = phys(8);
    let mm = mm_with(&p, policy);
    fn maperr<T>(a: u64) -> Result<T, Fault> {
        Err(segv(a, SegvCode::MapErr))
    }
    let a = mm.mmap(0, 4 * PAGE, RW, ANON, None, 0).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        for i in 0..4 {
            cpu.write_u8(a + i * PAGE, 7).unwrap();
        }
        assert_eq!(mm.madvise(a + PAGE, 2 * PAGE, MADV_GUARD_INSTALL), Ok(()));
        assert_eq!(cpu.read_u8(a + PAGE + 3), maperr(a + PAGE + 3));
        assert_eq!(cpu.write_u8(a + 2 * PAGE, 1), maperr(a + 2 * PAGE));
        assert_eq!(cpu.read_u8(a), Ok(7));
        let mut v = [9; 4];
        mm.mincore(a, 4 * PAGE, &mut v).unwrap();
        assert_eq!(v, [1, 0, 0, 1], "installing zapped the pages");
        assert_eq!(mm.maps()[0].rss, 2 * PAGE, "markers are not resident");
        // Idempotent, and kept by DONTNEED, FREE and mprotect.
        assert_eq!(mm.madvise(a + PAGE, PAGE, MADV_GUARD_INSTALL), Ok(()));
        assert_eq!(mm.madvise(a, 4 * PAGE, MADV_DONTNEED), Ok(()));
        assert_eq!(mm.madvise(a, 4 * PAGE, MADV_FREE), Ok(()));
        assert_eq!(cpu.read_u8(a + PAGE), maperr(a + PAGE));
        assert_eq!(mm.madvise(a, 4 * PAGE, MADV_POPULATE_READ), Err(Errno::Fault));
        assert_eq!(mm.madvise(a, 4 * PAGE, MADV_POPULATE_WRITE), Err(Errno::Fault));
        mm.mprotect(a, 4 * PAGE, PROT_READ).unwrap();
        assert_eq!(cpu.read_u8(a + PAGE), maperr(a + PAGE));
        mm.mprotect(a, 4 * PAGE, PROT_NONE).unwrap();
        assert_eq!(cpu.read_u8(a + PAGE), Err(segv(a + PAGE, SegvCode::AccErr)), "the VMA's check comes first");
        mm.mprotect(a, 4 * PAGE, RW).unwrap();
    }
    // mremap moves the markers with the pages.
    let b = mm.mremap(a, 4 * PAGE, 4 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, a - 100 * PAGE).unwrap();
    // fork copies them; a WIPEONFORK VMA's child gets none.
    let child = mm.fork().unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        assert_eq!(cpu.read_u8(b + PAGE), maperr(b + PAGE));
        assert_eq!(cpu.read_u8(b), Ok(0));
        let mut ccpu = Cpu::attached(&child);
        assert_eq!(ccpu.read_u8(b + 2 * PAGE), maperr(b + 2 * PAGE), "fork copied the marker");
    }
    drop(child);
    mm.madvise(b, 4 * PAGE, MADV_WIPEONFORK).unwrap();
    let child = mm.fork().unwrap();
    assert_eq!(Cpu::attached(&child).read_u8(b + PAGE), Ok(0), "wiped in the child");
    drop(child);
    mm.madvise(b, 4 * PAGE, MADV_KEEPONFORK).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        // GUARD_REMOVE: the page is empty again.
        assert_eq!(mm.madvise(b + PAGE, PAGE, MADV_GUARD_REMOVE), Ok(()));
        assert_eq!(cpu.read_u8(b + PAGE), Ok(0));
        // munmap removes markers, also in a page table another VMA keeps.
        assert_eq!(cpu.read_u8(b + 2 * PAGE), maperr(b + 2 * PAGE));
        mm.munmap(b + 2 * PAGE, PAGE).unwrap();
        mm.mmap(b + 2 * PAGE, PAGE, RW, ANON | MAP_FIXED, None, 0).unwrap();
        assert_eq!(cpu.read_u8(b + 2 * PAGE), Ok(0));
        // A range with a hole: the mapped part is guarded, then ENOMEM.
        mm.munmap(b + 3 * PAGE, PAGE).unwrap();
        assert_eq!(mm.madvise(b, 8 * PAGE, MADV_GUARD_INSTALL), Err(Errno::NoMem));
        assert_eq!(cpu.read_u8(b), maperr(b));
    }
    mm.munmap(b, 4 * PAGE).unwrap();
    // Locked VMAs refuse installing but allow removing.
    let l = mm.mmap(0, 4 * PAGE, RW, ANON | MAP_LOCKED, None, 0).unwrap();
    assert_eq!(mm.madvise(l, 4 * PAGE, MADV_GUARD_INSTALL), Err(Errno::Inval));
    assert_eq!(mm.madvise(l, 4 * PAGE, MADV_GUARD_REMOVE), Ok(()));
    let mut v = [9; 4];
    mm.mincore(l, 4 * PAGE, &mut v).unwrap();
    assert_eq!(v, [1; 4], "the refused install zapped nothing");
    mm.munmap(l, 4 * PAGE).unwrap();
    // Shared and private file mappings, and read-only ones, take markers too.
    let f = File::create(&p, "/memfd:x (deleted)", 0).unwrap();
    f.write_at(0, &[7; 4 * PAGE as usize]).unwrap();
    let of = OpenFile::read_write(&f);
    let ro = OpenFile::read_only(&f);
    let s = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED, Some(&of), 0).unwrap();
    let r = mm.mmap(0, 4 * PAGE, PROT_READ, MAP_SHARED, Some(&ro), 0).unwrap();
    let pr = mm.mmap(0, 4 * PAGE, RW, MAP_PRIVATE, Some(&of), 0).unwrap();
    let sa = mm.mmap(0, 4 * PAGE, RW, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(pr + PAGE, 9).unwrap();
        for m in [s, r, pr, sa] {
            assert_eq!(mm.madvise(m + PAGE, PAGE, MADV_GUARD_INSTALL), Ok(()));
            assert_eq!(cpu.read_u8(m + PAGE), maperr(m + PAGE));
        }
        let mut v = [9; 4];
        mm.mincore(s, 4 * PAGE, &mut v).unwrap();
        assert_eq!(v, [1; 4], "a guarded file page still counts by the page cache");
        let child = mm.fork().unwrap();
        let mut ccpu = Cpu::attached(&child);
        for m in [s, r, pr, sa] {
            assert_eq!(ccpu.read_u8(m + PAGE), maperr(m + PAGE), "fork copies file and shared markers");
        }
        drop(ccpu);
        drop(child);
        f.set_len(PAGE).unwrap();
        f.set_len(4 * PAGE).unwrap();
        assert_eq!(cpu.read_u8(s + PAGE), maperr(s + PAGE), "truncate keeps markers");
        f.write_at(PAGE, &[7]).unwrap();
        assert_eq!(mm.madvise(s + PAGE, PAGE, MADV_GUARD_REMOVE), Ok(()));
        assert_eq!(cpu.read_u8(s + PAGE), Ok(7), "the file shows through again");
        assert_eq!(mm.madvise(pr + PAGE, PAGE, MADV_GUARD_REMOVE), Ok(()));
        assert_eq!(cpu.read_u8(pr + PAGE), Ok(7), "the private copy was zapped; the file shows");
    }
    drop(mm);
    drop((f, of, ro));
    assert_no_leaks(&p);
}
