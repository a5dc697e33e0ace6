//! loom models of the unmap policies that differ from holding `mmap_lock`
//! for write throughout (`sys/munmap.rs`): `downgrade` (zap under the read
//! lock) and `lock-free` (zap under a reservation, no `mmap_lock`), each on
//! the real [`AddressSpace::munmap`] against a concurrent fault in the range
//! and against a concurrent `mmap(MAP_FIXED)` of part of it, on a two-page
//! address space (under loom every span is zapped lock-free, however small),
//! and the lock-free unmap's one shootdown before its zap against a real
//! `Cpu` reading the range (a gather holds one frame under loom, so the two
//! pages are freed in two gathers, the second without a shootdown).
//!
//! Run with the loom line of scripts/test.sh. Page tables, PTE locks,
//! `mmap_lock` (with loom's downgrade, `sync/loom_lock.rs`), the
//! reservation's lock, frame counts, the shootdown and crossbeam-epoch are
//! loom's, so every interleaving up to the preemption bound is explored.

use std::sync::Arc;

use crate::error::Fault;
use crate::fault::Access;
use crate::mm::{AddressSpace, FaultPolicy, MmConfig, UnmapPolicy};
use crate::phys::{PhysConfig, PhysMem};
use crate::uapi::*;
use crate::PAGE_SIZE;

const UNMAP: [UnmapPolicy; 2] = [UnmapPolicy::Downgrade, UnmapPolicy::LockFree];
/// A fault that takes `mmap_lock` for read (and so runs during a downgraded
/// zap) and the default lock-free one.
const FAULT: [FaultPolicy; 2] = [FaultPolicy::MmapLock, FaultPolicy::PerVmaSeq];

fn builder() -> crate::sync::model::Builder {
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b
}

/// What the old frame holds, byte by byte.
const OLD: u8 = 0xab;

/// The first byte of the frame `pfn`.
fn first_byte(phys: &PhysMem, pfn: crate::phys::Pfn) -> u8 {
    let mut b = [0u8];
    phys.read(pfn, 0, &mut b);
    b[0]
}

/// Two pages: the first maps the zero page (read), the second a frame
/// filled with [`OLD`]; returns the frame's number too.
fn setup(unmap: UnmapPolicy, fault: FaultPolicy) -> (Arc<PhysMem>, Arc<AddressSpace>, u64, crate::phys::Pfn) {
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default().policy(fault).unmap_policy(unmap)).unwrap();
    let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a + PAGE_SIZE, Access::Write).unwrap();
    mm.handle_fault(a, Access::Read).unwrap();
    let old = mm.pte_at(a + PAGE_SIZE).pfn();
    phys.fill(old, 0, OLD, PAGE_SIZE as usize);
    (phys, mm, a, old)
}

fn each(body: impl Fn(UnmapPolicy, FaultPolicy) + Send + Sync + Clone + 'static) {
    for unmap in UNMAP {
        for fault in FAULT {
            let body = body.clone();
            builder().check(move || body(unmap, fault));
        }
    }
}

/// munmap against a write fault in the range: once munmap has returned and
/// the fault joined, the range has no entry and no frame is left (a fault
/// that committed behind the zap would leave both), and the fault either
/// came first (it succeeded) or got `SIGSEGV` — never a page in a range
/// whose VMA was gone.
#[test]
fn fault_vs_policy_munmap() {
    each(|unmap, fault| {
        let (phys, mm, a, _) = setup(unmap, fault);
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let _q = crate::tlb::QuiescentGuard::enter();
                mm.handle_fault(a, Access::Write)
            })
        };
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        let r: Result<(), Fault> = t.join().unwrap();
        assert!(r.is_ok() || r.is_err_and(|f| f.signal() == libc::SIGSEGV), "{unmap:?}/{fault:?}: {r:?}");
        for page in [a, a + PAGE_SIZE] {
            assert!(mm.pte_at(page).is_none(), "{unmap:?}/{fault:?}: an entry survived munmap at {page:#x}");
        }
        assert_eq!(phys.stats().frames_used, 0, "{unmap:?}/{fault:?}: a frame outlived its mapping");
    });
}

/// munmap against `mmap(MAP_FIXED)` of its second page and a write fault
/// there: if the new mapping outlived the munmap (it came second), its page
/// is a new, zeroed frame (never the old one, a stale entry the zap had not
/// reached yet: the frame number may repeat, as a freed frame is reused,
/// but not the contents) and it is the only frame left; otherwise nothing
/// is left.
#[test]
fn fixed_mmap_vs_policy_munmap() {
    each(|unmap, fault| {
        let (phys, mm, a, old) = setup(unmap, fault);
        let b = a + PAGE_SIZE;
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let _q = crate::tlb::QuiescentGuard::enter();
                let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
                assert_eq!(mm.mmap(b, PAGE_SIZE, PROT_READ | PROT_WRITE, flags, None, 0), Ok(b));
                mm.handle_fault(b, Access::Write)
            })
        };
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        let r = t.join().unwrap();
        assert!(mm.pte_at(a).is_none(), "{unmap:?}/{fault:?}: an entry survived munmap");
        let survived = mm.stats().map_count == 1;
        let pte = mm.pte_at(b);
        if survived && r.is_ok() {
            assert!(pte.has_frame(), "{unmap:?}/{fault:?}: the new mapping has {pte:?}");
            assert_eq!(
                first_byte(&phys, pte.pfn()),
                0,
                "{unmap:?}/{fault:?}: old data (frame {old}) in the new mapping"
            );
            assert_eq!(phys.stats().frames_used, 1, "{unmap:?}/{fault:?}");
        } else {
            assert!(!pte.has_frame(), "{unmap:?}/{fault:?}: {pte:?} left after {r:?}");
            assert_eq!(phys.stats().frames_used, 0, "{unmap:?}/{fault:?}");
        }
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        assert_eq!(phys.stats().frames_used, 0);
    });
}

/// The lock-free unmap's one shootdown (`tlb/unreachable.rs`), on the
/// real `Cpu` and the real `munmap`: a CPU reads the second page twice
/// while the main thread unmaps both pages (two gathers, the second freed
/// with no shootdown of its own) and then reuses both frames. Each read
/// gets the old bytes or `SIGSEGV`, once `SIGSEGV` always `SIGSEGV`, and
/// never the reused frames' bytes: with TLB fills allowed in the range
/// after the shootdown, the CPU caches the second page before its zap and
/// its next read hits the freed frame.
#[test]
fn a_real_cpu_against_the_one_shootdown_of_a_lock_free_munmap() {
    const REUSED: u8 = 0xee;
    builder().check(|| {
        let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
        let config = MmConfig::model_default().policy(FaultPolicy::PerVmaSeq).unmap_policy(UnmapPolicy::LockFree);
        let mm = AddressSpace::new(&phys, config).unwrap();
        let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        let b = a + PAGE_SIZE;
        let mut frames = Vec::new();
        for page in [a, b] {
            mm.handle_fault(page, Access::Write).unwrap();
            let pfn = mm.pte_at(page).pfn();
            phys.fill(pfn, 0, OLD, PAGE_SIZE as usize);
            frames.push(pfn);
        }
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let mut cpu = crate::Cpu::attached(&mm);
                let first = cpu.read_u8(b);
                let second = cpu.read_u8(b);
                (first, second)
            })
        };
        mm.munmap(a, 2 * PAGE_SIZE).unwrap();
        assert_eq!(phys.stats().frames_used, 0);
        for &pfn in &frames {
            phys.fill(pfn, 0, REUSED, PAGE_SIZE as usize);
        }
        let (first, second) = t.join().unwrap();
        let segv = |r: Result<u8, Fault>| r.is_err_and(|f| f.signal() == libc::SIGSEGV);
        assert!(first == Ok(OLD) || segv(first), "{first:?}");
        assert!(second == Ok(OLD) || segv(second), "a read of a freed, reused frame: {second:?}");
        assert!(!segv(first) || segv(second), "{first:?} then {second:?}");
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
    });
}
