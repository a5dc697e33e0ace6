//! The protocol on the real code: a real `Cpu` (its access sections, its
//! fills, its switches) against a real `munmap` or `MADV_DONTNEED`, and
//! ranged requests against a catch-up.

use super::*;

/// The bytes of the page the models' CPUs read before the munmap.
const OLD: u8 = 0xab;
/// The bytes the frame gets once it is reused after the munmap.
const REUSED: u8 = 0xee;

/// An arena and an address space with one private anonymous page mapped at
/// the returned address, its frame (also returned) full of [`OLD`].
fn page_of_old_bytes() -> (Arc<crate::phys::PhysMem>, Arc<crate::mm::AddressSpace>, u64, crate::phys::Pfn) {
    use crate::mm::{AddressSpace, MmConfig};
    use crate::phys::{PhysConfig, PhysMem};
    use crate::uapi::*;
    use crate::{Access, PAGE_SIZE};
    let phys = PhysMem::new(PhysConfig::new(16 * PAGE_SIZE)).unwrap();
    let mm = AddressSpace::new(&phys, MmConfig::model_default()).unwrap();
    let a = mm.mmap(0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.handle_fault(a, Access::Write).unwrap();
    let old = mm.pte_at(a).pfn();
    // SAFETY: the frame is mapped at `a` and nothing else runs.
    unsafe { crate::access::fill_host(phys.frame_ptr(old), OLD, PAGE_SIZE as usize) };
    (phys, mm, a, old)
}

/// The byte at `a` read through a translation held open across a
/// scheduling point (where a real CPU could be preempted inside the
/// access, its entry cached).
fn read_held(cpu: &mut crate::Cpu, a: u64) -> Result<u8, crate::Fault> {
    cpu.translate(a, crate::Access::Read).map(|t| {
        loom::thread::yield_now();
        let mut byte = [0];
        // SAFETY: inside the page, while the translation lives; atomic.
        unsafe { crate::access::copy_from_host(t.as_ptr(), &mut byte) };
        byte[0]
    })
}

/// The protocol on the real code: a `Cpu` with a cached translation holds it
/// open ([`crate::Cpu::translate`], one access section, with a scheduling
/// point inside, where a real CPU could be preempted) while the main thread
/// munmaps the page with the real `munmap` and then reuses the frame. The
/// access must read the old bytes (it finished before the free) and a later
/// access must fault; reading the reused frame's bytes is the bug.
#[test]
fn a_real_cpu_access_against_a_real_munmap() {
    use crate::{Cpu, PAGE_SIZE};
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    // The real munmap takes many loom steps (locks, epoch, frame counts).
    b.max_branches = 100_000;
    b.check(|| {
        let (phys, mm, a, old) = page_of_old_bytes();
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                // A walk fills the TLB (the entry is present: no fault).
                let first = cpu.read_u8(a);
                let held = read_held(&mut cpu, a);
                let after = cpu.read_u8(a);
                (first, held, after)
            })
        };
        mm.munmap(a, PAGE_SIZE).unwrap();
        // Reuse: the frame is free, and its bytes change.
        // SAFETY: arena memory, accessed atomically; no mapping refers to it.
        unsafe { crate::access::fill_host(phys.frame_ptr(old), REUSED, PAGE_SIZE as usize) };
        let (first, held, after) = t.join().unwrap();
        let segv = |r: Result<u8, crate::Fault>| r.is_err_and(|f| f.signal() == libc::SIGSEGV);
        assert!(first == Ok(OLD) || segv(first), "{first:?}");
        assert!(held == Ok(OLD) || segv(held), "an access read a freed, reused frame: {held:?}");
        assert!(after == Ok(OLD) || segv(after), "{after:?}");
        // Once an access faulted, the next ones do too.
        assert!(!segv(first) || segv(held));
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
    });
}

/// A multi-access [`crate::Section`] on the real `Cpu` against the real
/// `munmap` and a reuse of the frame. Inside the section the thread reads
/// the page, is preempted, calls into softmm (a [`QuiescentGuard`], as any
/// syscall or fault of the thread makes: its CPUs are quiescent, so the
/// munmap's flush may skip this one and free the frame), then reads again.
/// Every read must see the old bytes or fault; the reused frame's bytes are
/// the bug. Not publishing the section on entry, or not emptying the TLB of
/// a CPU whose section stayed open when its thread leaves softmm
/// (`QuiescentGuard`'s drop), fails this model.
#[test]
fn a_real_section_against_a_real_munmap() {
    use crate::{Cpu, PAGE_SIZE};
    let mut b = crate::sync::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b.check(|| {
        let (phys, mm, a, old) = page_of_old_bytes();
        let t = {
            let mm = mm.clone();
            crate::sync::model::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                let mut s = cpu.section();
                // A walk fills the TLB (the entry is present: no fault).
                let first = s.read_u8(a);
                loom::thread::yield_now();
                let held = s.read_u8(a);
                // A call into softmm from inside the section.
                drop(QuiescentGuard::enter());
                let after_call = s.read_u8(a);
                drop(s);
                (first, held, after_call)
            })
        };
        mm.munmap(a, PAGE_SIZE).unwrap();
        // SAFETY: arena memory, accessed atomically; no mapping refers to it.
        unsafe { crate::access::fill_host(phys.frame_ptr(old), REUSED, PAGE_SIZE as usize) };
        let (first, held, after_call) = t.join().unwrap();
        let segv = |r: Result<u8, crate::Fault>| r.is_err_and(|f| f.signal() == libc::SIGSEGV);
        assert!(first == Ok(OLD) || segv(first), "{first:?}");
        assert!(held == Ok(OLD) || segv(held), "a section read a freed, reused frame: {held:?}");
        assert!(after_call == Ok(OLD) || segv(after_call), "a section read a freed, reused frame: {after_call:?}");
        assert!(!segv(first) || segv(held));
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
    });
}

/// Three shootdowns in a row, the last one unmapping: the second one's
/// mark may land after an entry (taking the first one's mark) has already
/// seen its request, a stale mark; the third one's request may then come
/// while the next entry takes that mark. The entry's catch-up
/// (`CpuTlbState::catch_up`) takes the mark before it loads the requests,
/// so the third request is either seen or left marked for the entry after;
/// loading them first loses it with the mark, keeps the cached translation
/// and reads the freed frame (this model fails so, with four preemptions;
/// three are not enough).
#[test]
fn a_request_sent_while_the_cpu_takes_a_stale_mark_is_not_lost() {
    three_accesses_against_an_unmap(2, 4);
}

/// Fill owners on the real code (`targets.rs`): a `Cpu` on another thread
/// reads a page twice, its first read filling the TLB (the walk records
/// the CPU in the entry with its compare-exchange), while the main thread
/// drops the page with the real `MADV_DONTNEED`, whose shootdown asks only
/// the CPUs the zap's swap returned, then reuses the frame. Each read must
/// see the old bytes or, once the page is gone, the zero page; the reused
/// frame's bytes are the bug. Either the fill's compare-exchange comes
/// first, and the swap returns the CPU (which the flush then asks), or the
/// swap does, and the fill fails and walks again to an empty entry.
///
/// Returns what went wrong in one execution, if anything (a panic inside a
/// loom execution aborts the process while loom objects unwind, so the
/// broken variants report rather than panic).
fn a_real_fill_against_a_real_dontneed() -> Result<(), String> {
    let page = DroppedPage::new(
        crate::mm::MmConfig::model_default().shootdown_targets(crate::tlb::ShootdownTargets::FillOwners),
    );
    let t = {
        let page = page.clone();
        crate::sync::model::spawn(move || {
            let mut cpu = crate::Cpu::attached(&page.mm);
            let (first, stale1) = page.read(&mut cpu);
            let (second, stale2) = page.read(&mut cpu);
            (first, second, stale1 || stale2)
        })
    };
    page.drop_and_reuse();
    let (first, second, stale) = t.join().unwrap();
    page.verdict(first, second, stale)?;
    // Once the page read as dropped, it stays so.
    assert!(first != Ok(0) || second == Ok(0));
    Ok(())
}

/// The page the fill-owner models drop: one written page of an address
/// space, its frame filled with [`DroppedPage::OLD`], which the main
/// thread drops with the real `MADV_DONTNEED` and reuses.
#[derive(Clone)]
struct DroppedPage {
    phys: Arc<crate::phys::PhysMem>,
    mm: Arc<crate::mm::AddressSpace>,
    a: u64,
    /// The old frame's host address.
    old_ptr: usize,
    /// Set once the zap's flush has returned: from then on no CPU may hold
    /// a translation to the old frame. A loom atomic, so that the model
    /// sees the reader's check conflict with it (the bytes of guest memory
    /// are plain atomics that loom does not track).
    freed: Arc<AtomicBool>,
}

impl DroppedPage {
    fn new(config: crate::mm::MmConfig) -> DroppedPage {
        use crate::uapi::*;
        let phys = crate::phys::PhysMem::new(crate::phys::PhysConfig::new(16 * crate::PAGE_SIZE)).unwrap();
        let mm = crate::mm::AddressSpace::new(&phys, config).unwrap();
        let a = mm.mmap(0, crate::PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        mm.handle_fault(a, crate::Access::Write).unwrap();
        let old_ptr = phys.frame_ptr(mm.pte_at(a).pfn());
        // SAFETY: the frame is mapped at `a` and nothing else runs.
        unsafe { crate::access::fill_host(old_ptr, OLD, crate::PAGE_SIZE as usize) };
        DroppedPage { phys, mm, a, old_ptr: old_ptr as usize, freed: Arc::new(AtomicBool::new(false)) }
    }

    /// One access of the page through `cpu` (a held translation): the byte
    /// it reads, and whether it translated to the old frame after the free.
    fn read(&self, cpu: &mut crate::Cpu) -> (Result<u8, crate::Fault>, bool) {
        match cpu.translate(self.a, crate::Access::Read) {
            Ok(t) => {
                let page = t.as_ptr() as usize & !(crate::PAGE_SIZE as usize - 1);
                let stale = page == self.old_ptr && self.freed.load(Ordering::Acquire);
                let mut byte = [0];
                // SAFETY: inside the page, while the guard lives and the
                // thread makes no call into softmm; atomic.
                unsafe { crate::access::copy_from_host(t.as_ptr(), &mut byte) };
                (Ok(byte[0]), stale)
            }
            Err(f) => (Err(f), false),
        }
    }

    /// The main thread's side: `MADV_DONTNEED` of the page, then the frame
    /// reused (its bytes change).
    fn drop_and_reuse(&self) {
        self.mm.madvise(self.a, crate::PAGE_SIZE, crate::uapi::MADV_DONTNEED).unwrap();
        self.freed.store(true, Ordering::Release);
        // SAFETY: arena memory, accessed atomically; no mapping refers to it.
        unsafe { crate::access::fill_host(self.old_ptr as *mut u8, REUSED, crate::PAGE_SIZE as usize) };
    }

    /// Each read saw the old bytes or the zero page, never the reused
    /// frame's, and none went through a stale entry. Consumes the page and
    /// checks that its frames are all free.
    fn verdict(
        self,
        first: Result<u8, crate::Fault>,
        second: Result<u8, crate::Fault>,
        stale: bool,
    ) -> Result<(), String> {
        let DroppedPage { phys, mm, .. } = self;
        drop(mm);
        assert_eq!(phys.stats().frames_used, 0);
        let ok = |r: Result<u8, crate::Fault>| r == Ok(OLD) || r == Ok(0);
        if stale || !ok(first) || !ok(second) {
            return Err(format!("a read through a stale entry of a freed frame: {first:?}, {second:?}, {stale}"));
        }
        Ok(())
    }
}

/// Posting against a detach, on the real code: a `Cpu` on another thread
/// reads a page of `mm` (its walk records it as the entry's fill owner),
/// switches to another address space and back (`Cpu::attach`: out of the
/// attached list and in again) and reads the page again, while the main
/// thread drops the page with the real `MADV_DONTNEED` under `posting` and
/// reuses the frame. The shootdown asks the CPU only if it finds it in the
/// list it loads; a CPU out of the list holds no entry (a switch empties
/// the TLB), and one back in took its request count on attach, after any
/// request posted to it, so that entry must be gone. Each read sees the old
/// bytes or the zero page; the reused frame's bytes are the bug, which
/// `broken::SWITCH_KEEPS_TLB` (a switch that keeps the TLB) shows.
fn a_real_cpu_switching_against_a_real_dontneed(posting: PostingPolicy) -> Result<(), String> {
    let config = crate::mm::MmConfig::model_default().posting_policy(posting);
    let page = DroppedPage::new(config.clone());
    let other = crate::mm::AddressSpace::new(&page.phys, config).unwrap();
    let t = {
        let (page, other) = (page.clone(), other.clone());
        crate::sync::model::spawn(move || {
            let mut cpu = crate::Cpu::attached(&page.mm);
            let (first, stale1) = page.read(&mut cpu);
            cpu.attach(&other);
            cpu.attach(&page.mm);
            let (second, stale2) = page.read(&mut cpu);
            (first, second, stale1 || stale2)
        })
    };
    page.drop_and_reuse();
    let (first, second, stale) = t.join().unwrap();
    drop(other);
    page.verdict(first, second, stale).map_err(|e| format!("{posting:?}: {e}"))
}

/// The model under the lock-free list and under the default (adaptive)
/// posting, and its variant where a switch keeps the TLB
/// (`broken::SWITCH_KEEPS_TLB`).
#[test]
fn a_cpu_that_left_the_list_holds_no_entry_a_shootdown_skipped() {
    crate::sync::broken::check_model(
        || a_real_cpu_switching_against_a_real_dontneed(PostingPolicy::LockFree),
        &crate::tlb::broken::SWITCH_KEEPS_TLB,
    );
    crate::sync::broken::check_model(
        || a_real_cpu_switching_against_a_real_dontneed(PostingPolicy::Adaptive),
        &crate::tlb::broken::SWITCH_KEEPS_TLB,
    );
}

/// The model, and its variant where the zap collects no owner
/// (`broken::CLEAR_SKIPS_OWNERS`): its flush asks no CPU, and the reader
/// keeps using its cached translation of the freed frame.
#[test]
fn a_fill_racing_a_clear_is_seen_by_the_clear_or_sees_the_cleared_entry() {
    crate::sync::broken::check_model(a_real_fill_against_a_real_dontneed, &crate::tlb::broken::CLEAR_SKIPS_OWNERS);
}

/// The model, and its variant where the fill stores the entry instead of a
/// compare-exchange (`broken::FILL_STORES`): a store after the zap's clear
/// maps the freed frame again.
#[test]
fn a_fill_that_stores_without_a_compare_exchange_is_caught() {
    crate::sync::broken::check_model(a_real_fill_against_a_real_dontneed, &crate::tlb::broken::FILL_STORES);
}

/// Ranged requests on the real `CpuTlbState` and `TlbDomain` (one range
/// slot under loom): the CPU caches page `A` and makes two accesses to it,
/// each entry catching up on whatever was requested (the fence form, where
/// every entry looks); the initiator asks it to drop page `B`, then unmaps
/// `A`, asks it to drop `A`, waits and frees `A`. No access may hit `A`
/// once it is freed. A catch-up that loads the second request's number
/// before its initiator stored its range finds the first request's range in
/// the slot: the tag tells them apart, and the CPU drops everything. With
/// `broken::RANGE_WITHOUT_TAG` it drops `B` only, acknowledges, and keeps
/// `A` past the free.
fn ranged_requests_against_a_catch_up() -> Result<(), String> {
    use crate::tlb::{CpuSet, FlushRange};
    use crate::{Access, PAGE_SIZE};
    const A: u64 = 0x10_0000;
    const B: u64 = 0x20_0000;
    let dom = Arc::new(TlbDomain::new());
    let state = CpuTlbState::new();
    let mut seen = dom.attach(&state);
    let mut frame = [0u8; 8];
    state.tlb.fill(A, frame.as_mut_ptr(), Access::Read.bit());
    let freed = Arc::new(AtomicBool::new(false));
    let t = {
        let (state, freed) = (state.clone(), freed.clone());
        crate::sync::model::spawn(move || {
            let mut stale = false;
            for _ in 0..2 {
                state.section_begin(false);
                state.catch_up(&mut seen, true);
                stale |= state.tlb.hit(A, Access::Read).is_some() && freed.load(Ordering::Acquire);
                state.section_end();
            }
            stale
        })
    };
    let mut targets = CpuSet::EMPTY;
    targets.insert(state.slot().expect("a slot"));
    dom.flush_begin_targets(&[], &targets, FlushRange::new(B, B + PAGE_SIZE)).wait();
    dom.flush_begin_targets(&[], &targets, FlushRange::new(A, A + PAGE_SIZE)).wait();
    freed.store(true, Ordering::Release);
    let stale = t.join().unwrap();
    dom.detach(&state);
    if stale {
        return Err("an access hit a page dropped by a ranged request after its free".into());
    }
    Ok(())
}

/// The model above, and its variant that trusts a range slot without its
/// tag (`broken::RANGE_WITHOUT_TAG`).
#[test]
fn a_ranged_request_is_never_mistaken_for_an_older_one() {
    crate::sync::broken::check_model(ranged_requests_against_a_catch_up, &crate::tlb::broken::RANGE_WITHOUT_TAG);
}

/// A callback that softmm runs inside a call of its thread (a device's, a
/// host memory release) accesses memory through a CPU of that thread,
/// which the call marked quiescent ([`QuiescentGuard`]): the real `Cpu`
/// holds a translation open, preempted inside, while the main thread
/// munmaps the page with the real `munmap` and reuses the frame. The
/// section lifts the quiescence (`CpuTlbState::lift_quiescence`), so the
/// munmap's flush waits for it or the section sees the request; reading
/// the reused frame's bytes is the bug.
fn a_real_callback_access_against_a_real_munmap() -> Result<(), String> {
    use crate::{Cpu, PAGE_SIZE};
    let (phys, mm, a, old) = page_of_old_bytes();
    let t = {
        let mm = mm.clone();
        crate::sync::model::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            // A walk fills the TLB (the entry is present: no fault).
            let first = cpu.read_u8(a);
            // The call that runs the callback.
            let call = QuiescentGuard::enter();
            let held = read_held(&mut cpu, a);
            drop(call);
            (first, held)
        })
    };
    mm.munmap(a, PAGE_SIZE).unwrap();
    // SAFETY: arena memory, accessed atomically; no mapping refers to it.
    unsafe { crate::access::fill_host(phys.frame_ptr(old), REUSED, PAGE_SIZE as usize) };
    let (first, held) = t.join().unwrap();
    let segv = |r: Result<u8, crate::Fault>| r.is_err_and(|f| f.signal() == libc::SIGSEGV);
    if !(first == Ok(OLD) || segv(first)) {
        return Err(format!("{first:?}"));
    }
    if !(held == Ok(OLD) || segv(held)) {
        return Err(format!("a callback's access read a freed, reused frame: {held:?}"));
    }
    drop(mm);
    assert_eq!(phys.stats().frames_used, 0);
    Ok(())
}

/// The model above, and its variant whose section keeps the quiescence
/// (`broken::SECTION_KEEPS_QUIESCENCE`).
#[test]
fn a_callbacks_access_through_a_quiescent_cpu_is_waited_for() {
    crate::sync::broken::check_model(
        a_real_callback_access_against_a_real_munmap,
        &crate::tlb::broken::SECTION_KEEPS_QUIESCENCE,
    );
}
