//! `move_pages` and `migrate_pages(2)` against the host kernel, for what a
//! host with one NUMA node can run: the same layout of pages (written,
//! read-faulted onto the zero page, never touched, a hole, `PROT_NONE`
//! after a write, all shared with a forked child but one written again
//! after the fork) at the same addresses in this
//! test process and in a one-node softmm address space, then the same calls
//! on both: the query mode's statuses, moves to node 0 (statuses and
//! return), `ENODEV` for nodes that do not exist (and the statuses written
//! before it), `EINVAL` for bad flags, `MPOL_MF_MOVE_ALL` as root, and
//! `migrate_pages(2)` with empty, foreign and oversized masks. Every call
//! compares the return (value or errno) and every status.
//!
//! The host calls use `pid` 0 (this process). Skipped, saying why, where the
//! host refuses `move_pages` itself (no NUMA support: `ENOSYS`).

use std::sync::Arc;

use softmm::uapi::*;
use softmm::*;

const PAGE: u64 = PAGE_SIZE;
/// Pages of the layout; page [`HOLE`] is unmapped on both sides.
const PAGES: u64 = 8;
const WRITTEN: u64 = 0;
const ZERO: u64 = 1;
const UNTOUCHED: u64 = 2;
const HOLE: u64 = 3;
const SHARED: u64 = 4;
const PROTNONE: u64 = 5;
const WRITTEN2: u64 = 6;
/// Stands for an address no VMA covers on either side: the page at 4 KiB,
/// below `mmap_min_addr` on the host (a page just past the layout is not:
/// a test running beside this one may map it).
const NO_VMA: u64 = u64::MAX;

/// The host side: the layout in this process, and a forked child that maps
/// page [`SHARED`] too (it sleeps until killed when this is dropped).
struct Host {
    base: u64,
    child: libc::pid_t,
}

/// One layout at a time: the other test's mappings must not land in this
/// one's hole.
static LAYOUT: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Host {
    fn new() -> Host {
        // SAFETY: a fresh private anonymous reservation owned by the test;
        // every page touched below lies in it; the child only sleeps (no
        // allocation or lock after fork) until it is killed.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                (PAGES * PAGE) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let base = p as u64;
            libc::munmap((base + HOLE * PAGE) as *mut libc::c_void, PAGE as usize);
            for page in [WRITTEN, SHARED, PROTNONE, WRITTEN2] {
                std::ptr::write_volatile((base + page * PAGE) as *mut u64, 1);
            }
            std::ptr::read_volatile((base + ZERO * PAGE) as *const u64);
            libc::mprotect((base + PROTNONE * PAGE) as *mut libc::c_void, PAGE as usize, libc::PROT_NONE);
            let child = libc::fork();
            assert!(child >= 0);
            if child == 0 {
                // Until the parent kills it (a pipe would not do: a child
                // forked by another test at the same time inherits its end).
                loop {
                    libc::pause();
                }
            }
            // Written again after the fork: the parent's own copy.
            std::ptr::write_volatile((base + WRITTEN2 * PAGE) as *mut u64, 2);
            Host { base, child }
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SAFETY: our child, our mapping.
        unsafe {
            libc::kill(self.child, libc::SIGKILL);
            libc::waitpid(self.child, std::ptr::null_mut(), 0);
            libc::munmap(self.base as *mut libc::c_void, (PAGES * PAGE) as usize);
        }
    }
}

/// The softmm side: the same layout at the same addresses in a one-node
/// arena, with a forked child mapping page [`SHARED`] too.
fn soft(base: u64, phys: &Arc<PhysMem>) -> (Arc<AddressSpace>, Arc<AddressSpace>) {
    let mm = AddressSpace::new(phys, MmConfig::default().cap_sys_nice(root())).unwrap();
    let rw = PROT_READ | PROT_WRITE;
    mm.mmap(base, PAGES * PAGE, rw, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    mm.munmap(base + HOLE * PAGE, PAGE).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        for page in [WRITTEN, SHARED, PROTNONE, WRITTEN2] {
            cpu.write_u64(base + page * PAGE, 1).unwrap();
        }
        cpu.read_u64(base + ZERO * PAGE).unwrap();
    }
    mm.mprotect(base + PROTNONE * PAGE, PAGE, PROT_NONE).unwrap();
    let child = mm.fork().unwrap();
    Cpu::attached(&mm).write_u64(base + WRITTEN2 * PAGE, 2).unwrap();
    (mm, child)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A call's outcome: the return value, or the errno.
type Outcome = std::result::Result<u64, i32>;

fn host_move_pages(pages: &[u64], nodes: Option<&[i32]>, status: &mut [i32], flags: u32) -> Outcome {
    let nodes_ptr = nodes.map_or(std::ptr::null(), |n| n.as_ptr());
    // SAFETY: `pages`, `nodes` and `status` have `pages.len()` entries each
    // (asserted by the callers' construction); the addresses are the test's
    // own mappings or unmapped, which the kernel reports per page.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            nodes_ptr,
            status.as_mut_ptr(),
            flags as libc::c_int,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

fn soft_outcome(r: Result<u64>) -> Outcome {
    r.map_err(|e| e.code())
}

/// `move_pages` with these page indices (relative to each side's base) and
/// nodes on both sides: same outcome, same statuses.
#[track_caller]
fn same_move_pages(host: &Host, mm: &AddressSpace, idx: &[u64], nodes: Option<&[i32]>, flags: u32, what: &str) {
    let pages: Vec<u64> = idx.iter().map(|&i| if i == NO_VMA { PAGE } else { host.base + i * PAGE }).collect();
    if let Some(n) = nodes {
        assert_eq!(n.len(), pages.len());
    }
    let mut hs = vec![i32::MIN; pages.len()];
    let mut ss = vec![i32::MIN; pages.len()];
    let h = host_move_pages(&pages, nodes, &mut hs, flags);
    let s = soft_outcome(mm.move_pages(&pages, nodes, &mut ss, flags));
    assert_eq!(s, h, "{what}: move_pages returned {s:?} in softmm, {h:?} on the host");
    assert_eq!(ss, hs, "{what}: statuses (softmm, host) for pages {idx:?}");
}

fn host_supports_move_pages() -> bool {
    let mut st = [0];
    let page = [0u64];
    if host_move_pages(&page, None, &mut st, 0) == Err(libc::ENOSYS) {
        eprintln!("skipped: the host kernel has no move_pages (no NUMA support)");
        return false;
    }
    true
}

/// Root on the host has `CAP_SYS_NICE`; the softmm side is configured with
/// it. As another user the host refuses `MPOL_MF_MOVE_ALL`: softmm's
/// default configuration (no `cap_sys_nice`) is compared then.
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn move_pages_matches_the_host_on_one_node() {
    if !host_supports_move_pages() {
        return;
    }
    let _one = LAYOUT.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    {
        let (mm, _child) = soft(host.base, &phys);
        let all: Vec<u64> = (0..PAGES).chain([NO_VMA]).collect();
        same_move_pages(&host, &mm, &all, None, 0, "query");
        same_move_pages(&host, &mm, &all, None, MPOL_MF_MOVE, "query with MPOL_MF_MOVE");
        let zeros = vec![0; all.len()];
        same_move_pages(&host, &mm, &all, Some(&zeros), MPOL_MF_MOVE, "every page to node 0");
        same_move_pages(&host, &mm, &[SHARED], Some(&[0]), MPOL_MF_MOVE, "a shared page, already there");
        if root() {
            same_move_pages(&host, &mm, &all, Some(&zeros), MPOL_MF_MOVE_ALL, "MPOL_MF_MOVE_ALL as root");
        }
        same_move_pages(&host, &mm, &[], Some(&[]), MPOL_MF_MOVE, "no pages");
        same_move_pages(&host, &mm, &[WRITTEN], Some(&[1]), MPOL_MF_MOVE, "node 1");
        same_move_pages(&host, &mm, &[WRITTEN], Some(&[-1]), MPOL_MF_MOVE, "node -1");
        same_move_pages(&host, &mm, &[WRITTEN], Some(&[1 << 20]), MPOL_MF_MOVE, "a huge node");
        same_move_pages(&host, &mm, &[WRITTEN, WRITTEN2], Some(&[0, 1]), MPOL_MF_MOVE, "node 0 then node 1");
        same_move_pages(
            &host,
            &mm,
            &[ZERO, WRITTEN, UNTOUCHED],
            Some(&[0, 0, 1]),
            MPOL_MF_MOVE,
            "statuses before ENODEV",
        );
        for flags in [MPOL_MF_STRICT, 8, 1 << 31, MPOL_MF_MOVE | MPOL_MF_STRICT] {
            same_move_pages(&host, &mm, &[WRITTEN], Some(&[0]), flags, &format!("flags {flags:#x}"));
        }
        same_move_pages(&host, &mm, &[WRITTEN], None, MPOL_MF_STRICT, "query with bad flags");
    }
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
}

fn host_migrate_pages(maxnode: u64, old: Option<&[u64]>, new: Option<&[u64]>) -> Outcome {
    let ptr = |m: Option<&[u64]>| m.map_or(std::ptr::null(), |m| m.as_ptr());
    // SAFETY: the kernel reads at most `maxnode - 1` bits of each mask, and
    // the cases give masks of at least that many bits (or maxnode values
    // the kernel refuses before reading).
    let r = unsafe { libc::syscall(libc::SYS_migrate_pages, 0, maxnode, ptr(old), ptr(new)) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// A `migrate_pages(2)` case: what, `maxnode`, old nodes, new nodes.
type MigrateCase<'a> = (&'a str, u64, Option<&'a [u64]>, Option<&'a [u64]>);

#[test]
fn migrate_pages_matches_the_host_on_one_node() {
    if !host_supports_move_pages() {
        return;
    }
    let _one = LAYOUT.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    {
        let (mm, _child) = soft(host.base, &phys);
        let big = [0u64; 64 * 2 + 1];
        let mut high = [0u64; 64 * 2];
        high[64 * 2 - 1] = 1 << 63;
        let cases: &[MigrateCase] = &[
            ("0 to 0", 2, Some(&[1]), Some(&[1])),
            ("empty old", 2, Some(&[0]), Some(&[1])),
            ("no old mask", 2, None, Some(&[1])),
            ("empty new", 2, Some(&[1]), Some(&[0])),
            ("no new mask", 2, Some(&[1]), None),
            ("0 to a foreign node", 3, Some(&[1]), Some(&[2])),
            ("0 to 0 and a foreign node", 3, Some(&[1]), Some(&[3])),
            ("a foreign node to 0", 3, Some(&[2]), Some(&[1])),
            ("maxnode 0", 0, Some(&[1]), Some(&[1])),
            ("maxnode 1", 1, Some(&[1]), Some(&[1])),
            ("maxnode 65", 65, Some(&[1, 0]), Some(&[1, 0])),
            ("maxnode past a page of bits", 4096 * 8 + 2, Some(&big), Some(&big)),
            ("a bit past MAX_NUMNODES", 64 * 2 * 64, Some(&high), Some(&[1; 128])),
        ];
        for &(what, maxnode, old, new) in cases {
            let h = host_migrate_pages(maxnode, old, new);
            let s = soft_outcome(mm.migrate_pages(maxnode, old, new));
            assert_eq!(s, h, "migrate_pages {what}: softmm {s:?}, host {h:?}");
        }
    }
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
}
