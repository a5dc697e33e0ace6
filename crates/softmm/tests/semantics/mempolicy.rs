//! NUMA memory policies: `set_mempolicy` and `mbind` place the pages of
//! anonymous and page-cache faults, VMAs split and merge on their policies,
//! fork inherits them, `move_pages`' query mode reports the nodes; and the
//! errnos of `mbind`/`set_mempolicy` agree with the host kernel's (which has
//! one node here) for the same arguments.

use std::sync::Arc;

use softmm::uapi::*;
use softmm::*;

const PAGE: u64 = PAGE_SIZE;

/// A two-node arena of `frames_per_node` frames per node.
fn two_nodes(frames_per_node: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(2 * frames_per_node * PAGE).nodes(2)).unwrap()
}

fn anon(mm: &AddressSpace, pages: u64) -> u64 {
    mm.mmap(0, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap()
}

/// The node of each page of `[a, a + pages)`, as `move_pages(.., NULL, ..)` reports it.
#[track_caller]
fn nodes_of(mm: &AddressSpace, a: u64, pages: u64) -> Vec<i32> {
    let addrs: Vec<u64> = (0..pages).map(|i| a + i * PAGE).collect();
    let mut status = vec![i32::MIN; addrs.len()];
    mm.pages_stat(&addrs, &mut status).unwrap();
    status
}

fn touch(mm: &Arc<AddressSpace>, a: u64, pages: u64) {
    let mut cpu = Cpu::attached(mm);
    for i in 0..pages {
        cpu.write_u64(a + i * PAGE, i).unwrap();
    }
}

#[test]
fn default_policy_allocates_on_node_0() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = anon(&mm, 4);
    touch(&mm, a, 4);
    assert_eq!(nodes_of(&mm, a, 4), [0; 4]);
    let stats = phys.node_stats();
    assert_eq!(stats.len(), 2);
    assert!(stats[0].frames_used >= 4, "{stats:?}");
}

#[test]
fn set_mempolicy_bind_places_anonymous_pages_and_counts_them_per_node() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let before = phys.node_stats()[1].frames_used;
    mm.set_mempolicy(MPOL_BIND, Some(&[0b10]), 3).unwrap();
    let a = anon(&mm, 8);
    touch(&mm, a, 8);
    assert_eq!(nodes_of(&mm, a, 8), [1; 8]);
    // Node 1 counts the 8 pages.
    assert!(phys.node_stats()[1].frames_used >= before + 8);
    // Back to the default: new pages on node 0.
    mm.set_mempolicy(MPOL_DEFAULT, None, 0).unwrap();
    let b = anon(&mm, 2);
    touch(&mm, b, 2);
    assert_eq!(nodes_of(&mm, b, 2), [0; 2]);
}

#[test]
fn interleave_alternates_by_page_index() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    mm.set_mempolicy(MPOL_INTERLEAVE, Some(&[0b11]), 3).unwrap();
    let a = anon(&mm, 6);
    touch(&mm, a, 6);
    let nodes = nodes_of(&mm, a, 6);
    // Linear index (a >> 12) + i picks node (index % 2).
    let want: Vec<i32> = (0..6).map(|i| (((a / PAGE) + i) % 2) as i32).collect();
    assert_eq!(nodes, want);
}

#[test]
fn bind_fails_when_its_nodes_are_full_but_preferred_falls_back() {
    let phys = two_nodes(16);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    mm.set_mempolicy(MPOL_PREFERRED, Some(&[0b10]), 3).unwrap();
    let a = anon(&mm, 24);
    touch(&mm, a, 24);
    let nodes = nodes_of(&mm, a, 24);
    assert!(nodes.contains(&1) && nodes.contains(&0), "preferred node 1 first, then node 0: {nodes:?}");
    let mm2 = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    mm2.set_mempolicy(MPOL_BIND, Some(&[0b10]), 3).unwrap();
    let b = anon(&mm2, 4);
    let mut cpu = Cpu::attached(&mm2);
    let err = cpu.write_u64(b, 1).unwrap_err();
    assert!(matches!(err, Fault::Oom { .. }), "node 1 is full and BIND may not use node 0: {err:?}");
}

/// `MPOL_PREFERRED_MANY` (Linux's `alloc_pages_preferred_many`): the
/// nodes of the mask first, the local one leading, and only when they are
/// all full any other node. With nodes 0 and 2 preferred, node 0's
/// overflow goes to node 2, not to node 1 (softmm's next node in order),
/// and the overflow of both to node 1.
#[test]
fn preferred_many_fills_its_nodes_before_any_other() {
    let phys = PhysMem::new(PhysConfig::new(3 * 16 * PAGE).nodes(3)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    mm.set_mempolicy(MPOL_PREFERRED_MANY, Some(&[0b101]), 4).unwrap();
    let a = anon(&mm, 20);
    touch(&mm, a, 20);
    let nodes = nodes_of(&mm, a, 20);
    assert!(nodes.iter().all(|&n| n == 0 || n == 2), "only the preferred nodes while they have frames: {nodes:?}");
    assert!(nodes.contains(&2), "node 0's overflow on node 2: {nodes:?}");
    let free: u64 = phys.node_stats().iter().map(|s| s.frames_free).sum();
    let b = anon(&mm, free.min(24));
    touch(&mm, b, free.min(24));
    let more = nodes_of(&mm, b, free.min(24));
    assert!(more.contains(&1), "then any node: {more:?}");
    drop(mm);
    assert_eq!(phys.quiesce().frames_used, 0);
}

#[test]
fn mbind_splits_the_vma_places_its_pages_and_merges_back() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = anon(&mm, 6);
    assert_eq!(mm.maps().len(), 1);
    mm.mbind(a + 2 * PAGE, 2 * PAGE, MPOL_BIND, Some(&[0b10]), 3, 0).unwrap();
    assert_eq!(mm.maps().len(), 3, "{}", mm.maps_text());
    touch(&mm, a, 6);
    assert_eq!(nodes_of(&mm, a, 6), [0, 0, 1, 1, 0, 0]);
    // The VMA policy wins over the address space's.
    mm.set_mempolicy(MPOL_BIND, Some(&[0b01]), 3).unwrap();
    let b = anon(&mm, 2);
    mm.mbind(b, 2 * PAGE, MPOL_PREFERRED, Some(&[0b10]), 3, 0).unwrap();
    touch(&mm, b, 2);
    assert_eq!(nodes_of(&mm, b, 2), [1, 1]);
    // The same policy on the neighbours merges the three VMAs back.
    mm.mbind(a, 6 * PAGE, MPOL_BIND, Some(&[0b10]), 3, 0).unwrap();
    assert!(mm.maps().iter().any(|m| m.start == a && m.end == a + 6 * PAGE), "{}", mm.maps_text());
    // STRICT: pages 0, 1, 4, 5 sit on node 0, outside the mask: EIO, policy set anyway.
    assert_eq!(mm.mbind(a, 6 * PAGE, MPOL_BIND, Some(&[0b10]), 3, MPOL_MF_STRICT), Err(Errno::Io));
    assert_eq!(mm.mbind(a + 2 * PAGE, 2 * PAGE, MPOL_BIND, Some(&[0b10]), 3, MPOL_MF_STRICT), Ok(()));
}

#[test]
fn fork_inherits_both_policies() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    mm.set_mempolicy(MPOL_BIND, Some(&[0b10]), 3).unwrap();
    let a = anon(&mm, 2);
    mm.mbind(a, PAGE, MPOL_BIND, Some(&[0b01]), 3, 0).unwrap();
    let child = mm.fork().unwrap();
    touch(&child, a, 2);
    assert_eq!(nodes_of(&child, a, 2), [0, 1]);
    let b = anon(&child, 1);
    touch(&child, b, 1);
    assert_eq!(nodes_of(&child, b, 1), [1]);
}

#[test]
fn page_cache_pages_follow_the_mapping_policy() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let f = File::create(&phys, "/tmp/f", 4 * PAGE).unwrap();
    let a = mm.mmap(0, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
    mm.mbind(a, 4 * PAGE, MPOL_BIND, Some(&[0b10]), 3, 0).unwrap();
    touch(&mm, a, 4);
    assert_eq!(nodes_of(&mm, a, 4), [1; 4]);
}

#[test]
fn pages_stat_reports_like_linux() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = anon(&mm, 3);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    cpu.read_u64(a + PAGE).unwrap(); // the zero page
    let addrs = [a + 8, a + PAGE, a + 2 * PAGE, a + 3 * PAGE];
    let mut status = [0; 4];
    mm.pages_stat(&addrs, &mut status).unwrap();
    assert_eq!(status, [0, -libc::EFAULT, -libc::ENOENT, -libc::EFAULT]);
    assert_eq!(mm.pages_stat(&addrs, &mut [0; 3]), Err(Errno::Fault));
}

#[test]
fn nothing_leaks() {
    let phys = two_nodes(64);
    {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        mm.set_mempolicy(MPOL_INTERLEAVE, Some(&[0b11]), 3).unwrap();
        let a = anon(&mm, 8);
        mm.mbind(a, 4 * PAGE, MPOL_BIND, Some(&[0b10]), 3, 0).unwrap();
        touch(&mm, a, 8);
        let c = mm.fork().unwrap();
        touch(&c, a, 8);
    }
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
    assert!(phys.node_stats().iter().all(|n| n.frames_used == 0), "{:?}", phys.node_stats());
}

/// One call of the errno table: `mbind(base + start_pages * PAGE + extra, len, mode, mask, maxnode, flags)`.
struct Case {
    what: &'static str,
    start: u64,
    len: u64,
    mode: i32,
    mask: Option<&'static [u64]>,
    maxnode: u64,
    flags: u32,
}

/// The layout both sides share: 5 pages mapped, the third and fifth unmapped (holes),
/// then `CASES` run in order; the first page is written to (node 0).
const CASES: &[Case] = &[
    Case { what: "bind node 0", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case { what: "unaligned start", start: 1, len: PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case { what: "unknown mode", start: 0, len: PAGE, mode: MPOL_MAX, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case {
        what: "static|relative",
        start: 0,
        len: PAGE,
        mode: MPOL_BIND | MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES,
        mask: Some(&[1]),
        maxnode: 2,
        flags: 0,
    },
    Case { what: "node 1 only", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[2]), maxnode: 3, flags: 0 },
    Case { what: "empty bind", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[0]), maxnode: 2, flags: 0 },
    Case { what: "default with mask", start: 0, len: PAGE, mode: MPOL_DEFAULT, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case { what: "hole inside", start: 0, len: 4 * PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case {
        what: "default over the hole",
        start: 0,
        len: 4 * PAGE,
        mode: MPOL_DEFAULT,
        mask: None,
        maxnode: 0,
        flags: 0,
    },
    Case { what: "only the hole", start: 2 * PAGE, len: PAGE, mode: MPOL_DEFAULT, mask: None, maxnode: 0, flags: 0 },
    Case { what: "unknown flag", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 8 },
    Case { what: "zero length", start: 0, len: 0, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case {
        what: "wrapping length",
        start: 0,
        len: u64::MAX - 0x1000,
        mode: MPOL_BIND,
        mask: Some(&[1]),
        maxnode: 2,
        flags: 0,
    },
    Case { what: "huge maxnode", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 1 << 20, flags: 0 },
    Case { what: "strict in place", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 1 },
    Case { what: "move in place", start: 0, len: 2 * PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 2 },
    Case { what: "move all (root)", start: 0, len: PAGE, mode: MPOL_BIND, mask: Some(&[1]), maxnode: 2, flags: 4 },
    Case { what: "interleave", start: 0, len: 2 * PAGE, mode: MPOL_INTERLEAVE, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case {
        what: "maxnode 0 with a mask",
        start: 0,
        len: PAGE,
        mode: MPOL_BIND,
        mask: Some(&[1]),
        maxnode: 0,
        flags: 0,
    },
    Case { what: "preferred empty", start: 0, len: PAGE, mode: MPOL_PREFERRED, mask: None, maxnode: 0, flags: 0 },
    Case {
        what: "preferred empty static",
        start: 0,
        len: PAGE,
        mode: MPOL_PREFERRED | MPOL_F_STATIC_NODES,
        mask: None,
        maxnode: 0,
        flags: 0,
    },
    Case { what: "local with mask", start: 0, len: PAGE, mode: MPOL_LOCAL, mask: Some(&[1]), maxnode: 2, flags: 0 },
    Case {
        what: "past the end",
        start: 3 * PAGE,
        len: 2 * PAGE,
        mode: MPOL_BIND,
        mask: Some(&[1]),
        maxnode: 2,
        flags: 0,
    },
];

fn errno_of(r: i64) -> i32 {
    if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        0
    }
}

#[test]
fn mbind_and_set_mempolicy_errnos_match_the_host() {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default().cap_sys_nice(true)).unwrap();
    // SAFETY: a fresh anonymous mapping the test owns; a page of it is unmapped to make a hole.
    let host = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            5 * PAGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap((p as *mut u8).add(2 * PAGE as usize).cast(), PAGE as usize);
        libc::munmap((p as *mut u8).add(4 * PAGE as usize).cast(), PAGE as usize);
        *(p as *mut u64) = 1;
        p as u64
    };
    mm.mmap(host, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
    mm.munmap(host + 2 * PAGE, PAGE).unwrap();
    Cpu::attached(&mm).write_u64(host, 1).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for c in CASES {
        if c.flags & 4 != 0 && !root {
            continue;
        }
        let mask_ptr = c.mask.map_or(std::ptr::null(), |m| m.as_ptr());
        // SAFETY: mbind reads at most `maxnode - 1` bits of `mask` (checked
        // against its length by the case table: a huge maxnode fails first)
        // and changes only the policy of the test's own mapping.
        let r = unsafe { libc::syscall(libc::SYS_mbind, host + c.start, c.len, c.mode, mask_ptr, c.maxnode, c.flags) };
        let want = errno_of(r);
        let got = mm.mbind(host + c.start, c.len, c.mode, c.mask, c.maxnode, c.flags).err().map_or(0, |e| e.code());
        assert_eq!(got, want, "mbind {}: softmm {got} host {want}", c.what);
        if c.start == 0 && c.len == PAGE && c.flags == 0 {
            // SAFETY: set_mempolicy changes only this test thread's policy; it is reset below.
            let r = unsafe { libc::syscall(libc::SYS_set_mempolicy, c.mode, mask_ptr, c.maxnode) };
            let want = errno_of(r);
            let got = mm.set_mempolicy(c.mode, c.mask, c.maxnode).err().map_or(0, |e| e.code());
            assert_eq!(got, want, "set_mempolicy {}: softmm {got} host {want}", c.what);
        }
    }
    // SAFETY: back to the default policy for this thread; the mapping is the test's.
    unsafe {
        libc::syscall(libc::SYS_set_mempolicy, MPOL_DEFAULT, std::ptr::null::<u64>(), 0u64);
        // Only the pages still this test's: the holes may be another
        // test thread's mappings by now.
        libc::munmap(host as *mut libc::c_void, 2 * PAGE as usize);
        libc::munmap((host + 3 * PAGE) as *mut libc::c_void, PAGE as usize);
    }
}
