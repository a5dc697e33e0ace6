//! Seed 000's two programs (`softmm bench hugetlb-fork-fault`), one step at
//! a time, on the host and on softmm: a forker (map the 1 GiB hugetlbfs
//! file, write 4 pages, fork a child that writes one page and exits, unmap)
//! and a faulter (map, write all 512 pages, unmap), interleaved in a fixed
//! order, and the faults of each step compared. On the host each program is
//! a process of its own driven through a shared board (minor faults from
//! `getrusage`); on softmm each is an address space with a CPU of its own
//! (the CPU's fault count).
//!
//! What it shows is the life of the shared PMD table, as Linux 6.12 has it:
//! fork copies no page table of the shared hugetlb VMA (`vma_needs_copy`:
//! no `anon_vma`), so the child links its parent's table with its one
//! fault; an unmap with other sharers only drops its own link
//! (`huge_pmd_unshare`) and leaves the table, populated, to them; and the
//! first fault of a new mapping links the table another mapping of the
//! file holds (`huge_pmd_share`), so a faulter's pass costs one fault while
//! any other mapping keeps the table. Only the last unmap zaps and frees
//! it. In these sequential steps softmm takes the host's faults exactly;
//! the difference the lab showed comes from concurrency (the other
//! address space's `mmap_lock` held for write during its fork), which
//! `hugetlb/share/tests.rs` checks.

use softmm_testkit::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::assert_no_leaks;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem};

const HP: u64 = 2 << 20;
const PUD: u64 = 1 << 30;
const PAGES: u64 = PUD / HP;
/// Pages the forker writes before each fork (the lab's `FORK_TOUCH`).
const FORK_TOUCH: u64 = 4;

/// One step of one program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Map the whole file shared at the actor's 1 GiB-aligned address.
    Map,
    /// Write one byte of each of the first `n` huge pages; its faults.
    Write(u64),
    /// Fork a child that writes page 0 and exits; the child's faults.
    Fork,
    /// Unmap the file.
    Unmap,
}

const FORKER: usize = 0;
const FAULTER: usize = 1;
const ACTORS: usize = 2;

/// The sequence: each program's loop, cut into steps and interleaved so
/// that the table passes from one to the other, then ends with its last
/// user. With each step, the faults Linux takes for it.
fn steps() -> Vec<(usize, Op, Option<u64>)> {
    use Op::*;
    vec![
        (FORKER, Map, None),
        // A table of its own: no other mapping has one.
        (FORKER, Write(FORK_TOUCH), Some(FORK_TOUCH)),
        (FAULTER, Map, None),
        // Links the forker's table (4 pages there) and faults the others.
        (FAULTER, Write(PAGES), Some(1 + PAGES - FORK_TOUCH)),
        // The child links its parent's table: fork copied none of it.
        (FORKER, Fork, Some(1)),
        // The forker's unmap leaves the table, populated, to the faulter.
        (FORKER, Unmap, None),
        (FORKER, Map, None),
        (FORKER, Write(FORK_TOUCH), Some(1)),
        (FAULTER, Unmap, None),
        (FAULTER, Map, None),
        // A new pass of the faulter: one fault for all 512 pages.
        (FAULTER, Write(PAGES), Some(1)),
        (FORKER, Fork, Some(1)),
        (FORKER, Unmap, None),
        (FORKER, Map, None),
        (FORKER, Write(FORK_TOUCH), Some(1)),
        (FORKER, Fork, Some(1)),
        (FAULTER, Unmap, None),
        // The last user's unmap zaps the table and frees it.
        (FORKER, Unmap, None),
        (FAULTER, Map, None),
        (FAULTER, Write(PAGES), Some(PAGES)),
        (FAULTER, Unmap, None),
    ]
}

/// The faults of each `Write` and `Fork` step on softmm.
fn softmm_faults() -> Vec<u64> {
    let phys = PhysMem::new(PhysConfig::new((16 << 20) + (PAGES + 1) * HP).hugepages(PAGES)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/area", PUD).unwrap();
    f.fallocate(0, 0, PUD).unwrap();
    let open = OpenFile::read_write(&f);
    let at = 64 * PUD;
    let actors: Vec<Arc<AddressSpace>> =
        (0..ACTORS).map(|_| AddressSpace::new(&phys, MmConfig::default()).unwrap()).collect();
    let mut cpus: Vec<Cpu> = actors.iter().map(Cpu::attached).collect();
    let mut out = Vec::new();
    for (who, op, _) in steps() {
        let (mm, cpu) = (&actors[who], &mut cpus[who]);
        match op {
            Op::Map => {
                mm.mmap(at, PUD, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, Some(&open), 0).unwrap();
            }
            Op::Write(n) => {
                let before = cpu.stats().fault.faults;
                for i in 0..n {
                    cpu.write_u8(at + i * HP, 1).unwrap();
                }
                out.push(cpu.stats().fault.faults - before);
            }
            Op::Fork => {
                let child = mm.fork().unwrap();
                let mut c = Cpu::attached(&child);
                c.write_u8(at, 1).unwrap();
                out.push(c.stats().fault.faults);
            }
            Op::Unmap => mm.munmap(at, PUD).unwrap(),
        }
    }
    drop((cpus, actors, open, f));
    assert_no_leaks(&phys);
    out
}

/// One actor's mailbox on the host: the driver writes `cmd` (a sequence
/// number in the high 32 bits, the op's page count and code below); the
/// actor runs it, writes `result`, then `done` (the sequence number).
#[repr(C)]
struct Cell {
    cmd: AtomicU64,
    result: AtomicU64,
    done: AtomicU64,
}

/// The mailboxes, in a shared anonymous page the actors inherit.
struct Board(*mut Cell);

impl Board {
    fn new() -> Board {
        // SAFETY: a fresh shared anonymous page; zero is a valid `Cell`
        // array (atomics of zero).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Board(p.cast())
    }

    fn cell(&self, i: usize) -> &Cell {
        assert!(i < ACTORS);
        // SAFETY: inside the page mapped in `new`, which lives as long as
        // `self`; cells are accessed only through atomics.
        unsafe { &*self.0.add(i) }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: the page mapped in `new`.
        unsafe { libc::munmap(self.0.cast(), 4096) };
    }
}

fn minflt() -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_minflt as u64
}

/// Minor faults writing one byte of each of `n` huge pages from `at`.
///
/// # Safety
///
/// `at` must map `n` huge pages, writable.
#[inline(never)]
unsafe fn faults_writing(at: u64, n: u64) -> u64 {
    // A first call faults in this frame's stack page (a fork made it
    // copy-on-write), so the count covers the writes only.
    minflt();
    let before = minflt();
    for i in 0..n {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_volatile((at + i * HP) as *mut u8, 1) };
    }
    minflt() - before
}

/// The body of a host actor: runs the driver's ops until it is killed.
/// Only async-signal-safe calls: the test process has other threads.
fn actor(cell: &Cell, fd: i32, at: u64) -> ! {
    let mut seen = 0;
    loop {
        let cmd = cell.cmd.load(Ordering::Acquire);
        if cmd >> 32 == seen {
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 20_000 };
            // SAFETY: sleeps; the pointers are to a local and null.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
            continue;
        }
        seen = cmd >> 32;
        let op = cmd & 0xff;
        // SAFETY: `at..at + PUD` lies in the reservation the driver made
        // for this actor; nothing else in this process maps there.
        let result = unsafe {
            match op {
                1 => {
                    let flags = libc::MAP_SHARED | libc::MAP_FIXED;
                    let p = libc::mmap(at as *mut _, PUD as usize, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0);
                    u64::from(p as u64 != at)
                }
                2 => faults_writing(at, (cmd >> 8) & 0xffff),
                3 => {
                    let pid = libc::fork();
                    if pid == 0 {
                        let n = faults_writing(at, 1);
                        libc::_exit(n as i32);
                    }
                    let mut status = 0;
                    if pid < 0 || libc::waitpid(pid, &mut status, 0) != pid || !libc::WIFEXITED(status) {
                        u64::MAX
                    } else {
                        libc::WEXITSTATUS(status) as u64
                    }
                }
                _ => u64::from(libc::munmap(at as *mut _, PUD as usize) != 0),
            }
        };
        cell.result.store(result, Ordering::Relaxed);
        cell.done.store(seen, Ordering::Release);
    }
}

/// The host's actors: killed and reaped on drop.
struct Actors {
    pids: Vec<libc::pid_t>,
}

impl Drop for Actors {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: our own children.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// The faults of each `Write` and `Fork` step on the host, in `dir` (a
/// hugetlbfs mount with 512 free pages).
fn host_faults(dir: &std::path::Path) -> Vec<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = dir.join(format!("fork-fault.{}", std::process::id()));
    let cpath = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a new file in the test's own mount.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600) };
    assert!(fd >= 0, "open {}", path.display());
    // SAFETY: our own descriptor.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, PUD as i64) }, 0, "fallocate of 1 GiB");
    // Room for the area at a 1 GiB-aligned address, the same in every
    // actor (each inherits it).
    let room = 2 * PUD as usize;
    // SAFETY: a new inaccessible reservation.
    let res = unsafe {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        libc::mmap(std::ptr::null_mut(), room, libc::PROT_NONE, flags, -1, 0)
    };
    assert_ne!(res, libc::MAP_FAILED);
    let at = (res as u64).next_multiple_of(PUD);
    let board = Board::new();
    let mut actors = Actors { pids: Vec::new() };
    for i in 0..ACTORS {
        // SAFETY: the child runs `actor` (async-signal-safe calls only)
        // until it is killed.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: `prctl` takes no pointer: the actor dies with the test.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            actor(board.cell(i), fd, at);
        }
        actors.pids.push(pid);
    }
    let mut out = Vec::new();
    for (seq, (who, op, _)) in steps().into_iter().enumerate() {
        let seq = seq as u64 + 1;
        let code = match op {
            Op::Map => 1,
            Op::Write(n) => 2 | (n << 8),
            Op::Fork => 3,
            Op::Unmap => 4,
        };
        let cell = board.cell(who);
        cell.cmd.store(seq << 32 | code, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(30);
        while cell.done.load(Ordering::Acquire) != seq {
            assert!(Instant::now() < deadline, "host actor {who} did not finish {op:?}");
            std::thread::sleep(Duration::from_micros(50));
        }
        let r = cell.result.load(Ordering::Relaxed);
        match op {
            Op::Write(_) | Op::Fork => {
                assert_ne!(r, u64::MAX, "{op:?} failed on the host");
                out.push(r);
            }
            Op::Map | Op::Unmap => assert_eq!(r, 0, "{op:?} failed on the host"),
        }
    }
    drop(actors);
    // SAFETY: the reservation, the descriptor and the file are ours; the
    // actors are gone.
    unsafe {
        libc::munmap(res, room);
        libc::close(fd);
        libc::unlink(cpath.as_ptr());
    }
    out
}

/// The forker and the faulter, step by step: softmm takes Linux's faults
/// at every step (the child links its parent's table, an unmap leaves the
/// populated table to the other program, each new pass links it with one
/// fault, the last unmap frees it), and the host, probed in the same test
/// where it can reserve 512 huge pages (else skipped with its reason, its
/// pool restored when done), takes the same.
#[test]
#[cfg_attr(miri, ignore = "a 1 GiB arena, the host's huge page pool and fork")]
fn forker_and_faulter_steps_take_the_hosts_faults() {
    let _one_at_a_time = crate::hugetlb_share::FULL_SIZE.lock().unwrap_or_else(|e| e.into_inner());
    use softmm_hostsys::{HugePages, PAGES_PER_PUD};
    let want: Vec<u64> = steps().into_iter().filter_map(|(_, _, w)| w).collect();
    let ours = softmm_faults();
    eprintln!("softmm faults per step: {ours:?}");
    assert_eq!(ours, want, "softmm against Linux's faults");
    let guard = match HugePages::reserve_with_mount(PAGES_PER_PUD as usize) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("host half skipped: {e}");
            return;
        }
    };
    let host = host_faults(guard.mount_dir().expect("mounted"));
    eprintln!("host faults per step: {host:?}");
    assert_eq!(host, ours, "softmm and the host differ");
}
