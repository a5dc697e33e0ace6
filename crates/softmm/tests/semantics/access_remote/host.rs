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
