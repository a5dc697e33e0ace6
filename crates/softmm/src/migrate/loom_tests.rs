//! loom models of page migration on the real code: the real
//! [`AddressSpace::move_pages`] (isolation, [`super::migrate_pages`] with its
//! unmap into migration entries, flush, copy and remap) on the main thread
//! against, on another thread, a real [`Cpu`] writing the page through the
//! lock-free fault path, a real `munmap` of the page, and two real `Cpu`s
//! reading a page that a fork left mapped in two address spaces; and a
//! private hugetlb page moving against a `Cpu` writing it.
//!
//! Run with the loom line of scripts/test.sh. Page tables, PTE locks,
//! `mmap_lock`, page flags and counts, the shootdown and crossbeam-epoch are
//! loom's, so every interleaving of the two threads up to the preemption
//! bound is explored. Guest memory itself is plain host memory (the `Cpu`'s
//! copies), so the models check its contents, not loom's race detector.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crate::fault::Access;
use crate::mempolicy::{MPOL_MF_MOVE, MPOL_MF_MOVE_ALL};
use crate::mm::{AddressSpace, FaultPolicy, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::{Cpu, PAGE_SIZE};

use super::MigratePolicy;

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    // A table scan is 512 atomic loads, each a loom branch.
    b.max_branches = 100_000;
    b
}

/// The first u64 of frame `pfn`.
fn word(phys: &PhysMem, pfn: crate::phys::Pfn) -> u64 {
    let mut b = [0u8; 8];
    phys.read(pfn, 0, &mut b);
    u64::from_le_bytes(b)
}

/// A two-node arena and an address space with `policy` and `migrate`, with
/// one private anonymous page at the returned address holding 1 on node 0.
fn setup(policy: FaultPolicy, migrate: MigratePolicy) -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let phys = PhysMem::new(PhysConfig::new(32 * PAGE_SIZE).nodes(2)).unwrap();
    let config =
        MmConfig::model_default().policy(policy).force_speculative(true).migrate_policy(migrate).cap_sys_nice(true);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    phys.write(mm.pte_at(a).pfn(), 0, &1u64.to_le_bytes());
    assert_eq!(phys.node_of(mm.pte_at(a).pfn()), 0);
    (phys, mm, a)
}

/// `move_pages` of the page at `a` to node 1; its status and return.
fn move_to_node_1(mm: &AddressSpace, a: u64, flags: u32) -> (i32, u64) {
    let mut status = [i32::MIN];
    let left = mm.move_pages(&[a], Some(&[1]), &mut status, flags).unwrap();
    (status[0], left)
}

/// Migration against a write through a lock-free fault: the page is
/// present and write-protected (mprotect read-only and back), so the
/// accessor's first write faults (`do_wp_page` on the lock-free path, or
/// after it met the migration entry, the `mmap_lock` path that waits), and
/// its second write goes through the translation the first one cached.
/// Neither write is lost (each lands before the unmap's flush and is
/// copied, or waits and lands in the new page), no migration entry is left,
/// and one frame is in use. Under each policy with a lock-free path, both
/// outcomes of the race must be seen: the fault completing lock-free, and
/// falling back on the migration entry.
///
/// Seen failing: with the flush tickets not waited for (`migrate_batch`),
/// the cached translation writes 3 into the old frame after its copy.
#[test]
fn migration_vs_lock_free_fault() {
    for policy in [FaultPolicy::PerVmaSeq, FaultPolicy::Speculative] {
        let lock_free = Arc::new(AtomicBool::new(false));
        let fell_back = Arc::new(AtomicBool::new(false));
        let (lf, fb) = (lock_free.clone(), fell_back.clone());
        builder().check(move || {
            let (phys, mm, a) = setup(policy, MigratePolicy::Batched);
            mm.mprotect(a, PAGE_SIZE, PROT_READ).unwrap();
            mm.mprotect(a, PAGE_SIZE, PROT_READ | PROT_WRITE).unwrap();
            let t = {
                let mm = mm.clone();
                crate::sync::model::spawn(move || {
                    let mut cpu = Cpu::attached(&mm);
                    cpu.write_u64(a, 2).unwrap();
                    cpu.write_u64(a, 3).unwrap();
                    cpu.stats().fault
                })
            };
            let (status, left) = move_to_node_1(&mm, a, MPOL_MF_MOVE);
            let stats = t.join().unwrap();
            assert!(left == 0 && status == 1, "{policy:?}: status {status}, {left} not moved");
            let pte = mm.pte_at(a);
            assert!(pte.is_present(), "{policy:?}: {pte:?} left at the page");
            assert_eq!(word(&phys, pte.pfn()), 3, "{policy:?}: a write was lost");
            assert_eq!(phys.stats().frames_used, 1, "{policy:?}: a frame leaked or was lost");
            if stats.spec_successes > 0 {
                lf.store(true, Relaxed);
            }
            if stats.fallbacks > 0 {
                fb.store(true, Relaxed);
            }
        });
        assert!(lock_free.load(Relaxed), "{policy:?}: the lock-free path never completed");
        assert!(fell_back.load(Relaxed), "{policy:?}: the fault never met the migration entry");
    }
}

/// The flush before the freeze (`phys/frozen.rs`, step 3 of its protocol):
/// the real `move_pages` of a present, writable page against a real `Cpu`
/// writing it twice, the second time through the translation the first
/// one cached (or, once the entry is a migration entry, after waiting for
/// the remap). The page must end present on node 1 holding the second
/// write. With `sync::broken::migrate::SKIP_FLUSH_WAIT` the migrator
/// begins its flush but copies before it completed, still holding the
/// proof its freeze takes: the cached translation writes 3 into the old
/// page after its copy, and the model catches it ("a write was lost";
/// seen failing, through `check_model`).
fn a_write_through_a_cached_translation_against_a_frozen_copy() -> Result<(), String> {
    let (phys, mm, a) = setup(FaultPolicy::PerVmaSeq, MigratePolicy::Batched);
    let t = {
        let mm = mm.clone();
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a, 2).unwrap();
            cpu.write_u64(a, 3).unwrap();
        })
    };
    let (status, left) = move_to_node_1(&mm, a, MPOL_MF_MOVE);
    t.join().unwrap();
    if left != 0 || status != 1 {
        return Err(format!("status {status}, {left} not moved"));
    }
    let pte = mm.pte_at(a);
    if !pte.is_present() {
        return Err(format!("{pte:?} left at the page"));
    }
    match word(&phys, pte.pfn()) {
        3 => Ok(()),
        w => Err(format!("a write was lost: the page holds {w}")),
    }
}

/// The model, and its variant without the flush.
#[test]
fn a_frozen_copy_comes_after_the_flush() {
    crate::sync::broken::check_model(
        a_write_through_a_cached_translation_against_a_frozen_copy,
        &crate::sync::broken::migrate::SKIP_FLUSH_WAIT,
    );
}

/// A page-cache page of a shared file mapping moving against writes
/// through the mapping: the page is mapped read-only (a read fault), so the
/// first write faults (the shared write-protect fault) and the second goes
/// through the cached translation. Neither write is lost: the file's page,
/// whichever it is at the end, holds 3 (`read_at`), the mapping maps that
/// page, and the cache's page is the only frame in use.
///
/// Seen failing: with the flush tickets not waited for, like the anonymous
/// model.
#[test]
fn file_page_migration_vs_write() {
    builder().check(|| {
        let phys = PhysMem::new(PhysConfig::new(32 * PAGE_SIZE).nodes(2)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::model_default().force_speculative(true)).unwrap();
        let f = crate::File::create(&phys, "f", PAGE_SIZE).unwrap();
        f.write_at(0, &1u64.to_le_bytes()).unwrap();
        let of = crate::OpenFile::read_write(&f);
        let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&of), 0).unwrap();
        mm.handle_fault(a, Access::Read).unwrap();
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.write_u64(a, 2).unwrap();
                cpu.write_u64(a, 3).unwrap();
            })
        };
        let (status, left) = move_to_node_1(&mm, a, MPOL_MF_MOVE);
        t.join().unwrap();
        assert!(left == 0 && status == 1, "status {status}, {left} not moved");
        let mut b = [0u8; 8];
        f.read_at(0, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 3, "a write was lost");
        let pte = mm.pte_at(a);
        assert!(pte.is_present(), "{pte:?} left at the page");
        assert_eq!(word(&phys, pte.pfn()), 3, "the mapping and the page cache parted");
        assert_eq!(phys.stats().frames_used, 1, "a frame leaked or was lost");
    });
}

/// Migration against munmap of the page: once both are done, nothing is
/// mapped, no frame is in use (neither the old page, nor the new one the
/// remap would have installed into a range munmap had emptied), and the
/// page's status is the node (moved before the munmap, or freed while
/// isolated: Linux counts a page whose last mapping went as migrated),
/// `-EFAULT` (no VMA any more) or `-ENOENT` (the entry was zapped), or the
/// page is counted as not moved.
///
/// Two protections keep the remap out of a range munmap emptied: the walk
/// holds each member's `mmap_lock` for read (munmap detaches the VMA under
/// it for write), and the remap re-checks under the table lock that the
/// entry is still the migration entry. The model passes with either one
/// removed; seen failing with both (the walk on the published VMA tree
/// without `mmap_lock`, and the remap storing into any non-present entry):
/// the new page is installed after the zap and its frame leaks.
#[test]
fn migration_vs_munmap() {
    for migrate in MigratePolicy::ALL {
        builder().check(move || {
            let (phys, mm, a) = setup(FaultPolicy::PerVmaSeq, migrate);
            let t = {
                let mm = mm.clone();
                crate::sync::model::spawn(move || mm.munmap(a, PAGE_SIZE).unwrap())
            };
            let (status, left) = move_to_node_1(&mm, a, MPOL_MF_MOVE);
            t.join().unwrap();
            // A page freed by the zap only after its flush (munmap's gather
            // holds it meanwhile) has a reference besides the migrator's for
            // every pass: it fails to move, its status unwritten, as on Linux.
            let moved_or_gone = left == 0 && [1, -libc::EFAULT, -libc::ENOENT].contains(&status);
            assert!(moved_or_gone || (left, status) == (1, i32::MIN), "{migrate:?}: status {status}, {left} not moved");
            assert!(mm.pte_at(a).is_none(), "{migrate:?}: {:?} survived munmap", mm.pte_at(a));
            assert_eq!(phys.stats().frames_used, 0, "{migrate:?}: a frame outlived its mapping");
        });
    }
}

/// The batched flush covering two address spaces: after a fork, the page is
/// mapped (read-only) by parent and child, and one thread runs a `Cpu` in
/// each, reading it. The migration (`MPOL_MF_MOVE_ALL`) unmaps both
/// entries, flushes both address spaces once, and once the old frame is
/// freed the main thread reuses it for a new page of the parent and fills
/// it with 0xee bytes. Every read must see 1: a CPU of either address space
/// that still reached the old frame after its reuse would read the new
/// page's bytes.
///
/// Seen failing: with the flush begun for the first address space only
/// (`mms.iter().take(1)` in `migrate_batch`), the child's CPU reads 0 or
/// 0xeeee.. through its stale translation.
#[test]
fn batched_flush_covers_two_address_spaces() {
    builder().check(|| {
        let (phys, mm, a) = setup(FaultPolicy::PerVmaSeq, MigratePolicy::Batched);
        let b = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let child = mm.fork().unwrap();
        let old = mm.pte_at(a).pfn();
        let t = {
            let (mm, child) = (mm.clone(), child.clone());
            crate::sync::model::spawn(move || {
                let mut cpus = [Cpu::attached(&mm), Cpu::attached(&child)];
                for i in [0, 1, 0, 1] {
                    assert_eq!(cpus[i].read_u64(a).unwrap(), 1, "CPU {i} read a reused frame");
                }
            })
        };
        let (status, left) = move_to_node_1(&mm, a, MPOL_MF_MOVE_ALL);
        assert!(left == 0 && status == 1, "status {status}, {left} not moved");
        // The old frame is free again: the next page of this thread reuses it.
        mm.handle_fault(b, Access::Write).unwrap();
        let reused = mm.pte_at(b).pfn();
        phys.fill(reused, 0, 0xee, PAGE_SIZE as usize);
        t.join().unwrap();
        assert_eq!(reused, old, "the model needs the old frame reused");
        assert_eq!(mm.pte_at(a).pfn(), child.pte_at(a).pfn(), "parent and child map one new page");
        assert_eq!(word(&phys, mm.pte_at(a).pfn()), 1);
        drop(child);
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0, "a frame outlived both address spaces");
    });
}

/// A private hugetlb page (`migrate/hugetlb.rs`) moving against two writes
/// through a real `Cpu`: the first write may fault on the PMD migration
/// entry (the hugetlb fault then waits for the remap and retries), the
/// second goes through the translation the first one cached. Neither write
/// is lost, the entry ends present on node 1's pool page, and the pool's
/// counts are exact: one page in use, on node 1, the old one free again.
///
/// Seen failing: with no flush begun (`unmap_and_move_huge_page`'s
/// tickets left empty), the cached translation writes 3 into the old page
/// after its copy ("a write was lost").
#[test]
fn hugetlb_migration_vs_write() {
    const HP: u64 = crate::hugetlb::HPAGE_SIZE;
    let waited = Arc::new(AtomicBool::new(false));
    let w = waited.clone();
    builder().check(move || {
        // Two nodes of 2 MiB + 64 KiB past an aligned 2 MiB: one pool page each.
        let phys = PhysMem::new(PhysConfig::new(2 * (HP + HP + 16 * PAGE_SIZE)).nodes(2).hugepages(1)).unwrap();
        let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
        let a = mm.mmap(0, HP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
        mm.handle_fault(a, Access::Write).unwrap();
        assert_eq!(phys.node_of(mm.pte_at(a).pfn()), 0);
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.write_u64(a + HP - 8, 2).unwrap();
                cpu.write_u64(a + HP - 8, 3).unwrap();
                cpu.stats().fault
            })
        };
        let (status, left) = move_to_node_1(&mm, a, MPOL_MF_MOVE);
        if t.join().unwrap().faults > 0 {
            // Only a migration entry makes the mapped page fault.
            w.store(true, Relaxed);
        }
        assert!(left == 0 && status == 1, "status {status}, {left} not moved");
        let pte = mm.pte_at(a);
        assert!(pte.is_present(), "{pte:?} left at the page");
        let mut b = [0u8; 8];
        phys.read(pte.pfn() + 511, PAGE_SIZE as usize - 8, &mut b);
        assert_eq!(u64::from_le_bytes(b), 3, "a write was lost");
        let nodes = phys.huge_page_node_stats();
        assert_eq!((nodes[0].free, nodes[1].free), (1, 0));
        let h = phys.huge_page_stats();
        assert_eq!((h.total, h.free, h.rsvd), (2, 1, 0));
    });
    assert!(waited.load(Relaxed), "the write never met the PMD migration entry");
}

/// A hugetlb page in a PMD table two address spaces share (a 1 GiB window
/// of one hugetlbfs file in each), moved with `MPOL_MF_MOVE_ALL` by the
/// first mapper against two writes through a real `Cpu` of the second:
/// the migration unshares the table in the first (reached while the table
/// is still shared: Linux's `try_to_migrate_one`) and writes the migration
/// entry into the second's, now its own, where the write may fault, wait
/// and retry. Neither write is lost, exactly one unshare happened, the
/// unsharer maps nothing, the second maps the new page on node 1, and the
/// old pool page is free again.
#[test]
fn hugetlb_migration_unshares_vs_write() {
    use crate::hugetlb::HPAGE_SIZE as HP;
    use crate::{File, OpenFile};
    const PUD: u64 = 1 << 30;
    let waited = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(AtomicBool::new(false));
    let (w, s) = (waited.clone(), shared.clone());
    // The hugetlb models' switches (sharing off after their setup, broken
    // variants) are process-wide: hold them at their defaults meanwhile.
    let _serial = crate::hugetlb::lock::broken::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    crate::hugetlb::lock::broken::NO_SHARE.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut b = builder();
    // Two address spaces' faults, shares and unshares: one preemption keeps
    // it to seconds, and the write still meets the migration entry.
    b.preemption_bound = Some(1);
    b.check(move || {
        let phys = PhysMem::new(PhysConfig::new(2 * (HP + HP + 16 * PAGE_SIZE)).nodes(2).hugepages(1)).unwrap();
        let f = File::create_hugetlbfs(&phys, "/db", PUD).unwrap();
        let open = OpenFile::read_write(&f);
        let config = MmConfig::model_default().cap_sys_nice(true);
        let map = |mm: &AddressSpace, at: u64| {
            let flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE;
            mm.mmap(at, PUD, PROT_READ | PROT_WRITE, flags, Some(&open), 0).unwrap()
        };
        let first = AddressSpace::new(&phys, config.clone()).unwrap();
        let a = map(&first, 4 * PUD);
        first.handle_fault(a, Access::Write).unwrap();
        let second = AddressSpace::new(&phys, config).unwrap();
        let b = map(&second, 8 * PUD);
        second.handle_fault(b, Access::Read).unwrap();
        assert_eq!(phys.huge_page_stats().pmd_shares, 1, "the second links the first's table");
        {
            s.store(true, Relaxed);
            assert_eq!(phys.node_of(first.pte_at(a).pfn()), 0);
            let t = {
                let mm = second.clone();
                crate::sync::model::spawn(move || {
                    let mut cpu = Cpu::attached(&mm);
                    cpu.write_u64(b + HP - 8, 2).unwrap();
                    cpu.write_u64(b + HP - 8, 3).unwrap();
                    cpu.stats().fault
                })
            };
            let (status, left) = move_to_node_1(&first, a, MPOL_MF_MOVE_ALL);
            if t.join().unwrap().faults > 0 {
                w.store(true, Relaxed);
            }
            assert!(left == 0 && status == 1, "status {status}, {left} not moved");
            assert_eq!(phys.huge_page_stats().pmd_unshares, 1, "the first mapper unshares");
            assert!(first.pte_at(a).is_none(), "the unsharer maps nothing until it faults");
            let pte = second.pte_at(b);
            assert!(pte.is_present() && phys.node_of(pte.pfn()) == 1, "{pte:?} left at the page");
            let mut buf = [0u8; 8];
            phys.read(pte.pfn() + 511, PAGE_SIZE as usize - 8, &mut buf);
            assert_eq!(u64::from_le_bytes(buf), 3, "a write was lost");
            let nodes = phys.huge_page_node_stats();
            assert_eq!((nodes[0].free, nodes[1].free), (1, 0));
        }
        // (Leaks are checked by tests/semantics/hugetlb_migrate.rs: a table freed by
        // the teardown waits for a grace period that only `quiesce`, not
        // usable inside a model, would end.)
        drop((first, second, open, f));
    });
    assert!(shared.load(Relaxed), "no execution shared the table");
    assert!(waited.load(Relaxed), "the write never met the PMD migration entry");
}

/// What one execution of a model with a broken variant found wrong.
type Outcome = Result<(), String>;

/// Runs `model` with `crate::hugetlb::lock::broken::UNLOCKED_PAGE_REF`
/// clear, where no execution may find anything wrong, then set, where some
/// execution must (the old order: no page lock, the reference on the page
/// taken after the PMD lock is gone). A model reports rather than panics: a
/// panic inside a loom execution aborts the process as loom objects unwind.
fn check_page_ref(preemptions: usize, model: fn() -> Outcome) {
    use crate::hugetlb::lock::broken;
    let _serial = broken::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    broken::NO_SHARE.store(false, Relaxed);
    let mut b = builder();
    b.preemption_bound = Some(preemptions);
    broken::UNLOCKED_PAGE_REF.store(false, Relaxed);
    b.check(move || {
        if let Err(e) = model() {
            panic!("{e}");
        }
    });
    broken::UNLOCKED_PAGE_REF.store(true, Relaxed);
    let caught = crate::sync::broken::caught(preemptions, builder, move || model().is_err());
    broken::UNLOCKED_PAGE_REF.store(false, Relaxed);
    assert!(caught, "the model did not catch the broken variant");
}

/// A parent with a private hugetlb page holding 1 on node 0, forked: both
/// map it read-only. Two pool pages per node.
fn forked_huge_page() -> (Arc<PhysMem>, Arc<AddressSpace>, Arc<AddressSpace>, u64) {
    use crate::hugetlb::HPAGE_SIZE as HP;
    let phys = PhysMem::new(PhysConfig::new(2 * (3 * HP + 16 * PAGE_SIZE)).nodes(2).hugepages(2)).unwrap();
    let parent = AddressSpace::new(&phys, MmConfig::model_default().cap_sys_nice(true)).unwrap();
    let a = parent.mmap(0, HP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, None, 0).unwrap();
    parent.handle_fault(a, Access::Write).unwrap();
    phys.write(parent.pte_at(a).pfn(), 0, &1u64.to_le_bytes());
    assert_eq!(phys.node_of(parent.pte_at(a).pfn()), 0);
    let child = parent.fork().unwrap();
    (phys, parent, child, a)
}

/// Every pool page free again once the model's address spaces are gone.
fn whole_pool(phys: &PhysMem) -> Outcome {
    let h = phys.huge_page_stats();
    if h.free != h.total {
        return Err(format!("pages left after both exited: {h:?}"));
    }
    Ok(())
}

/// `move_pages`' answer for the one page: moved to node 1, or not moved at
/// all (status untouched, 1 left) because the other thread's references
/// held it through every pass (Linux's `-EAGAIN` from a failed refcount
/// freeze, which a schedule may repeat up to the pass limit).
fn moved_or_held(status: i32, left: u64) -> Outcome {
    match (status, left) {
        (1, 0) | (i32::MIN, 1) => Ok(()),
        _ => Err(format!("status {status}, {left} not moved")),
    }
}

/// The parent's page after a model: present, holding 1, and not the
/// child's; `pages` pool pages in use in all.
fn check_after(phys: &PhysMem, parent: &AddressSpace, child: &AddressSpace, a: u64, pages: u64) -> Outcome {
    let (p, c) = (parent.pte_at(a), child.pte_at(a));
    if !p.is_present() || word(phys, p.pfn()) != 1 {
        return Err(format!("the parent's page {p:?} lost its data"));
    }
    if c.has_frame() && c.pfn() == p.pfn() {
        return Err(format!("the child's copy is the parent's page {p:?}"));
    }
    let h = phys.huge_page_stats();
    if h.free + pages != h.total {
        return Err(format!("{pages} pages in use, but the pool says {h:?}"));
    }
    Ok(())
}

/// The child's write to the private hugetlb page a fork left shared
/// (`hugetlb_wp`'s copy) against `move_pages(MPOL_MF_MOVE_ALL)` of it in
/// the parent. The COW takes its reference on the old page and the page's
/// lock under the PMD lock, so its copy never reads a page the migration
/// freed, and the migration (which holds the page lock from its unmap to
/// its remap) never shows it a map count of 1 with the parent's mapping
/// hidden in a migration entry. Afterwards the parent's page holds 1, the
/// child has its own copy holding 2, and two pool pages are in use.
///
/// Broken (`UNLOCKED_PAGE_REF`), the migration frees the old page between
/// the COW's PMD lock and its reference: the page goes back to the pool
/// twice, or the child's write reaches the parent.
fn hugetlb_cow_vs_migration() -> Outcome {
    let (phys, parent, child, a) = forked_huge_page();
    let t = {
        let child = child.clone();
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&child);
            cpu.write_u64(a + 8, 2).unwrap();
        })
    };
    let (status, left) = move_to_node_1(&parent, a, MPOL_MF_MOVE_ALL);
    t.join().unwrap();
    moved_or_held(status, left)?;
    check_after(&phys, &parent, &child, a, 2)?;
    let c = child.pte_at(a);
    let mut b = [0u8; 8];
    phys.read(c.pfn(), 8, &mut b);
    if u64::from_le_bytes(b) != 2 || word(&phys, c.pfn()) != 1 {
        return Err(format!("the child's copy {c:?} is not the page with its write"));
    }
    drop((parent, child));
    whole_pool(&phys)
}

#[test]
fn hugetlb_cow_vs_migration_takes_the_page_under_the_pmd_lock() {
    check_page_ref(1, hugetlb_cow_vs_migration);
}

/// A long-term read pin in the child (`hugetlb_unshare`: a page a fork
/// left shared is copied for the pin) against `move_pages(MPOL_MF_MOVE_ALL)`
/// of the page in the parent. As for the COW: the copy never reads a freed
/// page, and the pin never takes the parent's page for the child's own.
/// Afterwards the pin holds the child's copy of 1, the parent keeps its
/// page, and two pool pages are in use until the pin goes.
fn hugetlb_unshare_vs_migration() -> Outcome {
    let (phys, parent, child, a) = forked_huge_page();
    let t = {
        let child = child.clone();
        crate::sync::model::spawn(move || {
            let pin = child.pin_user_pages(a, 1, crate::Foll::LONGTERM).unwrap();
            let mut b = [0u8; 8];
            pin.read(0, &mut b).unwrap();
            (pin, u64::from_le_bytes(b))
        })
    };
    let (status, left) = move_to_node_1(&parent, a, MPOL_MF_MOVE_ALL);
    let (pin, seen) = t.join().unwrap();
    if seen != 1 {
        return Err(format!("the pin reads {seen}"));
    }
    moved_or_held(status, left)?;
    check_after(&phys, &parent, &child, a, 2)?;
    drop(pin);
    drop((parent, child));
    whole_pool(&phys)
}

#[test]
fn hugetlb_unshare_vs_migration_takes_the_page_under_the_pmd_lock() {
    check_page_ref(1, hugetlb_unshare_vs_migration);
}
