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
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
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
/// guard is dropped. The writer flushes its bag and collects in between, so that
/// the marker can run in the model (crossbeam collects every 128 pins
/// otherwise), until it has freed the version. Seen failing with `broken::rcu::FREE_WITHOUT_GRACE_PERIOD`
/// (the writer frees the version at once).
#[test]
fn a_writer_frees_its_own_old_versions_after_their_grace_period() {
    crate::sync::broken::check_model(own_rcu_model, &crate::sync::broken::rcu::FREE_WITHOUT_GRACE_PERIOD);
}

fn own_rcu_model() -> Result<(), String> {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let config = MmConfig::default().writer_policy(crate::WriterPolicy::ShortOwnRcu);
    let mm = AddressSpace::new(&phys, config).unwrap();
    let a = 5 * GIB;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
    assert_eq!(mm.mmap(a, PAGE_SIZE, PROT_READ, flags, None, 0), Ok(a));
    let writer = {
        let mm = mm.clone();
        crate::sync::model::spawn(move || {
            mm.munmap(a, PAGE_SIZE).unwrap();
            // Until the writer freed the old version: each flush tries to
            // end a grace period (the reader's guard holds it back), and a
            // write section with nothing to change reclaims at its end. So
            // the thread exits with nothing queued.
            while crate::sync::rcu::own_queued() > 0 {
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
