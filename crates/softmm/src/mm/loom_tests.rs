//! loom models of the publication of the VMA set by window
//! (`vma/windows.rs`, `VmaTree::publish_changed`) on the real code: the
//! real `mprotect` on one thread, splitting or merging a VMA across a 1 GiB
//! window boundary, against the real lock-free lookup
//! (`AddressSpace::vmas_rcu(..).find`) on another, which must find a VMA
//! (the old one, detached, or a new one) at every address that had one
//! before and has one after: never a hole.
//!
//! The split, seen failing with `broken::windows::NO_FALL_THROUGH_RECHECK`
//! (a lookup that falls through to nothing is not confirmed against the
//! sequence count of sections publishing several windows): the reader
//! loads window 5 (the upper page's) before the writer publishes anything
//! and window 4 after it published both, whose left piece ends below the
//! address. No order of publication prevents that (the reader loads the
//! windows top down). The merge, without the recheck, seen failing with
//! `broken::windows::PUBLISH_REVERSED`: there the order is what keeps the
//! reader from the old left VMA once window 5 is emptied.
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release
//! -p softmm --lib mm::loom_tests`.

use std::sync::Arc;

use crate::mm::{AddressSpace, MmConfig};
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::vma::WINDOW_SHIFT;
use crate::PAGE_SIZE;

const GIB: u64 = 1 << WINDOW_SHIFT;

/// A tiny address space with one private anonymous VMA of two pages
/// across the boundary of windows 4 and 5, read-write, or (`split`) with
/// its upper page read-only: two VMAs, one in each window.
fn setup(split: bool) -> Arc<AddressSpace> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = 5 * GIB - PAGE_SIZE;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
    assert_eq!(mm.mmap(a, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0), Ok(a));
    if split {
        mm.mprotect(5 * GIB, PAGE_SIZE, PROT_READ).unwrap();
    }
    mm
}

/// Runs `change` on a writer thread against lookups of both pages on this
/// one, each of which must find a VMA containing the page.
fn model(split: bool, change: fn(&AddressSpace)) -> Result<(), String> {
    let mm = setup(split);
    let writer = {
        let mm = mm.clone();
        crate::sync::model::spawn(move || change(&mm))
    };
    let mut res = Ok(());
    for addr in [5 * GIB, 5 * GIB - PAGE_SIZE] {
        let guard = crossbeam_epoch::pin();
        let found = mm.vmas_rcu(&guard).find(addr).map(|v| (v.start, v.end));
        if !found.is_some_and(|(s, e)| s <= addr && addr < e) {
            res = Err(format!("a hole at {addr:#x}"));
        }
    }
    writer.join().unwrap();
    res
}

fn split(mm: &AddressSpace) {
    mm.mprotect(5 * GIB, PAGE_SIZE, PROT_READ).unwrap();
}

fn merge(mm: &AddressSpace) {
    mm.mprotect(5 * GIB, PAGE_SIZE, PROT_READ | PROT_WRITE).unwrap();
}

/// A split across the window boundary: window 5 gains the right piece
/// before window 4 replaces the VMA by its left piece, but a reader may
/// load window 5 before and window 4 after both: the recheck is what
/// keeps it from a hole. Seen failing with `NO_FALL_THROUGH_RECHECK`.
#[test]
fn a_split_across_windows_never_shows_a_hole() {
    crate::sync::broken::check_model(|| model(false, split), &crate::sync::broken::windows::NO_FALL_THROUGH_RECHECK);
}

/// A merge across the window boundary: window 4 gains the merged VMA
/// before window 5 loses the right one, which is enough by itself: a
/// reader that finds window 5 emptied then finds window 4's new version.
/// Without the recheck, seen failing with `PUBLISH_REVERSED`.
#[test]
fn a_merge_across_windows_never_shows_a_hole() {
    use crate::sync::broken::windows::{NO_FALL_THROUGH_RECHECK, PUBLISH_REVERSED};
    NO_FALL_THROUGH_RECHECK.with(|c| c.set(true));
    crate::sync::broken::check_model(|| model(true, merge), &PUBLISH_REVERSED);
    NO_FALL_THROUGH_RECHECK.with(|c| c.set(false));
}

/// `short-own-rcu` (`sync/rcu.rs`, `OwnCallbacks`): a munmap on a writer
/// thread queues the old version of the VMA's window on the writer's own
/// list, and the writer's next write section frees it once its batch's
/// marker ran; a reader on this thread that loaded the window's version
/// holding the VMA must see the VMA alive (counted in the arena) until its
/// guard is dropped. The writer closes its batch whatever it holds
/// (`end_batch_now`, as `PhysMem::quiesce` does: a write section closes
/// it only once it holds `BATCH_FREES`), flushes its bag and collects in
/// between, so that the marker can run in the model (crossbeam collects
/// every 128 pins otherwise), until it has freed the version. Seen failing with `broken::rcu::FREE_WITHOUT_GRACE_PERIOD`
/// (the writer frees the version at once).
#[test]
fn a_writer_frees_its_own_old_versions_after_their_grace_period() {
    crate::sync::broken::check_model(own_rcu_model, &crate::sync::broken::rcu::FREE_WITHOUT_GRACE_PERIOD);
}

fn own_rcu_model() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let config = MmConfig::model_default().writer_policy(crate::WriterPolicy::ShortOwnRcu);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let a = 5 * GIB;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
    assert_eq!(mm.mmap(a, PAGE_SIZE, PROT_READ, flags, None, 0), Ok(a));
    let writer = {
        let mm = mm.clone();
        crate::sync::model::spawn(move || {
            mm.munmap(a, PAGE_SIZE).unwrap();
            // Until the writer freed the old version: each close after the
            // first is refused while the first batch waits, each flush tries
            // to end a grace period (the reader's guard holds it back), and a
            // write section with nothing to change reclaims at its end. So
            // the thread exits with nothing queued.
            while crate::sync::rcu::own_queued() > 0 {
                crate::sync::rcu::end_batch_now();
                crossbeam_epoch::pin().flush();
                mm.munmap(a, PAGE_SIZE).unwrap();
                loom::thread::yield_now();
            }
        })
    };
    let mut res = Ok(());
    {
        let guard = crossbeam_epoch::pin();
        // The window's version loaded, not read: a broken reclaim may have
        // freed it, and the model must see that without touching it.
        if mm.windows.has_version(a >> WINDOW_SHIFT, &guard) && phys.stats().vmas == 0 {
            res = Err("a VMA found under a guard was freed before the guard was dropped".to_string());
        }
    }
    writer.join().unwrap();
    res
}

/// An address space under the range policy with one private anonymous
/// read-write VMA `[a, a + 2 pages)` in window 5, its first page written
/// (a frame, its tables, its `anon_vma`) by an `mmap_lock`-free fault.
fn range_setup() -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let (phys, mm, a) = range_setup_unfaulted();
    mm.handle_fault(a, crate::fault::Access::Write).unwrap();
    (phys, mm, a)
}

/// [`range_setup`] before its fault: the VMA has no page and no `anon_vma`.
fn range_setup_unfaulted() -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default().writer_policy(crate::WriterPolicy::Range)).unwrap();
    let a = 5 * GIB + 4 * PAGE_SIZE;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
    assert_eq!(mm.mmap(a, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0), Ok(a));
    (phys, mm, a)
}

/// A write fault at `va` of `mm`, on a model thread of its own (a CPU
/// that holds no translation the other threads' shootdowns wait for).
fn spawn_write_fault(mm: &Arc<AddressSpace>, va: u64) -> loom::thread::JoinHandle<Result<(), crate::Fault>> {
    let mm = mm.clone();
    crate::sync::model::spawn(move || {
        let _q = crate::tlb::QuiescentGuard::enter();
        mm.handle_fault(va, crate::fault::Access::Write)
    })
}

/// What the mremap models check once both sides are done.
struct Moved {
    phys: Arc<PhysMem>,
    mm: Arc<AddressSpace>,
    /// The old place and the new one.
    a: u64,
    b: u64,
    /// How the write fault ended.
    fault: Result<(), crate::Fault>,
}

/// The mremap models' start: [`range_setup`]'s two pages at `a` moved
/// with `flags` to `b`, 8 pages above, against a write fault at the second
/// page; `seen` set when both calls were range writes. `Err` if the move
/// did not end at `b`.
fn move_against_a_fault(flags: i32, seen: &std::sync::atomic::AtomicBool) -> Result<Moved, String> {
    let (phys, mm, a) = range_setup();
    let fault = spawn_write_fault(&mm, a + PAGE_SIZE);
    let b = a + 8 * PAGE_SIZE;
    let moved = mm.mremap(a, 2 * PAGE_SIZE, 2 * PAGE_SIZE, flags, b);
    let fault = fault.join().unwrap();
    if mm.range.stats().writes == 2 {
        seen.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if moved != Ok(b) {
        return Err(format!("the move ended {moved:?}"));
    }
    Ok(Moved { phys, mm, a, b, fault })
}

/// `Err` unless the frames in use are exactly those mapped at `vas`: a
/// page a fault left behind a move, unmapped, would be one more.
fn frames_are_mapped(phys: &PhysMem, mm: &AddressSpace, vas: &[u64]) -> Result<(), String> {
    let mapped = vas.iter().filter(|&&va| mm.pte_at(va).has_frame()).count() as u64;
    match phys.stats().frames_used {
        used if used == mapped => Ok(()),
        used => Err(format!("{used} frames for {mapped} entries")),
    }
}

/// Fails unless some execution of a model took the range path (else it
/// would only check the `mmap_lock` fallback): `seen`, set by the model
/// when its calls all ran as range writers.
fn assert_ranged(seen: &std::sync::atomic::AtomicBool) {
    assert!(seen.load(std::sync::atomic::Ordering::Relaxed), "no execution ran a range writer");
}

/// A range writer's `munmap` (`mm/range.rs`, no `mmap_lock`) against a
/// lock-free write fault in its range: once both are done, nothing is
/// mapped there and no frame is left (a fault that committed after the zap
/// would leave both), and the fault succeeded or raised `SIGSEGV`. Seen
/// failing with `broken::range_writers::NO_DETACH` (the VMA taken out of
/// the window's view without its detach: the fault that found it in the
/// window's old version commits after the zap).
#[test]
fn a_range_munmap_against_a_fault_in_its_range() {
    use crate::sync::broken::range_writers::NO_DETACH;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let (phys, mm, a) = range_setup();
        let fault = spawn_write_fault(&mm, a + PAGE_SIZE);
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        let r = fault.join().unwrap();
        if mm.range.stats().writes == 2 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if !(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV)) {
            return Err(format!("the fault ended {r:?}"));
        }
        if !mm.pte_at(a + PAGE_SIZE).is_none() || phys.stats().frames_used != 0 {
            return Err("an entry or a frame outlived the range munmap".to_string());
        }
        Ok(())
    }
    crate::sync::broken::check_model(model, &NO_DETACH);
    assert_ranged(&SEEN);
}

/// Two range writers of one window, each mapping a page next to the same
/// VMA (`[a - 1 page, a)` and `[a + 2 pages, a + 3 pages)`): both merge
/// with it, one after the other under the window's lock, and the result is
/// one VMA `[a - 1 page, a + 3 pages)`, as under `mmap_lock`. Seen failing
/// with `broken::range_writers::NO_WINDOW_LOCK` (both merge into the
/// version they loaded; the second publication loses the first's page).
#[test]
fn a_range_mmap_against_a_merging_neighbour() {
    use crate::sync::broken::range_writers::NO_WINDOW_LOCK;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let (_phys, mm, a) = range_setup();
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
        let right = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                mm.mmap(a + 2 * PAGE_SIZE, PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0)
            })
        };
        let left = mm.mmap(a - PAGE_SIZE, PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0);
        let right = right.join().unwrap();
        if mm.range.stats().writes == 3 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if (left, right) != (Ok(a - PAGE_SIZE), Ok(a + 2 * PAGE_SIZE)) {
            return Err(format!("{left:?} {right:?}"));
        }
        let spans: Vec<(u64, u64)> = mm.maps().iter().map(|e| (e.start, e.end)).collect();
        if spans != [(a - PAGE_SIZE, a + 3 * PAGE_SIZE)] {
            return Err(format!("{spans:x?}: a merge was lost"));
        }
        Ok(())
    }
    crate::sync::broken::check_model(model, &NO_WINDOW_LOCK);
    assert_ranged(&SEEN);
}

/// A range writer's `munmap` of the written page against `fork`, an
/// `mmap_lock` writer that blocks the range writers and takes their windows
/// in: the child has the VMA whole with its page (fork first) or without
/// the page's part (the munmap first), never the VMA whole without the
/// page's entry. Seen failing with `broken::range_writers::NO_BLOCK` (fork
/// neither waits for the range writer nor takes its window in: it copies
/// the VMA the munmap removes, without the entry the munmap zapped).
#[test]
fn a_range_munmap_against_fork() {
    use crate::sync::broken::range_writers::NO_BLOCK;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        // The setup's first write fault takes mmap_lock (it assigns the
        // anon_vma), which the switch would leave behind the setup's mmap.
        let broken = NO_BLOCK.with(|c| c.replace(false));
        let (phys, mm, a) = range_setup();
        NO_BLOCK.with(|c| c.set(broken));
        let unmap = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || mm.munmap(a, PAGE_SIZE))
        };
        let child = mm.fork().unwrap();
        unmap.join().unwrap().unwrap();
        if mm.range.stats().writes == 2 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let kept = child.maps().iter().any(|e| e.start <= a && a < e.end);
        let res = if kept && !child.pte_at(a).has_frame() {
            Err("the child maps the page without its entry".to_string())
        } else {
            Ok(())
        };
        drop(child);
        drop(mm);
        if phys.stats().frames_used != 0 {
            return Err("a frame outlived both address spaces".to_string());
        }
        res
    }
    crate::sync::broken::check_model(model, &NO_BLOCK);
    assert_ranged(&SEEN);
}

/// The file models' start: an address space under range writers, a file
/// of one page opened read-write, and the address `a` in window 5 where
/// they map it.
fn file_setup() -> (Arc<PhysMem>, Arc<AddressSpace>, Arc<crate::File>, crate::OpenFile, u64) {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let config = MmConfig::model_default().writer_policy(crate::WriterPolicy::Range);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let file = crate::File::create(&phys, "f", PAGE_SIZE).unwrap();
    let open = crate::OpenFile::new(&file, true, true);
    (phys, mm, file, open, 5 * GIB + 4 * PAGE_SIZE)
}

/// A range writer's `munmap` of a shared file mapping (`mm/range.rs`,
/// `range_vma_ok`) against a truncate of the file to nothing, whose
/// reverse-map walk (`Mapper::unmap_file_range` under
/// `read_lock_recursive`) zaps the address space's VMAs of the file: once
/// the truncate returns, no entry maps the page it dropped (Linux's
/// `truncate_pagecache`), whether the munmap ran before it, after it or
/// beside it; once both are done, nothing is mapped and no frame is left.
/// Seen failing with `broken::range_writers::ZAP_AFTER_LEAVE` (the munmap
/// zaps after publishing and leaving: the walk finds the VMA gone and
/// returns while its entry still maps the dropped page).
#[test]
fn a_range_munmap_of_a_file_against_truncate() {
    use crate::sync::broken::range_writers::ZAP_AFTER_LEAVE;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let (phys, mm, file, open, a) = file_setup();
        let flags = MAP_SHARED | MAP_FIXED;
        assert_eq!(mm.mmap(a, PAGE_SIZE, PROT_READ | PROT_WRITE, flags, Some(&open), 0), Ok(a));
        mm.handle_fault(a, crate::fault::Access::Write).unwrap();
        let unmap = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || mm.munmap(a, PAGE_SIZE))
        };
        file.set_len(0).unwrap();
        let after_truncate = mm.pte_at(a).has_frame();
        unmap.join().unwrap().unwrap();
        if mm.range.stats().writes == 1 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let res = if after_truncate {
            Err("the truncate returned with its dropped page still mapped".to_string())
        } else if mm.pte_at(a).has_frame() {
            Err("an entry outlived the munmap".to_string())
        } else {
            Ok(())
        };
        drop((open, file, mm));
        if phys.stats().frames_used != 0 {
            return Err("a frame outlived the file and the address space".to_string());
        }
        res
    }
    crate::sync::broken::check_model(model, &ZAP_AFTER_LEAVE);
    assert_ranged(&SEEN);
}

/// A range writer's `mmap` of a shared file mapping (`sys/mmap.rs`,
/// `range_mmap`) against a write fault in the new mapping followed by a
/// truncate of the file to nothing: once the truncate returns, no entry
/// maps the page it dropped, whether the fault found the mapping or not.
/// Seen failing with `broken::range_writers::LINK_AFTER_LEAVE` (the
/// address space is linked to the file after the VMA is published: the
/// fault maps the page, and the truncate's reverse-map walk, which finds
/// no link, leaves it mapped).
#[test]
fn a_range_mmap_of_a_file_against_truncate() {
    use crate::sync::broken::range_writers::LINK_AFTER_LEAVE;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let (phys, mm, file, open, a) = file_setup();
        // Window 5's leaf of the directory made before the threads, as in
        // the other models: its pointer is a `std` atomic, whose order loom
        // does not see, so a leaf made beside a reader reads to loom as a
        // race on the windows' own atomics.
        let other = 5 * GIB + 64 * PAGE_SIZE;
        let anon = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
        assert_eq!(mm.mmap(other, PAGE_SIZE, PROT_READ, anon, None, 0), Ok(other));
        let map = {
            let (mm, open) = (mm.clone(), open.clone());
            crate::sync::model::spawn(move || {
                mm.mmap(a, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, Some(&open), 0)
            })
        };
        let fault = {
            let _q = crate::tlb::QuiescentGuard::enter();
            mm.handle_fault(a, crate::fault::Access::Write)
        };
        file.set_len(0).unwrap();
        let after_truncate = mm.pte_at(a).has_frame();
        assert_eq!(map.join().unwrap(), Ok(a));
        if mm.range.stats().writes == 2 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let res = if after_truncate {
            Err(format!("the truncate returned with its dropped page still mapped (the fault: {fault:?})"))
        } else if !(fault.is_ok() || fault.is_err_and(|f| f.signal() == libc::SIGSEGV)) {
            Err(format!("the fault ended {fault:?}"))
        } else {
            Ok(())
        };
        mm.munmap(a, PAGE_SIZE).unwrap();
        drop((open, file, mm));
        if phys.stats().frames_used != 0 {
            return Err("a frame outlived the file and the address space".to_string());
        }
        res
    }
    crate::sync::broken::check_model(model, &LINK_AFTER_LEAVE);
    assert_ranged(&SEEN);
}

/// A range writer's `mremap` move of a shared file mapping
/// (`sys/mremap/range.rs`, `MREMAP_FIXED` inside the window; `mm/range.rs`,
/// `range_vma_ok`) against a truncate of the file to nothing: once the
/// truncate returns, no entry maps the page it dropped, at the old place
/// or the new one, whether the move ran before it, after it or beside it;
/// once both are done, nothing is mapped and no frame is left. Seen
/// failing with `broken::range_writers::NO_BLOCK` (the truncate's walk,
/// `read_lock_recursive`, reads the published windows beside the writer
/// inside: it finds the VMA at the old place, whose entry the move has
/// emptied, and returns while the new place maps the page).
#[test]
fn a_range_mremap_of_a_file_against_truncate() {
    use crate::sync::broken::range_writers::NO_BLOCK;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let (phys, mm, file, open, a) = file_setup();
        let b = a + 8 * PAGE_SIZE;
        let flags = MAP_SHARED | MAP_FIXED;
        assert_eq!(mm.mmap(a, PAGE_SIZE, PROT_READ | PROT_WRITE, flags, Some(&open), 0), Ok(a));
        mm.handle_fault(a, crate::fault::Access::Write).unwrap();
        let moved = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || mm.mremap(a, PAGE_SIZE, PAGE_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, b))
        };
        file.set_len(0).unwrap();
        let after_truncate = mm.pte_at(a).has_frame() || mm.pte_at(b).has_frame();
        assert_eq!(moved.join().unwrap(), Ok(b));
        if mm.range.stats().writes == 2 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let res = if after_truncate {
            Err("the truncate returned with its dropped page still mapped".to_string())
        } else if mm.pte_at(a).has_frame() || mm.pte_at(b).has_frame() {
            Err("an entry outlived the truncate".to_string())
        } else {
            Ok(())
        };
        drop((open, file, mm));
        if phys.stats().frames_used != 0 {
            return Err("a frame outlived the file and the address space".to_string());
        }
        res
    }
    crate::sync::broken::check_model(model, &NO_BLOCK);
    assert_ranged(&SEEN);
}

/// A range writer's `mremap` move (`sys/mremap/range.rs`: `MREMAP_FIXED`
/// inside the window, no `mmap_lock`) of the VMA against a lock-free write
/// fault in it: once both are done, the old range holds no entry, the new
/// one holds the moved page (and the faulted one if the fault came first),
/// no frame is left unmapped, and the fault succeeded or raised `SIGSEGV`.
/// Seen failing with `broken::range_writers::NO_DETACH` (the source VMA
/// taken out of the window's view without its detach: the fault that found
/// it installs its page in the old range after `move_ptes` emptied it).
#[test]
fn a_range_mremap_against_a_fault_in_its_range() {
    use crate::sync::broken::range_writers::NO_DETACH;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let Moved { phys, mm, a, b, fault: r } = move_against_a_fault(MREMAP_MAYMOVE | MREMAP_FIXED, &SEEN)?;
        if !(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV)) {
            return Err(format!("the fault ended {r:?}"));
        }
        if !mm.pte_at(a).is_none() || !mm.pte_at(a + PAGE_SIZE).is_none() {
            return Err("an entry was left in the old range".to_string());
        }
        if !mm.pte_at(b).has_frame() {
            return Err("the moved page is not at its new address".to_string());
        }
        frames_are_mapped(&phys, &mm, &[b, b + PAGE_SIZE])
    }
    crate::sync::broken::check_model(model, &NO_DETACH);
    assert_ranged(&SEEN);
}

/// A range writer's `MREMAP_DONTUNMAP` move (`sys/mremap/range.rs`, a
/// fixed target inside the window) of the whole VMA against a lock-free
/// write fault in its source: the source VMA is replaced by an empty one
/// without the `anon_vma` (which the moved VMA takes along) before the
/// entries move, so the fault either came first (its page moved) or
/// finds the replacement (a fresh page in the source, under the
/// replacement's own `anon_vma`). Once both are done, the old page is at
/// its new address only, and a page in the source is mapped by a VMA with
/// an `anon_vma`. Seen failing with `broken::range_writers::NO_DETACH`
/// (the source VMA replaced without its detach: the fault that found it
/// commits after the move, a page in the source under a VMA with no
/// `anon_vma`, which no reverse-map walk reaches).
#[test]
fn a_range_dontunmap_move_against_a_fault_in_its_source() {
    use crate::sync::broken::range_writers::NO_DETACH;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let flags = MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED;
        let Moved { phys, mm, a, b, fault: r } = move_against_a_fault(flags, &SEEN)?;
        if r.is_err() {
            return Err(format!("the fault ended {r:?}"));
        }
        if !mm.pte_at(a).is_none() || !mm.pte_at(b).has_frame() {
            return Err("the old page is not at its new address only".to_string());
        }
        if mm.pte_at(a + PAGE_SIZE).has_frame() {
            let st = mm.read_lock();
            if st.vmas.find(a + PAGE_SIZE).is_none_or(|v| v.anon_vma.get().is_none()) {
                return Err("a page in the source under a VMA with no anon_vma".to_string());
            }
        }
        frames_are_mapped(&phys, &mm, &[a + PAGE_SIZE, b, b + PAGE_SIZE])
    }
    crate::sync::broken::check_model(model, &NO_DETACH);
    assert_ranged(&SEEN);
}

/// A range writer's `madvise(MADV_DONTFORK)` (`sys/madvise/range.rs`),
/// splitting the VMA, against the first write fault in its range, which
/// gives the VMA its `anon_vma` under `mmap_lock` for read: once both are
/// done, the VMA mapping the new page has the advice's flag and the
/// `anon_vma` (else `fork`, `munmap` and the reverse map would miss the
/// page). Seen failing with `broken::range_writers::NO_BLOCK` (the fault's
/// `mmap_lock` reader neither blocks nor drains the range writer: it gives
/// the `anon_vma` to the VMA the split copied before).
#[test]
fn a_range_madvise_against_a_fault_in_its_range() {
    use crate::sync::broken::range_writers::NO_BLOCK;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        // The setup's mmap is a range write, which a reader takes in under
        // the write lock: done unbroken, so that the broken reader finds
        // the VMA (and races the split, not the publication).
        let broken = NO_BLOCK.with(|c| c.replace(false));
        let (phys, mm, a) = range_setup_unfaulted();
        drop(mm.read_lock());
        NO_BLOCK.with(|c| c.set(broken));
        let fault = spawn_write_fault(&mm, a + PAGE_SIZE);
        let advised = mm.madvise(a + PAGE_SIZE, PAGE_SIZE, MADV_DONTFORK);
        let r = fault.join().unwrap();
        if mm.range.stats().writes == 2 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if advised.is_err() || r.is_err() {
            return Err(format!("madvise {advised:?}, fault {r:?}"));
        }
        let guard = crossbeam_epoch::pin();
        let Some(v) = mm.vmas_rcu(&guard).find(a + PAGE_SIZE) else {
            return Err("no VMA at the advised page".to_string());
        };
        if !v.flags.contains(crate::vma::VmFlags::DONTCOPY) || v.start != a + PAGE_SIZE {
            return Err(format!("the advised VMA is {v:?}"));
        }
        if mm.pte_at(a + PAGE_SIZE).has_frame() && v.anon_vma.get().is_none() {
            return Err("an anonymous page mapped by a VMA without its anon_vma".to_string());
        }
        drop(guard);
        drop(mm);
        if phys.stats().frames_used != 0 {
            return Err("a frame outlived the address space".to_string());
        }
        Ok(())
    }
    crate::sync::broken::check_model(model, &NO_BLOCK);
    assert_ranged(&SEEN);
}

/// `max_map_count` under two range writers of one slot
/// (`RangeState::map_count_share`, Linux's `percpu_counter` with a batch):
/// with `max_map_count` 6, an `mmap_lock` section leaves two VMAs `x` and
/// `y` (3 pages each, in windows 5 and 6) and splits the room, 4, into
/// shares of 2; a writer of the other slot adds a VMA `z` (3 VMAs, window
/// 7). Then two threads of slot 0 each
/// `mprotect` the middle page of one of `x` and `y`, a split in three (2
/// more VMAs each). In either order under `mmap_lock` the first goes
/// (5 VMAs) and the second is refused with `ENOMEM` at its tail split,
/// its head split off (6 VMAs, as Linux's `vma_modify` leaves it). So in
/// every execution exactly one is refused, the map count is 6, never past
/// the limit, and the refused one's VMA is its head and the rest: the range
/// writer goes ahead only within its share, counting the writer beside it
/// (3 for another inside), and a call its share does not cover takes
/// `mmap_lock` (blocking and draining the range writer beside it), whose
/// check is exact. Seen failing with
/// `broken::range_writers::NO_COUNT_OTHERS` (both read the slot's change
/// as 0 and go ahead: 7 VMAs, no `ENOMEM`).
#[test]
fn a_range_writer_pair_against_the_map_count_limit() {
    use crate::sync::broken::range_writers::NO_COUNT_OTHERS;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    const MAX: usize = 6;
    fn model() -> Result<(), String> {
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
        let config = MmConfig::model_default().writer_policy(crate::WriterPolicy::Range).max_map_count(MAX);
        let mm = AddressSpace::new(&phys, config).unwrap();
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
        let rw = PROT_READ | PROT_WRITE;
        // Each in a window of its own: two writers of one window are
        // serialized by its lock, and the later one reads the earlier's change.
        let (x, y, z) = (5 * GIB + 4 * PAGE_SIZE, 6 * GIB + 4 * PAGE_SIZE, 7 * GIB + 4 * PAGE_SIZE);
        // Range writes of slot 0 (this thread's, taken first), then an
        // `mmap_lock` section that takes them in: base 2, shares of 2.
        assert_eq!(mm.mmap(x, 3 * PAGE_SIZE, rw, flags, None, 0), Ok(x));
        assert_eq!(mm.mmap(y, 3 * PAGE_SIZE, rw, flags, None, 0), Ok(y));
        drop(mm.write_lock());
        // A writer of slot 1 (the next thread to count) uses half its share.
        let other = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || mm.mmap(z, PAGE_SIZE, rw, flags, None, 0))
        };
        assert_eq!(other.join().unwrap(), Ok(z));
        if mm.range.stats().writes != 3 {
            return Err(format!("the setup's calls were not all range writes: {:?}", mm.range.stats()));
        }
        // The next thread counts in slot 0 again, beside this one.
        crate::sync::percpu::restart_slots();
        let first = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || mm.mprotect(x + PAGE_SIZE, PAGE_SIZE, PROT_READ))
        };
        let second = mm.mprotect(y + PAGE_SIZE, PAGE_SIZE, PROT_READ);
        let first = first.join().unwrap();
        if mm.range.stats().writes == 4 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let spans: Vec<(u64, u64)> = mm.maps().iter().map(|e| (e.start, e.end)).collect();
        if spans.len() > MAX {
            return Err(format!("{} VMAs, past max_map_count {MAX}: {first:?} {second:?}", spans.len()));
        }
        let refused = match (first, second) {
            (Ok(()), Err(crate::Errno::NoMem)) => y,
            (Err(crate::Errno::NoMem), Ok(())) => x,
            other => return Err(format!("not one refusal with ENOMEM: {other:?}")),
        };
        let head_split = [(refused, refused + PAGE_SIZE), (refused + PAGE_SIZE, refused + 3 * PAGE_SIZE)];
        if spans.len() != MAX || !head_split.iter().all(|s| spans.contains(s)) {
            return Err(format!(
                "{spans:x?}: the refused call did more than split its head, or the other did not split"
            ));
        }
        Ok(())
    }
    crate::sync::broken::check_model(model, &NO_COUNT_OTHERS);
    assert_ranged(&SEEN);
}

/// Two range writers that each `munmap` the last VMA of one window of a
/// 512 GiB region (windows 5 and 6, the first with a page written: the
/// region's PUD table, a PMD table and a PTE table): once both are done,
/// the region's PUD table is gone, as Linux's `free_pgtables` frees it
/// before the last `munmap` returns. Each publishes its emptied window
/// (a swap), fences, and looks at the region in the published set; one
/// of them sees both windows empty and frees the table under `mmap_lock`
/// (`AddressSpace::range_free_emptied_region`). Each side holds an epoch
/// guard across its call, so that the pins inside it are nested and issue
/// no fence: an outermost pin's own SeqCst fence (crossbeam-epoch's, not
/// the protocol's) would order the look after the publication as well,
/// and hide whether the protocol's fence is needed. Seen failing with
/// `broken::range_writers::NO_REGION_FENCE` (each sees the other's window
/// as it was, and the table stays until the exit).
#[test]
fn two_range_munmaps_that_empty_a_region_free_its_pud_table() {
    use crate::sync::broken::range_writers::NO_REGION_FENCE;
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fn model() -> Result<(), String> {
        let (_phys, mm, a) = range_setup();
        let b = 6 * GIB;
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
        assert_eq!(mm.mmap(b, PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0), Ok(b));
        let other = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let _q = crate::tlb::QuiescentGuard::enter();
                let _pinned = crossbeam_epoch::pin();
                mm.munmap(b, PAGE_SIZE)
            })
        };
        let mine = {
            let _pinned = crossbeam_epoch::pin();
            mm.munmap(a, 2 * PAGE_SIZE)
        };
        let other = other.join().unwrap();
        if (mine, other) != (Ok(()), Ok(())) {
            return Err(format!("the munmaps ended {mine:?} and {other:?}"));
        }
        if mm.range.stats().writes == 4 {
            SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if mm.pgtables.has_pud_table(a) {
            return Err("the emptied region kept its PUD table".to_string());
        }
        Ok(())
    }
    crate::sync::broken::check_model(model, &NO_REGION_FENCE);
    assert_ranged(&SEEN);
}
