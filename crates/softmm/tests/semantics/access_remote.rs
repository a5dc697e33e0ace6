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

mod rules {
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
}

/// The host side: a forked child lays out the same mappings and waits; the
/// parent reads and writes them through `/proc/<pid>/mem` and
/// `process_vm_readv`/`writev`, then the child reports what it sees.
mod host {
    use super::*;

    /// The mappings, one page each, at `base + i * PAGE`.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Region {
        /// Private anonymous, filled, then read-only.
        PrivRo,
        /// Private anonymous read-only, never touched.
        PrivUntouched,
        /// Shared anonymous, filled, then read-only.
        SharedRo,
        /// Private anonymous, filled, then `PROT_NONE`.
        PrivNone,
        /// Private file text (`PROT_READ | PROT_EXEC`) at file page 0.
        FileText,
        /// Shared file, read-only, of a read-write open, at file page 1.
        FileSharedRo,
        /// Shared file, read-only, of a read-only open, at file page 2.
        FileSharedRoOpen,
        /// Private anonymous read-write, filled.
        PrivRw,
        /// Nothing.
        Hole,
        /// Private anonymous `PROT_NONE`, never touched.
        NoneUntouched,
        /// Private file mapping past the end of the file (page 3 of 3).
        PastEof,
        /// Private file, read-only open, at file page 0.
        FilePrivRoOpen,
        /// Execute-only private anonymous, filled.
        ExecOnly,
    }

    pub(super) const REGIONS: [Region; 13] = [
        Region::PrivRo,
        Region::PrivUntouched,
        Region::SharedRo,
        Region::PrivNone,
        Region::FileText,
        Region::FileSharedRo,
        Region::FileSharedRoOpen,
        Region::PrivRw,
        Region::Hole,
        Region::NoneUntouched,
        Region::PastEof,
        Region::FilePrivRoOpen,
        Region::ExecOnly,
    ];
    pub(super) const FILE_PAGES: u64 = 3;

    /// The file's byte at `offset`.
    pub(super) fn file_byte(offset: u64) -> u8 {
        (offset * 7 + offset / PAGE + 3) as u8
    }

    /// The byte a region is filled with before it is protected.
    pub(super) fn fill(i: usize) -> u8 {
        0xa0 + i as u8
    }

    /// Readable by the child afterwards (its snapshot).
    pub(super) fn readable(r: Region) -> bool {
        // Not execute-only memory: with protection keys the host makes it
        // unreadable even to its own process.
        !matches!(r, Region::PrivNone | Region::Hole | Region::NoneUntouched | Region::PastEof | Region::ExecOnly)
    }

    /// (prot, flags, file open: None / read-write / read-only, file page, filled)
    pub(super) fn layout(r: Region) -> Option<(i32, i32, Option<bool>, u64, bool)> {
        let anon = MAP_PRIVATE | MAP_ANONYMOUS;
        Some(match r {
            Region::PrivRo => (PROT_READ, anon, None, 0, true),
            Region::PrivUntouched => (PROT_READ, anon, None, 0, false),
            Region::SharedRo => (PROT_READ, MAP_SHARED | MAP_ANONYMOUS, None, 0, true),
            Region::PrivNone => (PROT_NONE, anon, None, 0, true),
            Region::FileText => (PROT_READ | PROT_EXEC, MAP_PRIVATE, Some(true), 0, false),
            Region::FileSharedRo => (PROT_READ, MAP_SHARED, Some(true), 1, false),
            Region::FileSharedRoOpen => (PROT_READ, MAP_SHARED, Some(false), 2, false),
            Region::PrivRw => (PROT_READ | PROT_WRITE, anon, None, 0, true),
            Region::Hole => return None,
            Region::NoneUntouched => (PROT_NONE, anon, None, 0, false),
            Region::PastEof => (PROT_READ, MAP_PRIVATE, Some(true), FILE_PAGES, false),
            Region::FilePrivRoOpen => (PROT_READ, MAP_PRIVATE, Some(false), 0, false),
            Region::ExecOnly => (PROT_EXEC, anon, None, 0, true),
        })
    }

    /// One access: region, offset in it, length, bytes to write (if a
    /// write), through `/proc/pid/mem` (forced) or `process_vm_*`.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Op {
        pub(super) at: u64,
        pub(super) len: usize,
        pub(super) write: Option<u8>,
        pub(super) force: bool,
    }

    /// Every region read and written, forced and not, plus copies across
    /// region boundaries.
    pub(super) fn ops() -> Vec<Op> {
        let mut v = Vec::new();
        for i in 0..REGIONS.len() as u64 {
            for force in [false, true] {
                let b = i * PAGE;
                v.push(Op { at: b + 100, len: 16, write: None, force });
                v.push(Op { at: b + 200 + force as u64 * 8, len: 4, write: Some(0x40 + i as u8), force });
                v.push(Op { at: b + 196, len: 16, write: None, force });
            }
        }
        for i in 1..REGIONS.len() as u64 {
            for force in [false, true] {
                v.push(Op { at: i * PAGE - 4, len: 8, write: Some(0x30 + i as u8), force });
                v.push(Op { at: i * PAGE - 4, len: 8, write: None, force });
            }
        }
        v
    }

    /// An op's result: bytes done (or the errno), and the bytes read.
    pub(super) type Outcome = (Result<usize, i32>, Vec<u8>);

    pub(super) struct Trace {
        pub(super) outcomes: Vec<Outcome>,
        /// The child's view of each readable region afterwards.
        pub(super) snapshot: Vec<Vec<u8>>,
        /// The file afterwards.
        pub(super) file: Vec<u8>,
    }

    fn check(r: libc::c_long) -> u64 {
        assert!(r >= 0, "host call failed: {}", std::io::Error::last_os_error());
        r as u64
    }

    /// Runs the ops on the host. Everything the child uses is allocated
    /// before the fork; the child makes only raw system calls.
    pub(super) fn run() -> Trace {
        let ops = ops();
        let n = REGIONS.len();
        let len = n * PAGE as usize;
        // SAFETY: plain system calls on values this function owns; every
        // pointer passed is to a live buffer of the size given; the child
        // runs `child`'s contract (reservation and snapshot made here).
        unsafe {
            let memfd = check(libc::memfd_create(c"softmm-access-remote".as_ptr(), 0) as _) as i32;
            let content: Vec<u8> = (0..FILE_PAGES * PAGE).map(file_byte).collect();
            check(libc::pwrite(memfd, content.as_ptr().cast(), content.len(), 0) as _);
            let path = format!("/proc/self/fd/{memfd}\0");
            let rofd = check(libc::open(path.as_ptr().cast(), libc::O_RDONLY) as _) as i32;
            let base = libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, ANON, -1, 0);
            assert_ne!(base, libc::MAP_FAILED);
            let base = base as u64;
            let snap = libc::mmap(std::ptr::null_mut(), len, RW, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
            assert_ne!(snap, libc::MAP_FAILED);
            let (mut ready, mut go) = ([0i32; 2], [0i32; 2]);
            check(libc::pipe(ready.as_mut_ptr()) as _);
            check(libc::pipe(go.as_mut_ptr()) as _);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                child(base, memfd, rofd, snap.cast(), ready[1], go[0]);
            }
            let mut b = [0u8];
            assert_eq!(libc::read(ready[0], b.as_mut_ptr().cast(), 1), 1, "child set-up failed");
            let mem_path = format!("/proc/{pid}/mem\0");
            let mem = check(libc::open(mem_path.as_ptr().cast(), libc::O_RDWR) as _) as i32;
            let mut outcomes = Vec::new();
            for op in &ops {
                let addr = base + op.at;
                let mut buf = vec![op.write.unwrap_or(0); op.len];
                let r = match (op.force, op.write.is_some()) {
                    (true, false) => libc::pread(mem, buf.as_mut_ptr().cast(), op.len, addr as i64),
                    (true, true) => libc::pwrite(mem, buf.as_ptr().cast(), op.len, addr as i64),
                    (false, w) => {
                        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: op.len };
                        let remote = libc::iovec { iov_base: addr as *mut _, iov_len: op.len };
                        if w {
                            libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
                        } else {
                            libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
                        }
                    }
                };
                let res = if r < 0 { Err(*libc::__errno_location()) } else { Ok(r as usize) };
                if op.write.is_some() {
                    buf.clear();
                } else {
                    buf.truncate(*res.as_ref().unwrap_or(&0));
                }
                outcomes.push((res, buf));
            }
            check(libc::write(go[1], b.as_ptr().cast(), 1) as _);
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
            let all = std::slice::from_raw_parts(snap as *const u8, len);
            let snapshot = REGIONS
                .iter()
                .enumerate()
                .filter(|(_, r)| readable(**r))
                .map(|(i, _)| all[i * PAGE as usize..][..PAGE as usize].to_vec())
                .collect();
            let mut file = vec![0u8; content.len()];
            check(libc::pread(memfd, file.as_mut_ptr().cast(), file.len(), 0) as _);
            for fd in [memfd, rofd, mem, ready[0], ready[1], go[0], go[1]] {
                libc::close(fd);
            }
            libc::munmap(base as *mut _, len);
            libc::munmap(snap, len);
            Trace { outcomes, snapshot, file }
        }
    }

    /// The forked child: raw system calls only (no allocation, no lock).
    ///
    /// # Safety
    ///
    /// Called once, in the child of a fork, with the parent's descriptors
    /// and a `base` reservation of `REGIONS.len()` pages and a shared
    /// `snap` buffer as large.
    unsafe fn child(base: u64, memfd: i32, rofd: i32, snap: *mut u8, ready: i32, go: i32) -> ! {
        // SAFETY: the caller's contract; every pointer is inside `base`'s
        // reservation (remapped here) or `snap`.
        unsafe {
            let fail = || libc::_exit(1);
            for (i, r) in REGIONS.iter().enumerate() {
                let at = (base + i as u64 * PAGE) as *mut libc::c_void;
                let Some((prot, flags, file, page, filled)) = layout(*r) else {
                    libc::munmap(at, PAGE as usize);
                    continue;
                };
                let fd = match file {
                    None => -1,
                    Some(true) => memfd,
                    Some(false) => rofd,
                };
                let first = if filled { RW } else { prot };
                let p = libc::mmap(at, PAGE as usize, first, flags | MAP_FIXED, fd, (page * PAGE) as i64);
                if p != at {
                    fail();
                }
                if filled {
                    std::ptr::write_bytes(p as *mut u8, fill(i), PAGE as usize);
                    if libc::mprotect(p, PAGE as usize, prot) != 0 {
                        fail();
                    }
                }
            }
            let b = [0u8];
            if libc::write(ready, b.as_ptr().cast(), 1) != 1 {
                fail();
            }
            let mut b = [0u8];
            if libc::read(go, b.as_mut_ptr().cast(), 1) != 1 {
                fail();
            }
            for (i, r) in REGIONS.iter().enumerate() {
                if !readable(*r) {
                    continue;
                }
                let from = (base + i as u64 * PAGE) as *const u8;
                std::ptr::copy_nonoverlapping(from, snap.add(i * PAGE as usize), PAGE as usize);
            }
            libc::_exit(0)
        }
    }
}

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
mod hugetlb {
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
        let plan =
            [(RW, true), (PROT_NONE, false), (PROT_READ, true), (PROT_NONE, true), (RW, true), (PROT_READ, false)];
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
}
