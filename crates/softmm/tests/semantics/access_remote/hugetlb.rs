use super::*;
use softmm::PhysConfig;

const HP: u64 = 2 << 20;
const PRIVATE_HUGE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;

fn pool(huge: u64) -> Arc<softmm::PhysMem> {
    softmm::PhysMem::new(PhysConfig::new((8 << 20) + (huge + 1) * HP).hugepages(huge)).unwrap()
}

#[test]
fn forced_reads_and_writes_reach_the_subpage_of_a_huge_page() {
    let phys = pool(4);
    let mm = mm(&phys);
    let a = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a + 5 * PAGE + 8, 0x1122_3344_5566_7788).unwrap();
    cpu.write_u64(a + HP, 0x99).unwrap();
    // A write through gup (no force needed: the VMA is writable) lands
    // in the subpage of its address, across the boundary of two huge
    // pages too.
    assert_eq!(mm.access_remote_write(a + 5 * PAGE + 16, &[0xab; 4], false), 4);
    assert_eq!(cpu.read_u32(a + 5 * PAGE + 16), Ok(0xabab_abab));
    assert_eq!(mm.access_remote_write(a + HP - 2, &[1, 2, 3, 4], false), 4);
    assert_eq!(cpu.read_u16(a + HP - 2), Ok(0x0201));
    assert_eq!(cpu.read_u64(a + HP), Ok(0x0403));
    // PROT_NONE: read only with FOLL_FORCE, and the guest still faults.
    mm.mprotect(a, 2 * HP, PROT_NONE).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(mm.access_remote_read(a + 5 * PAGE + 8, &mut buf, false), 0);
    assert_eq!(mm.access_remote_read(a + 5 * PAGE + 8, &mut buf, true), 16);
    assert_eq!(buf[..8], 0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(buf[8..12], [0xab; 4]);
    assert_eq!(cpu.read_u8(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
}

/// A forced write to a read-only private hugetlb mapping breaks COW as
/// for a small page: the fork child (and a file) keep the old bytes,
/// the page stays read-only to the guest. To a shared one it fails.
#[test]
fn forced_writes_break_cow_in_private_hugetlb_and_fail_in_shared() {
    let phys = pool(6);
    let f = File::create_hugetlbfs(&phys, "/text", HP).unwrap();
    let file = OpenFile::read_write(&f);
    let mm = mm(&phys);
    let private = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let shared = mm.mmap(0, HP, RW, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(private, 7).unwrap();
    cpu.write_u64(shared, 8).unwrap();
    let text = mm.mmap(0, HP, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_HUGETLB, Some(&file), 0).unwrap();
    assert_eq!(cpu.fetch_le::<u8>(text), Ok(0));
    mm.mprotect(private, HP, PROT_READ).unwrap();
    mm.mprotect(shared, HP, PROT_READ).unwrap();
    let child = mm.fork().unwrap();
    for a in [private, shared, text] {
        assert_eq!(mm.access_remote_write(a + 3 * PAGE, &[0xcc], false), 0, "{a:#x}");
    }
    // Shared: refused.
    assert_eq!(mm.access_remote_write(shared, &[0xcc], true), 0);
    assert_eq!(cpu.read_u64(shared), Ok(8));
    // Private anonymous, shared with the child since fork: a copy.
    assert_eq!(mm.access_remote_write(private + 3 * PAGE, &[0xcc], true), 1);
    assert_eq!(cpu.read_u8(private + 3 * PAGE), Ok(0xcc));
    assert_eq!(cpu.read_u64(private), Ok(7), "the copy keeps the rest of the huge page");
    assert_eq!(cpu.write_u8(private, 0), Err(Fault::Segv { addr: private, code: SegvCode::AccErr }));
    assert_eq!(Cpu::attached(&child).read_u8(private + 3 * PAGE), Ok(0));
    // Private text of a hugetlbfs file: a breakpoint, not in the file.
    assert_eq!(mm.access_remote_write(text + 5, &[0xcc], true), 1);
    assert_eq!(cpu.fetch_le::<u8>(text + 5), Ok(0xcc));
    let mut b = [1u8; 1];
    assert_eq!(f.read_at(5, &mut b), Ok(1));
    assert_eq!(b, [0]);
    drop((cpu, mm, child, file, f));
    assert_no_leaks(&phys);
}

/// A never-touched page of a `PROT_NONE` hugetlb VMA is faulted in by a
/// forced read (zeros); a write to a writable private huge page shared
/// with a fork child breaks COW for the writer only.
#[test]
fn forced_read_faults_a_huge_page_in_and_a_write_after_fork_breaks_cow() {
    let phys = pool(4);
    let mm = mm(&phys);
    let none = mm.mmap(0, HP, PROT_NONE, PRIVATE_HUGE, None, 0).unwrap();
    let mut buf = [1u8; 8];
    assert_eq!(mm.access_remote_read(none + 3 * PAGE, &mut buf, true), 8);
    assert_eq!(buf, [0; 8]);
    let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    Cpu::attached(&mm).write_u64(a + PAGE, 5).unwrap();
    let child = mm.fork().unwrap();
    assert_eq!(mm.access_remote_write(a + PAGE, &6u64.to_le_bytes(), false), 8);
    assert_eq!(Cpu::attached(&mm).read_u64(a + PAGE), Ok(6));
    assert_eq!(Cpu::attached(&child).read_u64(a + PAGE), Ok(5));
    drop((mm, child));
    assert_no_leaks(&phys);
}

/// The same steps on a host hugetlb mapping through `/proc/self/mem`
/// (`FOLL_FORCE`) and on softmm: a forced read of `PROT_NONE` works, a
/// forced write to a private `PROT_READ` or `PROT_NONE` one works (a
/// COW break), one to a shared `PROT_READ` one fails (`EIO`, 0 bytes
/// here). Linux 6.12 refused the private case too.
#[test]
fn forced_hugetlb_access_matches_the_host() {
    use std::os::unix::fs::FileExt;
    let _pool = match softmm_hostsys::HugePages::reserve(2) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipping the host comparison of forced hugetlb access: {e}");
            return;
        }
    };
    let mem = std::fs::OpenOptions::new().read(true).write(true).open("/proc/self/mem").unwrap();
    // SAFETY: a new private mapping, unmapped at the end of the test;
    // this test alone touches it.
    let h = unsafe { libc::mmap(std::ptr::null_mut(), HP as usize, RW, PRIVATE_HUGE, -1, 0) };
    assert_ne!(h, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let h = h as u64;
    // Each step: (protection, write?) -> bytes done (0 for an error).
    let plan = [(RW, true), (PROT_NONE, false), (PROT_READ, true), (PROT_NONE, true), (RW, true), (PROT_READ, false)];
    let mut host = Vec::new();
    for (i, &(prot, write)) in plan.iter().enumerate() {
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { libc::mprotect(h as *mut libc::c_void, HP as usize, prot) }, 0);
        let at = h + 7 * PAGE + 4;
        let r = if write { mem.write_at(&[i as u8 + 1; 8], at) } else { mem.read_at(&mut [0u8; 8], at) };
        let mut got = [0u8; 8];
        // SAFETY: the mapping made above, made readable for the check.
        unsafe { libc::mprotect(h as *mut libc::c_void, HP as usize, PROT_READ) };
        mem.read_at(&mut got, at).unwrap();
        host.push((r.unwrap_or(0), got));
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(h as *mut libc::c_void, HP as usize) };
    // A shared read-only one: refused.
    let shared_flags = MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB;
    // SAFETY: a new shared mapping, unmapped right after.
    let sh = unsafe { libc::mmap(std::ptr::null_mut(), HP as usize, PROT_READ, shared_flags, -1, 0) };
    assert_ne!(sh, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let host_shared = mem.write_at(&[9; 8], sh as u64 + PAGE).map_err(|e| e.raw_os_error());
    // SAFETY: the mapping made just above.
    unsafe { libc::munmap(sh, HP as usize) };
    assert_eq!(host_shared, Err(Some(libc::EIO)));

    let phys = pool(3);
    let mm = mm(&phys);
    let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut ours = Vec::new();
    for (i, &(prot, write)) in plan.iter().enumerate() {
        mm.mprotect(a, HP, prot).unwrap();
        let at = a + 7 * PAGE + 4;
        let n = if write {
            mm.access_remote_write(at, &[i as u8 + 1; 8], true)
        } else {
            mm.access_remote_read(at, &mut [0u8; 8], true)
        };
        let mut got = [0u8; 8];
        assert_eq!(mm.access_remote_read(at, &mut got, true), 8);
        ours.push((n, got));
    }
    assert_eq!(ours, host, "(bytes done, contents after) per step of {plan:?}");
    let sh = mm.mmap(0, HP, PROT_READ, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    assert_eq!(mm.access_remote_write(sh + PAGE, &[9; 8], true), 0, "the host's EIO");
    drop(mm);
    assert_no_leaks(&phys);
}

/// A forced write to a `PROT_NONE` private huge page that is not yet
/// the process's own: one never touched, and one shared with a fork
/// child. The host (`/proc/self/mem`) copies both (the child keeps its
/// bytes, the parent's page stays inaccessible); softmm must too.
#[test]
fn forced_write_to_a_prot_none_huge_page_not_yet_own_matches_the_host() {
    use std::os::unix::fs::FileExt;
    let _pool = match softmm_hostsys::HugePages::reserve(4) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipping the host comparison of forced hugetlb writes: {e}");
            return;
        }
    };
    let mem = std::fs::OpenOptions::new().read(true).write(true).open("/proc/self/mem").unwrap();
    let at = 7 * PAGE + 4;
    // (bytes written by the forced write, the parent's 8 bytes after it,
    // the child's 8 bytes after it, the parent's guest access faults).
    let host = {
        // SAFETY: new private mappings, unmapped at the end of this block;
        // this test alone touches them.
        let fresh = unsafe { libc::mmap(std::ptr::null_mut(), HP as usize, PROT_NONE, PRIVATE_HUGE, -1, 0) };
        assert_ne!(fresh, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let fresh = fresh as u64;
        let w_fresh = mem.write_at(&[0x11; 8], fresh + at).unwrap_or(0);
        let mut got_fresh = [0u8; 8];
        mem.read_at(&mut got_fresh, fresh + at).unwrap();
        // SAFETY: as above.
        let forked = unsafe { libc::mmap(std::ptr::null_mut(), HP as usize, RW, PRIVATE_HUGE, -1, 0) };
        assert_ne!(forked, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let forked = forked as u64;
        // SAFETY: inside the mapping made just above, which is writable.
        unsafe { std::ptr::write_bytes((forked + at) as *mut u8, 0x22, 8) };
        let (go, back) = (pipe(), pipe());
        // SAFETY: the child calls only async-signal-safe functions
        // (`read`, `write`, `_exit`) and reads its own memory.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut b = [0u8; 8];
            // SAFETY: the pipes made before the fork; the mapping the
            // child inherited, readable.
            unsafe {
                libc::read(go[0], b.as_mut_ptr().cast(), 1);
                std::ptr::copy_nonoverlapping((forked + at) as *const u8, b.as_mut_ptr(), 8);
                libc::write(back[1], b.as_ptr().cast(), 8);
                libc::_exit(0);
            }
        }
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { libc::mprotect(forked as *mut libc::c_void, HP as usize, PROT_NONE) }, 0);
        let w_forked = mem.write_at(&[0x33; 8], forked + at).unwrap_or(0);
        let mut got_forked = [0u8; 8];
        mem.read_at(&mut got_forked, forked + at).unwrap();
        let mut child = [0u8; 8];
        // SAFETY: the pipes made above; `waitpid` on our own child.
        unsafe {
            libc::write(go[1], [0u8].as_ptr().cast(), 1);
            assert_eq!(libc::read(back[0], child.as_mut_ptr().cast(), 8), 8);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            go.iter().chain(&back).for_each(|&fd| {
                libc::close(fd);
            });
            libc::munmap(fresh as *mut libc::c_void, HP as usize);
            libc::munmap(forked as *mut libc::c_void, HP as usize);
        }
        [(w_fresh, got_fresh, None), (w_forked, got_forked, Some(child))]
    };

    let phys = pool(4);
    let mm = mm(&phys);
    let fresh = mm.mmap(0, HP, PROT_NONE, PRIVATE_HUGE, None, 0).unwrap();
    let w_fresh = mm.access_remote_write(fresh + at, &[0x11; 8], true);
    let mut got_fresh = [0u8; 8];
    assert_eq!(mm.access_remote_read(fresh + at, &mut got_fresh, true), 8);
    let forked = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write(forked + at, &[0x22; 8]).unwrap();
    let child = mm.fork().unwrap();
    mm.mprotect(forked, HP, PROT_NONE).unwrap();
    let w_forked = mm.access_remote_write(forked + at, &[0x33; 8], true);
    let mut got_forked = [0u8; 8];
    assert_eq!(mm.access_remote_read(forked + at, &mut got_forked, true), 8);
    let mut in_child = [0u8; 8];
    Cpu::attached(&child).read(forked + at, &mut in_child).unwrap();
    let ours = [(w_fresh, got_fresh, None), (w_forked, got_forked, Some(in_child))];
    assert_eq!(ours, host, "(bytes written, parent's bytes, child's bytes): fresh page, page shared with a child");
    for a in [fresh, forked] {
        assert_eq!(cpu.read_u8(a + at), Err(Fault::Segv { addr: a + at, code: SegvCode::AccErr }));
    }
    drop((cpu, child, mm));
    assert_no_leaks(&phys);
}

fn pipe() -> [i32; 2] {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    fds
}
