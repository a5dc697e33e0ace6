//! The published VMA set between the publications of one write section
//! (`crate::vma::windows`' protocol), driven through real system calls.

use std::sync::Arc;

use crate::phys::{PhysConfig, PhysMem};
use crate::vma::{window_of, Vma, WINDOW_SHIFT};

const GIB: u64 = 1 << WINDOW_SHIFT;

fn spans<'a>(it: impl Iterator<Item = &'a Arc<Vma>>) -> Vec<(u64, u64)> {
    it.map(|v| (v.start, v.end)).collect()
}

/// The random sequence below fails with the windows published in the
/// reverse order: the order is what keeps every state between two
/// publications free of holes.
#[test]
#[cfg_attr(
    miri,
    ignore = "400 rounds of system calls across 1 GiB windows: many minutes under Miri; the windows' unsafe code runs under Miri in vma::windows::tests and every address-space test"
)]
fn the_order_matters() {
    crate::sync::broken::windows::PUBLISH_REVERSED.with(|c| c.set(true));
    let res = std::panic::catch_unwind(every_write_section_publishes_the_windows_it_changed);
    crate::sync::broken::windows::PUBLISH_REVERSED.with(|c| c.set(false));
    assert!(res.is_err(), "no hole seen with the order reversed");
}

/// After every call of a random sequence of `mmap`, `munmap`,
/// `mprotect` and `mremap` on ranges across window boundaries (merging,
/// splitting and moving VMAs that cross them), the published set is the
/// writer's: each write section republished every window it changed.
/// And after each window a call publishes, a lookup at every probe (the
/// windows' boundaries and every VMA's, before and after) finds what
/// the set held there before the call or what it holds after, never a
/// hole where both held a VMA (the publication order,
/// `VmaTree::publish_changed`).
#[test]
#[cfg_attr(
    miri,
    ignore = "400 rounds of system calls across 1 GiB windows: many minutes under Miri; the windows' unsafe code runs under Miri in vma::windows::tests and every address-space test"
)]
fn every_write_section_publishes_the_windows_it_changed() {
    use crate::uapi::*;
    use crate::{AddressSpace, MmConfig, PAGE_SIZE};
    let phys = PhysMem::new(PhysConfig::new(256 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
    // Pages around the boundaries of windows 0x100..0x104 (1 GiB each).
    let base = 0x100 * GIB;
    let addr = |next: &mut dyn FnMut(u64) -> u64| base + next(4) * GIB + next(16) * PAGE_SIZE - 8 * PAGE_SIZE;
    let prots = [PROT_READ, PROT_READ | PROT_WRITE, PROT_NONE];
    let (mut ok, mut most, mut crossing, mut steps) = (0, 0, 0, 0);
    for round in 0..400 {
        let a = addr(&mut next);
        let len = match next(3) {
            0 => (1 + next(8)) * PAGE_SIZE,
            1 => GIB + next(8) * PAGE_SIZE,
            _ => 2 * GIB - next(8) * PAGE_SIZE,
        };
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
        let before = mm.read_lock().vmas.clone();
        let mut probes: Vec<u64> = (0x100..0x106).flat_map(|w| [w * GIB - PAGE_SIZE, w * GIB]).collect();
        for v in before.iter() {
            probes.extend([v.start, v.end - PAGE_SIZE, v.end]);
        }
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let (hook_mm, hook_seen, hook_probes) = (mm.clone(), seen.clone(), probes.clone());
        crate::mm::hooks::set_after_window_published(move |_| {
            let guard = crossbeam_epoch::pin();
            let published = hook_mm.vmas_rcu(&guard);
            // The state between two publications itself: the lookup
            // without its recheck, which would wait for this section.
            let find = |p| crate::vma::query::find(published, p).map(|v| (v.start, v.end));
            let found: Vec<_> = hook_probes.iter().map(|&p| find(p)).collect();
            hook_seen.borrow_mut().push(found);
        });
        // Errors are Linux's to decide; only the published set is checked.
        let r = match next(5) {
            0 | 1 => mm.mmap(a, len, prots[next(3) as usize], flags, None, 0).map(|_| ()),
            2 => mm.munmap(a, len),
            3 => mm.mprotect(a, len, prots[next(3) as usize]),
            _ => {
                mm.mremap(a, len, len + PAGE_SIZE * next(3), MREMAP_MAYMOVE | MREMAP_FIXED, addr(&mut next)).map(|_| ())
            }
        };
        crate::mm::hooks::clear_after_window_published();
        ok += u32::from(r.is_ok());
        let st = mm.read_lock();
        for found in seen.borrow().iter() {
            for (&p, &f) in probes.iter().zip(found) {
                let (was, is) = (before.find(p).map(|v| (v.start, v.end)), st.vmas.find(p).map(|v| (v.start, v.end)));
                assert!(f == was || f == is, "round {round}: {f:x?} at {p:#x}, {was:x?} before, {is:x?} after");
            }
        }
        steps += seen.borrow().len();
        most = most.max(st.vmas.len());
        crossing += st.vmas.iter().filter(|v| window_of(v.start) != window_of(v.end - 1)).count();
        let guard = crossbeam_epoch::pin();
        let published = mm.vmas_rcu(&guard);
        assert_eq!(spans(published.iter()), spans(st.vmas.iter()), "round {round}");
        for w in 0x100..0x106 {
            for probe in [w * GIB - PAGE_SIZE, w * GIB, w * GIB + 3 * PAGE_SIZE] {
                let one = |v: Option<&Arc<Vma>>| v.map(|v| (v.start, v.end));
                assert_eq!(one(published.find(probe)), one(st.vmas.find(probe)), "round {round} {probe:#x}");
                assert!(published.find(probe).is_none_or(|v| !v.lock.is_detached()), "a detached VMA published");
            }
        }
    }
    // The sequence did what it is for.
    assert!(
        ok > 200 && most >= 4 && crossing > 100 && steps > 400,
        "{ok} calls succeeded, {most} VMAs at most, {crossing} crossing, {steps} windows published"
    );
}
