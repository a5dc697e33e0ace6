//! Page migration: `move_pages` moves anonymous pages between nodes under
//! both migration policies with their contents, statuses and errnos as
//! Linux's; batched migration flushes once per batch; writers racing with
//! migration, fork and munmap never lose a write; nothing leaks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softmm::uapi::*;
use softmm::*;

const PAGE: u64 = PAGE_SIZE;

fn two_nodes(frames_per_node: u64) -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(2 * frames_per_node * PAGE).nodes(2)).unwrap()
}

fn mm_with(phys: &Arc<PhysMem>, policy: MigratePolicy) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().migrate_policy(policy).cap_sys_nice(true)).unwrap()
}

fn anon(mm: &AddressSpace, pages: u64) -> u64 {
    mm.mmap(0, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap()
}

fn addrs(a: u64, pages: u64) -> Vec<u64> {
    (0..pages).map(|i| a + i * PAGE).collect()
}

#[track_caller]
fn nodes_of(mm: &AddressSpace, a: u64, pages: u64) -> Vec<i32> {
    let mut st = vec![i32::MIN; pages as usize];
    mm.pages_stat(&addrs(a, pages), &mut st).unwrap();
    st
}

/// Moves `[a, a + pages)` to `node`; returns the call's result and statuses.
fn move_to(mm: &AddressSpace, a: u64, pages: u64, node: i32, flags: u32) -> (Result<u64>, Vec<i32>) {
    let nodes = vec![node; pages as usize];
    let mut status = vec![i32::MIN; pages as usize];
    let r = mm.move_pages(&addrs(a, pages), Some(&nodes), &mut status, flags);
    (r, status)
}

#[test]
fn move_pages_moves_contents_and_frees_the_old_frames() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(256);
        {
            let mm = mm_with(&phys, policy);
            let a = anon(&mm, 32);
            let mut cpu = Cpu::attached(&mm);
            // Every word of every page distinct, so that a partial copy shows.
            let word = |i: u64, w: u64| (i << 32) | w | 1 << 63;
            for i in 0..32 {
                for w in 0..PAGE / 8 {
                    cpu.write_u64(a + i * PAGE + w * 8, word(i, w)).unwrap();
                }
            }
            let used0 = phys.node_stats()[0].frames_used;
            let (r, st) = move_to(&mm, a, 32, 1, MPOL_MF_MOVE);
            assert_eq!(r, Ok(0), "{policy:?}");
            assert_eq!(st, vec![1; 32]);
            assert_eq!(nodes_of(&mm, a, 32), vec![1; 32]);
            for i in 0..32 {
                for w in 0..PAGE / 8 {
                    assert_eq!(cpu.read_u64(a + i * PAGE + w * 8).unwrap(), word(i, w), "{policy:?} page {i} word {w}");
                }
            }
            assert_eq!(phys.node_stats()[0].frames_used, used0 - 32, "old frames freed");
            assert_eq!(mm.stats().pages_migrated, 32);
            // Still writable, privately: a write lands in the new page.
            cpu.write_u64(a, 5).unwrap();
            // And back.
            let (r, st) = move_to(&mm, a, 32, 0, MPOL_MF_MOVE);
            assert_eq!((r, st), (Ok(0), vec![0; 32]));
            assert_eq!(cpu.read_u64(a).unwrap(), 5);
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// PROT_NONE pages move as Linux moves them (their entries map the frame:
/// x86-64's `PROT_NONE` entry is present to the folio walk and to
/// `try_to_migrate_one`): the query reports their node, `move_pages` and
/// `migrate_pages(2)` move them, and they stay inaccessible until an
/// `mprotect` gives their contents back.
#[test]
fn prot_none_pages_migrate_and_stay_hidden() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(64);
        {
            let mm = mm_with(&phys, policy);
            let a = anon(&mm, 4);
            let mut cpu = Cpu::attached(&mm);
            for i in 0..4 {
                cpu.write_u64(a + i * PAGE, 70 + i).unwrap();
            }
            mm.mprotect(a, 4 * PAGE, PROT_NONE).unwrap();
            assert_eq!(nodes_of(&mm, a, 4), [0; 4], "{policy:?}: the query sees PROT_NONE pages");
            let (r, st) = move_to(&mm, a, 2, 1, MPOL_MF_MOVE);
            assert_eq!((r, st), (Ok(0), vec![1; 2]), "{policy:?}");
            let new: [u64; 1] = [1 << 1];
            assert_eq!(mm.migrate_pages(2 + 1, Some(&[1]), Some(&new)), Ok(0), "{policy:?}");
            assert_eq!(nodes_of(&mm, a, 4), [1; 4], "{policy:?}");
            assert_eq!(mm.stats().pages_migrated, 4);
            let f = cpu.read_u64(a).unwrap_err();
            assert_eq!(f.signal(), libc::SIGSEGV, "{policy:?}: a migrated PROT_NONE page became accessible");
            mm.mprotect(a, 4 * PAGE, PROT_READ | PROT_WRITE).unwrap();
            for i in 0..4 {
                assert_eq!(cpu.read_u64(a + i * PAGE).unwrap(), 70 + i, "{policy:?} page {i}");
            }
            cpu.write_u64(a, 1).unwrap();
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// Page-cache pages move through the file's reverse map (`i_mmap`): a
/// shared mapping's pages mapped by parent and child (`-EACCES` without
/// `MPOL_MF_MOVE_ALL`, as Linux's shared-page rule) and a private mapping's
/// clean pages. Afterwards the page cache holds the new pages (`read_at`,
/// `write_at` and both processes see one page), a private write still
/// copies, truncation still zaps, and nothing leaks.
#[test]
fn file_pages_migrate_through_the_file_reverse_map() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(64);
        {
            let mm = mm_with(&phys, policy);
            let f = File::create(&phys, "f", 4 * PAGE).unwrap();
            for i in 0..4 {
                f.write_at(i * PAGE + 8, &(100 + i).to_le_bytes()).unwrap();
            }
            let rw = PROT_READ | PROT_WRITE;
            let a = mm.mmap(0, 2 * PAGE, rw, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
            let b = mm.mmap(0, 2 * PAGE, rw, MAP_PRIVATE, Some(&OpenFile::read_write(&f)), 2 * PAGE).unwrap();
            let mut cpu = Cpu::attached(&mm);
            for (base, first) in [(a, 0), (b, 2)] {
                for i in 0..2 {
                    assert_eq!(cpu.read_u64(base + i * PAGE + 8).unwrap(), 100 + first + i);
                }
            }
            let child = mm.fork().unwrap();
            let mut ccpu = Cpu::attached(&child);
            assert_eq!(ccpu.read_u64(a + 8).unwrap(), 100);
            // Fork copied neither entry (no anon_vma: Linux's vma_needs_copy);
            // the child's read of page 0 mapped page 1 too (fault-around), so
            // both are mapped twice (`tests/fork_host.rs` checks both against
            // the host).
            assert_eq!(nodes_of(&child, a, 2), [0, 0]);
            let (r, st) = move_to(&mm, a, 2, 1, MPOL_MF_MOVE);
            assert_eq!((r, st), (Ok(0), vec![-libc::EACCES; 2]), "{policy:?}: both pages are mapped twice");
            let (r, st) = move_to(&mm, a, 2, 1, MPOL_MF_MOVE_ALL);
            assert_eq!((r, st), (Ok(0), vec![1; 2]), "{policy:?}");
            let (r, st) = move_to(&mm, b, 2, 1, MPOL_MF_MOVE);
            assert_eq!((r, st), (Ok(0), vec![1; 2]), "{policy:?}");
            assert_eq!(nodes_of(&mm, a, 2), [1; 2]);
            assert_eq!(nodes_of(&mm, b, 2), [1; 2]);
            assert_eq!(nodes_of(&child, a, 1), [1], "{policy:?}: the child maps the new page too");
            assert_eq!(mm.stats().pages_migrated, 4);
            for (base, first) in [(a, 0), (b, 2)] {
                for i in 0..2 {
                    assert_eq!(cpu.read_u64(base + i * PAGE + 8).unwrap(), 100 + first + i, "{policy:?}");
                }
            }
            // One page for the cache and both processes.
            cpu.write_u64(a + 8, 7).unwrap();
            assert_eq!(ccpu.read_u64(a + 8).unwrap(), 7);
            let mut buf = [0u8; 8];
            f.read_at(8, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), 7, "{policy:?}: the page cache kept the old page");
            f.write_at(PAGE + 8, &9u64.to_le_bytes()).unwrap();
            assert_eq!(cpu.read_u64(a + PAGE + 8).unwrap(), 9);
            // A private write still copies; the file keeps its byte.
            cpu.write_u64(b + 8, 5).unwrap();
            f.read_at(2 * PAGE + 8, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), 102);
            // Truncation still finds and zaps the new pages.
            f.set_len(0).unwrap();
            assert_eq!(cpu.read_u64(a + 8).unwrap_err().signal(), libc::SIGBUS);
            drop(ccpu);
            drop(child);
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// One `move_pages` call whose pages alternate between owners (two
/// anonymous regions and a shared file mapping): a batch walks each run of
/// pages of one owner through that owner's reverse map, and every page
/// moves with its contents, and back.
#[test]
fn a_batch_of_pages_of_several_owners_moves_each_through_its_own() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(64);
        {
            let mm = mm_with(&phys, policy);
            let f = File::create(&phys, "f", 2 * PAGE).unwrap();
            let rw = PROT_READ | PROT_WRITE;
            let x = anon(&mm, 2);
            let y = mm.mmap(0, 2 * PAGE, rw, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
            let z = anon(&mm, 2);
            let mut cpu = Cpu::attached(&mm);
            let pages: Vec<u64> = (0..2).flat_map(|i| [x, y, z].map(|base| base + i * PAGE)).collect();
            for (k, &p) in pages.iter().enumerate() {
                cpu.write_u64(p + 16, 500 + k as u64).unwrap();
            }
            // Another CPU of the process: each flush sends it one request,
            // so a page left for a second pass (its run walked through the
            // wrong owner) shows as a second batched flush.
            let stop = Arc::new(AtomicBool::new(false));
            let peer = attached_peer(&mm, x, &stop);
            for node in [1, 0] {
                let mut status = vec![i32::MIN; pages.len()];
                let before = mm.stats().tlb.flush_requests;
                let r = mm.move_pages(&pages, Some(&vec![node; pages.len()]), &mut status, MPOL_MF_MOVE);
                assert_eq!((r, &status), (Ok(0), &vec![node; pages.len()]), "{policy:?}");
                let per_batch = if policy == MigratePolicy::Batched { 1 } else { pages.len() as u64 };
                assert_eq!(mm.stats().tlb.flush_requests - before, per_batch, "{policy:?}: one pass");
                let mut st = vec![i32::MIN; pages.len()];
                mm.pages_stat(&pages, &mut st).unwrap();
                assert_eq!(st, vec![node; pages.len()], "{policy:?}");
                for (k, &p) in pages.iter().enumerate() {
                    assert_eq!(cpu.read_u64(p + 16).unwrap(), 500 + k as u64, "{policy:?} page {k}");
                }
            }
            stop.store(true, Ordering::Relaxed);
            peer.join().unwrap();
            let mut buf = [0u8; 8];
            f.read_at(PAGE + 16, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), 504, "{policy:?}: the page cache holds the moved page");
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// A page-cache page that someone else holds a reference to (here
/// `get_user_pages`; a `write(2)` in progress holds one the same way) is
/// not switched: it stays in the cache and mapped, counted as not moved
/// (Linux's refcount freeze fails), and moves once the reference is gone.
#[test]
fn a_referenced_file_page_stays_until_released() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(64);
        {
            let mm = mm_with(&phys, policy);
            let f = File::create(&phys, "f", PAGE).unwrap();
            let a = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
            let mut cpu = Cpu::attached(&mm);
            cpu.write_u64(a, 3).unwrap();
            let held = mm.get_user_pages(a, 1, Foll::WRITE).unwrap();
            let (r, st) = move_to(&mm, a, 1, 1, MPOL_MF_MOVE_ALL);
            assert_eq!((r, st), (Ok(1), vec![i32::MIN]), "{policy:?}: a referenced page moved");
            assert_eq!(nodes_of(&mm, a, 1), [0]);
            cpu.write_u64(a, 4).unwrap();
            let mut buf = [0u8; 8];
            f.read_at(0, &mut buf).unwrap();
            assert_eq!(u64::from_le_bytes(buf), 4, "{policy:?}: the mapping and the cache parted");
            drop(held);
            let (r, st) = move_to(&mm, a, 1, 1, MPOL_MF_MOVE);
            assert_eq!((r, st), (Ok(0), vec![1]), "{policy:?}");
            f.read_at(0, &mut buf).unwrap();
            assert_eq!((u64::from_le_bytes(buf), cpu.read_u64(a).unwrap()), (4, 4));
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// A page-cache page moving back and forth while one thread writes it
/// through a shared mapping and another with `write_at`: every write is
/// read back by its writer (none lands in a page the cache or the mapping
/// already left), and the last ones are in the file at the end.
#[test]
fn file_page_writes_are_never_lost_while_it_migrates() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(64);
        {
            let mm = mm_with(&phys, policy);
            let f = File::create(&phys, "f", PAGE).unwrap();
            let a = mm.mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
            Cpu::attached(&mm).write_u64(a, 0).unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let mapped = {
                let (mm, stop) = (mm.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut cpu = Cpu::attached(&mm);
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        cpu.write_u64(a, i).unwrap();
                        assert_eq!(cpu.read_u64(a).unwrap(), i, "a write through the mapping was lost");
                    }
                    i
                })
            };
            let syscall = {
                let (f, stop) = (f.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8];
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        f.write_at(8, &i.to_le_bytes()).unwrap();
                        f.read_at(8, &mut buf).unwrap();
                        assert_eq!(u64::from_le_bytes(buf), i, "a write(2) was lost");
                        // Not always inside a write: its reference would
                        // make the page look shared (softmm counts
                        // references, Linux mappings) and nothing would move.
                        std::thread::yield_now();
                    }
                    i
                })
            };
            for m in 0..400 {
                let (r, _) = move_to(&mm, a, 1, 1 - m % 2, MPOL_MF_MOVE);
                assert!(matches!(r, Ok(0) | Ok(1)), "{policy:?}: {r:?}");
            }
            stop.store(true, Ordering::Relaxed);
            let (m, w) = (mapped.join().unwrap(), syscall.join().unwrap());
            let mut buf = [0u8; 16];
            f.read_at(0, &mut buf).unwrap();
            assert_eq!(buf, [m.to_le_bytes(), w.to_le_bytes()].concat()[..], "{policy:?}");
            assert!(mm.stats().pages_migrated > 0, "{policy:?}: nothing moved");
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

#[test]
fn statuses_and_errnos_follow_linux() {
    let phys = two_nodes(64);
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = anon(&mm, 4);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    cpu.read_u64(a + PAGE).unwrap(); // zero page
    let pages = [a, a + PAGE, a + 2 * PAGE, a + 64 * PAGE];
    let mut status = [i32::MIN; 4];
    // Page 0 is on node 0 already: its status is the node.
    assert_eq!(mm.move_pages(&pages, Some(&[0, 1, 1, 1]), &mut status, MPOL_MF_MOVE), Ok(0));
    assert_eq!(status, [0, -libc::EFAULT, -libc::ENOENT, -libc::EFAULT]);
    assert_eq!(mm.move_pages(&pages, Some(&[0; 4]), &mut status, 8), Err(Errno::Inval));
    assert_eq!(mm.move_pages(&pages, Some(&[0; 4]), &mut status, MPOL_MF_MOVE_ALL), Err(Errno::Perm));
    assert_eq!(mm.move_pages(&pages, Some(&[0; 4]), &mut [0; 3], MPOL_MF_MOVE), Err(Errno::Fault));
    assert_eq!(mm.move_pages(&pages, Some(&[0; 3]), &mut status, MPOL_MF_MOVE), Err(Errno::Fault));
    // A node that does not exist ends the call with ENODEV; -1 too.
    assert_eq!(mm.move_pages(&pages[..1], Some(&[2]), &mut status, MPOL_MF_MOVE), Err(Errno::NoDev));
    assert_eq!(mm.move_pages(&pages[..1], Some(&[-1]), &mut status, MPOL_MF_MOVE), Err(Errno::NoDev));
    // ... after moving what came before it.
    let mut st2 = [i32::MIN; 2];
    assert_eq!(mm.move_pages(&[a, a + PAGE], Some(&[1, 7]), &mut st2, MPOL_MF_MOVE), Err(Errno::NoDev));
    assert_eq!(st2[0], 1);
    assert_eq!(nodes_of(&mm, a, 1), [1]);
    // The query mode.
    let mut q = [i32::MIN; 4];
    assert_eq!(mm.move_pages(&pages, None, &mut q, 0), Ok(0));
    assert_eq!(q, [1, -libc::EFAULT, -libc::ENOENT, -libc::EFAULT]);
}

#[test]
fn shared_pages_need_move_all_and_stay_shared_after_moving() {
    let phys = two_nodes(64);
    let mm = mm_with(&phys, MigratePolicy::Batched);
    let a = anon(&mm, 2);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 11).unwrap();
    cpu.write_u64(a + PAGE, 12).unwrap();
    let child = mm.fork().unwrap();
    let (r, st) = move_to(&mm, a, 2, 1, MPOL_MF_MOVE);
    assert_eq!((r, st), (Ok(0), vec![-libc::EACCES; 2]));
    let (r, st) = move_to(&mm, a, 2, 1, MPOL_MF_MOVE_ALL);
    assert_eq!((r, st), (Ok(0), vec![1; 2]));
    // Both address spaces map the moved page (the anon walk found the child's entry).
    assert_eq!(nodes_of(&child, a, 2), [1, 1]);
    let mut ccpu = Cpu::attached(&child);
    assert_eq!(ccpu.read_u64(a).unwrap(), 11);
    // Still copy-on-write: the child's write does not reach the parent.
    ccpu.write_u64(a, 99).unwrap();
    assert_eq!(cpu.read_u64(a).unwrap(), 11);
    cpu.write_u64(a + PAGE, 13).unwrap();
    assert_eq!(ccpu.read_u64(a + PAGE).unwrap(), 12);
}

/// "Mapped more than once" is a count of mappings (Linux's
/// `folio_mapcount`), not of references: a page mapped once with a reference
/// held for a moment (here a `Cpu` slice's, as `get_user_pages` or an
/// unmap's gather would hold one) is not `-EACCES` under `MPOL_MF_MOVE`: it
/// is isolated, stays while the reference is held (counted as not moved,
/// statuses unwritten) and moves once it is gone. A page mapped twice, by
/// two VMAs of one address space or by parent and child, is `-EACCES`.
#[test]
fn a_transient_reference_is_not_a_second_mapping() {
    let phys = two_nodes(64);
    {
        let mm = mm_with(&phys, MigratePolicy::Batched);
        let a = anon(&mm, 1);
        let f = File::create(&phys, "f", PAGE).unwrap();
        let rw = PROT_READ | PROT_WRITE;
        let b = mm.mmap(0, PAGE, rw, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 5).unwrap();
        cpu.write_u64(b, 6).unwrap();
        for addr in [a, b] {
            let mut inside = None;
            cpu.with_slice(addr, 8, |_, _| inside = Some(move_to(&mm, addr, 1, 1, MPOL_MF_MOVE))).unwrap();
            assert_eq!(inside, Some((Ok(1), vec![i32::MIN])), "{addr:#x}: the slice's reference made it shared");
            assert_eq!(nodes_of(&mm, addr, 1), [0]);
            assert_eq!(move_to(&mm, addr, 1, 1, MPOL_MF_MOVE), (Ok(0), vec![1]), "{addr:#x}");
        }
        assert_eq!((cpu.read_u64(a).unwrap(), cpu.read_u64(b).unwrap()), (5, 6));
        // The file page mapped a second time in the same address space.
        let c = mm.mmap(0, PAGE, rw, MAP_SHARED, Some(&OpenFile::read_write(&f)), 0).unwrap();
        assert_eq!(cpu.read_u64(c).unwrap(), 6);
        assert_eq!(move_to(&mm, b, 1, 0, MPOL_MF_MOVE), (Ok(0), vec![-libc::EACCES]));
        mm.munmap(c, PAGE).unwrap();
        // The anonymous page mapped by parent and child after fork.
        let child = mm.fork().unwrap();
        assert_eq!(move_to(&mm, a, 1, 0, MPOL_MF_MOVE), (Ok(0), vec![-libc::EACCES]));
        // Once the child's write gives it its own copy, the parent's page is mapped once again.
        Cpu::attached(&child).write_u64(a, 7).unwrap();
        assert_eq!(move_to(&mm, a, 1, 0, MPOL_MF_MOVE), (Ok(0), vec![0]));
        assert_eq!(cpu.read_u64(a).unwrap(), 5);
    }
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0));
}

/// A thread with a CPU attached to `mm` that stays attached (so that
/// flushes send it requests) until `stop`, parked while it sleeps (a
/// running CPU would be waited for).
fn attached_peer(mm: &Arc<AddressSpace>, a: u64, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let (mm, stop) = (mm.clone(), stop.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut cpu = Cpu::attached(&mm);
        cpu.read_u64(a).unwrap();
        cpu.park();
        tx.send(()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    rx.recv().unwrap();
    h
}

#[test]
fn batched_migration_sends_one_flush_per_batch() {
    let mut requests = Vec::new();
    let mut ptl_locks = Vec::new();
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(1024);
        let mm = mm_with(&phys, policy);
        let a = anon(&mm, 600);
        let mut cpu = Cpu::attached(&mm);
        for i in 0..600 {
            cpu.write_u64(a + i * PAGE, i).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let peer = attached_peer(&mm, a, &stop);
        let before = mm.stats().tlb.flush_requests;
        let (r, _) = move_to(&mm, a, 600, 1, MPOL_MF_MOVE);
        assert_eq!(r, Ok(0));
        requests.push(mm.stats().tlb.flush_requests - before);
        ptl_locks.push(mm.stats().migrate_ptl_locks);
        stop.store(true, Ordering::Relaxed);
        peer.join().unwrap();
    }
    // One request per page to the one other CPU, against one per batch of 512.
    assert_eq!(requests, [600, 2], "one-by-one, batched");
    // move_pages isolates page by page, a PTE lock each (Linux's
    // add_folio_for_migration takes one per entry too); then a PTE lock per
    // page and walk (unmap, remap) one by one; batched, one per page table
    // and walk: two batches, each over at most two tables.
    assert_eq!(ptl_locks[0], 600 + 1200);
    assert!((604..=608).contains(&ptl_locks[1]), "batched took {} PTE locks", ptl_locks[1]);
}

#[test]
fn writers_never_lose_a_write_while_pages_migrate_fork_and_unmap() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(2048);
        {
            let mm = mm_with(&phys, policy);
            const PAGES: u64 = 64;
            let a = anon(&mm, PAGES);
            let scratch = anon(&mm, 16);
            Cpu::attached(&mm).write_u64(a, 0).unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            // Two writers, each owning one word per page, counting up.
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let (mm, stop) = (mm.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut cpu = Cpu::attached(&mm);
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            n += 1;
                            for p in 0..PAGES {
                                let at = a + p * PAGE + w * 8;
                                let v = cpu.read_u64(at).unwrap();
                                assert_eq!(v, n - 1, "writer {w} page {p}: a write was lost or a stale page read");
                                cpu.write_u64(at, n).unwrap();
                            }
                        }
                        n
                    })
                })
                .collect();
            // A thread that forks (children read, then die) and maps/unmaps scratch memory.
            let churn = {
                let (mm, stop) = (mm.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let child = mm.fork().unwrap();
                        Cpu::attached(&child).read_u64(a).unwrap();
                        drop(child);
                        let mut cpu = Cpu::attached(&mm);
                        cpu.write_u64(scratch, 1).unwrap();
                        mm.madvise(scratch, 16 * PAGE, MADV_DONTNEED).unwrap();
                    }
                })
            };
            for round in 0..400 {
                let node = (round % 2 + 1) % 2;
                let (r, _) = move_to(&mm, a, PAGES, node, MPOL_MF_MOVE_ALL);
                assert!(r.is_ok(), "{r:?}");
            }
            stop.store(true, Ordering::Relaxed);
            let counts: Vec<u64> = writers.into_iter().map(|h| h.join().unwrap()).collect();
            churn.join().unwrap();
            let mut cpu = Cpu::attached(&mm);
            for p in 0..PAGES {
                for (w, &n) in counts.iter().enumerate() {
                    assert_eq!(cpu.read_u64(a + p * PAGE + w as u64 * 8).unwrap(), n, "{policy:?}");
                }
            }
            assert!(mm.stats().pages_migrated > 0, "{policy:?}: nothing moved");
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

#[test]
fn mbind_move_and_migrate_pages_move_pages_between_nodes() {
    let phys = two_nodes(256);
    let mm = mm_with(&phys, MigratePolicy::Batched);
    let a = anon(&mm, 8);
    let mut cpu = Cpu::attached(&mm);
    for i in 0..8 {
        cpu.write_u64(a + i * PAGE, i).unwrap();
    }
    // mbind with MOVE: the misplaced pages go to the bound node.
    assert_eq!(mm.mbind(a, 4 * PAGE, MPOL_BIND, Some(&[0b10]), 3, MPOL_MF_MOVE | MPOL_MF_STRICT), Ok(()));
    assert_eq!(nodes_of(&mm, a, 8), [1, 1, 1, 1, 0, 0, 0, 0]);
    // migrate_pages: node 0 -> node 1 for everything left, then all back.
    assert_eq!(mm.migrate_pages(3, Some(&[0b01]), Some(&[0b10])), Ok(0));
    assert_eq!(nodes_of(&mm, a, 8), [1; 8]);
    assert_eq!(mm.migrate_pages(3, Some(&[0b10]), Some(&[0b01])), Ok(0));
    assert_eq!(nodes_of(&mm, a, 8), [0; 8]);
    for i in 0..8 {
        assert_eq!(cpu.read_u64(a + i * PAGE).unwrap(), i);
    }
    // A pinned page is counted as not moved. (Page 4: pages 0-3 are bound
    // to node 1, where pinning's unshare of a page that migration left
    // non-exclusive would place its copy.)
    let pin = mm.pin_user_pages(a + 4 * PAGE, 1, Foll::WRITE).unwrap();
    assert_eq!(mm.migrate_pages(3, Some(&[0b01]), Some(&[0b10])), Ok(1));
    drop(pin);
    // Errnos: a new node the arena lacks (EPERM without CAP_SYS_NICE, else
    // EINVAL as nothing is left), masks as set_mempolicy's.
    let plain = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    assert_eq!(plain.migrate_pages(8, Some(&[1]), Some(&[0b1000])), Err(Errno::Perm));
    assert_eq!(mm.migrate_pages(8, Some(&[1]), Some(&[0b1000])), Err(Errno::Inval));
    assert_eq!(mm.migrate_pages(1 << 20, Some(&[1]), Some(&[1])), Err(Errno::Inval));
    assert_eq!(mm.migrate_pages(66, Some(&[1]), Some(&[1])), Err(Errno::Fault));
}

/// Fills node 1 of `phys` with pages of a fresh address space bound to it
/// until only `left` frames of node 1 are free; returns that address space.
fn fill_node1(phys: &Arc<PhysMem>, left: u64) -> Arc<AddressSpace> {
    let filler = AddressSpace::new(phys, MmConfig::default()).unwrap();
    filler.set_mempolicy(MPOL_BIND, Some(&[0b10]), 3).unwrap();
    let free = phys.node_stats()[1].frames_free;
    let f = anon(&filler, free);
    let mut cpu = Cpu::attached(&filler);
    let mut i = 0;
    while phys.node_stats()[1].frames_free > left {
        cpu.write_u64(f + i * PAGE, i).unwrap();
        i += 1;
    }
    assert_eq!(phys.node_stats()[1].frames_free, left);
    filler
}

/// A target node short of frames is `ENOMEM` for `move_pages` and
/// `migrate_pages(2)`, as Linux's `migrate_pages_batch` returns it ("move
/// unmapped folios, then exit"), under both policies: the pages that got a
/// frame move, the others stay where they are with their data, the run's
/// statuses are left unwritten; `mbind` ORs it into its failures (`EIO` with
/// `MPOL_MF_STRICT`, success without). Nothing leaks.
#[test]
#[cfg_attr(miri, ignore = "fills a node page by page: minutes under Miri")]
fn a_node_short_of_frames_is_enomem() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(256);
        {
            let mm = mm_with(&phys, policy);
            let a = anon(&mm, 64);
            let mut cpu = Cpu::attached(&mm);
            for i in 0..64 {
                cpu.write_u64(a + i * PAGE, 1000 + i).unwrap();
            }
            let filler = fill_node1(&phys, 20);
            let (r, st) = move_to(&mm, a, 64, 1, MPOL_MF_MOVE);
            assert_eq!(r, Err(Errno::NoMem), "{policy:?}");
            assert_eq!(st, vec![i32::MIN; 64], "{policy:?}: the run's statuses are unwritten");
            let nodes = nodes_of(&mm, a, 64);
            assert_eq!(nodes.iter().filter(|&&n| n == 1).count(), 20, "{policy:?}: {nodes:?}");
            assert_eq!(phys.node_stats()[1].frames_free, 0);
            // An earlier run's statuses are written: the page already on
            // node 1 ends a run (its status the node) before the short one.
            let moved = a + nodes.iter().position(|&n| n == 1).unwrap() as u64 * PAGE;
            let stays = a + nodes.iter().position(|&n| n == 0).unwrap() as u64 * PAGE;
            let mut st = [i32::MIN; 2];
            assert_eq!(mm.move_pages(&[moved, stays], Some(&[1, 1]), &mut st, MPOL_MF_MOVE), Err(Errno::NoMem));
            assert_eq!(st, [1, i32::MIN], "{policy:?}");
            // ENODEV stands over the ENOMEM of the run flushed before it.
            assert_eq!(mm.move_pages(&[stays, stays], Some(&[1, 7]), &mut st, MPOL_MF_MOVE), Err(Errno::NoDev));
            // migrate_pages(2) and mbind.
            assert_eq!(mm.migrate_pages(3, Some(&[0b01]), Some(&[0b10])), Err(Errno::NoMem), "{policy:?}");
            assert_eq!(
                mm.mbind(a, 64 * PAGE, MPOL_BIND, Some(&[0b10]), 3, MPOL_MF_MOVE | MPOL_MF_STRICT),
                Err(Errno::Io),
                "{policy:?}"
            );
            assert_eq!(mm.mbind(a, 64 * PAGE, MPOL_BIND, Some(&[0b10]), 3, MPOL_MF_MOVE), Ok(()), "{policy:?}");
            for i in 0..64 {
                assert_eq!(cpu.read_u64(a + i * PAGE).unwrap(), 1000 + i, "{policy:?}");
            }
            // With room on node 1 again, everything moves.
            drop(filler);
            phys.quiesce();
            let (r, st) = move_to(&mm, a, 64, 1, MPOL_MF_MOVE);
            assert_eq!((r, st), (Ok(0), vec![1; 64]), "{policy:?}");
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// An entry that is not queued (here a page on the target node already)
/// ends the run before it: Linux migrates the queued pages then, and when
/// one of them fails, returns the failures plus the entries after this one,
/// which are never tried.
#[test]
fn an_entry_not_queued_migrates_the_run_before_it() {
    for policy in MigratePolicy::ALL {
        let phys = two_nodes(64);
        {
            let mm = mm_with(&phys, policy);
            let a = anon(&mm, 3);
            let mut cpu = Cpu::attached(&mm);
            for i in 0..3 {
                cpu.write_u64(a + i * PAGE, i).unwrap();
            }
            assert_eq!(move_to(&mm, a + PAGE, 1, 1, MPOL_MF_MOVE), (Ok(0), vec![1]));
            let pin = mm.pin_user_pages(a, 1, Foll::WRITE).unwrap();
            let mut st = [i32::MIN; 3];
            assert_eq!(mm.move_pages(&addrs(a, 3), Some(&[1, 1, 1]), &mut st, MPOL_MF_MOVE), Ok(2), "{policy:?}");
            assert_eq!(st, [i32::MIN, 1, i32::MIN], "{policy:?}");
            assert_eq!(nodes_of(&mm, a, 3), [0, 1, 0], "{policy:?}: the entry after the run was tried");
            drop(pin);
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}

/// `migrate_pages(2)` and `mbind` isolate a range's pages in one walk with
/// one PTE lock per page table (Linux's `queue_folios_pte_range`), not one
/// per page: with batching, 1,024 adjacent pages cost a handful of PTE locks
/// in all (isolation, unmap, remap), where isolating page by page took
/// 1,024 more.
#[test]
#[cfg_attr(miri, ignore = "migrates hundreds of pages: minutes under Miri")]
fn isolation_takes_one_pte_lock_per_table() {
    let phys = two_nodes(2048);
    {
        let mm = mm_with(&phys, MigratePolicy::Batched);
        let a = mm
            .mmap(1 << 30, 1024 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0)
            .unwrap();
        let mut cpu = Cpu::attached(&mm);
        for i in 0..1024 {
            cpu.write_u64(a + i * PAGE, i).unwrap();
        }
        // Two page tables: isolation 2, then two batches of 512, each one
        // table, unmapped and remapped: 4.
        let locks = mm.stats().migrate_ptl_locks;
        assert_eq!(mm.migrate_pages(3, Some(&[0b01]), Some(&[0b10])), Ok(0));
        assert_eq!(nodes_of(&mm, a, 1024), vec![1; 1024]);
        assert_eq!(mm.stats().migrate_ptl_locks - locks, 2 + 4, "migrate_pages(2)");
        let locks = mm.stats().migrate_ptl_locks;
        assert_eq!(mm.mbind(a, 1024 * PAGE, MPOL_BIND, Some(&[0b01]), 3, MPOL_MF_MOVE | MPOL_MF_STRICT), Ok(()));
        assert_eq!(nodes_of(&mm, a, 1024), vec![0; 1024]);
        assert_eq!(mm.stats().migrate_ptl_locks - locks, 2 + 4, "mbind");
        for i in 0..1024 {
            assert_eq!(cpu.read_u64(a + i * PAGE).unwrap(), i);
        }
    }
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0));
}

/// `mbind`'s migration allocates as the policy's faults do (Linux's
/// `alloc_migration_target_by_mpol`, no `__GFP_THISNODE`): `MPOL_BIND`
/// takes any node of its mask, its first node first, `MPOL_PREFERRED` and
/// `MPOL_INTERLEAVE` fall back to any node; so with node 1 nearly full the
/// pages still move. `move_pages` and `migrate_pages(2)` allocate on their
/// target node only (`__GFP_THISNODE`): `ENOMEM` though node 2 has room.
/// Under both policies, data intact, nothing leaked.
#[test]
#[cfg_attr(miri, ignore = "fills a node page by page: minutes under Miri")]
fn mbind_moves_fall_back_within_the_policy_and_move_pages_does_not() {
    for policy in MigratePolicy::ALL {
        let phys = PhysMem::new(PhysConfig::new(3 * 256 * PAGE).nodes(3)).unwrap();
        {
            let mm = mm_with(&phys, policy);
            let a = anon(&mm, 64);
            let b = anon(&mm, 32);
            let c = anon(&mm, 16);
            // The 112 pages of a, b and c, in order.
            let addr = |i: u64| match i {
                0..64 => a + i * PAGE,
                64..96 => b + (i - 64) * PAGE,
                _ => c + (i - 96) * PAGE,
            };
            let mut cpu = Cpu::attached(&mm);
            for i in 0..112 {
                cpu.write_u64(addr(i), 1000 + i).unwrap();
            }
            let filler = fill_node1(&phys, 20);
            // Targets of one node only: node 1's 20 frames are not enough.
            let (r, st) = move_to(&mm, b, 32, 1, MPOL_MF_MOVE);
            assert_eq!((r, st), (Err(Errno::NoMem), vec![i32::MIN; 32]), "{policy:?}");
            assert_eq!(phys.node_stats()[1].frames_free, 0, "{policy:?}: node 1 took what it had");
            assert_eq!(nodes_of(&mm, b, 32).iter().filter(|&&n| n == 2).count(), 0, "{policy:?}");
            assert_eq!(mm.migrate_pages(3, Some(&[0b01]), Some(&[0b10])), Err(Errno::NoMem), "{policy:?}");
            assert_eq!(nodes_of(&mm, a, 64), [0; 64], "{policy:?}");
            // BIND {1, 2}: node 1 is full, so every page goes to node 2.
            assert_eq!(mm.mbind(a, 64 * PAGE, MPOL_BIND, Some(&[0b110]), 4, MPOL_MF_MOVE | MPOL_MF_STRICT), Ok(()));
            assert_eq!(nodes_of(&mm, a, 64), [2; 64], "{policy:?}");
            // PREFERRED 1: node 1 full, then the next node, 2.
            let b_nodes = nodes_of(&mm, b, 32);
            let on0 = b_nodes.iter().filter(|&&n| n == 0).count();
            assert_eq!(mm.mbind(b, 32 * PAGE, MPOL_PREFERRED, Some(&[0b10]), 4, MPOL_MF_MOVE | MPOL_MF_STRICT), Ok(()));
            let want: Vec<i32> = b_nodes.iter().map(|&n| if n == 0 { 2 } else { n }).collect();
            assert_eq!((nodes_of(&mm, b, 32), on0), (want, 32 - 20), "{policy:?}");
            // INTERLEAVE {1, 2}: the pages interleaved onto node 1 (every
            // other one) fall back to the next node, 2, as the others go there.
            assert_eq!(
                mm.mbind(c, 16 * PAGE, MPOL_INTERLEAVE, Some(&[0b110]), 4, MPOL_MF_MOVE | MPOL_MF_STRICT),
                Ok(())
            );
            assert_eq!(nodes_of(&mm, c, 16), [2; 16], "{policy:?}");
            // BIND {1} alone: no node of the mask has room.
            assert_eq!(
                mm.mbind(a, 64 * PAGE, MPOL_BIND, Some(&[0b10]), 4, MPOL_MF_MOVE | MPOL_MF_STRICT),
                Err(Errno::Io),
                "{policy:?}"
            );
            assert_eq!(nodes_of(&mm, a, 64), [2; 64], "{policy:?}");
            for i in 0..112 {
                assert_eq!(cpu.read_u64(addr(i)).unwrap(), 1000 + i, "{policy:?}");
            }
            drop(filler);
        }
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas), (0, 0, 0), "{policy:?}");
    }
}
