//! Unit tests of PMD table sharing (`super`).

use std::sync::Arc;

use super::PUD_SIZE;
use crate::uapi::*;
use crate::{AddressSpace, Cpu, File, MmConfig, OpenFile, PhysConfig, PhysMem};

const HP: u64 = 2 << 20;
/// Huge pages each test faults in a window: enough to tell one fault
/// from one per page, small enough for the test machine.
const TOUCHED: u64 = 8;

fn arena() -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new((16 << 20) + (TOUCHED + 1) * HP).hugepages(TOUCHED)).expect("arena")
}

/// A 1 GiB + 2 MiB hugetlbfs file.
fn shared_file(phys: &Arc<PhysMem>) -> Arc<File> {
    File::create_hugetlbfs(phys, "/db", PUD_SIZE + HP).unwrap()
}

/// Maps `len` bytes of `f` from `off` at the PUD-aligned address `at`
/// plus `shift`.
fn map(mm: &AddressSpace, f: &Arc<File>, at: u64, shift: u64, len: u64, off: u64, flags: i32) -> u64 {
    let open = OpenFile::read_write(f);
    mm.mmap(at + shift, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED | MAP_NORESERVE, Some(&open), off).unwrap()
}

/// Faults taken by a fresh CPU of `mm` reading the first `TOUCHED`
/// huge pages from `a`, each checked against what `write_all` wrote.
fn touch(mm: &Arc<AddressSpace>, a: u64) -> u64 {
    let mut cpu = Cpu::attached(mm);
    for i in 0..TOUCHED {
        assert_eq!(cpu.read_u64(a + i * HP + 8).unwrap(), 0x5eed + i, "page {i}");
    }
    cpu.stats().fault.faults
}

fn write_all(mm: &Arc<AddressSpace>, a: u64) {
    let mut cpu = Cpu::attached(mm);
    for i in 0..TOUCHED {
        cpu.write_u64(a + i * HP + 8, 0x5eed + i).unwrap();
    }
}

/// A split that changes only flags (`MADV_DONTFORK` here; `mbind`
/// alike) unshares the window it cuts, and no fault through the VMA
/// being split can link a table into that window again: Linux
/// write-locks the VMA (`vma_start_write`) before `hugetlb_split`,
/// softmm detaches it first. The hook runs another thread's fault in
/// the window right after the unshare; a fault that must wait for the
/// write section is left waiting (200 ms) and finishes after it. Failed
/// with the split before the detach: under the per-VMA fault policies
/// the fault linked `B`'s table again and the split window stayed
/// shared.
#[test]
#[cfg_attr(
    miri,
    ignore = "a thread parks on the contended mmap_lock, and Miri rejects parking_lot_core's futex call (an &AtomicI32 for *mut u32)"
)]
fn a_fault_during_a_flags_only_split_cannot_share_the_window_again() {
    use std::sync::Mutex;
    for &policy in crate::FaultPolicy::ALL {
        for &hugetlb in crate::HugetlbPolicy::ALL {
            let what = (policy, hugetlb);
            let phys = arena();
            let f = shared_file(&phys);
            let cfg = MmConfig::default().policy(policy).hugetlb_policy(hugetlb);
            let b = AddressSpace::new(&phys, cfg.clone()).unwrap();
            let wb = map(&b, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
            write_all(&b, wb);
            let a = AddressSpace::new(&phys, cfg).unwrap();
            let wa = map(&a, &f, 8 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
            // Two CPUs attached, so faults may go lock-free.
            let mut cpu = Cpu::attached(&a);
            assert_eq!(cpu.read_u64(wa + 8).unwrap(), 0x5eed, "{what:?}");
            assert!(a.pgtables.pmd_is_shared(wa, &crossbeam_epoch::pin()), "{what:?}: A linked B's table");
            let faulter = Arc::new(Mutex::new(None));
            let (a2, slot) = (a.clone(), faulter.clone());
            crate::mm::hooks::set_after_hugetlb_split(move || {
                let (tx, rx) = std::sync::mpsc::channel();
                let t = std::thread::spawn(move || {
                    let r = Cpu::attached(&a2).read_u64(wa + 5 * HP + 8);
                    tx.send(()).ok();
                    r
                });
                let _ = rx.recv_timeout(std::time::Duration::from_millis(200));
                *slot.lock().unwrap() = Some(t);
            });
            a.madvise(wa + 2 * HP, PUD_SIZE - 2 * HP, MADV_DONTFORK).unwrap();
            let t = faulter.lock().unwrap().take().expect("the split ran the hook");
            assert_eq!(t.join().unwrap().unwrap(), 0x5eed + 5, "{what:?}");
            assert!(
                !a.pgtables.pmd_is_shared(wa, &crossbeam_epoch::pin()),
                "{what:?}: no VMA covers the split window whole, so it is not shared"
            );
            drop(cpu);
            drop((a, b));
            drop(f);
            assert_no_leaks(&phys);
        }
    }
}

#[test]
fn a_forked_child_shares_the_parents_pmd_table_and_takes_one_fault() {
    let phys = arena();
    let f = shared_file(&phys);
    let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
    write_all(&parent, a);
    let tables = phys.stats().page_tables;
    let child = parent.fork().unwrap();
    assert_eq!(touch(&child, a), 1, "one fault links the table that maps every page");
    assert_eq!(phys.huge_page_stats().pmd_shares, 1);
    // The child has a PGD and a PUD table of its own, and no PMD table.
    assert_eq!(phys.stats().page_tables, tables + 2);
    // A second process mapping the file at another 1 GiB shares too.
    let other = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let b = map(&other, &f, 9 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
    assert_eq!(touch(&other, b), 1);
    assert_eq!(phys.stats().page_tables, tables + 4, "still one PMD table for the window");
    assert_eq!(phys.huge_page_stats().pmd_shares, 2);
    // A write through one sharer is seen by the others.
    Cpu::attached(&other).write_u64(b + 8, 0xbeef).unwrap();
    assert_eq!(Cpu::attached(&parent).read_u64(a + 8).unwrap(), 0xbeef);
    // Exits in any order: the table goes once, with its last user.
    drop(parent);
    assert_eq!(Cpu::attached(&child).read_u64(a + HP + 8).unwrap(), 0x5eed + 1);
    drop((child, other, f));
    let s = phys.quiesce();
    assert_eq!((s.page_tables, s.rmap_entries, s.frames_used), (0, 0, 0));
    assert_eq!(phys.huge_page_stats().free, TOUCHED);
}

/// Linux's `huge_pmd_share` skips only the faulting VMA itself: another
/// VMA of the same address space mapping the same file pages at the
/// same offset within its PUD lends its table, which is then linked at
/// two PUD entries of one tree. Each window unshares alone (the other
/// keeps the table and its pages), and an exit with both links frees
/// the table once. (Seen failing before own VMAs were looked at: 8
/// faults, no share.)
#[test]
#[cfg_attr(
    miri,
    ignore = "safe sharing policy; the shared-table link, unshare and free run under Miri in the fork, fault and truncate sharing tests"
)]
fn a_second_mapping_in_the_same_address_space_shares_the_first_ones_table() {
    let phys = arena();
    let f = shared_file(&phys);
    // Which window goes first: the second, the first, or neither (exit);
    // under every fault policy (`mmap_lock` held, or only the VMA's
    // reference) and every hugetlb policy.
    // Under Miri, the default policies only: every pair takes minutes.
    let (faults, hugetlbs) = if cfg!(miri) {
        (&[crate::FaultPolicy::default()][..], &[crate::HugetlbPolicy::default()][..])
    } else {
        (crate::FaultPolicy::ALL, crate::HugetlbPolicy::ALL)
    };
    let policies = faults.iter().flat_map(|&p| hugetlbs.iter().map(move |&h| (p, h)));
    for ((policy, hugetlb), unmap) in policies.flat_map(|p| [Some(1usize), Some(0), None].map(|u| (p, u))) {
        let unmap = (policy, hugetlb, unmap);
        let cfg = MmConfig::default().policy(policy).hugetlb_policy(hugetlb);
        let mm = AddressSpace::new(&phys, cfg).unwrap();
        let w = [map(&mm, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED), 0];
        write_all(&mm, w[0]);
        let tables = phys.stats().page_tables;
        let (shares, unshares) = (phys.huge_page_stats().pmd_shares, phys.huge_page_stats().pmd_unshares);
        let w = [w[0], map(&mm, &f, 8 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED)];
        // The same CPU keeps translations through both windows.
        let mut cpu = Cpu::attached(&mm);
        for i in 0..TOUCHED {
            assert_eq!(cpu.read_u64(w[1] + i * HP + 8).unwrap(), 0x5eed + i, "page {i}");
        }
        assert_eq!(cpu.stats().fault.faults, 1, "{unmap:?}: one fault links the first window's table");
        assert_eq!(phys.huge_page_stats().pmd_shares, shares + 1);
        assert_eq!(phys.stats().page_tables, tables, "{unmap:?}: one PMD table for both windows");
        assert!(mm.pgtables.pmd_is_shared(w[0], &crossbeam_epoch::pin()));
        // A write through one window is read through the other.
        cpu.write_u64(w[1] + HP + 16, 0xbeef).unwrap();
        assert_eq!(cpu.read_u64(w[0] + HP + 16).unwrap(), 0xbeef);
        if let (_, _, Some(gone)) = unmap {
            let kept = 1 - gone;
            let flushes = mm.stats().tlb.flushes;
            mm.munmap(w[gone], PUD_SIZE).unwrap();
            assert_eq!(phys.huge_page_stats().pmd_unshares, unshares + 1, "{unmap:?}");
            assert!(mm.stats().tlb.flushes > flushes, "{unmap:?}: the unshare flushed");
            assert!(!mm.pgtables.pmd_is_shared(w[kept], &crossbeam_epoch::pin()), "{unmap:?}: exclusive now");
            // No translation through the unmapped window is left.
            assert_eq!(
                cpu.read_u64(w[gone] + 8).err(),
                Some(crate::Fault::Segv { addr: w[gone] + 8, code: crate::SegvCode::MapErr }),
                "{unmap:?}"
            );
            let faults = cpu.stats().fault.faults;
            for i in 0..TOUCHED {
                assert_eq!(cpu.read_u64(w[kept] + i * HP + 8).unwrap(), 0x5eed + i, "{unmap:?}: page {i}");
            }
            assert_eq!(cpu.stats().fault.faults, faults, "{unmap:?}: the kept window kept every page");
            assert_eq!(phys.stats().page_tables, tables, "{unmap:?}: the table stayed, once");
        }
        drop(cpu);
        drop(mm);
        let s = phys.quiesce();
        assert_eq!((s.page_tables, s.rmap_entries), (0, 0), "{unmap:?}: the table went once");
    }
    drop(f);
    assert_no_leaks(&phys);
}

/// Threads of one address space mapping the same file at three
/// PUD-aligned windows, each faulting its window (sharing another
/// window's table when it can), then unsharing it by munmap of a page,
/// mprotect, a split or `MADV_DONTNEED`, and unmapping it, while a
/// writer keeps a fourth window mapped, under every fault and hugetlb
/// policy: every read sees the file's data, every write reads back, and
/// nothing leaks. Under the per-VMA fault policies a fault in one window
/// links from another window whose VMA its own thread is changing: the
/// source VMA's read reference keeps that table linked meanwhile.
#[test]
#[cfg_attr(miri, ignore = "threads contending on parking_lot locks: Miri rejects parking_lot_core's futex call")]
fn windows_of_one_address_space_share_and_unshare_concurrently() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    const ROUNDS: u64 = 12;
    for &policy in crate::FaultPolicy::ALL {
        for &hugetlb in crate::HugetlbPolicy::ALL {
            let phys = arena();
            let f = shared_file(&phys);
            let cfg = MmConfig::default().policy(policy).hugetlb_policy(hugetlb);
            let mm = AddressSpace::new(&phys, cfg).unwrap();
            let kept = map(&mm, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
            write_all(&mm, kept);
            let done = AtomicBool::new(false);
            std::thread::scope(|s| {
                let (mm, f, done) = (&mm, &f, &done);
                s.spawn(move || {
                    let mut cpu = Cpu::attached(mm);
                    let mut k = 0u64;
                    while !done.load(Relaxed) || k < ROUNDS {
                        k += 1;
                        for i in 0..TOUCHED {
                            cpu.write_u64(kept + i * HP + 64, (k << 8) | i).unwrap();
                        }
                        for i in 0..TOUCHED {
                            assert_eq!(cpu.read_u64(kept + i * HP + 64).unwrap(), (k << 8) | i);
                            assert_eq!(cpu.read_u64(kept + i * HP + 8).unwrap(), 0x5eed + i);
                        }
                    }
                });
                let churners: Vec<_> = (0..3u64)
                    .map(|t| {
                        s.spawn(move || {
                            let at = (8 + 4 * t) * PUD_SIZE;
                            for n in 0..ROUNDS {
                                let a = map(mm, f, at, 0, PUD_SIZE, 0, MAP_SHARED);
                                {
                                    let mut cpu = Cpu::attached(mm);
                                    for i in 0..TOUCHED {
                                        assert_eq!(cpu.read_u64(a + i * HP + 8).unwrap(), 0x5eed + i);
                                    }
                                }
                                match (n + t) % 4 {
                                    0 => mm.munmap(a + HP, HP).unwrap(),
                                    1 => mm.mprotect(a, HP, PROT_READ).unwrap(),
                                    2 => mm.madvise(a + HP, HP, MADV_DONTFORK).unwrap(),
                                    _ => mm.madvise(a, 2 * HP, MADV_DONTNEED).unwrap(),
                                }
                                let mut cpu = Cpu::attached(mm);
                                assert_eq!(cpu.read_u64(a + 2 * HP + 8).unwrap(), 0x5eed + 2);
                                drop(cpu);
                                mm.munmap(a, PUD_SIZE).unwrap();
                            }
                        })
                    })
                    .collect();
                for c in churners {
                    c.join().unwrap();
                }
                done.store(true, Relaxed);
            });
            // Each round's first fault links a table: the kept window's
            // VMA is never changed, so its reference is always had.
            let stats = phys.huge_page_stats();
            assert!(stats.pmd_shares >= 3 * ROUNDS, "{policy:?} {hugetlb:?}: {} shares", stats.pmd_shares);
            assert!(stats.pmd_unshares >= 3 * ROUNDS, "{policy:?} {hugetlb:?}: {} unshares", stats.pmd_unshares);
            drop((mm, f));
            assert_no_leaks(&phys);
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe sharing policy; the shared-table link, unshare and free run under Miri in the fork, fault and truncate sharing tests"
)]
fn misaligned_private_or_partial_windows_do_not_share() {
    let phys = arena();
    let f = shared_file(&phys);
    let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
    write_all(&parent, a);
    let cases: [(u64, u64, u64, i32); 3] = [
        // Same file page at another offset within the PUD.
        (HP, PUD_SIZE, 0, MAP_SHARED),
        // A private mapping never shares.
        (0, PUD_SIZE, 0, MAP_PRIVATE),
        // A VMA that does not cover the whole window.
        (0, PUD_SIZE - HP, 0, MAP_SHARED),
    ];
    for (shift, len, off, flags) in cases {
        let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        let b = map(&mm, &f, 8 * PUD_SIZE, shift, len, off, flags);
        assert_eq!(touch(&mm, b), TOUCHED, "one fault per page ({shift:#x}, {len:#x}, {flags:#x})");
    }
    // The child of a parent whose window is misaligned faults per page too.
    let mis = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let m = map(&mis, &f, 8 * PUD_SIZE, HP, PUD_SIZE, 0, MAP_SHARED);
    let child = mis.fork().unwrap();
    assert_eq!(touch(&child, m), TOUCHED);
    assert_eq!(phys.huge_page_stats().pmd_shares, 0);
    drop((parent, mis, child, f));
    let s = phys.quiesce();
    assert_eq!((s.page_tables, s.rmap_entries, s.frames_used), (0, 0, 0));
}

/// A parent with the window faulted and a child sharing its table.
fn shared_pair(phys: &Arc<PhysMem>, f: &Arc<File>) -> (Arc<AddressSpace>, Arc<AddressSpace>, u64) {
    let parent = AddressSpace::new(phys, MmConfig::default()).unwrap();
    let a = map(&parent, f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
    write_all(&parent, a);
    let child = parent.fork().unwrap();
    assert_eq!(touch(&child, a), 1);
    (parent, child, a)
}

#[track_caller]
fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.page_tables, s.rmap_entries, s.frames_used), (0, 0, 0));
    assert_eq!(phys.huge_page_stats().free, TOUCHED);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe sharing policy; the shared-table link, unshare and free run under Miri in the fork, fault and truncate sharing tests"
)]
fn munmap_of_part_of_the_window_unshares_it_with_a_flush_and_leaves_the_others_mapped() {
    let phys = arena();
    let f = shared_file(&phys);
    let (parent, child, a) = shared_pair(&phys, &f);
    let tables = phys.stats().page_tables;
    // The child's CPU holds translations through the shared table.
    let mut cpu = Cpu::attached(&child);
    assert_eq!(cpu.read_u64(a + 3 * HP + 8).unwrap(), 0x5eed + 3);
    let flushes = child.stats().tlb.flushes;
    child.munmap(a + 3 * HP, HP).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 1);
    assert!(child.stats().tlb.flushes > flushes, "the unshare flushed the child's TLB");
    // No stale translation: the unmapped page faults, the rest refaults
    // into a private table, one fault per page.
    assert_eq!(
        cpu.read_u64(a + 3 * HP + 8).err(),
        Some(crate::Fault::Segv { addr: a + 3 * HP + 8, code: crate::SegvCode::MapErr })
    );
    let faults = cpu.stats().fault.faults;
    for i in (0..TOUCHED).filter(|&i| i != 3) {
        assert_eq!(cpu.read_u64(a + i * HP + 8).unwrap(), 0x5eed + i);
    }
    assert_eq!(cpu.stats().fault.faults - faults, TOUCHED - 1, "one fault per page left");
    drop(cpu);
    assert_eq!(phys.stats().page_tables, tables + 1, "the child's own PMD table");
    // The parent's table and pages are untouched.
    assert_eq!(touch(&parent, a), 0);
    drop((parent, child, f));
    assert_no_leaks(&phys);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe sharing policy; the shared-table link, unshare and free run under Miri in the fork, fault and truncate sharing tests"
)]
fn mprotect_mremap_and_dontneed_unshare_before_they_change_entries() {
    let phys = arena();
    let f = shared_file(&phys);
    // mprotect of one page in the child: the parent stays writable.
    let (parent, child, a) = shared_pair(&phys, &f);
    child.mprotect(a, HP, PROT_READ).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 1);
    assert!(Cpu::attached(&child).write_u64(a + 8, 1).is_err());
    Cpu::attached(&parent).write_u64(a + 8, 0x5eed).unwrap();
    // MADV_DONTNEED in the parent while a second child shares its
    // table: the parent unshares, the second child keeps every page.
    let other = parent.fork().unwrap();
    assert_eq!(touch(&other, a), 1);
    parent.madvise(a, 2 * HP, MADV_DONTNEED).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 2);
    assert_eq!(touch(&other, a), 0);
    // The parent's next fault links the second child's table.
    assert_eq!(touch(&parent, a), 1);
    // mremap in the second child: it unshares and moves nothing of the
    // window; at the new place, PUD-aligned too, its first fault shares
    // the parent's table again.
    let far = 12 * PUD_SIZE;
    other.mremap(a, PUD_SIZE, PUD_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, far).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 3);
    assert_eq!(touch(&other, far), 1);
    assert_eq!(touch(&parent, a), 0);
    drop(other);
    drop((parent, child, f));
    assert_no_leaks(&phys);
}

/// `hugetlb_split`: a split inside a window unshares it, in the address
/// space that splits, even when the operation changes no entry.
#[test]
#[cfg_attr(
    miri,
    ignore = "ten forked pairs faulting 2 MiB pages (minutes under Miri); the unshare itself runs there in the munmap test"
)]
fn a_split_that_breaks_a_window_unshares_it_even_without_an_entry_change() {
    type Split = fn(&AddressSpace, u64);
    let splits: [(&str, Split); 5] = [
        ("madvise(MADV_DONTFORK)", |mm, a| mm.madvise(a + 3 * HP, HP, MADV_DONTFORK).unwrap()),
        ("madvise(MADV_DONTDUMP) to the end", |mm, a| {
            mm.madvise(a + 3 * HP, PUD_SIZE - 3 * HP, MADV_DONTDUMP).unwrap()
        }),
        ("mbind", |mm, a| mm.mbind(a + 3 * HP, HP, crate::mempolicy::MPOL_BIND, Some(&[1]), 2, 0).unwrap()),
        ("mprotect", |mm, a| mm.mprotect(a + 3 * HP, HP, PROT_READ).unwrap()),
        ("munmap of the last page", |mm, a| mm.munmap(a + PUD_SIZE - HP, HP).unwrap()),
    ];
    let phys = arena();
    let f = shared_file(&phys);
    for (what, split) in splits {
        for child_splits in [true, false] {
            let (parent, child, a) = shared_pair(&phys, &f);
            let before = phys.huge_page_stats().pmd_unshares;
            let (splitter, other) = if child_splits { (&child, &parent) } else { (&parent, &child) };
            split(splitter, a);
            assert_eq!(phys.huge_page_stats().pmd_unshares, before + 1, "{what}: one unshare");
            assert_eq!(touch(splitter, a), TOUCHED, "{what}: the splitter refaults into a table of its own");
            assert_eq!(touch(other, a), 0, "{what}: the other keeps the table and every page");
            drop((parent, child));
        }
    }
    drop(f);
    assert_no_leaks(&phys);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "safe sharing policy; the shared-table link, unshare and free run under Miri in the fork, fault and truncate sharing tests"
)]
fn a_split_on_a_pud_boundary_keeps_the_window_shared() {
    let phys = arena();
    let f = shared_file(&phys);
    let parent = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE + HP, 0, MAP_SHARED);
    write_all(&parent, a);
    let child = parent.fork().unwrap();
    assert_eq!(touch(&child, a), 1);
    child.madvise(a + PUD_SIZE, HP, MADV_DONTFORK).unwrap();
    child.munmap(a + PUD_SIZE, HP).unwrap();
    assert_eq!(phys.huge_page_stats().pmd_unshares, 0);
    assert_eq!(touch(&child, a), 0, "still through the parent's table");
    drop((parent, child, f));
    assert_no_leaks(&phys);
}

/// `__hugetlb_zap_begin`: a zap under `mmap_lock` for read takes the
/// VMA lock and `i_mmap` for write once per window its VMA could share
/// (`MADV_DONTNEED`, truncate, hole punch), and never for anything
/// else: 4 KiB pages, a hugetlb VMA smaller than a window, a private
/// one. (Seen failing with the zap left unlocked: no write counted.)
#[test]
#[cfg_attr(
    miri,
    ignore = "safe lock accounting; the shared-table link, unshare and free run under Miri in the fork, fault and truncate sharing tests"
)]
fn read_locked_zaps_lock_shareable_windows_and_nothing_else() {
    let phys = arena();
    let f = shared_file(&phys);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = map(&mm, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
    write_all(&mm, a);
    let small = 16 * crate::PAGE_SIZE;
    let anon = mm.mmap(0, small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    // The last 2 MiB of the file, alone in a window: never shareable
    // (left unfaulted: the pool holds `TOUCHED` pages).
    let tail = map(&mm, &f, 9 * PUD_SIZE, 0, HP, PUD_SIZE, MAP_SHARED);
    let private = map(&mm, &f, 10 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_PRIVATE);
    {
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(anon, 1).unwrap();
        assert_eq!(cpu.read_u64(private + 8).unwrap(), 0x5eed);
    }
    let writes = |s: crate::HugetlbLockStats| (s.vma_lock_write, s.i_mmap_write);
    let before = writes(phys.hugetlb_lock_stats());
    mm.madvise(anon, small, MADV_DONTNEED).unwrap();
    mm.madvise(tail, HP, MADV_DONTNEED).unwrap();
    mm.madvise(private, HP, MADV_DONTNEED).unwrap();
    assert_eq!(writes(phys.hugetlb_lock_stats()), before, "no window that could share");
    mm.madvise(a, 2 * HP, MADV_DONTNEED).unwrap();
    assert_eq!(writes(phys.hugetlb_lock_stats()), (before.0 + 1, before.1 + 1), "one window");
    assert_eq!(touch(&mm, a), 2, "the two pages were zapped");
    let before = writes(phys.hugetlb_lock_stats());
    f.fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 6 * HP, HP).unwrap();
    assert_eq!(writes(phys.hugetlb_lock_stats()), (before.0 + 1, before.1 + 1), "punch: the one window");
    drop((mm, f));
    assert_no_leaks(&phys);
}

#[test]
fn truncate_unshares_every_mapper_and_no_one_reaches_a_removed_page() {
    let phys = arena();
    let f = shared_file(&phys);
    let (parent, child, a) = shared_pair(&phys, &f);
    let mut cpus = [Cpu::attached(&parent), Cpu::attached(&child)];
    for cpu in &mut cpus {
        assert_eq!(cpu.read_u64(a + 5 * HP).unwrap(), 0);
    }
    f.set_len(4 * HP).unwrap();
    for cpu in &mut cpus {
        assert_eq!(cpu.read_u64(a + 5 * HP).err(), Some(crate::Fault::Bus { addr: a + 5 * HP }));
        assert_eq!(cpu.read_u64(a + 3 * HP + 8).unwrap(), 0x5eed + 3);
    }
    assert!(phys.huge_page_stats().pmd_unshares >= 1);
    drop((cpus, parent, child, f));
    assert_no_leaks(&phys);
}

/// Processes writing patterns while others fork, munmap, mprotect,
/// split (madvise) and truncate the same file, and `MADV_DONTNEED`
/// unshares the writers' table under them, under every
/// [`crate::HugetlbPolicy`]: no write lost, no access to a truncated
/// page after truncate returns, nothing leaked. (With the unsharer's
/// flush removed, the truncating thread's CPU reads a removed page.)
#[test]
#[cfg_attr(miri, ignore = "threads contending on parking_lot locks: Miri rejects parking_lot_core's futex call")]
fn stress_sharing_against_fork_munmap_mprotect_and_truncate() {
    for &policy in crate::HugetlbPolicy::ALL {
        stress_sharing(policy);
    }
}

fn stress_sharing(policy: crate::HugetlbPolicy) {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    const KEPT: u64 = 4; // pages never truncated
    const ROUNDS: u64 = 150;
    let phys = arena();
    let f = shared_file(&phys);
    let parent = AddressSpace::new(&phys, MmConfig::default().hugetlb_policy(policy)).unwrap();
    let a = map(&parent, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
    write_all(&parent, a);
    let sibling = parent.fork().unwrap();
    let stop = AtomicBool::new(false);
    let truncations = AtomicU64::new(0);
    let forks = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Two writers in two address spaces sharing the table, each with
        // its own word of every kept page: every write reads back.
        for (w, mm) in [(0u64, &parent), (1, &sibling)] {
            let (stop, forks, truncations) = (&stop, &forks, &truncations);
            s.spawn(move || {
                let mut cpu = Cpu::attached(mm);
                // Bounded, so that a panic in another thread (whose
                // counter then stops) ends the test instead of hanging it.
                let busy = |k: u64| {
                    k < ROUNDS
                        || (k < 100 * ROUNDS
                            && (forks.load(std::sync::atomic::Ordering::Relaxed) < 20
                                || truncations.load(std::sync::atomic::Ordering::Relaxed) < 20))
                };
                let mut k = 0;
                while busy(k) {
                    k += 1;
                    for i in 0..KEPT {
                        cpu.write_u64(a + i * HP + 64 + 8 * w, (k << 16) | (w << 8) | i).unwrap();
                    }
                    for i in 0..KEPT {
                        assert_eq!(cpu.read_u64(a + i * HP + 64 + 8 * w).unwrap(), (k << 16) | (w << 8) | i);
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
        }
        // Forked children that share, read, then unshare by munmap or
        // mprotect, and exit.
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let child = parent.fork().unwrap();
                {
                    let mut cpu = Cpu::attached(&child);
                    for i in 0..KEPT {
                        assert_eq!(cpu.read_u64(a + i * HP + 8).unwrap(), 0x5eed + i);
                    }
                }
                match n % 3 {
                    0 => child.munmap(a + HP, HP).unwrap(),
                    1 => child.mprotect(a, HP, PROT_READ).unwrap(),
                    // A split that changes no entry (hugetlb_split).
                    _ => child.madvise(a + HP, HP, MADV_DONTFORK).unwrap(),
                }
                let mut cpu = Cpu::attached(&child);
                assert_eq!(cpu.read_u64(a + 2 * HP + 8).unwrap(), 0x5eed + 2);
                n += 1;
                forks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        // Truncate the tail and grow it back; after truncate returns,
        // no CPU of the parent's reaches a removed page.
        s.spawn(|| {
            let mut cpu = Cpu::attached(&parent);
            for _ in 0..20 {
                let _ = cpu.write_u64(a + (TOUCHED - 1) * HP, 7);
                f.set_len(KEPT * HP).unwrap();
                let far = a + (TOUCHED - 1) * HP;
                assert_eq!(cpu.read_u64(far).err(), Some(crate::Fault::Bus { addr: far }));
                f.set_len(PUD_SIZE + HP).unwrap();
                // Unshares the writers' table under their faults.
                parent.madvise(a, HP, MADV_DONTNEED).unwrap();
                truncations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
    });
    assert_eq!(truncations.into_inner(), 20, "{policy:?}");
    // How many children shared depends on the schedule (a fault that
    // finds the parent's `mmap_lock` busy does not share), so the
    // share and unshare counts are not asserted here.
    drop((parent, sibling, f));
    assert_no_leaks(&phys);
}

/// An address space that dies while another one's fault is sharing
/// from it: the fault may hold the last reference, and the drop
/// unlinks its VMAs under `i_mmap` for write, which the fault holds
/// for read (under `IMmapRwsem`, across the whole fault). Hung within
/// seconds in a fork+fault loop before the fault kept those references
/// until it held no lock; here a watchdog turns the hang into an abort
/// after 20 s (seen in one of two runs with the references dropped
/// under the lock: the race is a timing one).
#[test]
#[cfg_attr(miri, ignore = "threads contending on parking_lot locks: Miri rejects parking_lot_core's futex call")]
fn a_sharer_dying_under_a_sharing_fault_does_not_deadlock() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    for &policy in crate::HugetlbPolicy::ALL {
        let phys = arena();
        let f = shared_file(&phys);
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let watchdog = done.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if watchdog.load(Relaxed) {
                    return;
                }
            }
            eprintln!("{policy:?}: deadlock between a sharing fault and a dying sharer");
            std::process::abort();
        });
        let cfg = MmConfig::default().hugetlb_policy(policy);
        let forker = AddressSpace::new(&phys, cfg.clone()).unwrap();
        let faulter = AddressSpace::new(&phys, cfg).unwrap();
        // Long enough for the race to be likely (it hung the lab's loop
        // within a second), short for a test.
        let end = std::time::Instant::now() + std::time::Duration::from_millis(1000);
        std::thread::scope(|s| {
            s.spawn(|| {
                while std::time::Instant::now() < end {
                    let a = map(&forker, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
                    Cpu::attached(&forker).write_u64(a + 8, 0x5eed).unwrap();
                    let child = forker.fork().unwrap();
                    Cpu::attached(&child).read_u64(a + 8).unwrap();
                    drop(child);
                    forker.munmap(a, PUD_SIZE).unwrap();
                }
            });
            s.spawn(|| {
                while std::time::Instant::now() < end {
                    let b = map(&faulter, &f, 8 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
                    Cpu::attached(&faulter).write_u64(b + HP + 8, 1).unwrap();
                    faulter.munmap(b, PUD_SIZE).unwrap();
                }
            });
        });
        done.store(true, Relaxed);
        drop((forker, faulter, f));
        assert_no_leaks(&phys);
    }
}

/// Linux's `huge_pmd_share` takes no lock of the address space it links
/// from: the file's `i_mmap` lock, held for read, keeps the other VMA's
/// table in place. So a new mapping's first fault links the populated
/// table of an address space whose `mmap_lock` is held for write (a fork,
/// an `mmap` or `munmap` elsewhere in it) and maps all its pages with that
/// one fault, under every fault and hugetlb policy. The cause of
/// `hugetlb-fork-fault`'s faulters taking a fault on most pages: the
/// forkers hold their `mmap_lock` for write across each fork, and a
/// faulter whose first fault met that skipped the forker and filled a
/// table of its own. Failed before the share took the other VMA's read
/// reference instead of trying the other `mmap_lock`: 8 faults, no share.
#[test]
fn a_fault_shares_the_table_of_an_address_space_whose_mmap_lock_is_write_held() {
    // Miri runs the defaults only (every pair takes it a minute and more);
    // the pairs differ in their locks, which the other runs check.
    let (faults, hugetlbs): (&[_], &[_]) = match cfg!(miri) {
        true => (&[crate::FaultPolicy::default()], &[crate::HugetlbPolicy::default()]),
        false => (crate::FaultPolicy::ALL, crate::HugetlbPolicy::ALL),
    };
    for &policy in faults {
        for &hugetlb in hugetlbs {
            let what = (policy, hugetlb);
            let phys = arena();
            let f = shared_file(&phys);
            let cfg = MmConfig::default().policy(policy).hugetlb_policy(hugetlb);
            let forker = AddressSpace::new(&phys, cfg.clone()).unwrap();
            let a = map(&forker, &f, 4 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
            write_all(&forker, a);
            let faulter = AddressSpace::new(&phys, cfg).unwrap();
            let b = map(&faulter, &f, 8 * PUD_SIZE, 0, PUD_SIZE, 0, MAP_SHARED);
            let held = forker.write_lock();
            // On another thread: this one holds the forker's lock.
            let faults = std::thread::scope(|s| s.spawn(|| touch(&faulter, b)).join().unwrap());
            drop(held);
            assert_eq!(faults, 1, "{what:?}: one fault links the forker's populated table");
            assert_eq!(phys.huge_page_stats().pmd_shares, 1, "{what:?}");
            drop((forker, faulter, f));
            assert_no_leaks(&phys);
        }
    }
}
