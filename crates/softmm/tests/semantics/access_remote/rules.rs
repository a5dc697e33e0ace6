use super::*;

/// A loader's write into read-only private text breaks COW from the
/// file: the guest sees the new bytes, still read-only and executable,
/// and the file keeps its own.
#[test]
fn forced_write_into_private_file_text_breaks_cow() {
    let phys = phys(4);
    let file = File::create(&phys, "elf", 2 * PAGE).unwrap();
    file.write_at(0, &[0x90; 16]).unwrap();
    let mm = mm(&phys);
    let ro = OpenFile::read_only(&file);
    let text = mm.mmap(0, 2 * PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE, Some(&ro), 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.fetch_le::<u8>(text + 1).unwrap(), 0x90); // maps the page-cache page
    assert_eq!(mm.access_remote_write(text + 1, &[0xcc, 0xcc], false), 0);
    assert_eq!(mm.access_remote_write(text + 1, &[0xcc, 0xcc], true), 2);
    assert_eq!(cpu.fetch_le::<u16>(text + 1).unwrap(), 0xcccc);
    assert_eq!(cpu.read_u8(text).unwrap(), 0x90);
    assert_eq!(cpu.write_u8(text, 1), Err(Fault::Segv { addr: text, code: SegvCode::AccErr }));
    let mut f = [0u8; 4];
    file.read_at(0, &mut f).unwrap();
    assert_eq!(f, [0x90; 4]);
    // The VMA is unchanged.
    let maps = mm.maps();
    assert_eq!(maps.len(), 1);
    assert_eq!(maps[0].perms, "r-xp");
    drop((cpu, mm, ro, file));
    assert_no_leaks(&phys);
}

/// A forced write in a forked child changes the child's copy only.
#[test]
fn forced_write_after_fork_stays_in_its_address_space() {
    let phys = phys(4);
    let parent = mm(&phys);
    let a = parent.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    assert_eq!(parent.access_remote_write(a, &[7; 8], false), 8);
    parent.mprotect(a, PAGE, PROT_READ).unwrap();
    let child = parent.fork().unwrap();
    assert_eq!(child.access_remote_write(a, &[9; 8], true), 8);
    let (mut p, mut c) = ([0u8; 8], [0u8; 8]);
    assert_eq!(parent.access_remote_read(a, &mut p, false), 8);
    assert_eq!(child.access_remote_read(a, &mut c, false), 8);
    assert_eq!((p, c), ([7; 8], [9; 8]));
    // The parent's page is its own again; a second forced write reuses it.
    let used = phys.stats().frames_used;
    assert_eq!(parent.access_remote_write(a, &[8; 8], true), 8);
    assert_eq!(parent.access_remote_write(a, &[6; 8], true), 8);
    assert_eq!(phys.stats().frames_used, used);
    drop((parent, child));
    assert_no_leaks(&phys);
}

/// Shared mappings without `PROT_WRITE` are never written, forced or
/// not; a shared mapping of a read-only open is not even a COW mapping.
#[test]
fn forced_write_to_shared_read_only_mappings_fails() {
    let phys = phys(4);
    let file = File::create(&phys, "f", PAGE).unwrap();
    let mm = mm(&phys);
    let rw = OpenFile::read_write(&file);
    let ro = OpenFile::read_only(&file);
    let s = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&rw), 0).unwrap();
    let sro = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED, Some(&ro), 0).unwrap();
    let anon = mm.mmap(0, PAGE, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, None, 0).unwrap();
    for a in [s, sro, anon] {
        assert_eq!(mm.access_remote_write(a, &[1], true), 0, "{a:#x}");
        assert_eq!(mm.access_remote_read(a, &mut [0], true), 1);
    }
    // A writable shared mapping is written through to the file.
    let sw = mm.mmap(0, PAGE, RW, MAP_SHARED, Some(&rw), 0).unwrap();
    assert_eq!(mm.access_remote_write(sw + 5, &[3], false), 1);
    let mut b = [0u8];
    file.read_at(5, &mut b).unwrap();
    assert_eq!(b, [3]);
    drop((mm, rw, ro, file));
    assert_no_leaks(&phys);
}

/// `PROT_NONE` and execute-only memory reads only with `FOLL_FORCE`,
/// and stays inaccessible to the guest afterwards.
#[test]
fn forced_read_of_prot_none() {
    let phys = phys(4);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * PAGE, RW, ANON, None, 0).unwrap();
    assert_eq!(mm.access_remote_write(a + PAGE - 2, &[5; 4], false), 4);
    mm.mprotect(a, 2 * PAGE, PROT_NONE).unwrap();
    let mut b = [0u8; 6];
    assert_eq!(mm.access_remote_read(a + PAGE - 3, &mut b, false), 0);
    assert_eq!(mm.access_remote_read(a + PAGE - 3, &mut b, true), 6);
    assert_eq!(b, [0, 5, 5, 5, 5, 0]);
    // A forced write into PROT_NONE private memory is allowed too.
    assert_eq!(mm.access_remote_write(a, &[4], true), 1);
    let mut cpu = Cpu::attached(&mm);
    assert_eq!(cpu.read_u8(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    assert_eq!(cpu.read_u8(a + PAGE), Err(Fault::Segv { addr: a + PAGE, code: SegvCode::AccErr }));
    mm.mprotect(a, 2 * PAGE, PROT_READ).unwrap();
    assert_eq!(cpu.read_u8(a).unwrap(), 4);
    assert_eq!(cpu.read_u8(a + PAGE).unwrap(), 5);
    // Never touched, PROT_NONE: reads as zeros.
    let n = mm.mmap(0, PAGE, PROT_NONE, ANON, None, 0).unwrap();
    let mut z = [1u8; 3];
    assert_eq!(mm.access_remote_read(n, &mut z, true), 3);
    assert_eq!(z, [0; 3]);
    assert_eq!(cpu.read_u8(n), Err(Fault::Segv { addr: n, code: SegvCode::AccErr }));
    assert_eq!(mm.access_remote_write(n, &[1], true), 1);
    assert_eq!(cpu.read_u8(n), Err(Fault::Segv { addr: n, code: SegvCode::AccErr }));
    // A forced write leaves a read-only page read-only to the guest.
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    assert_eq!(mm.access_remote_write(a + 1, &[1], true), 1);
    assert_eq!(cpu.write_u8(a, 1), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// The copy stops at the first page it cannot have, and reports what
/// it did; the first page failing means 0.
#[test]
fn partial_copies_stop_at_holes_guards_and_eof() {
    let phys = phys(4);
    let mm = mm(&phys);
    let a = mm.mmap(0, 3 * PAGE, RW, ANON, None, 0).unwrap();
    mm.munmap(a + 2 * PAGE, PAGE).unwrap();
    assert_eq!(mm.access_remote_write(a + 2 * PAGE - 3, &[1; 8], true), 3);
    assert_eq!(mm.access_remote_read(a + 2 * PAGE - 3, &mut [0; 8], true), 3);
    assert_eq!(mm.access_remote_read(a + 2 * PAGE, &mut [0; 8], true), 0);
    mm.madvise(a + PAGE, PAGE, MADV_GUARD_INSTALL).unwrap();
    assert_eq!(mm.access_remote_read(a + PAGE - 2, &mut [0; 8], true), 2);
    let file = File::create(&phys, "short", PAGE).unwrap();
    let of = OpenFile::read_write(&file);
    let f = mm.mmap(0, 2 * PAGE, PROT_READ, MAP_PRIVATE, Some(&of), 0).unwrap();
    assert_eq!(mm.access_remote_read(f + PAGE - 1, &mut [0; 4], true), 1); // SIGBUS past EOF
    assert_eq!(mm.access_remote_write(f + PAGE - 1, &[1; 4], true), 1);
    assert_eq!(mm.access_remote_read(u64::MAX - 1, &mut [0; 4], true), 0);
    assert_eq!(mm.access_remote_write(0, &[], true), 0);
    drop((mm, of, file));
    assert_no_leaks(&phys);
}

/// An address just below a `MAP_GROWSDOWN` stack grows it, as
/// `__access_remote_vm`'s `expand_stack` does.
#[test]
fn access_below_a_growsdown_stack_grows_it() {
    let phys = phys(4);
    let mm = mm(&phys);
    let s = mm.mmap(0, 4 * PAGE, RW, ANON | MAP_GROWSDOWN, None, 0).unwrap();
    assert_eq!(mm.access_remote_write(s - 10, &[2; 10], false), 10);
    assert_eq!(mm.maps()[0].start, s - PAGE);
    drop(mm);
    assert_no_leaks(&phys);
}
