//! A CPU: one per thread, attached to one address space at a time, owning a
//! software TLB through which every guest access goes.
//!
//! Every access runs in an access section (see [`crate::tlb`]): a store to
//! a line only this thread writes, a compiler barrier and a check of the
//! mark of pending flush requests (one load of the same line, which only
//! shootdowns write besides) on entry, a store on exit. Each accessor of the `Cpu` is
//! a section of its own; a [`Section`] holds one open across many accesses (an emulator's
//! basic block), each of which then costs the TLB lookup alone. Outside a
//! section the CPU is quiescent: no shootdown waits for it, whatever its
//! thread does. A TLB hit is an index, one compare (tag, permission and,
//! for a scalar, alignment at once) and an add. A miss walks the page
//! table without locks and fills the entry, setting the accessed and dirty
//! bits as hardware does; a walk that finds no usable entry leaves the
//! section and raises a page fault.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::error::{Fault, SegvCode};
use crate::fault::{Access, FaultStats};
use crate::mm::AddressSpace;
use crate::pgtable::Pte;
use crate::phys::FrameRef;
use crate::tlb::{CpuTlbState, EntryBarrier, QuiescentGuard, ShootdownTargets};
use crate::watch::StoreCheck;
use crate::PAGE_SIZE;

mod accessors;
mod host_mem;
mod mmio;
mod scalar;
mod section;
mod split_atomic;

pub use scalar::Scalar;
pub use section::{Section, TlbAbi};

/// Per-CPU counters (never written by another thread). More counters may
/// come: read the fields, never build one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CpuStats {
    /// Page faults raised by this CPU's accesses, by outcome and policy path.
    pub fault: FaultStats,
    /// TLB misses (page-table walks).
    pub tlb_misses: u64,
    /// TLB flushes done on a shootdown: of the whole TLB, or of the pages
    /// the requests named (`ShootdownTargets::FillOwnersRanges`).
    pub tlb_flushes: u64,
}

/// A virtual CPU with a software TLB. Not `Send`: a CPU belongs to the thread
/// that made it, like a hardware thread's TLB.
///
/// Make one per host thread that accesses guest memory (a thread may hold
/// several, e.g. one per vCPU it switches between). Between accesses the
/// thread may block anywhere (a join, a lock, a channel, host I/O) with the
/// CPU attached: a `munmap`, `mprotect`, `mremap`, `madvise`, `fork` or COW
/// break on another thread waits only for CPUs that are inside an access
/// (a single accessor call, a [`Cpu::with_slice`] callback, a held
/// [`Translation`]), and this CPU drops what was shot down at the start of
/// its next access (see "Threads and CPUs" in `docs/architecture.md`).
///
/// ```
/// use softmm::{uapi::*, AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, SegvCode};
/// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
/// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
/// let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
/// let mut cpu = Cpu::attached(&mm);
/// cpu.write_u16(a, 0xbeef).unwrap();
/// assert_eq!(cpu.read_u8(a + 1).unwrap(), 0xbe);
/// assert_eq!(cpu.read_be::<u16>(a).unwrap(), 0xefbe);
/// // Not executable: a fetch faults as on x86-64 with NX.
/// assert_eq!(cpu.fetch_u32(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
/// // Blocking elsewhere (here a join) needs nothing: the CPU is outside an access.
/// std::thread::scope(|s| s.spawn(|| mm.munmap(a, 4096).unwrap()).join().unwrap());
/// assert_eq!(cpu.read_u8(a), Err(Fault::Segv { addr: a, code: SegvCode::MapErr }));
/// ```
pub struct Cpu {
    mm: Option<Arc<AddressSpace>>,
    state: Arc<CpuTlbState>,
    /// The flush requests (`CpuTlbState::flush_requests`) the TLB is
    /// current for.
    seen_req: u64,
    /// The section barrier: a compiler barrier alone where the process has
    /// `membarrier` (`tlb::reader_is_light`), else a fence; switched by the
    /// request rate under `PostingPolicy::Adaptive` (`tlb/fence_mode.rs`).
    barrier: EntryBarrier,
    parked: bool,
    stats: CpuStats,
    /// The last fault an access of this CPU returned ([`Cpu::last_fault`]).
    last_fault: Option<FaultInfo>,
    /// The next access that hits a watchpoint is made ([`Cpu::pass_watchpoint`]).
    pass_watchpoint: bool,
    /// The last anonymous VMA this CPU faulted in, of `mm`
    /// ([`crate::fault::VmaHint`]; cleared when the CPU leaves `mm`).
    vma_hint: crate::fault::VmaHint,
    _not_send: PhantomData<*const ()>,
}

impl Default for Cpu {
    fn default() -> Self {
        Self::new()
    }
}

impl Cpu {
    /// A CPU attached to nothing.
    pub fn new() -> Cpu {
        let state = CpuTlbState::new();
        crate::tlb::register_thread_cpu(&state);
        // Without the light barrier, the mark keeps a bit so that every
        // entry takes the slow path, which fences.
        let barrier = EntryBarrier::new(&state, crate::tlb::reader_is_light());
        Cpu {
            mm: None,
            state,
            seen_req: 0,
            barrier,
            parked: false,
            stats: CpuStats::default(),
            last_fault: None,
            vma_hint: Default::default(),
            pass_watchpoint: false,
            _not_send: PhantomData,
        }
    }

    /// A CPU attached to `mm`.
    pub fn attached(mm: &Arc<AddressSpace>) -> Cpu {
        let mut cpu = Cpu::new();
        cpu.attach(mm);
        cpu
    }

    /// Switches to `mm` (like loading CR3): the TLB starts empty.
    pub fn attach(&mut self, mm: &Arc<AddressSpace>) {
        // Every CPU of this thread is quiescent while it attaches: the
        // thread may block on the domain's CPU-list lock (a flush reads the
        // list under it), and meanwhile a shootdown must not wait for
        // another CPU of this very thread (an emulator switching vCPUs),
        // which cannot acknowledge until the thread returns.
        let _q = QuiescentGuard::enter();
        self.detach_locked();
        // Before the requests are read: a request in the mark it takes is
        // in the count, and the TLB is emptied below.
        let adaptive = mm.config.posting_policy == crate::tlb::PostingPolicy::Adaptive;
        self.barrier.reset(&self.state, adaptive, crate::tlb::TUNING);
        let seen = mm.tlb.attach(&self.state);
        self.empty_tlb();
        self.seen_req = seen;
        self.mm = Some(mm.clone());
    }

    /// Leaves the current address space, if any.
    pub fn detach(&mut self) {
        let _q = QuiescentGuard::enter();
        self.detach_locked();
    }

    /// [`Cpu::detach`] with the thread's CPUs already quiescent.
    fn detach_locked(&mut self) {
        if let Some(mm) = self.mm.take() {
            mm.tlb.detach(&self.state);
        }
        self.vma_hint.clear();
        self.empty_tlb();
        // Out of the domain with an empty TLB: a shootdown still waiting
        // for this CPU's next access stops waiting.
        self.state.passed_quiescent_point();
    }

    /// The attached address space.
    pub fn mm(&self) -> Option<&Arc<AddressSpace>> {
        self.mm.as_ref()
    }

    /// Parks the CPU until [`Cpu::resume`]. Never required: a CPU outside
    /// an access is already skipped by shootdowns. Parking only marks it
    /// quiescent as a whole (what a thread inside softmm does), and makes an
    /// access before `resume` a bug (a debug assertion). Idempotent.
    pub fn park(&mut self) {
        if !self.parked {
            self.parked = true;
            self.state.enter_quiescent();
        }
    }

    /// Resumes a parked CPU; its next access flushes whatever was shot down.
    /// Idempotent.
    pub fn resume(&mut self) {
        if self.parked {
            self.parked = false;
            self.state.exit_quiescent();
        }
    }

    /// This CPU's counters.
    pub fn stats(&self) -> CpuStats {
        self.stats
    }

    /// What the last access of this CPU that faulted was: its kind, its
    /// first byte and its size, beside the [`Fault`] it returned (x86's
    /// page-fault error code and CR2, which stay in the CPU until the next
    /// fault). Kept until another access of this CPU (or of one of its
    /// [`Section`]s) faults; `None` before the first fault.
    ///
    /// ```
    /// # use softmm::{Access, AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, SegvCode, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// let f = cpu.write_u32(a + 8, 1).unwrap_err();
    /// let info = cpu.last_fault().unwrap();
    /// assert_eq!((info.fault, info.access, info.addr, info.size), (f, Access::Write, a + 8, 4));
    /// ```
    pub fn last_fault(&self) -> Option<FaultInfo> {
        self.last_fault
    }

    /// Lets the next access of this CPU that hits a watchpoint
    /// ([`AddressSpace::watchpoint_insert`]) be made, once: how an embedder
    /// resumes the instruction that reported [`Fault::Watchpoint`] without
    /// removing the watchpoint (x86's resume flag does this for
    /// instruction breakpoints). Accesses that hit none leave it set.
    ///
    /// ```
    /// # use softmm::{AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, WatchAccess, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// mm.watchpoint_insert(a + 6, 2, WatchAccess::WRITE).unwrap();
    /// cpu.write_u32(a, 1).unwrap(); // bytes 0..4: not watched
    /// assert_eq!(cpu.write_u64(a, 2), Err(Fault::Watchpoint { addr: a }));
    /// assert_eq!(cpu.read_u64(a), Ok(1)); // not made; reads are not watched
    /// cpu.pass_watchpoint();
    /// cpu.write_u64(a, 2).unwrap();
    /// assert_eq!(cpu.write_u8(a + 7, 3), Err(Fault::Watchpoint { addr: a + 7 }));
    /// ```
    pub fn pass_watchpoint(&mut self) {
        self.pass_watchpoint = true;
    }

    /// Records `fault` as that of the `size`-byte `access` at `addr`, and
    /// returns it. Called by every accessor's fault path (never on a hit),
    /// the outermost last: a scalar across a page records its own extent,
    /// not its copy's.
    #[cold]
    fn note_fault(&mut self, fault: Fault, access: Access, addr: u64, size: usize) -> Fault {
        self.last_fault = Some(FaultInfo { fault, access, addr, size });
        fault
    }

    /// `r`, with an error recorded as a fault of the `size`-byte access at
    /// `addr` ([`Cpu::note_fault`]).
    #[inline(always)]
    fn sized<T>(&mut self, r: Result<T, Fault>, access: Access, addr: u64, size: usize) -> Result<T, Fault> {
        r.map_err(|f| self.note_fault(f, access, addr, size))
    }

    /// Translates `va` for `access`, faulting the page in if needed, and
    /// holds the translation open: the returned [`Translation`] gives the
    /// host address of the byte, usable for the rest of its page until the
    /// guard is dropped.
    ///
    /// The guard is an access section, and borrows the CPU, so no other
    /// access of this CPU can run meanwhile: a shootdown that begins while
    /// it lives waits for it to be dropped before freeing the frame. Hence:
    /// keep it short and **do not block while holding it** (a shootdown on
    /// another thread would wait as long; a guard forgotten with
    /// `mem::forget` leaves the access open until the CPU's next access
    /// ends, or it is detached or dropped; forget the CPU too and every
    /// later shootdown of its address space waits forever, as the lockers
    /// of a forgotten `MutexGuard` do). A call into softmm from the
    /// same thread while it lives (a syscall, another CPU's fault) makes
    /// the CPU quiescent, and a shootdown may then free the frame: the
    /// pointer is valid only while the thread makes no such call.
    /// Dereferencing it is the caller's `unsafe`, and must be atomic: other
    /// guest threads may access the bytes. The safe accessors
    /// ([`Cpu::read`], [`Cpu::with_slice`], ...) need none of this.
    ///
    /// ```
    /// # use softmm::{Access, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// {
    ///     let t = cpu.translate(a + 8, Access::Write).unwrap();
    ///     assert_eq!(t.len(), 4096 - 8);
    ///     // SAFETY: 4-aligned, inside the page, while the guard lives and
    ///     // this thread makes no call into softmm; accessed atomically.
    ///     unsafe { &*(t.as_ptr() as *const AtomicU32) }.store(7, Ordering::Relaxed);
    /// } // the access ends here
    /// assert_eq!(cpu.read_u32(a + 8).unwrap(), 7);
    /// ```
    ///
    /// The guard borrows the CPU: no other access of it while it lives,
    ///
    /// ```compile_fail,E0499
    /// # use softmm::{Access, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// # let a = mm.mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// # let mut cpu = Cpu::attached(&mm);
    /// let t = cpu.translate(a, Access::Read).unwrap();
    /// cpu.read_u8(a).unwrap();
    /// drop(t);
    /// ```
    ///
    /// and it stays on the CPU's thread:
    ///
    /// ```compile_fail,E0277
    /// # use softmm::{Access, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// # let a = mm.mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// # let mut cpu = Cpu::attached(&mm);
    /// let t = cpu.translate(a, Access::Read).unwrap();
    /// std::thread::scope(|s| { s.spawn(move || drop(t)); });
    /// ```
    ///
    /// The access it stands for is the rest of the page: a watchpoint
    /// ([`AddressSpace::watchpoint_insert`]) anywhere in it that traps
    /// `access` stops it.
    ///
    /// # Panics
    ///
    /// If the CPU is not attached.
    #[inline]
    pub fn translate(&mut self, va: u64, access: Access) -> Result<Translation<'_>, Fault> {
        // A fault is recorded as the translated byte's.
        self.translate_sized(va, (PAGE_SIZE - va % PAGE_SIZE) as usize, 1, access)
    }

    /// [`Cpu::translate`] for an access of the `size` bytes at `va`, which
    /// lie in one page: a watchpoint is checked against those bytes, and a
    /// fault recorded with `record` bytes.
    #[inline]
    fn translate_sized(
        &mut self,
        va: u64,
        size: usize,
        record: usize,
        access: Access,
    ) -> Result<Translation<'_>, Fault> {
        let mut section = self.section();
        // On a fault, the section ends as it is dropped.
        let ptr = section.lookup(va, size, access).map_err(|f| section.cpu_mut().note_fault(f, access, va, record))?;
        Ok(Translation { section, ptr, len: (PAGE_SIZE - va % PAGE_SIZE) as usize })
    }

    /// Enters an access section and drops the TLB if a shootdown began
    /// since the last one: from here until [`Cpu::section_end`], a shootdown
    /// that began before this point is done with this CPU, and one that
    /// begins later waits for the end before freeing anything.
    ///
    /// It does not look at the attachment: a CPU that is not attached has
    /// an empty TLB, so the section's first lookup misses, and the miss
    /// path panics before any memory is touched.
    #[inline(always)]
    fn section_begin(&mut self) {
        debug_assert!(!self.parked, "access from a parked CPU");
        // The compiler barrier alone: when the entries must fence, the
        // pending mark is never clear and `section_begin_slow` fences
        // before it looks.
        // One reference for both: after the barrier, `self.state` would be
        // loaded again.
        let state = &*self.state;
        state.section_begin(true);
        if state.flush_pending() != 0 {
            self.section_begin_slow();
        }
    }

    /// A section's entry when a shootdown asked this CPU to flush, or
    /// whenever the reader barrier must be a fence.
    #[cold]
    #[inline(never)]
    fn section_begin_slow(&mut self) {
        // A section made while the CPU is quiescent (by a callback that
        // softmm runs inside a call of this thread, which marked the
        // thread's CPUs so): it is an access all the same, which a
        // shootdown must wait for. Before the catch-up, which then sees
        // every request that did not see the lift.
        self.state.lift_quiescence();
        if self.barrier.slow_entry(&self.state, &mut self.seen_req) {
            self.stats.tlb_flushes += 1;
        }
    }

    /// Leaves the access section: pointers from [`Cpu::lookup`] are dead.
    #[inline(always)]
    fn section_end(&mut self) {
        self.state.section_end();
    }

    /// The host address of `va` for the `size`-byte `access` there (inside
    /// one page), from the TLB or a walk (and a fault, if needed). Called
    /// inside a section, which it leaves and re-enters around a fault; the
    /// pointer is valid until the section ends.
    #[inline(always)]
    fn lookup(&mut self, va: u64, size: usize, access: Access) -> Result<*mut u8, Fault> {
        match self.tlb_hit(va, access) {
            Some(p) => Ok(p),
            None => self.translate_slow(va, size, access),
        }
    }

    /// The host address of `va` if the 4 KiB TLB holds it for `access`:
    /// an index and one compare.
    #[inline(always)]
    fn tlb_hit(&self, va: u64, access: Access) -> Option<*mut u8> {
        self.state.tlb.hit(va, access)
    }

    /// Drops every translation the CPU holds.
    fn empty_tlb(&mut self) {
        #[cfg(loom)]
        if crate::tlb::broken::SWITCH_KEEPS_TLB.with(std::cell::Cell::get) {
            return;
        }
        self.state.tlb.clear();
    }

    /// A miss of the 4 KiB TLB for the `size`-byte `access` at `va`, inside
    /// a section: the 2 MiB TLB, then a walk (a TLB miss proper). The size
    /// is for the watchpoints alone: the bytes lie in one page.
    #[cold]
    #[inline(never)]
    fn translate_slow(&mut self, va: u64, size: usize, access: Access) -> Result<*mut u8, Fault> {
        if let Some(p) = self.state.tlb.hit_huge(va, access) {
            return Ok(p);
        }
        self.stats.tlb_misses += 1;
        let Some(mm) = self.mm.clone() else { not_attached() };
        // The walk indexes with the low 48 bits only: anything above the
        // user address space must fault before it, or it would alias a user
        // page. (The TLB is filled only here, so its hit path needs no check.)
        check_user_address(va, mm.config.task_size)?;
        let write = access == Access::Write;
        // Whether the fault handler ran and returned: only then may the
        // address be embedder memory, which has no entries (its handler
        // returns at once), so an ordinary first touch pays no VMA lookup.
        let mut handled = false;
        loop {
            {
                let guard = crossbeam_epoch::pin();
                // Nothing is filled from a range a lock-free munmap is
                // zapping: it shot the range down once and frees the rest
                // without another shootdown (`tlb/unreachable.rs`).
                let unreachable = mm.unreachable.contains(va, &guard);
                let walk = if unreachable { None } else { mm.pgtables.leaf(va, &guard) };
                if let Some(leaf) = &walk {
                    let pte = leaf.load(va);
                    if access == Access::Execute && pte.is_present() && pte.has(Pte::NX) {
                        // x86-64 raises a protection fault for a fetch
                        // through an NX entry, and `access_error` refuses
                        // every present-entry fault that is not a write:
                        // no fault handling, just the signal.
                        return Err(Fault::Segv { addr: va, code: SegvCode::AccErr });
                    }
                    if pte.is_present() && (!write || pte.has(Pte::WRITE)) {
                        // The embedder's watchpoints (`crate::watch`), after
                        // the guest's own faults and before anything is
                        // marked or cached: the access is not made, unless
                        // the embedder passes it (`Cpu::pass_watchpoint`),
                        // which the access uses up once it is made below.
                        let mut watchpoint = mm.watches.point_hit(va, size, access.bit());
                        if watchpoint && !self.pass_watchpoint {
                            return Err(Fault::Watchpoint { addr: va });
                        }
                        // The embedder's write watch (`crate::watch`), after
                        // the guest's own permission and before anything is
                        // marked or cached: a watched store is not made.
                        if write && mm.watches.store(va) == StoreCheck::Notify {
                            return Err(Fault::WriteWatch { addr: va });
                        }
                        let want = Pte::ACCESSED | if write { Pte::DIRTY } else { 0 };
                        // Set A/D like the hardware walker, and record this
                        // CPU among the entry's fill owners (`tlb/targets.rs`):
                        // only on the entry we read, never on one that was
                        // zapped meanwhile, whose clear would miss us.
                        let filled = match mm.config.shootdown_targets {
                            ShootdownTargets::Broadcast => pte.set(want),
                            _ => pte.filled(want, self.state.slot()),
                        };
                        if filled != pte && !leaf.set_filled(va, pte, filled) {
                            continue;
                        }
                        // A fill that just named this CPU in the entry looks
                        // at the watches again, after a barrier: a watch
                        // armed meanwhile either read the entry after the
                        // exchange (and shoots this CPU down, waiting for
                        // this section) or is seen here (`crate::watch`'s
                        // `# Protocol`, targeted shootdowns).
                        if filled != pte && !crate::watch::broken::FILL_WITHOUT_RECHECK.with(std::cell::Cell::get) {
                            crate::tlb::reader_barrier(crate::tlb::reader_is_light());
                            if !watchpoint && mm.watches.point_hit(va, size, access.bit()) {
                                if !self.pass_watchpoint {
                                    return Err(Fault::Watchpoint { addr: va });
                                }
                                watchpoint = true;
                            }
                            if write && mm.watches.store(va) == StoreCheck::Notify {
                                return Err(Fault::WriteWatch { addr: va });
                            }
                        }
                        if watchpoint {
                            self.pass_watchpoint = false;
                        }
                        // A watched page is cached without write permission
                        // while its stores must trap (`crate::watch`), so
                        // the hit path needs no check of its own.
                        let writable = pte.has(Pte::WRITE)
                            && (write || pte.has(Pte::DIRTY))
                            && mm.watches.may_cache_write(va & !(leaf.entry_size() - 1), leaf.entry_size() / PAGE_SIZE);
                        // A page that holds a watchpoint is not cached for
                        // the kinds it traps, whose accesses then all miss.
                        let watched =
                            mm.watches.point_mask(va & !(leaf.entry_size() - 1), leaf.entry_size() / PAGE_SIZE);
                        let perms = (Access::Read.bit()
                            | if writable { Access::Write.bit() } else { 0 }
                            | if pte.has(Pte::NX) { 0 } else { Access::Execute.bit() })
                            & !watched;
                        if leaf.entry_size() > PAGE_SIZE {
                            // A 2 MiB leaf: its 512 frames are contiguous
                            // arena memory (`frame_ptr` checks the last).
                            let _ = mm.phys.frame_ptr(pte.pfn() + (leaf.entry_size() / PAGE_SIZE - 1));
                            let host = mm.phys.frame_ptr(pte.pfn());
                            self.state.tlb.fill_huge(va, host, perms);
                            return Ok(host.wrapping_add((va - leaf.start()) as usize));
                        }
                        let host = mm.phys.frame_ptr(pte.pfn());
                        self.state.tlb.fill(va, host, perms);
                        return Ok(host.wrapping_add((va % PAGE_SIZE) as usize));
                    }
                }
                // Embedder memory has no entries: filled from its VMA.
                if handled && !unreachable && walk.as_ref().is_none_or(|leaf| leaf.load(va).is_none()) {
                    if let Some(r) = self.fill_host_mem(&mm, va, size, access, &guard) {
                        return r;
                    }
                }
            }
            // Out of the section for the fault, which may block and may
            // itself shoot down (a COW break). Every CPU of this thread is
            // quiescent, not just this one: a sibling CPU may be inside an
            // access (a `with_slice` callback that touches memory through
            // this CPU), and a shootdown the fault waits on must not wait
            // for it while its thread is in here.
            self.section_end();
            let quiescent = QuiescentGuard::enter();
            let before = crate::sync::shared_writes_so_far();
            let r = mm.handle_fault_counted(va, access, &mut self.stats.fault, Some(&mut self.vma_hint));
            self.stats.fault.shared_writes += crate::sync::shared_writes_so_far() - before;
            drop(quiescent);
            // Back in, with the TLB checked again: the entry is walked anew.
            self.section_begin();
            // `Fault::Mmio` (device memory) included: the access goes to
            // the device (`cpu/mmio.rs`), or the caller learns it has no
            // host address.
            r?;
            handled = true;
        }
    }

    /// Reads `buf.len()` bytes at `addr`.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.copy_in(addr, buf, Access::Read)
    }

    /// Fetches `buf.len()` bytes of instructions at `addr`: as [`Cpu::read`],
    /// but each page must be executable. A page mapped without `PROT_EXEC`
    /// faults with `SIGSEGV`/`SEGV_ACCERR` (after being mapped for reading,
    /// as on x86-64), an unmapped one with `SEGV_MAPERR`; the TLB keeps the
    /// execute permission apart, so a page already read through this CPU
    /// still faults on a fetch.
    pub fn fetch(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.copy_in(addr, buf, Access::Execute)
    }

    /// Copies guest bytes at `addr` into `buf`, translating each page for
    /// `access` (a read or a fetch), one access section per page: a long
    /// copy never holds a shootdown up for more than a page.
    fn copy_in(&mut self, addr: u64, buf: &mut [u8], access: Access) -> Result<(), Fault> {
        let mut done = 0;
        while done < buf.len() {
            let a = addr.wrapping_add(done as u64);
            let n = ((PAGE_SIZE - a % PAGE_SIZE) as usize).min(buf.len() - done);
            let r = self.section().copy_in(a, &mut buf[done..done + n], access);
            self.sized(r, access, addr, buf.len())?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr`. On a fault, the bytes before the faulting
    /// page have been written, as with a real `memcpy`. One access section
    /// per page, as [`Cpu::read`].
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let mut done = 0;
        while done < data.len() {
            let a = addr.wrapping_add(done as u64);
            let n = ((PAGE_SIZE - a % PAGE_SIZE) as usize).min(data.len() - done);
            let r = self.section().write(a, &data[done..done + n]);
            self.sized(r, Access::Write, addr, data.len())?;
            done += n;
        }
        Ok(())
    }

    /// Atomic compare-and-exchange of a naturally aligned `u64` (SeqCst):
    /// [`Cpu::atomic_compare_exchange`] with `SeqCst` both ways.
    pub fn compare_exchange_u64(&mut self, addr: u64, current: u64, new: u64) -> Result<Result<u64, u64>, Fault> {
        self.atomic_compare_exchange(addr, current, new, Ordering::SeqCst, Ordering::SeqCst)
    }

    /// Atomic fetch-and-add of a naturally aligned `u64` (SeqCst); returns the old value.
    pub fn fetch_add_u64(&mut self, addr: u64, v: u64) -> Result<u64, Fault> {
        self.atomic_fetch_add(addr, v, Ordering::SeqCst)
    }

    /// Atomic compare-and-exchange of a naturally aligned `u32` (SeqCst).
    pub fn compare_exchange_u32(&mut self, addr: u64, current: u32, new: u32) -> Result<Result<u32, u32>, Fault> {
        self.atomic_compare_exchange(addr, current, new, Ordering::SeqCst, Ordering::SeqCst)
    }

    /// Atomic fetch-and-add of a naturally aligned `u32` (SeqCst); returns the old value.
    pub fn fetch_add_u32(&mut self, addr: u64, v: u32) -> Result<u32, Fault> {
        self.atomic_fetch_add(addr, v, Ordering::SeqCst)
    }

    /// Zero-copy read access to `[addr, addr+len)`: calls `f(offset, chunk)`
    /// for each page-contiguous chunk in order, `offset` being the chunk's
    /// offset in the range. The chunk is a read-only view ([`GuestBytes`]):
    /// a read translation may point at the shared zero page or at a page
    /// cache page the address space may not write. An empty range calls
    /// nothing and succeeds; on a fault the chunks before it have been
    /// visited.
    ///
    /// Each call of `f` is inside an access section, as one accessor call
    /// is: a shootdown on another thread that begins meanwhile waits for `f`
    /// to return, so **`f` must not block** on anything outside softmm (a
    /// channel, another thread, host I/O), or those shootdowns wait as
    /// long. The chunk's frame is also referenced while `f` runs, so `f` may
    /// call into softmm and change the address space (unmap the very page,
    /// truncate its file): the frame is then not reused before `f` returns,
    /// and the next access through this CPU sees the change, as a DMA
    /// through `get_user_pages` would.
    ///
    /// ```
    /// # use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// cpu.write_u64(a, 0x0102).unwrap();
    /// let mut sum = 0u32;
    /// cpu.with_slice(a, 8, |_, bytes| sum += (0..bytes.len()).map(|i| bytes.get(i) as u32).sum::<u32>()).unwrap();
    /// assert_eq!(sum, 3);
    /// ```
    ///
    /// A read view cannot be written through:
    ///
    /// ```compile_fail
    /// # use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// # let a = mm.mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// # let mut cpu = Cpu::attached(&mm);
    /// cpu.with_slice(a, 1, |_, bytes| bytes.0[0].store(0x41, std::sync::atomic::Ordering::Relaxed));
    /// ```
    pub fn with_slice(&mut self, addr: u64, len: usize, mut f: impl FnMut(usize, GuestBytes<'_>)) -> Result<(), Fault> {
        self.for_each_chunk(addr, len, Access::Read, |off, chunk| f(off, GuestBytes(chunk)))
    }

    /// Zero-copy write access to `[addr, addr+len)`, as [`Cpu::with_slice`]
    /// but translated for writing (breaking COW where needed). The bytes are
    /// atomics because other guest threads may access them concurrently.
    pub fn with_slice_mut(&mut self, addr: u64, len: usize, f: impl FnMut(usize, &[AtomicU8])) -> Result<(), Fault> {
        self.for_each_chunk(addr, len, Access::Write, f)
    }

    fn for_each_chunk(
        &mut self,
        addr: u64,
        len: usize,
        access: Access,
        f: impl FnMut(usize, &[AtomicU8]),
    ) -> Result<(), Fault> {
        let r = self.for_each_page_chunk(addr, len, access, f);
        self.sized(r, access, addr, len)
    }

    /// [`Cpu::for_each_chunk`]'s loop.
    fn for_each_page_chunk(
        &mut self,
        addr: u64,
        len: usize,
        access: Access,
        mut f: impl FnMut(usize, &[AtomicU8]),
    ) -> Result<(), Fault> {
        let mut done = 0;
        while done < len {
            let a = addr.wrapping_add(done as u64);
            let n = ((PAGE_SIZE - a % PAGE_SIZE) as usize).min(len - done);
            // Declared before the section, so dropped after its end: the
            // last hold runs the embedder's release callback, which must
            // not run inside this CPU's open, waited-for section (anything
            // it blocks on would hold shootdowns up).
            let mut _host_hold = None;
            let t = self.translate_sized(a, n, n, access)?;
            let mm = t.section.cpu().mm.as_deref().expect("attached");
            let phys = &mm.phys;
            // Embedder memory (`mmap_host`) has no frame: its release is
            // held instead, or, if its VMA went meanwhile, the page is
            // translated again (and faults).
            let _frame: Option<FrameRef<'_>> = if phys.is_arena_ptr(t.ptr) {
                Some(phys.get(phys.pfn_of_ptr(t.ptr)))
            } else {
                match Cpu::hold_host_mem(mm, a, t.ptr) {
                    Some(hold) => {
                        _host_hold = Some(hold);
                        None
                    }
                    None => continue,
                }
            };
            // SAFETY:
            // 1. `[t.ptr, t.ptr+n)` lies in one arena frame or one page of
            //    embedder memory: `translate` returned a pointer into it and
            //    `n` stops at the page end;
            // 2. the frame (the embedder's memory: its release waits for
            //    `_host_hold`) stays allocated until `_frame` is dropped after
            //    `f` returns, whatever `f` does to the address space (the
            //    section `t` holds would not be enough if `f` calls into
            //    softmm, which makes the CPU quiescent);
            // 3. arena memory is only ever accessed atomically, and so is
            //    the embedder's while mapped (`mmap_host`'s contract).
            let chunk = unsafe { std::slice::from_raw_parts(t.ptr as *const AtomicU8, n) };
            // A panic in `f` drops `_frame` and `t`, which ends the section.
            f(done, chunk);
            done += n;
        }
        Ok(())
    }
}

/// What a faulting access was ([`Cpu::last_fault`]): the [`Fault`] it
/// returned, and what the fault itself does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultInfo {
    /// The fault the access returned.
    pub fault: Fault,
    /// A read, a write (an atomic read-modify-write is one) or a fetch.
    pub access: Access,
    /// The access's first byte. The fault's own address is the byte that
    /// faulted: for an access across a page boundary, possibly the first
    /// byte of the second page.
    pub addr: u64,
    /// The access's size in bytes: the scalar's width, the copy's length,
    /// 1 for [`Cpu::translate`].
    pub size: usize,
}

/// A translation held open by [`Cpu::translate`]: an access section of its
/// CPU, which it borrows, ended when the guard is dropped. Shootdowns that
/// begin while it lives wait for the drop, so hold it briefly and never
/// across a blocking call.
#[must_use = "the pointer is valid only while the guard lives"]
pub struct Translation<'a> {
    /// The access section the pointer is valid in, ended when dropped.
    section: Section<'a>,
    ptr: *mut u8,
    /// Bytes from `ptr` to the end of its page.
    len: usize,
}

impl Translation<'_> {
    /// The host address of the translated byte. Valid, for the rest of its
    /// page ([`Translation::len`] bytes), while the guard lives and the
    /// thread makes no call into softmm; access it atomically only.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes from the translated byte to the end of its page (at least 1).
    #[inline]
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.len
    }
}

/// The part of `order` that a load can have (`std` panics on the rest).
#[inline]
fn load_part(order: Ordering) -> Ordering {
    match order {
        Ordering::Release => Ordering::Relaxed,
        Ordering::AcqRel => Ordering::Acquire,
        o => o,
    }
}

/// The part of `order` that a store can have.
#[inline]
fn store_part(order: Ordering) -> Ordering {
    match order {
        Ordering::Acquire => Ordering::Relaxed,
        Ordering::AcqRel => Ordering::Release,
        o => o,
    }
}

/// A read-only view of guest bytes lent by [`Cpu::with_slice`]. Other guest
/// threads may write them meanwhile, so each read is an atomic load.
#[derive(Clone, Copy)]
pub struct GuestBytes<'a>(&'a [AtomicU8]);

impl GuestBytes<'_> {
    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for an empty view.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The byte at `i`. Panics if `i >= len()`, like slice indexing.
    pub fn get(&self, i: usize) -> u8 {
        self.0[i].load(Ordering::Relaxed)
    }

    /// Copies the bytes into `dst`, which must have the same length.
    ///
    /// # Panics
    ///
    /// If `dst.len() != self.len()`, like `<[u8]>::copy_from_slice`.
    pub fn copy_to_slice(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.0.len(), "destination and source slices have different lengths");
        // SAFETY: the range is `self.0`, a slice of atomics borrowed for the
        // view's lifetime, `dst.len()` bytes long (checked).
        unsafe { crate::access::copy_from_host(self.0.as_ptr().cast(), dst) };
    }
}

// A watchpoint's mask is a set of `Access` bits (`watch` sits below
// `fault`, and names the bits by value).
const _: () = {
    use crate::watch::WatchAccess;
    assert!(WatchAccess::READ.bits() == Access::Read.bit() as u32);
    assert!(WatchAccess::WRITE.bits() == Access::Write.bit() as u32);
    assert!(WatchAccess::FETCH.bits() == Access::Execute.bit() as u32);
};

/// The panic of an access through a CPU attached to nothing, kept out of
/// the accessors' fast path.
#[cold]
#[inline(never)]
fn not_attached() -> ! {
    panic!("CPU is not attached to an address space")
}

/// Faults an address outside the user address space as x86-64 does: a
/// non-canonical one (bits 63..47 not all equal) raises a general protection
/// fault, which Linux reports as `SIGSEGV` with `SI_KERNEL` and address 0;
/// a canonical one at or above `task_size` (the last user page, the kernel
/// half) is a page fault with no VMA, `SEGV_MAPERR`.
#[inline]
fn check_user_address(va: u64, task_size: u64) -> Result<(), Fault> {
    if va < task_size {
        return Ok(());
    }
    let top = (va as i64) >> 47;
    if top != 0 && top != -1 {
        return Err(Fault::Segv { addr: 0, code: SegvCode::Kernel });
    }
    Err(Fault::Segv { addr: va, code: SegvCode::MapErr })
}

impl Drop for Cpu {
    fn drop(&mut self) {
        self.detach();
        if self.parked {
            self.state.exit_quiescent();
        }
        crate::tlb::unregister_thread_cpu(&self.state);
    }
}

/// Soundness of the safe accessors against a hostile caller; these run under
/// Miri with the other library unit tests.
#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::uapi::*;
    use crate::{File, MmConfig, OpenFile, PhysConfig, PhysMem};

    const RW: i32 = PROT_READ | PROT_WRITE;
    const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

    fn phys() -> Arc<PhysMem> {
        PhysMem::new(PhysConfig::new(64 << 10)).unwrap()
    }

    #[track_caller]
    fn assert_no_leaks(phys: &PhysMem) {
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
    }

    /// The entry no longer looks at the attachment: the first lookup of a
    /// CPU never attached, or detached since (its TLB emptied), panics.
    #[test]
    #[should_panic(expected = "CPU is not attached")]
    fn an_access_of_a_cpu_never_attached_panics() {
        let _ = Cpu::new().read_u64(0x1000);
    }

    #[test]
    #[should_panic(expected = "CPU is not attached")]
    fn an_access_of_a_detached_cpu_panics_though_its_tlb_held_the_page() {
        let p = phys();
        let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm.mmap(0, 4096, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 1).unwrap();
        cpu.detach();
        let _ = cpu.section().read_u64(a);
    }

    /// A shootdown that found the CPU inside an access waits for that
    /// section's end or for the CPU's acknowledgement, which the next
    /// entry gives when it sees the request: a waiter need never catch a
    /// CPU between two sections.
    #[test]
    fn the_entry_that_sees_a_flush_request_acknowledges_it() {
        let p = phys();
        let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 1).unwrap();
        let mm2 = mm.clone();
        std::thread::spawn(move || mm2.mprotect(a, PAGE_SIZE, PROT_READ).unwrap()).join().unwrap();
        let req = cpu.state.flush_requests();
        assert!(req > 0 && cpu.state.flush_acknowledged() < req, "a request, not yet seen");
        assert_eq!(cpu.read_u64(a), Ok(1));
        assert_eq!(cpu.state.flush_acknowledged(), req);
        drop((cpu, mm));
        assert_no_leaks(&p);
    }

    #[test]
    fn a_slice_callback_may_unmap_and_reuse_its_own_page() {
        let p = phys();
        let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let f = File::create(&p, "f", 0).unwrap();
        let a = mm.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(a, 1).unwrap();
        cpu.with_slice_mut(a, 16, |_, s| {
            mm.munmap(a, PAGE_SIZE).unwrap();
            f.write_at(0, &[0x11; 16]).unwrap();
            s.iter().for_each(|b| b.store(0x41, Relaxed));
        })
        .unwrap();
        let mut back = [0; 16];
        f.read_at(0, &mut back).unwrap();
        assert_eq!(back, [0x11; 16]);
        assert!(cpu.read_u8(a).is_err());
        drop((cpu, mm, f));
        assert_no_leaks(&p);
    }

    #[test]
    fn a_read_slice_of_the_zero_page_reads_zeros() {
        let p = phys();
        let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm.mmap(0, 2 * PAGE_SIZE, PROT_READ, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        let mut n = 0;
        cpu.with_slice(a + PAGE_SIZE - 3, 6, |_, s| {
            let mut b = vec![1; s.len()];
            s.copy_to_slice(&mut b);
            n += b.iter().filter(|&&x| x == 0).count();
        })
        .unwrap();
        assert_eq!(n, 6);
        drop((cpu, mm));
        assert_no_leaks(&p);
    }

    #[test]
    fn a_file_of_another_arena_is_refused_and_nothing_reaches_its_frames() {
        let (p1, p2) = (phys(), phys());
        let f = File::create(&p1, "f", PAGE_SIZE).unwrap();
        let mm = AddressSpace::new(&p2, MmConfig::default()).unwrap();
        assert_eq!(
            mm.mmap(0, PAGE_SIZE, PROT_READ, MAP_SHARED, Some(&OpenFile::read_only(&f)), 0),
            Err(crate::Errno::Inval)
        );
        drop((mm, f));
        assert_no_leaks(&p1);
        assert_no_leaks(&p2);
    }

    #[test]
    fn addresses_above_user_space_never_reach_the_walk() {
        let p = phys();
        let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u8(a, 5).unwrap();
        assert_eq!(cpu.read_u8(a | 1 << 52), Err(Fault::Segv { addr: 0, code: SegvCode::Kernel }));
        let high = a | 0xffff_8000_0000_0000;
        assert_eq!(cpu.read_u8(high), Err(Fault::Segv { addr: high, code: SegvCode::MapErr }));
        // A copy that runs off the top of the address space wraps to page 0.
        let mut buf = [0; 2];
        assert!(cpu.read(u64::MAX, &mut buf).is_err());
        drop((cpu, mm));
        assert_no_leaks(&p);
    }

    /// Attaching (and a flush) empties the TLB: a CPU switched to another
    /// address space reads that space's page at the same address, never
    /// the entry it cached for the first one.
    #[test]
    fn a_switch_of_address_space_drops_every_entry() {
        let p = phys();
        let mm1 = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let mm2 = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm1.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        assert_eq!(mm2.mmap(a, PAGE_SIZE, RW, ANON | MAP_FIXED, None, 0), Ok(a));
        let mut cpu = Cpu::attached(&mm2);
        cpu.write_u64(a, 2).unwrap();
        cpu.attach(&mm1);
        cpu.write_u64(a, 1).unwrap();
        cpu.attach(&mm2);
        assert_eq!(cpu.read_u64(a), Ok(2));
        cpu.detach();
        cpu.attach(&mm1);
        assert_eq!(cpu.read_u64(a), Ok(1));
        drop((cpu, mm1, mm2));
        assert_no_leaks(&p);
    }

    #[test]
    fn cpus_attach_switch_and_drop_in_any_order() {
        let p = phys();
        let mm1 = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let mm2 = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm1.mmap(0, PAGE_SIZE, RW, ANON, None, 0).unwrap();
        let mut c1 = Cpu::attached(&mm1);
        let mut c2 = Cpu::attached(&mm1);
        c1.write_u8(a, 3).unwrap();
        c2.attach(&mm2);
        c1.detach();
        c1.attach(&mm1);
        assert_eq!(c1.read_u8(a).unwrap(), 3);
        mm1.munmap(a, PAGE_SIZE).unwrap();
        drop(c1);
        c2.detach();
        drop((c2, mm1, mm2));
        assert_no_leaks(&p);
    }
}
