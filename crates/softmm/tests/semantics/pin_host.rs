//! Pinning on the host kernel against softmm: the host pins through
//! io_uring's fixed buffers (`IORING_REGISTER_BUFFERS` pins with
//! `FOLL_WRITE | FOLL_LONGTERM`) and shows what the pinned frame holds with
//! `IORING_OP_WRITE_FIXED` into a pipe; softmm's device view shows its
//! pinned frame. Both must agree after fork with a child's write
//! (CVE-2020-29374), after the parent's own write, and after
//! `MADV_DONTNEED` and `munmap` of the pinned page; which file mappings a
//! long-term write pin is refused for; and a fork that finds no huge page
//! for the copy of a pinned private one fails with the host's errno.
//! Skipped (with the reason printed) where the host refuses io_uring or
//! huge pages.

use softmm_testkit::common;

use common::*;
use softmm::uapi::*;
use softmm::{Cpu, Foll, PhysConfig, PhysMem};
use softmm_hostsys::{pool_counters, HugePages};

const HP: u64 = 2 << 20;

/// A minimal io_uring with one registered one-page buffer, driven by raw
/// system calls.
struct Uring {
    fd: i32,
    sq: *mut u8,
    sq_len: usize,
    cq: *mut u8,
    cq_len: usize,
    sqes: *mut u8,
    sqes_len: usize,
    p: [u32; 30],
}

const SQ_OFF: usize = 10; // u32 index of sq_off in io_uring_params
const CQ_OFF: usize = 20; // u32 index of cq_off

impl Uring {
    fn new() -> Result<Uring, String> {
        let mut p = [0u32; 30];
        // SAFETY: io_uring_setup writes the 120-byte io_uring_params at `p`.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, p.as_mut_ptr()) } as i32;
        if fd < 0 {
            return Err(format!("io_uring_setup: {}", std::io::Error::last_os_error()));
        }
        let (sq_entries, cq_entries) = (p[0] as usize, p[1] as usize);
        let sq_len = p[SQ_OFF + 6] as usize + sq_entries * 4; // array + entries
        let cq_len = p[CQ_OFF + 5] as usize + cq_entries * 16; // cqes + entries
        let map = |len: usize, off: i64| {
            // SAFETY: maps the ring region the kernel made for `fd`.
            let m = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, off)
            };
            assert_ne!(m, libc::MAP_FAILED, "io_uring ring mmap");
            m as *mut u8
        };
        let sq = map(sq_len, 0);
        let cq = map(cq_len, 0x800_0000);
        let sqes_len = sq_entries * 64;
        let sqes = map(sqes_len, 0x1000_0000);
        Ok(Uring { fd, sq, sq_len, cq, cq_len, sqes, sqes_len, p })
    }

    fn register(&self, buf: *mut u8, len: usize) -> Result<(), String> {
        let iov = libc::iovec { iov_base: buf as *mut libc::c_void, iov_len: len };
        // SAFETY: one iovec of this process's memory; the kernel reads it.
        let rc = unsafe { libc::syscall(libc::SYS_io_uring_register, self.fd, 0u32, &iov, 1u32) };
        if rc < 0 {
            return Err(format!("IORING_REGISTER_BUFFERS: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn u32_at(base: *mut u8, off: u32) -> &'static std::sync::atomic::AtomicU32 {
        // SAFETY: `off` is an offset the kernel gave for a u32 in a ring
        // mapped until `self` drops; the test keeps the reference local.
        unsafe { &*(base.add(off as usize) as *const std::sync::atomic::AtomicU32) }
    }

    /// `IORING_OP_WRITE_FIXED` of `len` bytes of registered buffer 0 at
    /// `addr` into `fd`; the result.
    fn write_fixed(&self, fd: i32, addr: u64, len: u32) -> i32 {
        use std::sync::atomic::Ordering::{Acquire, Release};
        let so = &self.p[SQ_OFF..SQ_OFF + 10];
        let tail = Self::u32_at(self.sq, so[1]);
        let mask = Self::u32_at(self.sq, so[2]).load(Acquire);
        let t = tail.load(Acquire);
        let idx = t & mask;
        let mut sqe = [0u8; 64];
        sqe[0] = 5; // IORING_OP_WRITE_FIXED
        sqe[4..8].copy_from_slice(&fd.to_ne_bytes());
        sqe[8..16].copy_from_slice(&u64::MAX.to_ne_bytes()); // off -1: the pipe's position
        sqe[16..24].copy_from_slice(&addr.to_ne_bytes());
        sqe[24..28].copy_from_slice(&len.to_ne_bytes());
        // buf_index (u16 at 40) stays 0.
        // SAFETY: slot `idx` of the SQE array mapped by `new`.
        unsafe { std::ptr::copy_nonoverlapping(sqe.as_ptr(), self.sqes.add(idx as usize * 64), 64) };
        let array = Self::u32_at(self.sq, so[6] + idx * 4);
        array.store(idx, Release);
        tail.store(t + 1, Release);
        // SAFETY: io_uring_enter(fd, to_submit 1, min_complete 1, GETEVENTS).
        let rc = unsafe { libc::syscall(libc::SYS_io_uring_enter, self.fd, 1u32, 1u32, 1u32, 0usize, 0usize) };
        assert!(rc >= 0, "io_uring_enter: {}", std::io::Error::last_os_error());
        let co = &self.p[CQ_OFF..CQ_OFF + 10];
        let head = Self::u32_at(self.cq, co[0]);
        let cmask = Self::u32_at(self.cq, co[2]).load(Acquire);
        let h = head.load(Acquire);
        assert_ne!(Self::u32_at(self.cq, co[1]).load(Acquire), h, "no completion");
        let cqe = (co[5] + (h & cmask) * 16) as usize;
        // SAFETY: the CQE at the head, in the mapped CQ ring.
        let res = unsafe { std::ptr::read_volatile(self.cq.add(cqe + 8) as *const i32) };
        head.store(h + 1, Release);
        res
    }

    /// What the pinned frame holds at its first 8 bytes (buffer 0 at `addr`).
    fn pinned_u64(&self, addr: u64) -> u64 {
        let mut fds = [0i32; 2];
        // SAFETY: a pipe for the fixed write.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        assert_eq!(self.write_fixed(fds[1], addr, 8), 8);
        let mut b = [0u8; 8];
        // SAFETY: reads the 8 bytes just written into the pipe.
        assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr() as *mut libc::c_void, 8) }, 8);
        // SAFETY: our descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        u64::from_ne_bytes(b)
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // SAFETY: the regions mapped in `new`, and our descriptor.
        unsafe {
            libc::munmap(self.sq as *mut libc::c_void, self.sq_len);
            libc::munmap(self.cq as *mut libc::c_void, self.cq_len);
            libc::munmap(self.sqes as *mut libc::c_void, self.sqes_len);
            libc::close(self.fd);
        }
    }
}

/// The host's outcomes: (pinned frame after the child's write, parent after
/// it, pinned frame after the parent's write, parent after MADV_DONTNEED,
/// pinned frame after MADV_DONTNEED, munmap's result).
fn host_outcomes() -> Result<[u64; 6], String> {
    let ring = Uring::new()?;
    // SAFETY: a fresh private anonymous page.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as *mut u64;
    assert_ne!(buf as *mut libc::c_void, libc::MAP_FAILED);
    // SAFETY: `buf` is our page; volatile so the accesses really happen.
    unsafe { buf.write_volatile(0x50) };
    ring.register(buf as *mut u8, 4096)?;
    let addr = buf as u64;
    // SAFETY: fork in a test process; the child only writes its page and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child's copy of the page.
        unsafe {
            buf.write_volatile(0x43);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let mut out = [0u64; 6];
    out[0] = ring.pinned_u64(addr);
    // SAFETY: our page.
    out[1] = unsafe { buf.read_volatile() };
    // SAFETY: our page.
    unsafe { buf.write_volatile(0x51) };
    out[2] = ring.pinned_u64(addr);
    // SAFETY: our page.
    unsafe { libc::madvise(buf as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
    // SAFETY: our page (a fresh zero page now).
    out[3] = unsafe { buf.read_volatile() };
    out[4] = ring.pinned_u64(addr);
    // SAFETY: our page.
    out[5] = unsafe { libc::munmap(buf as *mut libc::c_void, 4096) } as u64;
    Ok(out)
}

/// The same steps on softmm.
fn soft_outcomes() -> [u64; 6] {
    let phys = phys(8);
    let mm = softmm::AddressSpace::new(&phys, softmm::MmConfig::default()).unwrap();
    let a = mm.mmap(0, PAGE, RW, ANON, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 0x50).unwrap();
    let p = mm.pin_user_pages(a, 1, Foll::WRITE | Foll::LONGTERM).unwrap();
    let child = mm.fork().unwrap();
    Cpu::attached(&child).write_u64(a, 0x43).unwrap();
    drop(child);
    let dev = |p: &softmm::PinnedPages| {
        let mut b = [0u8; 8];
        p.read(0, &mut b).unwrap();
        u64::from_ne_bytes(b)
    };
    let mut out = [0u64; 6];
    out[0] = dev(&p);
    out[1] = cpu.read_u64(a).unwrap();
    cpu.write_u64(a, 0x51).unwrap();
    out[2] = dev(&p);
    mm.madvise(a, PAGE, MADV_DONTNEED).unwrap();
    out[3] = cpu.read_u64(a).unwrap();
    out[4] = dev(&p);
    out[5] = mm.munmap(a, PAGE).map_or(u64::MAX, |()| 0);
    drop((p, cpu, mm));
    assert_no_leaks(&phys);
    out
}

#[test]
fn pins_across_fork_dontneed_and_munmap_match_the_host() {
    let host = match host_outcomes() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("skipped: the host cannot pin through io_uring: {e}");
            return;
        }
    };
    assert_eq!(host, [0x50, 0x50, 0x51, 0, 0x51, 0], "the host's own outcomes changed");
    assert_eq!(soft_outcomes(), host);
}

/// What a `FOLL_WRITE | FOLL_LONGTERM` pin of one page of a shared mapping
/// of a file on a filesystem that writes back, of a private mapping of the
/// same file, and of a shared mapping of shmem gives: 0 or the errno.
type LongtermOutcomes = [i32; 3];

/// The host's: `IORING_REGISTER_BUFFERS` of each mapping, with a fresh
/// ring each (a ring registers one set of buffers).
fn host_longterm_outcomes(file: &std::fs::File) -> Result<LongtermOutcomes, String> {
    use std::os::fd::AsRawFd;
    // SAFETY: memfd_create with a valid name; the descriptor is ours.
    let memfd = unsafe { libc::memfd_create(c"softmm-pin".as_ptr(), 0) };
    assert!(memfd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: our descriptor.
    assert_eq!(unsafe { libc::ftruncate(memfd, 4096) }, 0);
    let mut out = [0; 3];
    for (i, (fd, flags)) in
        [(file.as_raw_fd(), libc::MAP_SHARED), (file.as_raw_fd(), libc::MAP_PRIVATE), (memfd, libc::MAP_SHARED)]
            .into_iter()
            .enumerate()
    {
        // SAFETY: a fresh mapping of one page of a descriptor we hold.
        let buf = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        assert_ne!(buf, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let ring = Uring::new()?;
        let rc = {
            let iov = libc::iovec { iov_base: buf, iov_len: 4096 };
            // SAFETY: one iovec of this process's memory; the kernel reads it.
            unsafe { libc::syscall(libc::SYS_io_uring_register, ring.fd, 0u32, &iov, 1u32) }
        };
        out[i] = if rc < 0 { std::io::Error::last_os_error().raw_os_error().unwrap_or(-1) } else { 0 };
        // The ring (and any pin it holds) goes before the mapping.
        drop(ring);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(buf, 4096) };
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(memfd) };
    Ok(out)
}

/// softmm's: a host-backed file for the file, an in-memory file for shmem.
fn soft_longterm_outcomes(file: std::fs::File) -> LongtermOutcomes {
    let phys = phys(8);
    let mm = softmm::AddressSpace::new(&phys, softmm::MmConfig::default()).unwrap();
    let f = softmm::OpenFile::from_host(&phys, file, "data").unwrap();
    let shm = softmm::OpenFile::read_write(&softmm::File::create(&phys, "shm", PAGE).unwrap());
    let mut out = [0; 3];
    for (i, (f, flags)) in [(&f, MAP_SHARED), (&f, MAP_PRIVATE), (&shm, MAP_SHARED)].into_iter().enumerate() {
        let a = mm.mmap(0, PAGE, RW, flags, Some(f), 0).unwrap();
        out[i] = match mm.pin_user_pages(a, 1, Foll::WRITE | Foll::LONGTERM) {
            Ok(p) => {
                drop(p);
                0
            }
            Err(e) => e.code(),
        };
        mm.munmap(a, PAGE).unwrap();
    }
    drop((mm, f, shm));
    assert_no_leaks(&phys);
    out
}

/// True if the filesystem of `dir` keeps its pages in memory only (tmpfs,
/// ramfs), where the host allows a long-term write pin of a shared file
/// mapping.
fn is_memory_fs(dir: &std::path::Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statfs writes the struct it is given; the path is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut st) }, 0);
    matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// Linux 6.12 refuses a long-term write pin of a shared mapping of a file
/// that needs dirty tracking (`writable_file_mapping_allowed`: `EFAULT`) and
/// allows a private one and shmem; softmm must give the same for a
/// host-backed file and an in-memory one.
#[test]
fn long_term_write_pins_of_file_mappings_match_the_host() {
    let dir = std::env::temp_dir();
    if is_memory_fs(&dir) {
        eprintln!("skipped: {} keeps its files in memory, as shmem, which the host pins", dir.display());
        return;
    }
    let host_file = TempFile::new("pin-host-longterm", &[0x11; PAGE as usize]);
    let host = match host_longterm_outcomes(&host_file.open(true)) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("skipped: the host cannot pin through io_uring: {e}");
            return;
        }
    };
    assert_eq!(host, [libc::EFAULT, 0, 0], "the host's own outcomes changed");
    assert_eq!(soft_longterm_outcomes(host_file.open(true)), host);
}

/// `fork` on the host with the first of `pages` private huge pages pinned
/// through io_uring and every free huge page taken by them, so none is left
/// for the child's copy of the pinned one: the fork's errno (`Ok` if it made
/// a child, which exits at once).
fn host_fork_with_a_pinned_huge_page(pages: u64) -> Result<Result<(), i32>, String> {
    let ring = Uring::new()?;
    let len = (pages * HP) as usize;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB;
    // SAFETY: a fresh private hugetlb mapping, reserving `pages` pages.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap of {pages} huge pages: {}", std::io::Error::last_os_error()));
    }
    for i in 0..pages {
        // SAFETY: inside the mapping; each write takes its reserved page.
        unsafe { std::ptr::write_volatile((p as *mut u8).add((i * HP) as usize), 1) };
    }
    let res = ring.register(p as *mut u8, PAGE as usize).map(|()| {
        // SAFETY: fork in a test process; the child exits at once.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the child does nothing else.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let mut status = 0;
        // SAFETY: waits for our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        Ok(())
    });
    // The ring's end unpins the page; then the mapping goes.
    drop(ring);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, len) };
    res
}

/// The same on softmm, with a pool of `pages` pages.
fn soft_fork_with_a_pinned_huge_page(pages: u64) -> Result<(), i32> {
    let phys = PhysMem::new(PhysConfig::new((8 << 20) + (pages + 1) * HP).hugepages(pages)).unwrap();
    let mm = softmm::AddressSpace::new(&phys, softmm::MmConfig::default()).unwrap();
    let a = mm.mmap(0, pages * HP, RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    let mut cpu = Cpu::attached(&mm);
    for i in 0..pages {
        cpu.write_u8(a + i * HP, 1).unwrap();
    }
    let pin = mm.pin_user_pages(a, 1, Foll::WRITE | Foll::LONGTERM).unwrap();
    let res = mm.fork().map(drop).map_err(|e| e.code());
    drop((pin, cpu, mm));
    assert_no_leaks(&phys);
    res
}

/// `copy_hugetlb_page_range` fails with `ENOSPC` where no huge page is left
/// for the child's copy of a pinned page, and `copy_mm` returns `ENOMEM`
/// for any failure of `dup_mmap`.
#[test]
fn fork_with_a_pinned_huge_page_and_an_empty_pool_fails_as_on_the_host() {
    let guard = match HugePages::reserve(1) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: no huge pages on the host: {e}");
            return;
        }
    };
    let c = pool_counters().unwrap();
    let pages = c.free - c.rsvd;
    let overcommit = std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages").unwrap_or_default();
    if pages > 64 || overcommit.trim() != "0" {
        eprintln!(
            "skipped: {pages} free host pages, overcommit {}: the pool cannot be emptied here",
            overcommit.trim()
        );
        return;
    }
    let host = match host_fork_with_a_pinned_huge_page(pages) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("skipped: the host cannot pin through io_uring: {e}");
            return;
        }
    };
    drop(guard);
    assert_eq!(host, Err(libc::ENOMEM), "the host's own outcome changed");
    assert_eq!(soft_fork_with_a_pinned_huge_page(pages), host);
}
