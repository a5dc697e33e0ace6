use super::*;
use softmm::{File, OpenFile};
use softmm_hostsys::{pool_counters, HugePages};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

/// Pages the test reserves on the host.
const PAGES: usize = 4;

/// Host setup in one place: the reservation and its mount, or why not.
fn host_pool() -> Option<HugePages> {
    match HugePages::reserve_with_mount(PAGES) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipping the hugetlb host comparison: {e}");
            None
        }
    }
}

/// A host call's outcome as softmm reports one: the value or the errno.
fn host<T>(ok: bool, v: T) -> Result<T, Errno> {
    if ok {
        Ok(v)
    } else {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Err(errno(e))
    }
}

fn errno(e: i32) -> Errno {
    match e {
        libc::EINVAL => Errno::Inval,
        libc::ENOMEM => Errno::NoMem,
        libc::EOPNOTSUPP => Errno::OpNotSupp,
        libc::ENOSPC => Errno::NoSpc,
        libc::EBADF => Errno::BadF,
        libc::EFAULT => Errno::Fault,
        other => panic!("host errno {other} not expected by this test"),
    }
}

fn h_mmap(addr: u64, len: u64, prot: i32, flags: i32, fd: i32, off: u64) -> Result<u64, Errno> {
    // SAFETY: a new mapping; MAP_FIXED is used only at addresses this
    // test mapped itself (or inside a window it reserved).
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len as usize, prot, flags, fd, off as i64) };
    host(p != libc::MAP_FAILED, p as u64)
}

fn h_munmap(a: u64, len: u64) -> Result<(), Errno> {
    // SAFETY: ranges of mappings this test made.
    host(unsafe { libc::munmap(a as *mut libc::c_void, len as usize) } == 0, ())
}

fn h_mprotect(a: u64, len: u64, prot: i32) -> Result<(), Errno> {
    // SAFETY: as for munmap.
    host(unsafe { libc::mprotect(a as *mut libc::c_void, len as usize, prot) } == 0, ())
}

fn h_madvise(a: u64, len: u64, advice: i32) -> Result<(), Errno> {
    // SAFETY: as for munmap; the advice drops only this test's pages.
    host(unsafe { libc::madvise(a as *mut libc::c_void, len as usize, advice) } == 0, ())
}

fn h_mremap(a: u64, old: u64, new: u64, flags: i32, to: u64) -> Result<u64, Errno> {
    // SAFETY: as for munmap.
    let p = unsafe { libc::mremap(a as *mut libc::c_void, old as usize, new as usize, flags, to as *mut libc::c_void) };
    host(p != libc::MAP_FAILED, p as u64)
}

/// The host's maps lines: (start, end, perms, name).
fn host_maps() -> Vec<(u64, u64, String, String)> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (s, e) = range.split_once('-')?;
            let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
            let name = f.nth(3).map(|_| l.splitn(6, char::is_whitespace).last().unwrap_or("").trim().to_string());
            Some((s, e, perms.to_string(), name.unwrap_or_default()))
        })
        .collect()
}

/// The host's maps line for the mapping at `a`: (length, perms, name).
fn h_maps(a: u64) -> Option<(u64, String, String)> {
    host_maps().into_iter().find(|m| m.0 == a).map(|(s, e, perms, name)| (e - s, perms, name))
}

fn s_maps(mm: &AddressSpace, a: u64) -> Option<(u64, String, String)> {
    mm.maps().into_iter().find(|e| e.start == a).map(|e| (e.end - e.start, e.perms.clone(), e.name.clone()))
}

/// The host pool's (free, rsvd) beyond what it had at `base`.
fn h_counts(base: (u64, u64)) -> (i64, i64) {
    let c = pool_counters().unwrap();
    (c.free as i64 - base.0 as i64, c.rsvd as i64 - base.1 as i64)
}

fn s_counts(phys: &PhysMem, pages: u64) -> (i64, i64) {
    let s = phys.huge_page_stats();
    (s.free as i64 - pages as i64, s.rsvd as i64)
}

/// How many of `n` huge pages of a fresh `MAP_NORESERVE` mapping a child
/// process touches before it dies of SIGBUS (`n` if none).
fn h_noreserve_touches(n: u64, shared: bool) -> u64 {
    let mut fds = [0; 2];
    // SAFETY: a pipe for the child's progress; fork in a test is safe
    // because the child only touches memory and writes to the pipe.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let pid = libc::fork();
        if pid == 0 {
            let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
            let flags = kind | MAP_ANONYMOUS | MAP_HUGETLB | MAP_NORESERVE;
            let p = libc::mmap(std::ptr::null_mut(), (n * HP) as usize, RW, flags, -1, 0);
            if p == libc::MAP_FAILED {
                libc::_exit(2);
            }
            for i in 0..n {
                std::ptr::write_volatile((p as *mut u8).add((i * HP) as usize), 1);
                libc::write(fds[1], b"x".as_ptr().cast(), 1);
            }
            libc::_exit(0);
        }
        libc::close(fds[1]);
        let mut done = 0u64;
        let mut b = [0u8; 64];
        loop {
            let r = libc::read(fds[0], b.as_mut_ptr().cast(), b.len());
            if r <= 0 {
                break;
            }
            done += r as u64;
        }
        libc::close(fds[0]);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
                || libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "child status {status:#x}"
        );
        done
    }
}

/// Runs `f` in a forked child that exits with what `f` returns, and
/// says how the child ended: `Ok(exit status)` or `Err(signal)`. `f`
/// makes system calls and touches memory only: another thread of the
/// test may have held a lock (the allocator's) at the fork.
fn h_in_child(f: impl FnOnce() -> i32) -> Result<i32, i32> {
    // SAFETY: the child runs `f` and exits; the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            libc::_exit(f());
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        if libc::WIFSIGNALED(status) {
            Err(libc::WTERMSIG(status))
        } else {
            Ok(libc::WEXITSTATUS(status))
        }
    }
}

/// The host pool as [`host_pool`] leaves it, with every page but
/// `left` taken by a populated private mapping (returned, to unmap), or
/// `None` (saying why) where the host had free huge pages of its own,
/// which would change the outcomes.
fn host_pool_with(guard: &HugePages, left: u64) -> Option<(u64, u64)> {
    let c = pool_counters().unwrap();
    if c.free != guard.pages() as u64 || c.rsvd != 0 {
        eprintln!("skipped: the host pool had free or reserved pages of its own: {c:?}");
        return None;
    }
    let n = guard.pages() as u64 - left;
    let filler = h_mmap(0, n * HP, RW, PRIVATE_HUGE | MAP_POPULATE, -1, 0).unwrap();
    Some((filler, n))
}

/// A child process that waits until the returned pipe end is closed,
/// then exits; the caller waits for it with [`reap`].
fn h_fork_waiting() -> (libc::pid_t, i32) {
    let mut fds = [0; 2];
    // SAFETY: the child only blocks on the pipe and exits
    // (async-signal-safe calls only, as a fork of a threaded test needs).
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let pid = libc::fork();
        if pid == 0 {
            libc::close(fds[1]);
            let mut b = [0u8; 1];
            libc::read(fds[0], b.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
        libc::close(fds[0]);
        (pid, fds[1])
    }
}

/// Lets the child of [`h_fork_waiting`] exit and waits for it.
fn reap((pid, fd): (libc::pid_t, i32)) {
    let mut status = 0;
    // SAFETY: our pipe end and our child.
    unsafe {
        libc::close(fd);
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
    }
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
}

/// The owner of a private mapping zaps (`MADV_DONTNEED`) a page its
/// child still maps, then the child exits: the page comes back to the
/// pool reserved for the owner, so a mapping that needs both free pages
/// is `ENOMEM` and the owner's refault finds its page. (free, rsvd)
/// beyond the filler after each step, and the two calls' results.
#[test]
fn a_zap_in_the_owner_restores_a_shared_page_s_reservation_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let Some((filler, n)) = host_pool_with(&guard, 2) else { return };
    // The pool holds only the guard's pages (checked): counts are absolute.
    let base = (0, 0);
    let a = h_mmap(0, HP, RW, PRIVATE_HUGE, -1, 0).unwrap();
    // SAFETY: the mapping just made.
    unsafe { std::ptr::write_volatile(a as *mut u64, 7) };
    let child = h_fork_waiting();
    h_madvise(a, HP, MADV_DONTNEED).unwrap();
    let zapped = h_counts(base);
    reap(child);
    let exited = h_counts(base);
    let both = h_mmap(0, 2 * HP, RW, PRIVATE_HUGE, -1, 0).map(|b| h_munmap(b, 2 * HP).map(|_| 0));
    // SAFETY: as above.
    let refault = unsafe { std::ptr::read_volatile(a as *const u64) };
    let after = h_counts(base);
    h_munmap(a, HP).unwrap();
    h_munmap(filler, n * HP).unwrap();
    let host = (zapped, exited, both.is_err(), refault, after);

    let phys = pool(PAGES as u64);
    let owner = super::mm(&phys);
    let fill = owner.mmap(0, n * HP, RW, PRIVATE_HUGE | MAP_POPULATE, None, 0).unwrap();
    // Both pools hold only this test's pages: counts are absolute.
    let counts = |phys: &PhysMem| {
        let s = phys.huge_page_stats();
        (s.free as i64, s.rsvd as i64)
    };
    let a = owner.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&owner);
    cpu.write_u64(a, 7).unwrap();
    let child = owner.fork().unwrap();
    owner.madvise(a, HP, MADV_DONTNEED).unwrap();
    let zapped = counts(&phys);
    drop(child);
    let exited = counts(&phys);
    let both = owner.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0);
    let refault = cpu.read_u64(a).unwrap();
    let after = counts(&phys);
    let soft = (zapped, exited, both.is_err(), refault, after);
    assert_eq!(host, ((1, 0), (2, 1), true, 0, (1, 0)), "the host's own outcome changed");
    assert_eq!(soft, host);
    drop(cpu);
    owner.munmap(fill, n * HP).unwrap();
    drop(guard);
}

/// With the pool empty, an owner's write to its page after its child
/// exited reuses the page even while a `vmsplice` (a `get_user_pages`
/// reference) holds part of it, and the reference sees the write: the
/// page is mapped once (`hugetlb_wp` reads the map count, not the
/// reference count).
#[test]
fn an_owner_reuses_a_page_a_gup_reference_holds_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let Some((filler, n)) = host_pool_with(&guard, 1) else { return };
    let a = h_mmap(0, HP, RW, PRIVATE_HUGE, -1, 0).unwrap();
    // SAFETY: the mapping just made; the child of `h_fork_waiting`
    // exits without touching it; the pipe holds the spliced page.
    let host = unsafe {
        std::ptr::write_volatile(a as *mut u64, 1);
        reap(h_fork_waiting());
        let mut fds = [0; 2];
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let iov = libc::iovec { iov_base: (a + PAGE) as *mut libc::c_void, iov_len: PAGE as usize };
        assert_eq!(libc::vmsplice(fds[1], &iov, 1, 0), PAGE as isize);
        std::ptr::write_volatile((a + PAGE) as *mut u64, 2);
        let mut b = [0u8; 8];
        assert_eq!(libc::read(fds[0], b.as_mut_ptr().cast(), 8), 8);
        libc::close(fds[0]);
        libc::close(fds[1]);
        (u64::from_le_bytes(b), pool_counters().unwrap().free)
    };
    h_munmap(a, HP).unwrap();
    h_munmap(filler, n * HP).unwrap();

    let phys = pool(PAGES as u64);
    let owner = super::mm(&phys);
    let fill = owner.mmap(0, n * HP, RW, PRIVATE_HUGE | MAP_POPULATE, None, 0).unwrap();
    let a = owner.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&owner);
    cpu.write_u64(a, 1).unwrap();
    drop(owner.fork().unwrap());
    let got = owner.get_user_pages(a + PAGE, 1, softmm::Foll::empty()).unwrap();
    cpu.write_u64(a + PAGE, 2).unwrap();
    let mut b = [0u8; 8];
    got.read(0, &mut b).unwrap();
    let soft = (u64::from_le_bytes(b), phys.huge_page_stats().free);
    assert_eq!(host, (2, 0), "the host's own outcome changed");
    assert_eq!(soft, host);
    drop((got, cpu));
    owner.munmap(fill, n * HP).unwrap();
    drop(guard);
}

/// An anonymous `MAP_HUGETLB` mapping at a file offset: the first
/// access of a writable one (a write) and of a read-only one (a read),
/// each in a child on the host: the write finds its page, the read is
/// past the pseudo-file's end.
#[test]
fn an_anonymous_mapping_at_an_offset_faults_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let phys = pool(PAGES as u64);
    let mm = super::mm(&phys);
    let mut cpu = Cpu::attached(&mm);
    for flags in [PRIVATE_HUGE, SHARED_HUGE] {
        for prot in [RW, PROT_READ] {
            let write = prot & PROT_WRITE != 0;
            let host = h_in_child(|| {
                // SAFETY: a new mapping of the child's, accessed inside.
                unsafe {
                    let p = libc::mmap(std::ptr::null_mut(), HP as usize, prot, flags, -1, HP as i64);
                    if p == libc::MAP_FAILED {
                        return 2;
                    }
                    if write {
                        std::ptr::write_volatile(p as *mut u8, 1);
                    } else {
                        std::ptr::read_volatile(p as *const u8);
                    }
                }
                0
            });
            let a = mm.mmap(0, HP, prot, flags, None, HP).unwrap();
            let access = if write { cpu.write_u8(a, 1) } else { cpu.read_u8(a).map(drop) };
            let soft = match access {
                Ok(()) => Ok(0),
                Err(Fault::Bus { .. }) => Err(libc::SIGBUS),
                Err(f) => panic!("{f:?}"),
            };
            assert_eq!(soft, host, "flags {flags:#x}, prot {prot}");
            mm.munmap(a, HP).unwrap();
        }
    }
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
    drop(guard);
}

/// `MAP_HUGETLB | MAP_32BIT` and an unaligned hint, on the host and on
/// softmm: the mapping lands 2 MiB aligned in `[1 GiB, 2 GiB)` (the host
/// starts the window's search at a random page of its first 32 MiB, so
/// the range is compared, not the address); with the window full, or
/// with only an unaligned 2 MiB hole left (above the random start),
/// `ENOMEM`, while a small mapping of the same length fills that hole;
/// and a hint is rounded up to 2 MiB.
#[test]
fn map_32bit_and_hints_place_hugetlb_mappings_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let phys = pool(PAGES as u64);
    let mm = super::mm(&phys);
    let flags = PRIVATE_HUGE | MAP_NORESERVE | MAP_32BIT;
    let in_window = |a: Result<u64, Errno>| a.map(|a| a >= LOW32 && a + HP <= 2 * LOW32 && a % HP == 0);
    let (h, s) = (h_mmap(0, HP, RW, flags, -1, 0), mm.mmap(0, HP, RW, flags, None, 0));
    assert_eq!(in_window(h), Ok(true), "the host's own placement changed: {h:x?}");
    assert_eq!(in_window(s), Ok(true), "{s:x?}");
    assert_eq!(h_munmap(h.unwrap(), HP), mm.munmap(s.unwrap(), HP));
    // The window full: one mapping over all of it, where the host has
    // nothing there.
    let none = ANON | MAP_FIXED_NOREPLACE | MAP_NORESERVE;
    match h_mmap(LOW32, LOW32, PROT_NONE, none, -1, 0) {
        Ok(a) => {
            let window = HostWindow { base: a, len: LOW32 };
            assert_eq!(a, LOW32, "MAP_FIXED_NOREPLACE placed its mapping elsewhere");
            assert_eq!(mm.mmap(LOW32, LOW32, PROT_NONE, none, None, 0), Ok(LOW32));
            let (h, s) = (h_mmap(0, HP, RW, flags, -1, 0), mm.mmap(0, HP, RW, flags, None, 0));
            assert_eq!(h, Err(Errno::NoMem), "the host's own outcome changed");
            assert_eq!(s, h, "the window full");
            let hole = LOW32 + (64 << 20) + PAGE;
            assert_eq!(window.munmap(hole, HP), mm.munmap(hole, HP));
            let (h, s) = (h_mmap(0, HP, RW, flags, -1, 0), mm.mmap(0, HP, RW, flags, None, 0));
            assert_eq!(s, h, "an unaligned 2 MiB hole");
            let small = ANON | MAP_32BIT | MAP_NORESERVE;
            let (h, s) = (h_mmap(0, HP, PROT_NONE, small, -1, 0), mm.mmap(0, HP, PROT_NONE, small, None, 0));
            assert_eq!((h, s), (Ok(hole), Ok(hole)), "a small mapping fills the hole");
            assert_eq!(window.munmap(LOW32, LOW32), mm.munmap(LOW32, LOW32));
        }
        Err(e) => eprintln!("skipping the full window: [1 GiB, 2 GiB) is in use on the host ({e:?})"),
    }
    // An unaligned hint far from anything either side maps: rounded up.
    let hint = 0x5000_0000_0000 + PAGE;
    let flags = PRIVATE_HUGE | MAP_NORESERVE;
    let (h, s) = (h_mmap(hint, HP, RW, flags, -1, 0), mm.mmap(hint, HP, RW, flags, None, 0));
    assert_eq!(h, Ok(hint - PAGE + HP), "the host's own outcome changed");
    assert_eq!(s, h, "a hint");
    assert_eq!(h_munmap(h.unwrap(), HP), mm.munmap(s.unwrap(), HP));
    drop(mm);
    assert_no_leaks(&phys);
    drop(guard);
}

/// A `MAP_FIXED` mapping of a hugetlbfs file over the middle of a
/// hugetlb VMA, its split refused by the map count: on the host in a
/// child brought to `vm.max_map_count` (single pages of alternating
/// protection until `mmap` refuses, one unmapped again), on softmm with a
/// limit of 3. The errno, then `HugePages_Free/Rsvd` and the file's size
/// once the child is gone (a file's reservations and size outlive its
/// mappings), must agree: nothing reserved, the file not grown.
#[test]
fn a_fixed_mapping_refused_for_the_map_count_changes_nothing_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let dir = guard.mount_dir().expect("mounted").to_path_buf();
    let host_file = HostFile::create(&dir, "count");
    let fd = host_file.fd;
    let c = pool_counters().unwrap();
    let base = (c.free, c.rsvd);
    let fixed = MAP_SHARED | MAP_FIXED;
    let host_errno = h_in_child(|| {
        // SAFETY: the child's own mappings; MAP_FIXED only inside `v`.
        unsafe {
            let flags = PRIVATE_HUGE | MAP_NORESERVE;
            let v = libc::mmap(std::ptr::null_mut(), 4 * HP as usize, RW, flags, -1, 0);
            if v == libc::MAP_FAILED {
                return 100;
            }
            let (mut last, mut prot) = (std::ptr::null_mut(), PROT_READ);
            loop {
                let p = libc::mmap(std::ptr::null_mut(), PAGE as usize, prot, ANON, -1, 0);
                if p == libc::MAP_FAILED {
                    break;
                }
                (last, prot) = (p, prot ^ PROT_READ);
            }
            if *libc::__errno_location() != libc::ENOMEM || libc::munmap(last, PAGE as usize) != 0 {
                return 101;
            }
            let at = (v as *mut u8).add(HP as usize).cast();
            let r = libc::mmap(at, 2 * HP as usize, RW, fixed, fd, 6 * HP as i64);
            if r == libc::MAP_FAILED {
                *libc::__errno_location()
            } else {
                0
            }
        }
    });
    // SAFETY: `stat` is plain old data, valid all zeroes.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the file this test opened; fstat writes `st`.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    let host = (host_errno, h_counts(base), st.st_size as u64);
    assert_eq!(host.0, Ok(libc::ENOMEM), "the host's own outcome changed");

    let phys = pool(PAGES as u64);
    let mm = AddressSpace::new(&phys, MmConfig::default().max_map_count(3)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/count", 0).unwrap();
    let open = OpenFile::read_write(&f);
    let v = mm.mmap(0, 4 * HP, RW, PRIVATE_HUGE | MAP_NORESERVE, None, 0).unwrap();
    mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    mm.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
    let r = mm.mmap(v + HP, 2 * HP, RW, fixed, Some(&open), 6 * HP);
    let soft = (Ok(r.err().map_or(0, |e| e.code())), s_counts(&phys, PAGES as u64), f.len());
    assert_eq!(soft, host, "(errno, HugePages_Free/Rsvd, the file's size)");
    drop(mm);
    drop(open);
    phys.quiesce();
    drop(f);
    assert_no_leaks(&phys);
    drop(host_file);
    drop(guard);
}

fn s_noreserve_touches(pages: u64, n: u64, shared: bool) -> u64 {
    let phys = pool(pages);
    let mm = mm(&phys);
    let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
    let a = mm.mmap(0, n * HP, RW, kind | MAP_ANONYMOUS | MAP_HUGETLB | MAP_NORESERVE, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    (0..n).take_while(|i| cpu.write_u8(a + i * HP, 1).is_ok()).count() as u64
}

/// A file created in the test's hugetlbfs mount, closed and removed
/// (its pages back to the host's pool) when dropped.
struct HostFile {
    fd: i32,
    path: CString,
}

impl HostFile {
    fn create(dir: &std::path::Path, name: &str) -> HostFile {
        let path = CString::new(dir.join(name).as_os_str().as_bytes()).unwrap();
        // SAFETY: a new file in the mount this test owns.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600) };
        assert!(fd >= 0);
        HostFile { fd, path }
    }
}

impl Drop for HostFile {
    fn drop(&mut self) {
        // SAFETY: the descriptor and the path this test created.
        unsafe {
            libc::close(self.fd);
            libc::unlink(self.path.as_ptr());
        }
    }
}

/// A `PROT_NONE` range of the host's address space that a test reserves
/// and maps into with `MAP_FIXED`. Its `munmap` refuses a range it does
/// not hold: in a test binary whose other tests run on other threads, an
/// unmap past the reservation takes their mappings (or the allocator's)
/// from under them. It has no `Drop`: once the test has unmapped it, the
/// range may be another thread's.
struct HostWindow {
    base: u64,
    len: u64,
}

impl HostWindow {
    fn reserve(len: u64) -> HostWindow {
        let base = h_mmap(0, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0).unwrap();
        HostWindow { base, len }
    }

    /// The first `align`-aligned address of the window.
    fn aligned(&self, align: u64) -> u64 {
        self.base.next_multiple_of(align)
    }

    fn munmap(&self, a: u64, len: u64) -> Result<(), Errno> {
        assert!(
            a >= self.base && a + len <= self.base + self.len,
            "munmap of {a:#x}+{len:#x} reaches outside the window {:#x}+{:#x}",
            self.base,
            self.len
        );
        h_munmap(a, len)
    }
}

/// The VMAs of `[a, a + len)` in the host's maps, as (start - a, end - a, perms).
fn h_vmas(a: u64, len: u64) -> Vec<(u64, u64, String)> {
    host_maps().into_iter().filter(|&(s, e, _, _)| s < a + len && e > a).map(|(s, e, p, _)| (s - a, e - a, p)).collect()
}

fn s_vmas(mm: &AddressSpace, a: u64, len: u64) -> Vec<(u64, u64, String)> {
    mm.maps()
        .into_iter()
        .filter(|e| e.start < a + len && e.end > a)
        .map(|e| (e.start - a, e.end - a, e.perms.clone()))
        .collect()
}

/// hugetlb VMAs never merge: `hugetlbfs_file_mmap` sets
/// `VM_DONTEXPAND`, one of `VM_SPECIAL`. Neither a mapping of a file's
/// middle page between its two neighbours, nor a protection put back
/// to match both neighbours, joins them (so no merge has to carry a
/// VMA's `HPAGE_RESV_UNMAPPED` mark or reserve map into another).
#[test]
fn hugetlb_vmas_never_merge_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let dir = guard.mount_dir().expect("mounted").to_path_buf();
    let phys = pool(PAGES as u64);
    let mm = super::mm(&phys);
    let host_file = HostFile::create(&dir, "merge");
    let fd = host_file.fd;
    let f = File::create_hugetlbfs(&phys, "/merge", 0).unwrap();
    let open = OpenFile::read_write(&f);
    // SAFETY: the file just opened.
    assert_eq!(host(unsafe { libc::ftruncate(fd, 3 * HP as i64) } == 0, ()), f.set_len(3 * HP));
    // A 2 MiB-aligned run of 3 pages inside a 4-page PROT_NONE window.
    let window = HostWindow::reserve(4 * HP);
    let h = window.aligned(HP);
    let s_base = mm.mmap(0, 4 * HP, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    let s = s_base.next_multiple_of(HP);
    let fixed = MAP_SHARED | MAP_FIXED;
    for page in [0, 2, 1] {
        let (ha, sa) = (h + page * HP, s + page * HP);
        assert_eq!(h_mmap(ha, HP, RW, fixed, fd, page * HP), Ok(ha));
        assert_eq!(mm.mmap(sa, HP, RW, fixed, Some(&open), page * HP), Ok(sa));
    }
    assert_eq!(h_vmas(h, 3 * HP), s_vmas(&mm, s, 3 * HP), "the middle page mapped last");
    assert_eq!(h_mprotect(h + HP, HP, PROT_READ), mm.mprotect(s + HP, HP, PROT_READ));
    assert_eq!(h_mprotect(h, 3 * HP, RW), mm.mprotect(s, 3 * HP, RW));
    assert_eq!(h_vmas(h, 3 * HP), s_vmas(&mm, s, 3 * HP), "after mprotect there and back");
    assert_eq!(h_mprotect(h + HP, HP, PROT_READ), mm.mprotect(s + HP, HP, PROT_READ));
    assert_eq!(h_mprotect(h + HP, HP, RW), mm.mprotect(s + HP, HP, RW));
    assert_eq!(h_vmas(h, 3 * HP), s_vmas(&mm, s, 3 * HP), "after mprotect of the middle VMA alone");
    assert_eq!(window.munmap(window.base, 4 * HP), mm.munmap(s_base, 4 * HP));
    drop(host_file);
    drop(open);
    drop(f);
    drop(mm);
    assert_no_leaks(&phys);
    drop(guard);
}

#[test]
fn hugetlb_rules_match_the_host() {
    let Some(guard) = host_pool() else { return };
    let dir = guard.mount_dir().expect("mounted").to_path_buf();
    let c = pool_counters().unwrap();
    let base = (c.free, c.rsvd);
    let pages = c.free - c.rsvd;
    if pages > 64 {
        eprintln!("skipping the hugetlb host comparison: {pages} free host pages, more than the arena models");
        return;
    }
    let phys = pool(pages);
    let mm = mm(&phys);
    let shared = SHARED_HUGE;

    // mmap: rounding, placement alignment, the maps line.
    let h = h_mmap(0, 4096, RW, shared, -1, 0).unwrap();
    let s = mm.mmap(0, 4096, RW, shared, None, 0).unwrap();
    assert_eq!((h % HP, s % HP), (0, 0));
    let (hl, sl) = (h_maps(h).unwrap(), s_maps(&mm, s).unwrap());
    assert_eq!(hl, sl, "maps line (length, perms, name)");
    assert_eq!(h_counts(base), s_counts(&phys, pages), "one page reserved");
    // Faults consume the reservation.
    // SAFETY: the host mapping made above, 2 MiB long.
    unsafe { std::ptr::write_volatile(h as *mut u8, 1) };
    Cpu::attached(&mm).write_u8(s, 1).unwrap();
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after the fault");
    // Split rules on a 2 MiB VMA.
    assert_eq!(h_munmap(h, 4096), mm.munmap(s, 4096));
    assert_eq!(h_munmap(h + 4096, HP), mm.munmap(s + 4096, HP));
    assert_eq!(h_mprotect(h, 4096, PROT_READ), mm.mprotect(s, 4096, PROT_READ));
    assert_eq!(h_madvise(h + 4096, HP, MADV_DONTNEED), mm.madvise(s + 4096, HP, MADV_DONTNEED));
    assert_eq!(h_madvise(h, 4096, MADV_DONTNEED), mm.madvise(s, 4096, MADV_DONTNEED));
    assert_eq!(h_madvise(h, HP, MADV_FREE), mm.madvise(s, HP, MADV_FREE));
    assert_eq!(h_mremap(h, HP, 2 * HP, MREMAP_MAYMOVE, 0), mm.mremap(s, HP, 2 * HP, MREMAP_MAYMOVE, 0));
    assert_eq!(
        h_mremap(h + 4096, 4096, 4096, MREMAP_MAYMOVE, 0).map(|_| ()),
        mm.mremap(s + 4096, 4096, 4096, MREMAP_MAYMOVE, 0).map(|_| ())
    );
    assert_eq!(h_munmap(h, HP), mm.munmap(s, HP));
    // The pseudo-file goes after the VMA's grace period.
    drop(mm);
    phys.quiesce();
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after munmap");
    let mm = super::mm(&phys);

    // MADV_DONTNEED of a private page gives its reservation back.
    let flags = PRIVATE_HUGE;
    let (hp, sp) = (h_mmap(0, 2 * HP, RW, flags, -1, 0).unwrap(), mm.mmap(0, 2 * HP, RW, flags, None, 0).unwrap());
    let mut cpu = Cpu::attached(&mm);
    for i in 0..2 {
        // SAFETY: the host mapping made above, 4 MiB long.
        unsafe { std::ptr::write_volatile((hp + i * HP) as *mut u8, 1) };
        cpu.write_u8(sp + i * HP, 1).unwrap();
    }
    assert_eq!(h_counts(base), s_counts(&phys, pages), "private pages faulted");
    assert_eq!(h_madvise(hp, HP, MADV_DONTNEED), mm.madvise(sp, HP, MADV_DONTNEED));
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after MADV_DONTNEED of a private page");
    drop(cpu);
    assert_eq!(h_munmap(hp, 2 * HP), mm.munmap(sp, 2 * HP));
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after munmap of the private mapping");

    // Sizes and alignment of mmap itself.
    for (len, flags) in [(HP, shared | (22 << 26)), (HP, shared | MAP_FIXED)] {
        let fixed_at = if flags & MAP_FIXED != 0 { 0x7e00_0000_0000 + 4096 } else { 0 };
        let hr = h_mmap(fixed_at, len, RW, flags, -1, 0).map(|_| ());
        let sr = mm.mmap(fixed_at, len, RW, flags, None, 0).map(|_| ());
        assert_eq!(hr, sr, "mmap(len {len:#x}, flags {flags:#x})");
    }
    // Reservations: one page more than the pool is ENOMEM, shared or private.
    for kind in [MAP_SHARED, MAP_PRIVATE] {
        let flags = kind | MAP_ANONYMOUS | MAP_HUGETLB;
        let len = (pages + 1) * HP;
        assert_eq!(h_mmap(0, len, RW, flags, -1, 0).map(|_| ()), mm.mmap(0, len, RW, flags, None, 0).map(|_| ()));
    }
    // MAP_NORESERVE: the fault past the pool is SIGBUS.
    for shared in [true, false] {
        assert_eq!(
            h_noreserve_touches(pages + 1, shared),
            s_noreserve_touches(pages, pages + 1, shared),
            "touches before SIGBUS, shared {shared}"
        );
    }

    // hugetlbfs files.
    let host_file = HostFile::create(&dir, "f");
    let fd = host_file.fd;
    let f = File::create_hugetlbfs(&phys, "/f", 0).unwrap();
    let open = OpenFile::read_write(&f);
    // SAFETY: the file just opened.
    unsafe {
        assert_eq!(host(libc::ftruncate(fd, 4096) == 0, ()), f.set_len(4096));
        assert_eq!(host(libc::ftruncate(fd, 2 * HP as i64) == 0, ()), f.set_len(2 * HP));
        assert_eq!(host(libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) == 1, ()), f.write_at(0, b"x").map(|_| ()));
        assert_eq!(host(libc::fallocate(fd, 0x10, 0, HP as i64) == 0, ()), f.fallocate(0x10, 0, HP));
        assert_eq!(
            host(libc::fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, HP as i64) == 0, ()),
            f.fallocate(FALLOC_FL_PUNCH_HOLE, 0, HP)
        );
    }
    assert_eq!(
        h_mmap(0, HP, RW, MAP_SHARED, fd, 4096).map(|_| ()),
        mm.mmap(0, HP, RW, MAP_SHARED, Some(&open), 4096).map(|_| ())
    );
    let (hf, sf) =
        (h_mmap(0, 4096, RW, MAP_SHARED, fd, 0).unwrap(), mm.mmap(0, 4096, RW, MAP_SHARED, Some(&open), 0).unwrap());
    assert_eq!(h_maps(hf).unwrap().0, s_maps(&mm, sf).unwrap().0, "file mapping rounded up");
    assert_eq!(h_counts(base), s_counts(&phys, pages), "a shared file mapping reserves its pages");
    // A partial punch zeroes exactly its bytes.
    let mut cpu = Cpu::attached(&mm);
    for off in (0..512).step_by(8) {
        // SAFETY: inside the host file mapping, 2 MiB long.
        unsafe { std::ptr::write_volatile((hf + off) as *mut u64, u64::MAX) };
        cpu.write_u64(sf + off, u64::MAX).unwrap();
    }
    // SAFETY: the file opened above.
    let hr = host(unsafe { libc::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 100) } == 0, ());
    assert_eq!(hr, f.fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 100));
    for off in (0..512).step_by(8) {
        // SAFETY: as above.
        let hv = unsafe { std::ptr::read_volatile((hf + off) as *const u64) };
        assert_eq!(hv, cpu.read_u64(sf + off).unwrap(), "offset {off}");
    }
    drop(cpu);
    assert_eq!(h_munmap(hf, HP), mm.munmap(sf, HP));
    // Truncate under a private copy: the copy goes, and its owner gets
    // the reservation back (__unmap_hugepage_range, the last unmap of an
    // anonymous page in the mapping that owns the reserve map).
    let (hp, sp) = (
        h_mmap(0, 2 * HP, RW, MAP_PRIVATE, fd, 0).unwrap(),
        mm.mmap(0, 2 * HP, RW, MAP_PRIVATE, Some(&open), 0).unwrap(),
    );
    let mut cpu = Cpu::attached(&mm);
    // SAFETY: inside the host's private mapping of 2 MiB pages.
    unsafe { std::ptr::write_volatile((hp + HP) as *mut u64, 7) };
    cpu.write_u64(sp + HP, 7).unwrap();
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after a private write");
    // SAFETY: the file opened above.
    assert_eq!(host(unsafe { libc::ftruncate(fd, HP as i64) } == 0, ()), f.set_len(HP));
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after truncating the private copy's page");
    // The same for a hole punch, of a page the file has and the
    // private mapping copied.
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile(hp as *mut u64, 8) };
    cpu.write_u64(sp, 8).unwrap();
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after a private copy of a file page");
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    // SAFETY: the file opened above.
    let hr = host(unsafe { libc::fallocate(fd, punch, 0, HP as i64) } == 0, ());
    assert_eq!(hr, f.fallocate(punch, 0, HP));
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after punching the copied page");
    drop(cpu);
    assert_eq!(h_munmap(hp, 2 * HP), mm.munmap(sp, 2 * HP));
    assert_eq!(h_counts(base), s_counts(&phys, pages), "after munmap of the private mapping");
    // fallocate beyond the pool: ENOSPC.
    let len = (pages + 2) * HP;
    // SAFETY: the file opened above.
    let hr = host(unsafe { libc::fallocate(fd, 0, 0, len as i64) } == 0, ());
    assert_eq!(hr, f.fallocate(0, 0, len));
    // Closing and removing the file frees its pages on the host.
    drop(host_file);
    drop(open);
    drop(f);
    drop(mm);
    assert_no_leaks(&phys);
    assert_eq!(h_counts(base), (0, 0), "the host's pool is back as it was");
    drop(guard);
}

/// `MADV_COLD` and `MADV_PAGEOUT` refuse a hugetlb VMA with `EINVAL`
/// (Linux 6.12 `can_madv_lru_vma`: `VM_LOCKED|VM_PFNMAP|VM_HUGETLB`), on
/// the host and on softmm, touched or not, private or shared; an ordinary
/// anonymous mapping takes them. Found by `uffd-unit-tests`' replay, where
/// softmm accepted `MADV_PAGEOUT` on a hugetlb memfd mapping.
#[test]
fn madv_cold_and_pageout_refuse_hugetlb_as_on_the_host() {
    let Some(guard) = host_pool() else { return };
    let phys = pool(PAGES as u64);
    let mm = super::mm(&phys);
    let mut cpu = Cpu::attached(&mm);
    for flags in [PRIVATE_HUGE, SHARED_HUGE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS] {
        for touch in [false, true] {
            for advice in [libc::MADV_COLD, libc::MADV_PAGEOUT] {
                let h = h_mmap(0, HP, RW, flags, -1, 0).unwrap();
                if touch {
                    // SAFETY: the host mapping just made, writable.
                    unsafe { std::ptr::write_volatile(h as *mut u8, 1) };
                }
                let host = h_madvise(h, HP, advice);
                h_munmap(h, HP).unwrap();
                let a = mm.mmap(0, HP, RW, flags, None, 0).unwrap();
                if touch {
                    cpu.write_u8(a, 1).unwrap();
                }
                let soft = mm.madvise(a, HP, advice);
                mm.munmap(a, HP).unwrap();
                assert_eq!(soft, host, "flags {flags:#x}, touched {touch}, advice {advice}");
            }
        }
    }
    drop(cpu);
    drop(mm);
    assert_no_leaks(&phys);
    drop(guard);
}
