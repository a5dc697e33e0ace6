//! What a forked child maps, against the host kernel: Linux's fork copies
//! no entries of a VMA without anonymous pages (`copy_page_range` returns
//! early when `vma_needs_copy` is false: no `anon_vma`, no `VM_PFNMAP`, no
//! uffd-wp), so the child of a parent that touched a shared file mapping,
//! a shared anonymous mapping or a read-only private file mapping maps none
//! of those pages until it faults them itself; a private file mapping the
//! parent wrote (it has an `anon_vma`) is copied whole, the page cache's
//! read-only entries included. A read fault then maps the cached pages
//! around it (`do_fault_around`: `fault_around_bytes`, 64 KiB, aligned, but
//! clamped to the VMA's start and then extended to a whole window).
//!
//! The same layout at the same addresses in a host process and in a softmm
//! address space; at each step the `move_pages` query (`nodes == NULL`:
//! the node, or `-ENOENT` where no entry maps the page) of every page in the
//! parent and in the child, and the child's fault count for one read. The
//! host child works only with memory prepared before `fork` and raw system
//! calls, and writes its results into a shared mapping.

use softmm::uapi::*;
use softmm::*;

const PAGE: u64 = PAGE_SIZE;
/// Pages of the file, and of each file mapping.
const FILE_PAGES: u64 = 40;
/// The mappings, each at `BASE + slot * 1 MiB + shift` pages: (name,
/// shared, anonymous, shift in pages, pages).
const MAPS: [(&str, bool, bool, u64, u64); 5] = [
    // Shared file: the parent reads page 1 (fault-around maps 0..16) and
    // writes page 30.
    ("shared", true, false, 0, FILE_PAGES),
    // Shared file starting 3 pages into a 64 KiB window: a read of its
    // page 2 maps pages 0..16 (PTEs 3..19), not only up to the window's end.
    ("shared+3", true, false, 3, FILE_PAGES),
    // Private file, only read: no anon_vma, nothing copied.
    ("private-read", false, false, 0, FILE_PAGES),
    // Private file, read and written (a COW copy): copied whole.
    ("private-written", false, false, 0, FILE_PAGES),
    // Shared anonymous, written.
    ("shared-anon", true, true, 0, 8),
];

/// Where the layout goes on both sides: a 2 MiB aligned address well away
/// from what the test harness maps (reserved first on the host).
const SPAN: u64 = 8 << 20;

/// Each mapping's pages as addresses, in layout order.
fn all_pages(base: u64) -> Vec<u64> {
    MAPS.iter()
        .enumerate()
        .flat_map(|(slot, &(_, _, _, shift, pages))| {
            (0..pages).map(move |i| base + slot as u64 * (1 << 20) + (shift + i) * PAGE)
        })
        .collect()
}

fn addr(base: u64, slot: usize, page: u64) -> u64 {
    base + slot as u64 * (1 << 20) + (MAPS[slot].3 + page) * PAGE
}

/// What the parent does before fork: (slot, page, write).
const PARENT_TOUCHES: [(usize, u64, bool); 7] =
    [(0, 1, false), (0, 30, true), (1, 2, false), (2, 5, false), (3, 0, false), (3, 9, true), (4, 1, true)];

/// What the child reads after fork, one at a time: (slot, page).
const CHILD_READS: [(usize, u64); 4] = [(0, 20), (1, 2), (3, 33), (4, 3)];

/// Statuses of every page, the parent's then the child's before it
/// touches anything, then per child read: its fault count and the
/// child's statuses after it.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    parent: Vec<i32>,
    child: Vec<i32>,
    reads: Vec<(u64, Vec<i32>)>,
}

/// Readable statuses: per mapping, the pages mapped (status >= 0).
fn describe(st: &[i32]) -> String {
    let mut out = String::new();
    let mut at = 0;
    for &(name, _, _, _, pages) in &MAPS {
        let mapped: Vec<usize> = (0..pages as usize).filter(|&i| st[at + i] >= 0).collect();
        out.push_str(&format!("{name}: {mapped:?}; "));
        at += pages as usize;
    }
    out
}

fn softmm_side(base: u64) -> Observed {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let obs = {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let f = File::create(&phys, "f", FILE_PAGES * PAGE).unwrap();
        for i in 0..FILE_PAGES {
            f.write_at(i * PAGE, &(i + 1).to_le_bytes()).unwrap();
        }
        let rw = PROT_READ | PROT_WRITE;
        for (slot, &(_, shared, anonymous, _, pages)) in MAPS.iter().enumerate() {
            let flags = MAP_FIXED | if shared { MAP_SHARED } else { MAP_PRIVATE };
            let (flags, file) =
                if anonymous { (flags | MAP_ANONYMOUS, None) } else { (flags, Some(OpenFile::read_write(&f))) };
            mm.mmap(addr(base, slot, 0), pages * PAGE, rw, flags, file.as_ref(), 0).unwrap();
        }
        let mut cpu = Cpu::attached(&mm);
        for (slot, page, write) in PARENT_TOUCHES {
            let a = addr(base, slot, page);
            if write {
                cpu.write_u64(a, 7).unwrap();
            } else {
                cpu.read_u64(a).unwrap();
            }
        }
        let pages = all_pages(base);
        let stat = |mm: &AddressSpace| {
            let mut st = vec![i32::MIN; pages.len()];
            mm.pages_stat(&pages, &mut st).unwrap();
            st
        };
        let parent = stat(&mm);
        let child = mm.fork().unwrap();
        let before = stat(&child);
        let mut ccpu = Cpu::attached(&child);
        let reads = CHILD_READS
            .iter()
            .map(|&(slot, page)| {
                let f0 = ccpu.stats().fault.faults;
                ccpu.read_u64(addr(base, slot, page)).unwrap();
                (ccpu.stats().fault.faults - f0, stat(&child))
            })
            .collect();
        Observed { parent, child: before, reads }
    };
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0));
    obs
}

/// `move_pages(0, n, pages, NULL, status, 0)` on the calling process.
///
/// # Safety
///
/// `pages` and `status` are valid for `n` entries.
unsafe fn host_stat(n: usize, pages: *const u64, status: *mut i32) -> i64 {
    // SAFETY: the caller's contract; the kernel reads `pages` and writes `status`.
    unsafe { libc::syscall(libc::SYS_move_pages, 0, n, pages, std::ptr::null::<i32>(), status, 0) }
}

fn minflt() -> u64 {
    // SAFETY: `ru` is a valid out-pointer.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_minflt as u64
    }
}

/// The host side, or `None` (with the reason printed) where the host has
/// no `move_pages`.
fn host_side() -> Option<(u64, Observed)> {
    let pages_n = all_pages(0).len();
    // SAFETY: every mapping below is owned by this function; the layout
    // lies in a fresh reservation; the forked child touches only memory
    // mapped before the fork (the pages array, the result mapping, the
    // layout) and makes raw system calls, then `_exit`s.
    unsafe {
        let probe = [0u64];
        let mut st = [0i32];
        if host_stat(0, probe.as_ptr(), st.as_mut_ptr()) < 0 {
            eprintln!("skipped: the host has no move_pages ({})", std::io::Error::last_os_error());
            return None;
        }
        let reserve = libc::mmap(
            std::ptr::null_mut(),
            (SPAN + (2 << 20)) as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        assert_ne!(reserve, libc::MAP_FAILED);
        let base = (reserve as u64 + (2 << 20) - 1) & !((2 << 20) - 1);
        let fd = libc::memfd_create(c"fork_host".as_ptr(), 0);
        assert!(fd >= 0);
        for i in 0..FILE_PAGES {
            let v = (i + 1).to_le_bytes();
            assert_eq!(libc::pwrite(fd, v.as_ptr().cast(), 8, (i * PAGE) as i64), 8);
        }
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        for (slot, &(_, shared, anonymous, _, pages)) in MAPS.iter().enumerate() {
            let flags = libc::MAP_FIXED | if shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
            let (flags, f) = if anonymous { (flags | libc::MAP_ANONYMOUS, -1) } else { (flags, fd) };
            let a = addr(base, slot, 0);
            let p = libc::mmap(a as *mut libc::c_void, (pages * PAGE) as usize, rw, flags, f, 0);
            assert_eq!(p as u64, a, "{}", std::io::Error::last_os_error());
        }
        for (slot, page, write) in PARENT_TOUCHES {
            let a = addr(base, slot, page) as *mut u64;
            if write {
                std::ptr::write_volatile(a, 7);
            } else {
                std::ptr::read_volatile(a);
            }
        }
        let pages = all_pages(base);
        let mut parent = vec![i32::MIN; pages_n];
        assert_eq!(host_stat(pages_n, pages.as_ptr(), parent.as_mut_ptr()), 0);
        // The child's results: the statuses before its reads and after each,
        // and each read's fault count.
        let rows = 1 + CHILD_READS.len();
        let out_len = rows * pages_n * 4 + CHILD_READS.len() * 8;
        let out = libc::mmap(
            std::ptr::null_mut(),
            out_len,
            rw,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        );
        assert_ne!(out, libc::MAP_FAILED);
        let statuses = out as *mut i32;
        let faults = (out as *mut u8).add(rows * pages_n * 4) as *mut u64;
        let reads: Vec<u64> = CHILD_READS.iter().map(|&(slot, page)| addr(base, slot, page)).collect();
        let child = libc::fork();
        assert!(child >= 0);
        if child == 0 {
            let mut ok = host_stat(pages_n, pages.as_ptr(), statuses) == 0;
            // `getrusage` copies its count onto the stack after taking it:
            // on a stack page the child has not written since the fork,
            // that copy's COW fault came after the count, so the first
            // read's count had one fault more than the read made (by where
            // the stack began in its page). This call takes that fault.
            let _ = minflt();
            for (k, &a) in reads.iter().enumerate() {
                let f0 = minflt();
                std::ptr::read_volatile(a as *const u64);
                let f1 = minflt();
                faults.add(k).write_volatile(f1 - f0);
                ok &= host_stat(pages_n, pages.as_ptr(), statuses.add((k + 1) * pages_n)) == 0;
            }
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut wst = 0;
        assert_eq!(libc::waitpid(child, &mut wst, 0), child);
        assert!(libc::WIFEXITED(wst) && libc::WEXITSTATUS(wst) == 0, "the host child failed: {wst:#x}");
        let row = |r: usize| std::slice::from_raw_parts(statuses.add(r * pages_n), pages_n).to_vec();
        let obs = Observed {
            parent,
            child: row(0),
            reads: (0..CHILD_READS.len()).map(|k| (faults.add(k).read_volatile(), row(k + 1))).collect(),
        };
        libc::munmap(out, out_len);
        libc::munmap(reserve, (SPAN + (2 << 20)) as usize);
        libc::close(fd);
        Some((base, obs))
    }
}

#[test]
fn a_forked_child_maps_what_linux_maps() {
    let Some((base, host)) = host_side() else { return };
    let soft = softmm_side(base);
    assert_eq!(describe(&soft.parent), describe(&host.parent), "the parent's pages");
    assert_eq!(soft.parent, host.parent);
    assert_eq!(describe(&soft.child), describe(&host.child), "the child's pages right after fork");
    assert_eq!(soft.child, host.child);
    for (k, (s, h)) in soft.reads.iter().zip(&host.reads).enumerate() {
        let what = format!("child read {k} {:?}", CHILD_READS[k]);
        assert_eq!(describe(&s.1), describe(&h.1), "{what}: the child's pages");
        assert_eq!(s.1, h.1, "{what}");
        assert_eq!(s.0, h.0, "{what}: faults");
    }
}
