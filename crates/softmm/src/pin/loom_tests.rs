//! loom models of gup-fast on the real code: the real `gup_fast` pinning on
//! one thread against a real `munmap` (followed by a new mapping that reuses
//! the freed frame) and against a real `fork` on another, on a tiny address
//! space. The pin either sees the page before the unmap or write-protect
//! and holds it, or falls back to the slow path (returns the start address).
//!
//! Run with `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test --release
//! -p softmm --lib` (scripts/test.sh).

use std::sync::Arc;

use crate::fault::Access;
use crate::mm::{AddressSpace, MmConfig};
use crate::pgtable::Pte;
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::PAGE_SIZE;

use super::{fast, Request, Taken};

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b
}

/// A one-page private anonymous mapping whose page holds `0x55`, pinned
/// before (so `MMF_HAS_PINNED` is set and fork looks at pin counts).
fn setup() -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    write(&phys, mm.pte_at(a).pfn(), 0x55);
    mm.pins.set_has_pinned();
    (phys, mm, a)
}

fn write(phys: &PhysMem, pfn: crate::phys::Pfn, v: u8) {
    phys.write(pfn, 0, &[v]);
}

fn read(phys: &PhysMem, pfn: crate::phys::Pfn) -> u8 {
    let mut b = [0u8];
    phys.read(pfn, 0, &mut b);
    b[0]
}

/// gup-fast (a write pin of the page) on another thread; returns the frame
/// it pinned, if it did not fall back.
fn spawn_gup_fast(mm: &Arc<AddressSpace>, a: u64) -> loom::thread::JoinHandle<Option<crate::phys::Pfn>> {
    let mm = mm.clone();
    crate::sync::model::spawn(move || {
        let req = Request { start: a, end: a + PAGE_SIZE, write: true, longterm: true, pin: true };
        let mut out = Taken::new(&mm.phys, true, 1);
        let next = fast::gup_fast(&mm, &req, a, a + PAGE_SIZE, &mut out);
        assert_eq!(next == a + PAGE_SIZE, out.pfns.len() == 1);
        let (pfns, _, _) = out.into_pfns();
        pfns.first().copied()
    })
}

/// munmap, then a new mapping elsewhere whose write fault reuses the freed
/// frame (the thread cache hands it back first): a pin that holds a frame
/// must hold the original page, with its data, alive after the unmap; a
/// try-get without the re-check of the entry would pin the reused frame of
/// the new mapping. (At the same address the pin of the new page would be
/// right: it was mapped there when the re-check saw it.)
#[test]
fn gup_fast_vs_munmap() {
    builder().check(|| {
        let (phys, mm, a) = setup();
        let t = spawn_gup_fast(&mm, a);
        mm.munmap(a, PAGE_SIZE).unwrap();
        let b = a + 16 * PAGE_SIZE;
        mm.mmap(b, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0).unwrap();
        mm.handle_fault(b, Access::Write).unwrap();
        write(&phys, mm.pte_at(b).pfn(), 0x77);
        let pinned = t.join().unwrap();
        assert_eq!(mm.pte_at(a), Pte::NONE, "munmap left an entry");
        if let Some(pfn) = pinned {
            let d = phys.desc(pfn);
            assert_ne!(
                pfn,
                mm.pte_at(b).pfn(),
                "the pin holds the new mapping's frame: ref {} pin {} used {} a {:?} b {:?}",
                d.refcount.load(crate::sync::Ordering::Relaxed),
                d.pincount.load(crate::sync::Ordering::Relaxed),
                phys.stats().frames_used,
                mm.pte_at(a),
                mm.pte_at(b)
            );
            assert_eq!(read(&phys, pfn), 0x55, "the pinned frame lost the unmapped page's data");
            assert_eq!(phys.stats().frames_used, 2, "the pinned frame was freed");
            super::release(&phys, pfn, true);
        }
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0, "a frame outlived its mapping and pin");
    });
}

/// fork against gup-fast: a page pinned when fork returns must be the
/// parent's, mapped writable, and not the child's (fork copies it); a pin
/// that fork's write-protect overtook must have fallen back. Without the
/// `write_protect_seq` check, fork could read the pin count before the pin
/// and share the page that the pin then holds.
#[test]
fn gup_fast_vs_fork() {
    builder().check(|| {
        let (phys, mm, a) = setup();
        let t = spawn_gup_fast(&mm, a);
        let child = mm.fork().unwrap();
        let pinned = t.join().unwrap();
        if let Some(pfn) = pinned {
            let (p, c) = (mm.pte_at(a), child.pte_at(a));
            assert_eq!(p.pfn(), pfn, "the parent no longer maps its pinned page");
            assert!(p.has(Pte::WRITE), "the parent's pinned page was write-protected: its next write COWs away");
            assert_ne!(c.pfn(), pfn, "fork shared a pinned page with the child");
            super::release(&phys, pfn, true);
        }
        drop(child);
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
    });
}
