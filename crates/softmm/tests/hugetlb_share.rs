//! hugetlb PMD sharing, on by default, against the calls that meet it:
//! page migration (`move_pages`, `mbind`), which never migrates hugetlb
//! pages and reports them as Linux reports an unmovable page, and a full
//! 1 GiB window faulted by a forked child (one fault, as on the host).

mod common;

use std::sync::Arc;

use common::assert_no_leaks;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem, MPOL_BIND, MPOL_MF_MOVE};
use softmm::{MPOL_MF_MOVE_ALL, MPOL_MF_STRICT};

const HP: u64 = 2 << 20;
const PUD: u64 = 1 << 30;
const RW: i32 = PROT_READ | PROT_WRITE;

/// Maps `len` bytes of `f` shared at `at`, without reservations.
fn map_shared(mm: &AddressSpace, f: &Arc<File>, at: u64, len: u64) -> u64 {
    let open = OpenFile::read_write(f);
    mm.mmap(at, len, RW, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, Some(&open), 0).unwrap()
}

/// The node of the page at `addr` (`move_pages` with no nodes).
fn node_of(mm: &AddressSpace, addr: u64) -> i32 {
    let mut status = [0];
    mm.move_pages(&[addr], None, &mut status, 0).unwrap();
    status[0]
}

#[test]
fn move_pages_and_mbind_leave_hugetlb_pages_where_they_are_and_shared_tables_alone() {
    let phys = PhysMem::new(PhysConfig::new(64 << 20).nodes(2).hugepages(6)).unwrap();
    let f = File::create_hugetlbfs(&phys, "/db", PUD).unwrap();
    let config = MmConfig::default();
    let parent = AddressSpace::new(&phys, config.clone()).unwrap();
    let a = map_shared(&parent, &f, 4 * PUD, PUD);
    let mut cpu = Cpu::attached(&parent);
    for i in 0..3 {
        cpu.write_u64(a + i * HP, 0xface + i).unwrap();
    }
    drop(cpu);
    let child = parent.fork().unwrap();
    assert_eq!(Cpu::attached(&child).read_u64(a).unwrap(), 0xface);
    assert_eq!(phys.huge_page_stats().pmd_shares, 1, "the child links the parent's table");
    let here = node_of(&child, a);
    let there = 1 - here;
    let pages = [a, a + HP + 4096, a + 5 * HP];
    let mut status = [0; 3];
    // Mapped once (through one shared table): Linux would isolate it; here
    // it is unmovable, -EBUSY. Nothing mapped: -ENOENT. Already there: the node.
    for (mm, flags) in [(&child, MPOL_MF_MOVE), (&parent, MPOL_MF_MOVE)] {
        assert_eq!(mm.move_pages(&pages, Some(&[there; 3]), &mut status, flags), Ok(0));
        assert_eq!(status, [-libc::EBUSY, -libc::EBUSY, -libc::ENOENT]);
        assert_eq!(mm.move_pages(&pages[..2], Some(&[here; 2]), &mut status[..2], flags), Ok(0));
        assert_eq!(status[..2], [here, here]);
    }
    // A third process maps the window 2 MiB off the PUD: a table of its own,
    // so the page is mapped twice: -EACCES without MPOL_MF_MOVE_ALL.
    let other = AddressSpace::new(&phys, config.clone().cap_sys_nice(true)).unwrap();
    let b = map_shared(&other, &f, 8 * PUD + HP, PUD);
    assert_eq!(Cpu::attached(&other).read_u64(b).unwrap(), 0xface);
    assert_eq!(other.move_pages(&[b], Some(&[there]), &mut status[..1], MPOL_MF_MOVE), Ok(0));
    assert_eq!(status[0], -libc::EACCES);
    assert_eq!(other.move_pages(&[b], Some(&[there]), &mut status[..1], MPOL_MF_MOVE_ALL), Ok(0));
    assert_eq!(status[0], -libc::EBUSY);
    // mbind with MOVE|STRICT: a page reached through a shared table, or
    // mapped twice, is left alone and is no failure (queue_folios_hugetlb);
    // with MOVE_ALL it is one page that did not move: EIO.
    let mask = [1u64 << there];
    let strict = MPOL_MF_MOVE | MPOL_MF_STRICT;
    assert_eq!(child.mbind(a, PUD, MPOL_BIND, Some(&mask), 3, strict), Ok(()));
    assert_eq!(other.mbind(b, PUD, MPOL_BIND, Some(&mask), 3, strict), Ok(()));
    assert_eq!(
        other.mbind(b, PUD, MPOL_BIND, Some(&mask), 3, MPOL_MF_MOVE_ALL | MPOL_MF_STRICT),
        Err(softmm::Errno::Io)
    );
    // A private page mapped once is unmovable: EIO with STRICT, success
    // without; migrate_pages counts it once (one 2 MiB page, not 512).
    let p = parent.mmap(0, 2 * HP, RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    Cpu::attached(&parent).write_u64(p, 7).unwrap();
    assert_eq!(parent.mbind(p, 2 * HP, MPOL_BIND, Some(&mask), 3, strict), Err(softmm::Errno::Io));
    assert_eq!(parent.mbind(p, 2 * HP, MPOL_BIND, Some(&mask), 3, MPOL_MF_MOVE), Ok(()));
    let from = [1u64 << here];
    assert_eq!(parent.migrate_pages(3, Some(&from), Some(&mask)), Ok(1));
    // Nothing moved, nothing unshared, every value still there.
    assert_eq!(phys.huge_page_stats().pmd_unshares, 0);
    assert_eq!(node_of(&child, a), here);
    for (mm, at) in [(&parent, a), (&child, a), (&other, b)] {
        let mut cpu = Cpu::attached(mm);
        for i in 0..3 {
            assert_eq!(cpu.read_u64(at + i * HP).unwrap(), 0xface + i);
        }
    }
    assert_eq!(Cpu::attached(&parent).read_u64(p).unwrap(), 7);
    drop((parent, child, other, f));
    assert_no_leaks(&phys);
}
