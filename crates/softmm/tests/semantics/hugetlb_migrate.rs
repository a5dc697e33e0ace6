//! hugetlb page migration (`move_pages`, `mbind` with `MPOL_MF_MOVE`,
//! `migrate_pages(2)`): a 2 MiB page moves to a free page of the target
//! node's pool, every PMD entry mapping it going through a migration entry,
//! the page cache switching for a shared file; counts stay exact, pins keep
//! a page where it is, an empty target pool is `ENOMEM`, and a concurrent
//! writer never loses a write nor reads a stale value.

use softmm_testkit::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::{assert_no_leaks, watchdog};
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, File, Foll, MmConfig, OpenFile, PhysConfig, PhysMem};
use softmm::{HugePageNodeStats, MPOL_BIND, MPOL_MF_MOVE, MPOL_MF_MOVE_ALL, MPOL_MF_STRICT};

const HP: u64 = 2 << 20;
const PUD: u64 = 1 << 30;
const RW: i32 = PROT_READ | PROT_WRITE;
const PRIVATE_HUGE: i32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB;

/// Two nodes with `huge` pool pages each.
fn arena(huge: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(2 * ((8 << 20) + (huge + 1) * HP)).nodes(2).hugepages(huge)).unwrap()
}

/// The node of the page at `addr` (`move_pages` with no nodes).
fn node_of(mm: &AddressSpace, addr: u64) -> i32 {
    let mut status = [0];
    mm.move_pages(&[addr], None, &mut status, 0).unwrap();
    status[0]
}

/// Per node (total, free).
fn per_node(phys: &PhysMem) -> Vec<(u64, u64)> {
    phys.huge_page_node_stats().iter().map(|s: &HugePageNodeStats| (s.total, s.free)).collect()
}

/// Writes a pattern of `tag` over the huge page at `a`: one word per 4 KiB.
fn fill(cpu: &mut Cpu, a: u64, tag: u64) {
    for i in 0..512 {
        cpu.write_u64(a + i * 4096 + (i % 7) * 8, tag << 16 | i).unwrap();
    }
}

fn check(cpu: &mut Cpu, a: u64, tag: u64) {
    for i in 0..512 {
        assert_eq!(cpu.read_u64(a + i * 4096 + (i % 7) * 8).unwrap(), tag << 16 | i, "word {i}");
    }
}

#[test]
fn a_private_and_a_shared_hugetlb_page_move_between_nodes_with_data_intact_and_counts_exact() {
    let phys = arena(2);
    {
        let f = File::create_hugetlbfs(&phys, "/db", 2 * HP).unwrap();
        let open = OpenFile::read_write(&f);
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let s = mm.mmap(0, HP, RW, MAP_SHARED, Some(&open), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 1);
        fill(&mut cpu, s, 2);
        let here = node_of(&mm, p);
        assert_eq!(node_of(&mm, s), here, "both faulted on the local node");
        let there = 1 - here;
        let before = phys.huge_page_stats();
        assert_eq!((before.total, before.free), (4, 2));
        let mut nodes_before = per_node(&phys);
        let mut status = [-1; 2];
        assert_eq!(mm.move_pages(&[p, s], Some(&[there; 2]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!(status, [there; 2]);
        assert_eq!((node_of(&mm, p), node_of(&mm, s)), (there, there));
        check(&mut cpu, p, 1);
        check(&mut cpu, s, 2);
        // The pool: the same totals, two pages moved from one node's free
        // list to the other's; no reservation consumed or made.
        let after = phys.huge_page_stats();
        assert_eq!((after.total, after.free, after.rsvd, after.surp), (before.total, before.free, before.rsvd, 0));
        assert_eq!(after.allocations, before.allocations + 2);
        nodes_before[here as usize].1 += 2;
        nodes_before[there as usize].1 -= 2;
        assert_eq!(per_node(&phys), nodes_before);
        // The page cache holds the new page: a second address space maps it.
        let other = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let o = other.mmap(0, HP, PROT_READ, MAP_SHARED, Some(&open), 0).unwrap();
        check(&mut Cpu::attached(&other), o, 2);
        assert_eq!(node_of(&other, o), there);
        drop(other);
        // Writes land in the new pages, and they move back.
        fill(&mut cpu, p, 3);
        fill(&mut cpu, s, 4);
        assert_eq!(mm.move_pages(&[p, s], Some(&[here; 2]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!(status, [here; 2]);
        check(&mut cpu, p, 3);
        check(&mut cpu, s, 4);
        let back = phys.huge_page_stats();
        assert_eq!((back.free, back.rsvd), (before.free, before.rsvd));
        assert_eq!(per_node(&phys)[here as usize].1, 2 - 2, "both pages home again");
        drop((cpu, open, f, mm));
    }
    assert_no_leaks(&phys);
    assert_eq!(per_node(&phys), vec![(2, 2), (2, 2)]);
}

#[test]
fn a_private_page_shared_after_fork_moves_with_move_all_for_both() {
    let phys = arena(2);
    {
        let mm = AddressSpace::new(&phys, MmConfig::default().cap_sys_nice(true)).unwrap();
        let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 5);
        let child = mm.fork().unwrap();
        let there = 1 - node_of(&mm, p);
        let mut status = [-1];
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!(status[0], -libc::EACCES, "mapped twice");
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE_ALL), Ok(0));
        assert_eq!(status[0], there);
        assert_eq!((node_of(&mm, p), node_of(&child, p)), (there, there));
        check(&mut Cpu::attached(&child), p, 5);
        // Still COW: the child's write copies, the parent keeps its data.
        fill(&mut Cpu::attached(&child), p, 6);
        check(&mut cpu, p, 5);
        drop((cpu, child, mm));
    }
    assert_no_leaks(&phys);
}

#[test]
fn a_page_mapped_through_a_shared_pmd_table_moves_once_for_every_sharer() {
    let phys = PhysMem::new(PhysConfig::new(2 * (64 << 20)).nodes(2).hugepages(6)).unwrap();
    {
        let f = File::create_hugetlbfs(&phys, "/db", PUD).unwrap();
        let open = OpenFile::read_write(&f);
        let flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE;
        let parent = AddressSpace::new(&phys, MmConfig::default().cap_sys_nice(true)).unwrap();
        let a = parent.mmap(4 * PUD, PUD, RW, flags, Some(&open), 0).unwrap();
        let mut cpu = Cpu::attached(&parent);
        fill(&mut cpu, a, 7);
        fill(&mut cpu, a + HP, 8);
        let child = parent.fork().unwrap();
        check(&mut Cpu::attached(&child), a, 7);
        assert_eq!(phys.huge_page_stats().pmd_shares, 1, "the child links the parent's table");
        let here = node_of(&parent, a);
        let there = 1 - here;
        let mask = [1u64 << there];
        // mbind and migrate_pages(2) leave a page reached through a shared
        // table alone without MOVE_ALL (queue_folios_hugetlb): no failure.
        assert_eq!(child.mbind(a, PUD, MPOL_BIND, Some(&mask), 3, MPOL_MF_MOVE | MPOL_MF_STRICT), Ok(()));
        assert_eq!(node_of(&child, a), here);
        // move_pages counts mappings: one PMD entry maps it, so MOVE moves it.
        // The migration unshares the table in every sharer but the last
        // (try_to_migrate_one's huge_pmd_unshare), which alone gets the
        // migration entry: right after it, one sharer maps nothing there.
        let mut status = [-1];
        assert_eq!(child.move_pages(&[a], Some(&[there]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!(status[0], there);
        let s = phys.huge_page_stats();
        assert_eq!((s.pmd_shares, s.pmd_unshares), (1, 1), "one sharer unshared");
        let mut nodes = [node_of(&parent, a), node_of(&child, a)];
        nodes.sort();
        assert_eq!(nodes, [-libc::ENOENT, there], "the unsharer maps nothing until it faults");
        // Both see the data: the unsharer's fault links the table again.
        check(&mut cpu, a, 7);
        check(&mut Cpu::attached(&child), a, 7);
        assert_eq!((node_of(&parent, a), node_of(&child, a)), (there, there));
        assert_eq!(phys.huge_page_stats().pmd_shares, 2, "linked again");
        // With MOVE_ALL, mbind (of the whole window: a split would unshare
        // the table) moves the other page, for both: one more unshare.
        assert_eq!(parent.mbind(a, PUD, MPOL_BIND, Some(&mask), 3, MPOL_MF_MOVE_ALL | MPOL_MF_STRICT), Ok(()));
        assert_eq!(phys.huge_page_stats().pmd_unshares, 2);
        check(&mut cpu, a + HP, 8);
        check(&mut Cpu::attached(&child), a + HP, 8);
        assert_eq!((node_of(&parent, a + HP), node_of(&child, a + HP)), (there, there));
        // And migrate_pages(2) with CAP_SYS_NICE (MOVE_ALL) brings both
        // back: the first page's migration unshares, the second finds the
        // table no longer shared and moves through the last sharer's entry.
        assert_eq!(parent.migrate_pages(3, Some(&mask), Some(&[1u64 << here])), Ok(0));
        assert_eq!(phys.huge_page_stats().pmd_unshares, 3);
        check(&mut cpu, a, 7);
        check(&mut cpu, a + HP, 8);
        check(&mut Cpu::attached(&child), a, 7);
        check(&mut Cpu::attached(&child), a + HP, 8);
        assert_eq!((node_of(&child, a), node_of(&child, a + HP)), (here, here));
        assert_eq!((node_of(&parent, a), node_of(&parent, a + HP)), (here, here));
        drop((cpu, child, parent, open, f));
    }
    assert_no_leaks(&phys);
}

/// The same with both sharers in one address space (two shared mappings
/// of the file at PUD-aligned addresses, one table linked at two PUD
/// entries): the migration walks the address space's VMAs and unshares the
/// table by link, in the first window it reaches while the table is still
/// shared; the second window, then the table's only user, gets the
/// migration entry, and both windows read the page on its new node.
#[test]
fn a_page_mapped_through_a_table_shared_within_one_address_space_moves_once() {
    let phys = PhysMem::new(PhysConfig::new(2 * (64 << 20)).nodes(2).hugepages(6)).unwrap();
    {
        let f = File::create_hugetlbfs(&phys, "/db", PUD).unwrap();
        let open = OpenFile::read_write(&f);
        let flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE;
        let mm = AddressSpace::new(&phys, MmConfig::default().cap_sys_nice(true)).unwrap();
        let a = mm.mmap(4 * PUD, PUD, RW, flags, Some(&open), 0).unwrap();
        let b = mm.mmap(8 * PUD, PUD, RW, flags, Some(&open), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, a, 7);
        check(&mut cpu, b, 7);
        assert_eq!(phys.huge_page_stats().pmd_shares, 1, "the second window links the first one's table");
        let here = node_of(&mm, a);
        let there = 1 - here;
        // One PMD entry maps the page: MOVE moves it.
        let mut status = [-1];
        assert_eq!(mm.move_pages(&[b], Some(&[there]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!(status[0], there);
        assert_eq!(phys.huge_page_stats().pmd_unshares, 1, "one window unshared");
        let mut nodes = [node_of(&mm, a), node_of(&mm, b)];
        nodes.sort();
        assert_eq!(nodes, [-libc::ENOENT, there], "the unshared window maps nothing until it faults");
        check(&mut cpu, a, 7);
        check(&mut cpu, b, 7);
        assert_eq!((node_of(&mm, a), node_of(&mm, b)), (there, there));
        drop((cpu, mm, open, f));
    }
    assert_no_leaks(&phys);
}

#[test]
fn no_free_unreserved_page_on_the_target_node_is_enomem_and_nothing_changes() {
    let phys = arena(1);
    {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 9);
        let there = 1 - node_of(&mm, p);
        // The target node's one page is reserved by a mapping that has not
        // faulted it: a migration never takes a promised page.
        let q = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let before = phys.huge_page_stats();
        assert_eq!((before.free, before.rsvd), (1, 1));
        let nodes = per_node(&phys);
        let mut status = [-7];
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE), Err(Errno::NoMem));
        assert_eq!(status[0], -7, "the status is left unwritten");
        assert_eq!(node_of(&mm, p), 1 - there);
        check(&mut cpu, p, 9);
        let after = phys.huge_page_stats();
        assert_eq!((after.free, after.rsvd, after.allocations), (1, 1, before.allocations));
        assert_eq!(after.alloc_failures, before.alloc_failures + 1);
        assert_eq!(per_node(&phys), nodes);
        // Consumed: the pool is simply empty, still ENOMEM, for
        // migrate_pages(2) too (do_migrate_pages returns it).
        fill(&mut cpu, q, 10);
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE), Err(Errno::NoMem));
        let (from, to) = ([1u64 << (1 - there)], [1u64 << there]);
        assert_eq!(mm.migrate_pages(3, Some(&from), Some(&to)), Err(Errno::NoMem));
        assert_eq!(node_of(&mm, p), 1 - there);
        // Put back, not left isolated (which would be -EBUSY).
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE), Err(Errno::NoMem));
        check(&mut cpu, p, 9);
        check(&mut cpu, q, 10);
        drop((cpu, mm));
    }
    assert_no_leaks(&phys);
}

#[test]
fn the_target_comes_from_the_target_nodes_pool_only() {
    let phys = arena(2);
    {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 12);
        let here = node_of(&mm, p);
        let there = 1 - here;
        // Both pages of the target node in use (a mapping bound there).
        let q = mm.mmap(0, 2 * HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        mm.mbind(q, 2 * HP, MPOL_BIND, Some(&[1u64 << there]), 3, 0).unwrap();
        fill(&mut cpu, q, 13);
        fill(&mut cpu, q + HP, 14);
        assert_eq!((node_of(&mm, q), node_of(&mm, q + HP)), (there, there));
        assert_eq!(per_node(&phys)[here as usize], (2, 1), "a free page on the source node only");
        let mut status = [-7];
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE), Err(Errno::NoMem));
        assert_eq!((status[0], node_of(&mm, p)), (-7, here));
        // One of them freed: now it moves, into that page.
        mm.munmap(q + HP, HP).unwrap();
        assert_eq!(mm.move_pages(&[p], Some(&[there]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!((status[0], node_of(&mm, p)), (there, there));
        check(&mut cpu, p, 12);
        check(&mut cpu, q, 13);
        drop((cpu, mm));
    }
    assert_no_leaks(&phys);
}

#[test]
fn a_pinned_hugetlb_page_stays_where_it_is_until_unpinned() {
    let phys = arena(2);
    {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 11);
        let here = node_of(&mm, p);
        let pin = mm.pin_user_pages(p + 4096, 2, Foll::WRITE | Foll::LONGTERM).unwrap();
        let mut status = [-7];
        // Not moved (the refcount freeze fails, -EAGAIN to the pass limit):
        // one page not migrated, its status unwritten.
        assert_eq!(mm.move_pages(&[p], Some(&[1 - here]), &mut status, MPOL_MF_MOVE), Ok(1));
        assert_eq!((status[0], node_of(&mm, p)), (-7, here));
        check(&mut cpu, p, 11);
        drop(pin);
        assert_eq!(mm.move_pages(&[p], Some(&[1 - here]), &mut status, MPOL_MF_MOVE), Ok(0));
        assert_eq!((status[0], node_of(&mm, p)), (1 - here, 1 - here));
        check(&mut cpu, p, 11);
        drop((cpu, mm));
    }
    assert_no_leaks(&phys);
}

/// Writers store a rising sequence number in words all over a private and
/// a shared huge page and read every word back, while the pages move
/// between the nodes again and again: a write during a migration either
/// lands before the unmap and is copied, or waits on the migration entry
/// and lands in the new page; a read never sees an old value.
#[test]
fn concurrent_writers_never_lose_a_write_nor_read_a_stale_value_while_pages_migrate() {
    let phys = arena(2);
    let f = File::create_hugetlbfs(&phys, "/db", HP).unwrap();
    let open = OpenFile::read_write(&f);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let s = mm.mmap(0, HP, RW, MAP_SHARED, Some(&open), 0).unwrap();
    {
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 0);
        fill(&mut cpu, s, 0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = [p, s]
        .into_iter()
        .map(|base| {
            let (mm, stop) = (mm.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    for k in 0..16 {
                        cpu.write_u64(base + k * (HP / 16) + 8 * (seq % 8), seq).unwrap();
                    }
                    for k in 0..16 {
                        assert_eq!(cpu.read_u64(base + k * (HP / 16) + 8 * (seq % 8)).unwrap(), seq, "word {k}");
                    }
                }
                seq
            })
        })
        .collect();
    let migrator = {
        let mm = mm.clone();
        watchdog("migrator", 60, move || {
            let mut moves = 0;
            for round in 0..40 {
                let node = round % 2;
                let mut status = [0; 2];
                let r = mm.move_pages(&[p, s], Some(&[node; 2]), &mut status, MPOL_MF_MOVE);
                assert_eq!(r, Ok(0), "round {round}");
                moves += status.iter().filter(|&&st| st == node).count();
            }
            moves
        })
    };
    stop.store(true, Ordering::Relaxed);
    let seqs: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(migrator >= 78, "{migrator} moves");
    assert!(seqs.iter().all(|&n| n > 0));
    // The last values are in the pages, wherever they are now.
    let mut cpu = Cpu::attached(&mm);
    for (base, seq) in [p, s].into_iter().zip(seqs) {
        for k in 0..16 {
            assert_eq!(cpu.read_u64(base + k * (HP / 16) + 8 * (seq % 8)).unwrap(), seq);
        }
    }
    drop((cpu, mm, open, f));
    assert_no_leaks(&phys);
}

/// Migration racing with `fork` (whose child copies the private page's
/// entry, a migration entry included, and is then dropped) and with
/// `munmap` and `mmap` of a third page the migrator also asks for: the
/// writer's checked pattern holds, every call ends as Linux's may (statuses
/// `-EFAULT`/`-ENOENT` for the page while it is unmapped, a page held
/// across every pass counted as not moved), and nothing leaks.
#[test]
fn migration_racing_with_fork_and_munmap_loses_nothing_and_leaks_nothing() {
    let phys = arena(6);
    let mm = AddressSpace::new(&phys, MmConfig::default().cap_sys_nice(true)).unwrap();
    let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    let u = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
    fill(&mut Cpu::attached(&mm), p, 0);
    let stop = Arc::new(AtomicBool::new(false));
    // The threads that have been round their loop once: the migrator
    // starts only then, so that it races both however the host schedules.
    let started = Arc::new(AtomicU64::new(0));
    let writer = {
        let (mm, stop, started) = (mm.clone(), stop.clone(), started.clone());
        std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                for k in 0..8 {
                    cpu.write_u64(p + k * (HP / 8) + 8 * (seq % 8), seq).unwrap();
                }
                for k in 0..8 {
                    assert_eq!(cpu.read_u64(p + k * (HP / 8) + 8 * (seq % 8)).unwrap(), seq, "word {k}");
                }
                if seq == 1 {
                    started.fetch_add(1, Ordering::Relaxed);
                }
            }
            seq
        })
    };
    let churn = {
        let (mm, stop, started) = (mm.clone(), stop.clone(), started.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                drop(mm.fork().unwrap());
                mm.munmap(u, HP).unwrap();
                mm.mmap(u, HP, RW, PRIVATE_HUGE | MAP_FIXED, None, 0).unwrap();
                Cpu::attached(&mm).write_u64(u, rounds).unwrap();
                rounds += 1;
                if rounds == 1 {
                    started.fetch_add(1, Ordering::Relaxed);
                }
            }
            rounds
        })
    };
    let mm2 = mm.clone();
    let moves = watchdog("migrator", 60, move || {
        while started.load(Ordering::Relaxed) < 2 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut moves = 0;
        for round in 0..60 {
            let node = round % 2;
            let mut status = [0; 2];
            let r = mm2.move_pages(&[p, u], Some(&[node; 2]), &mut status, MPOL_MF_MOVE_ALL);
            // A page may stay for a round: a reference held across every
            // pass (a COW copy reading it, an exiting child's or munmap's
            // gather) is Linux's -EAGAIN, counted in the positive return.
            assert!(matches!(r, Ok(0..=2)), "round {round}: {r:?}");
            if r == Ok(0) {
                assert!(
                    [node, -libc::EFAULT, -libc::ENOENT, -libc::EBUSY].contains(&status[1]),
                    "round {round}: {status:?}"
                );
                moves += usize::from(status[0] == node);
            }
        }
        moves
    });
    stop.store(true, Ordering::Relaxed);
    let seq = writer.join().unwrap();
    let rounds = churn.join().unwrap();
    assert!(moves > 0, "the written page never moved");
    assert!(seq > 0 && rounds > 0);
    let mut cpu = Cpu::attached(&mm);
    for k in 0..8 {
        assert_eq!(cpu.read_u64(p + k * (HP / 8) + 8 * (seq % 8)).unwrap(), seq);
    }
    drop((cpu, mm));
    assert_no_leaks(&phys);
}

/// `mbind`'s migration of a hugetlb page takes the first free unreserved
/// page in the zonelist of the policy's node within its mask (Linux's
/// `alloc_migration_target_by_mpol`, `alloc_hugetlb_folio_nodemask` without
/// `__GFP_THISNODE`): node 1's pool in use, `MPOL_BIND` {1, 2} moves the page
/// to node 2; `move_pages` to node 1 stays `ENOMEM` (`__GFP_THISNODE`).
#[test]
fn mbind_takes_a_page_of_any_node_of_the_mask_and_move_pages_only_its_node() {
    let phys = PhysMem::new(PhysConfig::new(3 * ((8 << 20) + 2 * HP)).nodes(3).hugepages(1)).unwrap();
    {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let p = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        fill(&mut cpu, p, 21);
        assert_eq!(node_of(&mm, p), 0);
        // Node 1's one page in use by a mapping bound there.
        let q = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
        mm.mbind(q, HP, MPOL_BIND, Some(&[0b10]), 3, 0).unwrap();
        fill(&mut cpu, q, 22);
        assert_eq!(node_of(&mm, q), 1);
        let mut status = [-7];
        assert_eq!(mm.move_pages(&[p], Some(&[1]), &mut status, MPOL_MF_MOVE), Err(Errno::NoMem));
        assert_eq!((status[0], node_of(&mm, p)), (-7, 0));
        assert_eq!(mm.mbind(p, HP, MPOL_BIND, Some(&[0b110]), 4, MPOL_MF_MOVE | MPOL_MF_STRICT), Ok(()));
        assert_eq!(node_of(&mm, p), 2);
        assert_eq!(per_node(&phys), [(1, 1), (1, 0), (1, 0)]);
        check(&mut cpu, p, 21);
        check(&mut cpu, q, 22);
        drop((cpu, mm));
    }
    assert_no_leaks(&phys);
}

#[test]
fn a_migrated_private_page_stays_exclusive_and_pins_at_once() {
    // Migration keeps PageAnonExclusive (in the migration entry): a pin of
    // the moved page needs no unshare, under every pin policy.
    for policy in [softmm::PinPolicy::PerPage, softmm::PinPolicy::Batched, softmm::PinPolicy::PerVma] {
        for flags in [Foll::WRITE, Foll::empty(), Foll::LONGTERM] {
            let phys = arena(1);
            let mm = AddressSpace::new(&phys, MmConfig::default().pin_policy(policy)).unwrap();
            let a = mm.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a, 5).unwrap();
            let there = 1 - node_of(&mm, a);
            let mut status = [0];
            assert_eq!(mm.move_pages(&[a], Some(&[there]), &mut status, MPOL_MF_MOVE), Ok(0));
            assert_eq!(status, [there]);
            let pin = {
                let mm = mm.clone();
                watchdog("pin", 10, move || mm.pin_user_pages(a, 1, flags))
            }
            .unwrap();
            assert_eq!(pin.stats().faults, 0, "{policy:?} {flags:?}");
            let mut buf = [0u8; 8];
            pin.read(0, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), 5, "{policy:?} {flags:?}: the page moved with its data");
            // The pinned page is the one mapped: the guest's writes reach the device.
            cpu.write_u64(a + 8, 9).unwrap();
            pin.read(8, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), 9, "{policy:?} {flags:?}");
            drop((pin, cpu, mm));
            assert_no_leaks(&phys);
        }
    }
}

#[test]
fn a_child_cow_beside_a_migration_of_the_shared_page_never_frees_it_twice() {
    // The child's hugetlb_wp takes its reference on the page under the PMD
    // lock: migration (and a zap) may free the page its unlocked read saw.
    let phys = arena(5);
    let stop = Arc::new(AtomicBool::new(false));
    let stats = {
        let (phys, stop) = (phys.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = phys.huge_page_stats();
                assert!(s.free <= s.total, "{s:?}");
            }
        })
    };
    let phys2 = phys.clone();
    watchdog("rounds", 120, move || {
        let phys = phys2;
        for round in 0..1000u64 {
            let parent = AddressSpace::new(&phys, MmConfig::default().cap_sys_nice(true)).unwrap();
            let a = parent.mmap(0, HP, RW, PRIVATE_HUGE, None, 0).unwrap();
            let mut pc = Cpu::attached(&parent);
            pc.write_u64(a, round).unwrap();
            let child = parent.fork().unwrap();
            let there = 1 - node_of(&parent, a);
            let go = Arc::new(std::sync::Barrier::new(2));
            let writer = {
                let (child, go) = (child.clone(), go.clone());
                std::thread::spawn(move || {
                    let mut cc = Cpu::attached(&child);
                    go.wait();
                    // Staggered, so the write meets each phase of the move.
                    for i in 0..round % 16 * 64 {
                        std::hint::black_box(i);
                    }
                    cc.write_u64(a, !round).unwrap();
                    cc.read_u64(a).unwrap()
                })
            };
            let mut status = [0];
            go.wait();
            parent.move_pages(&[a], Some(&[there]), &mut status, MPOL_MF_MOVE_ALL).unwrap();
            assert_eq!(writer.join().unwrap(), !round, "round {round}: the child's own copy");
            assert_eq!(pc.read_u64(a).unwrap(), round, "round {round}: the parent's page");
            drop((pc, child, parent));
            let s = phys.huge_page_stats();
            assert_eq!((s.free, s.rsvd), (s.total, 0), "round {round}: {s:?}");
        }
    });
    stop.store(true, Ordering::Relaxed);
    stats.join().unwrap();
    assert_no_leaks(&phys);
}
