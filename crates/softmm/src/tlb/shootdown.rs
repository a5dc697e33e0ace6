//! The shootdown handshake of [`super`], free of the rest of the crate so that
//! loom can model it.

use std::sync::Arc;

use super::barrier;
use super::fence_mode;
use super::shared_barrier::{self, Covered};
use super::soft_tlb::SoftTlb;
use super::targets::{self, CpuSet};
use crate::sync::{fence, spin_hint, AtomicU64, Mutex, Ordering};

/// Flush requests whose range a CPU keeps ([`CpuTlbState::ranges`]); a
/// catch-up more requests behind drops the whole TLB. One under loom, so
/// that a model's second request reuses the first one's slot.
const FLUSH_RANGES: usize = if cfg!(loom) { 1 } else { 4 };

/// The slot of [`CpuTlbState::ranges`] for request number `k`.
#[inline]
#[allow(clippy::modulo_one)] // one slot under loom
fn range_slot(k: u64) -> usize {
    (k % FLUSH_RANGES as u64) as usize
}

/// The pages a flush request covers: `pages` pages from `start`, or every
/// entry ([`FlushRange::ALL`]). A range of more than
/// [`FlushRange::MAX_PAGES`] is every entry, as Linux's
/// `tlb_single_page_flush_ceiling` (33) and Asterinas (32) decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushRange {
    start: u64,
    pages: u64,
}

impl FlushRange {
    /// Every entry.
    pub const ALL: FlushRange = FlushRange { start: 0, pages: 0 };
    /// The most pages a request drops one by one.
    pub const MAX_PAGES: u64 = 32;

    /// The 4 KiB pages overlapping `[start, end)`, or [`FlushRange::ALL`]
    /// past [`FlushRange::MAX_PAGES`] (or for an empty or non-user range).
    pub fn new(start: u64, end: u64) -> FlushRange {
        let (first, last) = (start / crate::PAGE_SIZE, end.div_ceil(crate::PAGE_SIZE));
        if end <= start || last - first > Self::MAX_PAGES || last > 1 << 36 {
            return Self::ALL;
        }
        FlushRange { start: first * crate::PAGE_SIZE, pages: last - first }
    }

    /// The range in one word for request `k`: `k`'s low 16 bits, the first
    /// page's number (36 bits: a 48-bit address space), the page count (12
    /// bits, 0 for every entry).
    fn pack(self, k: u64) -> u64 {
        (k & 0xffff) << 48 | (self.start / crate::PAGE_SIZE) << 12 | self.pages
    }

    /// The range [`FlushRange::pack`] stored for request `k`, or `None` if
    /// the word is another request's.
    fn unpack(packed: u64, k: u64) -> Option<FlushRange> {
        if packed >> 48 != k & 0xffff {
            return None;
        }
        Some(FlushRange { start: (packed >> 12 & ((1 << 36) - 1)) * crate::PAGE_SIZE, pages: packed & 0xfff })
    }
}

/// The shootdown state one CPU shares with the initiators.
///
/// A CPU is attached to at most one [`TlbDomain`] at a time.
pub struct CpuTlbState {
    /// 1 while the CPU is inside an access (an access section), 0 outside;
    /// written only by the CPU's own thread, with a store of a constant at
    /// the entry and at the exit: neither loads anything.
    inside: AtomicU64,
    /// Flush requests sent to this CPU so far: every shootdown of its domain
    /// adds one (Release, after the PTE changes it covers), and the CPU
    /// drops its TLB at the start of a section when the count moved. Next
    /// to `inside` and the mark, so that a section's entry mostly touches
    /// one cache line of the CPU's own, which initiators write only when
    /// they shoot down. (Not always one: the `Arc`'s allocation is 16-byte
    /// aligned. Padding the four words to a line of their own was measured
    /// and made no lone hit faster, `docs/architecture.md`.)
    flush_req: AtomicU64,
    /// Non-zero when the CPU's next section entry must look at the flush
    /// requests: [`PENDING_REQUEST`] when one came since the last look,
    /// [`PENDING_ALWAYS`] where every entry must fence first (the barrier
    /// is not light). One compare with zero on the entry's fast path, with
    /// no copy of the requests to load.
    flush_pending: AtomicU64,
    /// The flush requests the CPU has acted on: stored (Release) by a
    /// section's entry that saw them and emptied the TLB before any lookup,
    /// or when the CPU leaves its domain with an empty TLB. A waiter that
    /// sees its request here may stop waiting even if it never saw `inside`
    /// at 0 (a CPU that ends one section and enters the next in a loop):
    /// the entry that stored it is that of a later section, or that of the
    /// section the waiter saw, which then uses no translation from before
    /// the request.
    flush_ack: AtomicU64,
    /// The CPU's quiescence, written only by its own thread: in the low 32
    /// bits, the levels entered (1 while parked, 1 per [`super::QuiescentGuard`]
    /// of its thread alive: a syscall, a fault); in the high 32 bits, how
    /// many of them a section of the CPU's own lifted
    /// ([`CpuTlbState::lift_quiescence`]). The CPU is quiescent, and no
    /// shootdown waits for it, while more levels are entered than lifted
    /// ([`is_quiescent`]).
    quiescent: AtomicU64,
    /// What each of the last [`FLUSH_RANGES`] flush requests covers, in
    /// the slot of its number (modulo): the number's low bits as a tag,
    /// and the pages, or none for the whole TLB ([`FlushRange::pack`]).
    /// A catch-up whose requests are all found here, tags matching, drops
    /// only their pages; any other drops the whole TLB.
    ranges: [AtomicU64; FLUSH_RANGES],
    /// The CPU's TLB, read and written by its own thread only (see
    /// `soft_tlb.rs` for why it lives here).
    pub(crate) tlb: SoftTlb,
    /// The CPU's process-wide slot (`targets.rs`), which its fills record
    /// in the entries they fill from; `None` if every slot was taken.
    slot: Option<u8>,
}

/// [`CpuTlbState::flush_pending`]: a flush request came since the last look.
const PENDING_REQUEST: u64 = 1;
/// [`CpuTlbState::flush_pending`]: every entry looks (and fences first).
const PENDING_ALWAYS: u64 = 2;
/// [`CpuTlbState::flush_pending`]: the CPU is quiescent, so that an entry
/// takes the slow path, where it lifts that for its section
/// ([`CpuTlbState::lift_quiescence`]). Set by the first level entered,
/// kept by the entries' takes while any is, cleared by the last one's exit.
const PENDING_QUIESCENT: u64 = 4;

/// [`CpuTlbState`]'s `quiescent` word: the levels entered.
const QUIESCENT_LEVELS: u64 = u32::MAX as u64;

/// Whether a CPU whose `quiescent` word is `word` and which is `inside`
/// an access section (or not) is quiescent: more levels entered than a
/// section of its own lifted, or any level entered and no section open
/// (a lift counts only inside the section that made it: after its end the
/// CPU is quiescent again, with no store on the section's exit).
#[inline]
fn is_quiescent(word: u64, inside: bool) -> bool {
    let levels = word & QUIESCENT_LEVELS;
    levels > word >> 32 || (levels > 0 && !inside)
}

impl CpuTlbState {
    /// A CPU outside any access.
    pub fn new() -> Arc<CpuTlbState> {
        Arc::new(CpuTlbState {
            inside: AtomicU64::new(0),
            flush_req: AtomicU64::new(0),
            flush_pending: AtomicU64::new(0),
            flush_ack: AtomicU64::new(0),
            quiescent: AtomicU64::new(0),
            ranges: std::array::from_fn(|_| AtomicU64::new(0)),
            tlb: SoftTlb::new(),
            slot: targets::alloc_slot(),
        })
    }

    /// The CPU's slot, which [`CpuSet`]s name it by: the same for the CPU's
    /// whole life; `None` if every slot was taken when it was made (its
    /// fills then mark entries as filled by several CPUs).
    #[inline]
    pub fn slot(&self) -> Option<u8> {
        self.slot
    }

    /// Enters an access section. The caller loads
    /// [`CpuTlbState::flush_pending`] after this and, if it is not zero,
    /// calls [`CpuTlbState::catch_up`] before using any entry. `light` is
    /// [`barrier::reader_is_light`], which the CPU keeps at hand. Called
    /// only on the CPU's own thread. A section whose end was skipped (a
    /// `Translation` or `Section` forgotten with `mem::forget`) simply
    /// lasts until this one ends.
    #[inline(always)]
    pub fn section_begin(&self, light: bool) {
        // Relaxed: the barrier below orders it before the mark's load.
        self.inside.store(1, Ordering::Relaxed);
        // Dekker with `TlbDomain::flush_begin`: our store of `inside`, this
        // barrier, then our load of `flush_pending`; the initiator's bump of
        // `flush_req` and mark of `flush_pending`, its barrier, then its
        // load of `inside`. Either it sees us inside and waits for the
        // section to end (or for an entry that saw the request), or we see
        // the mark and flush before using a stale entry.
        barrier::reader_barrier(light);
    }

    /// The flush requests sent to this CPU so far, compared with the count
    /// the CPU's TLB is current for. Acquire pairs with the initiator's
    /// Release bump: a CPU that sees the request walks the page tables the
    /// shootdown changed as changed.
    #[inline(always)]
    pub fn flush_requests(&self) -> u64 {
        self.flush_req.load(Ordering::Acquire)
    }

    /// Non-zero if the entry must look at the flush requests; loaded after
    /// [`CpuTlbState::section_begin`]'s barrier. Acquire, as for
    /// [`CpuTlbState::flush_requests`].
    #[inline(always)]
    pub fn flush_pending(&self) -> u64 {
        self.flush_pending.load(Ordering::Acquire)
    }

    /// Takes the pending mark. `always` (the barrier is a fence) leaves
    /// [`PENDING_ALWAYS`] in its place, so that every entry takes the slow
    /// path; `Cpu::new` sets the CPU's mode so. On the CPU's own thread.
    #[inline]
    pub fn take_flush_pending(&self, always: bool) {
        let mut keep = if always { PENDING_ALWAYS } else { 0 };
        // Relaxed: the CPU's own thread is the word's only writer.
        if self.quiescent.load(Ordering::Relaxed) & QUIESCENT_LEVELS != 0 {
            keep |= PENDING_QUIESCENT;
        }
        // AcqRel: the requests load that follows is not hoisted above it.
        self.flush_pending.swap(keep, Ordering::AcqRel);
    }

    /// An entry's slow path, once it saw the mark (and, without the light
    /// barrier, fenced): takes the mark, then loads the flush requests (in
    /// that order: a request sent after the take marks the next entry
    /// again); if they moved from `seen`, the count the TLB is current
    /// for, drops the entries they cover (the pages of each, if every one
    /// is a ranged request still in its slot; else the whole TLB), records
    /// them in `seen` and acknowledges them. Returns whether it dropped
    /// entries. `always` as for [`CpuTlbState::take_flush_pending`]. On
    /// the CPU's own thread.
    #[inline]
    pub fn catch_up(&self, seen: &mut u64, always: bool) -> bool {
        self.take_flush_pending(always);
        let req = self.flush_requests();
        if req == *seen {
            return false;
        }
        self.drop_requested(*seen, req);
        *seen = req;
        // A shootdown waiting for the section it saw this CPU in stops
        // waiting: that section ended before this entry, or is this one,
        // which has just emptied its TLB before any lookup.
        self.acknowledge(req);
        true
    }

    /// Drops the entries that requests `seen + 1 ..= req` cover: their
    /// ranges, if each one's slot still holds it (its tag) and names a
    /// range, else the whole TLB. A slot read before its initiator stored
    /// it (the number is taken first) holds an older request's tag, and a
    /// slot overwritten by a later one (more than [`FLUSH_RANGES`] behind)
    /// a newer tag: both mean the whole TLB.
    #[cold]
    fn drop_requested(&self, seen: u64, req: u64) {
        let mut ranges = [FlushRange::ALL; FLUSH_RANGES];
        let n = req.wrapping_sub(seen);
        let ranged = n <= FLUSH_RANGES as u64
            && (0..n).all(|i| {
                let k = seen.wrapping_add(i + 1);
                // Acquire: pairs with the initiator's Release store, though
                // the pages named are only ever dropped, never trusted.
                let packed = self.ranges[range_slot(k)].load(Ordering::Acquire);
                #[cfg(loom)]
                let k = if super::broken::RANGE_WITHOUT_TAG.with(std::cell::Cell::get) { packed >> 48 } else { k };
                match FlushRange::unpack(packed, k) {
                    Some(r) if r != FlushRange::ALL => {
                        ranges[i as usize] = r;
                        true
                    }
                    _ => false,
                }
            });
        if ranged {
            ranges[..n as usize].iter().for_each(|r| self.tlb.flush_range(r.start, r.pages));
        } else {
            self.tlb.clear();
        }
    }

    /// Asks the CPU to drop the entries of `range` (or every entry) before
    /// its next section uses one. Called by initiators before their
    /// barrier, after their PTE changes. Returns the request's number, the
    /// count a waiter needs acknowledged, and whether the CPU's entries
    /// fence (`PENDING_ALWAYS` was in the mark: `fence_mode.rs`).
    pub(super) fn request_flush(&self, range: FlushRange) -> (u64, bool) {
        let req = self.flush_req.fetch_add(1, Ordering::Release).wrapping_add(1);
        // After the number is taken, so that the slot names its request: a
        // catch-up that reads the number first and the slot before this
        // store finds another tag and drops everything.
        self.ranges[range_slot(req)].store(range.pack(req), Ordering::Release);
        // After the count: an entry that sees the mark and takes it loads
        // a count that includes this request.
        let mark = self.flush_pending.fetch_or(PENDING_REQUEST, Ordering::Release);
        crate::sync::shared_write(2);
        (req, mark & PENDING_ALWAYS != 0)
    }

    /// Records, at a section's entry that dropped the TLB, that the CPU
    /// acted on the first `req` flush requests (a value
    /// [`CpuTlbState::flush_requests`] returned). On the CPU's own thread.
    #[inline]
    fn acknowledge(&self, req: u64) {
        // Release: the CPU's earlier sections, which ended before this
        // entry, happen before a waiter that reads it (Acquire) and frees.
        self.flush_ack.store(req, Ordering::Release);
    }

    /// The flush requests the CPU has acknowledged (for the `Cpu` tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn flush_acknowledged(&self) -> u64 {
        self.flush_ack.load(Ordering::Acquire)
    }

    /// Leaves the access section (on the CPU's own thread): from here on,
    /// an initiator may free what the section used.
    #[inline(always)]
    pub fn section_end(&self) {
        debug_assert!(self.in_section(), "no access section to end");
        // Release: the section's accesses happen before an initiator that
        // reads the 0 (Acquire) stops waiting and frees the frame.
        self.inside.store(0, Ordering::Release);
    }

    /// Records that the CPU, outside any access, holds no translation from
    /// before this point (it left its domain with an empty TLB): counts as
    /// one whole access for a shootdown waiting for its next one
    /// ([`ShootdownPolicy::NextAccess`]), which would otherwise wait for an
    /// access that never comes to that domain, and ends a section whose
    /// end was skipped. On the CPU's own thread, after it left the domain's
    /// list, so no request of that domain comes later.
    #[inline]
    pub fn passed_quiescent_point(&self) {
        // Release, both: what the CPU did before happens before a waiter
        // that reads either (Acquire).
        self.inside.store(0, Ordering::Release);
        self.acknowledge(self.flush_req.load(Ordering::Acquire));
    }

    /// Marks the CPU quiescent (parked or blocked in softmm); nests. On the
    /// CPU's own thread, as every write of its quiescence.
    #[inline]
    pub fn enter_quiescent(&self) {
        // SeqCst, hence Release: the CPU's accesses so far (a `with_slice`
        // callback's, whose section is still open) happen before an
        // initiator that reads this word (SeqCst, hence Acquire) stops
        // waiting. An entered level is above any lifted one, so the CPU is
        // quiescent from here whatever its sections lifted.
        let w = self.quiescent.load(Ordering::Relaxed);
        debug_assert!(w & QUIESCENT_LEVELS < QUIESCENT_LEVELS);
        self.quiescent.store(w + 1, Ordering::SeqCst);
        // A section entered while a level lives (by a callback that softmm
        // runs inside the call) must take the slow path, which lifts it
        // (`lift_quiescence`); set by the first level, cleared by the last
        // one's exit. Relaxed: only this thread reads it so.
        if w & QUIESCENT_LEVELS == 0 {
            self.flush_pending.fetch_or(PENDING_QUIESCENT, Ordering::Relaxed);
        }
    }

    /// Called by a section's entry, on the slow path, after its store of
    /// `inside` and before it takes the mark: if a level is entered, a
    /// callback that softmm runs inside a call of this thread (a device's,
    /// a host memory release) is accessing memory through the CPU. A
    /// shootdown must wait for that section as for any other, so it lifts
    /// every level entered, for as long as the section is open
    /// ([`is_quiescent`]; a level entered later counts again). Returns
    /// whether it lifted.
    #[inline]
    pub(crate) fn lift_quiescence(&self) -> bool {
        let w = self.quiescent.load(Ordering::Relaxed);
        #[cfg(loom)]
        if super::broken::SECTION_KEEPS_QUIESCENCE.with(std::cell::Cell::get) {
            return false;
        }
        let levels = w & QUIESCENT_LEVELS;
        if levels == 0 {
            return false;
        }
        self.quiescent.store(levels | levels << 32, Ordering::SeqCst);
        // Dekker with an initiator, as the entry's own barrier, but on the
        // word: our store of it, this fence, then the mark's and the
        // requests' loads (the caller's catch-up); the initiator's request,
        // its barrier, then its load of the word. Either it sees the CPU
        // not quiescent (and inside, stored before) and waits, or we see
        // its request and drop the entries it covers before any lookup.
        fence(Ordering::SeqCst);
        true
    }

    /// True while the CPU is inside an access section. Exact only on the
    /// CPU's own thread, the only writer of `inside`.
    #[inline]
    pub(crate) fn in_section(&self) -> bool {
        self.inside.load(Ordering::Relaxed) == 1
    }

    /// Leaves one level of quiescence.
    #[inline]
    pub fn exit_quiescent(&self) {
        let w = self.quiescent.load(Ordering::Relaxed);
        let levels = w & QUIESCENT_LEVELS;
        debug_assert!(levels > 0);
        let levels = levels.saturating_sub(1);
        // A lifting section that outlives the guard whose level it lifted
        // (its `Cpu` leaked, so its `Translation` may be kept anywhere)
        // keeps no more lifted than entered: a level entered later counts.
        let lifted = (w >> 32).min(levels);
        self.quiescent.store(levels | lifted << 32, Ordering::SeqCst);
        if levels == 0 {
            // No entry after this one lifts anything: none takes the slow
            // path for it (each would count toward the fence mode's switch,
            // `fence_mode.rs`). Only this thread clears the bit; the
            // initiators' `fetch_or`s of theirs are kept.
            self.flush_pending.fetch_and(!PENDING_QUIESCENT, Ordering::Relaxed);
        }
        // Nothing after this uses a translation without a new section,
        // whose own barrier orders its load of `gen`; the fence keeps the
        // quiescent state's end ordered for the fallback's Dekker reasoning
        // all the same, and costs nothing on this cold path.
        fence(Ordering::SeqCst);
    }

    /// What a shootdown under `policy`, which has just sent its request,
    /// must wait for the CPU to do, or `None` if nothing: inside an access,
    /// leave it (or acknowledge the request); outside one, nothing under
    /// [`ShootdownPolicy::AccessSections`], and acknowledge the request
    /// under [`ShootdownPolicy::NextAccess`]. Never for a quiescent CPU.
    /// `ack` is the number of the shootdown's request (later shootdowns'
    /// may have come since: their acknowledgement covers it too).
    #[inline]
    fn wait_until(&self, policy: ShootdownPolicy, ack: u64) -> Option<WaitFor> {
        // Acquire on `inside` pairs with the Release in `section_end`;
        // SeqCst on `quiescent` with the stores of `enter_quiescent` and
        // `exit_quiescent`.
        let inside = self.inside.load(Ordering::Acquire) == 1;
        if is_quiescent(self.quiescent.load(Ordering::SeqCst), inside) {
            return None;
        }
        match (inside, policy) {
            (true, _) => Some(WaitFor { ack, or_exit: true }),
            (false, ShootdownPolicy::NextAccess) => Some(WaitFor { ack, or_exit: false }),
            (false, _) => None,
        }
    }

    /// True once the CPU did what `w` waits for, or is quiescent.
    #[inline]
    fn done(&self, w: WaitFor) -> bool {
        // A 0 read after the 1 that `wait_until` read is a later store (the
        // location's modification order): the section seen then is over.
        // Acquire on each pairs with the CPU's Release stores.
        let inside = self.inside.load(Ordering::Acquire) == 1;
        w.or_exit && !inside
            || self.flush_ack.load(Ordering::Acquire) >= w.ack
            || is_quiescent(self.quiescent.load(Ordering::SeqCst), inside)
    }
}

impl Drop for CpuTlbState {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            targets::free_slot(slot);
        }
    }
}

/// Which CPUs a shootdown waits for. Both are the same handshake; they
/// differ in what a CPU outside an access must do. More policies may come,
/// so a `match` on it needs a wildcard arm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShootdownPolicy {
    /// Only CPUs inside an access at that moment are waited for, until that
    /// access ends; a CPU outside one flushes at the start of its next.
    #[default]
    AccessSections,
    /// softmm's first protocol, kept for comparison: every attached CPU of
    /// another thread that is not quiescent is waited for until it has
    /// completed an access begun after the flush (or ended the one it was
    /// in), as if it acknowledged at its next MMU call. A thread blocked
    /// outside softmm with an unparked CPU holds the shootdown up until it
    /// accesses guest memory again, which is why `Cpu::park` existed.
    NextAccess,
}

impl ShootdownPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [ShootdownPolicy] = &[ShootdownPolicy::AccessSections, ShootdownPolicy::NextAccess];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            ShootdownPolicy::AccessSections => "access-sections",
            ShootdownPolicy::NextAccess => "next-access",
        }
    }

    /// The policy named `name` (see [`ShootdownPolicy::name`]).
    pub fn from_name(name: &str) -> Option<ShootdownPolicy> {
        ShootdownPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// How a shootdown reaches the attached CPUs: what it locks while it posts
/// its requests, and whose barrier covers them. Every policy gives the same
/// guarantee (once the ticket's wait returns, no CPU uses a translation
/// removed before the flush began); they differ in what concurrent
/// shootdowns of one process share. More policies may come, so a `match`
/// on it needs a wildcard arm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PostingPolicy {
    /// The posts, the barrier and the look at each CPU under the address
    /// space's CPU-list lock, one barrier per shootdown: every shootdown of
    /// the address space runs alone (softmm's first posting, kept for the
    /// lab).
    Locked,
    /// The CPU list read from an epoch-published copy, with no lock held
    /// (attach and detach fence against initiators instead); one barrier per
    /// shootdown, concurrent shootdowns' barriers overlapping.
    LockFree,
    /// [`PostingPolicy::LockFree`], and concurrent initiators share one
    /// barrier: one that starts after an initiator posted covers it
    /// (userspace RCU's batched grace periods, `tlb/shared_barrier.rs`).
    SharedBarrier,
    /// [`PostingPolicy::SharedBarrier`], and a CPU shot down often switches
    /// its own section barrier to a fence, so that a shootdown whose every
    /// target fences needs no barrier at all (`tlb/fence_mode.rs`); a CPU
    /// seldom shot down switches back. The default: it measured best
    /// (`docs/architecture.md`, "Posting policies").
    #[default]
    Adaptive,
}

impl PostingPolicy {
    /// Every policy, for sweeps.
    pub const ALL: &'static [PostingPolicy] =
        &[PostingPolicy::Locked, PostingPolicy::LockFree, PostingPolicy::SharedBarrier, PostingPolicy::Adaptive];

    /// The kebab-case name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            PostingPolicy::Locked => "locked",
            PostingPolicy::LockFree => "lock-free",
            PostingPolicy::SharedBarrier => "shared-barrier",
            PostingPolicy::Adaptive => "adaptive",
        }
    }

    /// The policy named `name` (see [`PostingPolicy::name`]).
    pub fn from_name(name: &str) -> Option<PostingPolicy> {
        PostingPolicy::ALL.iter().copied().find(|p| p.name() == name)
    }
}

/// Counters of shootdown traffic (the seeds count IPIs). More counters may
/// come: read the fields, never build one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlbStats {
    /// Flushes initiated.
    pub flushes: u64,
    /// Flush requests sent: one per CPU of another thread attached when the
    /// flush began (the IPIs Linux would send; the initiator flushes itself).
    pub flush_requests: u64,
    /// Requests that needed a wait: the CPU was inside an access when the
    /// flush began (a CPU outside one flushes at its next access).
    pub flush_waits: u64,
    /// Process-wide barriers issued: one per flush that had a CPU of
    /// another thread to ask (`membarrier`, or a fence where it is
    /// unavailable; see `fences_are_asymmetric`), except under
    /// [`PostingPolicy::SharedBarrier`], where a flush that joined another
    /// initiator's barrier counts in `barriers_joined` instead.
    pub barriers: u64,
    /// Flushes covered by a barrier another initiator issued
    /// ([`PostingPolicy::SharedBarrier`]).
    pub barriers_joined: u64,
    /// Flushes that had CPUs of other threads to ask, all in fence mode,
    /// and so ran no barrier ([`PostingPolicy::Adaptive`]).
    pub barriers_skipped: u64,
    /// Nanoseconds initiators spent waiting for CPUs inside an access
    /// (the wait of a flush counted in `flush_waits`), summed over
    /// flushes; a flush that waits for nobody adds nothing and reads no
    /// clock.
    pub flush_wait_ns: u64,
    /// Flushes that asked no CPU of another thread: no request, no
    /// barrier, no wait (with [`crate::ShootdownTargets::FillOwners`], the
    /// entries were filled by the initiator's CPUs or by none).
    pub local_flushes: u64,
    /// Writes the flushes made to memory other CPUs also write (lock
    /// words, other CPUs' request words, the shared barrier's words,
    /// shared counters); 0 without the `shared-write-stats` feature.
    pub shared_writes: u64,
}

/// One stripe of a domain's counters, written by the initiators whose
/// threads map to it ([`stripe`]), summed by [`TlbDomain::stats`]: flush
/// statistics cost no shared-line write on the flush path.
#[derive(Default)]
struct FlushCounters {
    flushes: std::sync::atomic::AtomicU64,
    flush_requests: std::sync::atomic::AtomicU64,
    flush_waits: std::sync::atomic::AtomicU64,
    barriers: std::sync::atomic::AtomicU64,
    barriers_joined: std::sync::atomic::AtomicU64,
    barriers_skipped: std::sync::atomic::AtomicU64,
    flush_wait_ns: std::sync::atomic::AtomicU64,
    shared_writes: std::sync::atomic::AtomicU64,
    local_flushes: std::sync::atomic::AtomicU64,
}

/// Stripes of [`FlushCounters`] per domain: enough that the threads of a
/// 16-CPU machine rarely share one.
const STRIPES: usize = 16;

type Stripes = Arc<[crossbeam_utils::CachePadded<FlushCounters>]>;

/// The calling thread's stripe, from its number
/// ([`crate::sync::percpu::this_thread_number`]). (Pure statistics: `std`'s
/// thread number even under loom.)
fn stripe() -> usize {
    crate::sync::percpu::this_thread_number().unwrap_or(0) % STRIPES
}

/// Adds `n` to a counter of statistics (Relaxed: read after the fact).
fn count(c: &std::sync::atomic::AtomicU64, n: u64) {
    if n != 0 {
        c.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The attached CPUs as initiators read them without a lock
/// ([`PostingPolicy::LockFree`] and later): a copy published on every
/// attach and detach, freed once no initiator can hold it.
type CpuList = Vec<Arc<CpuTlbState>>;

/// The CPUs attached to one address space, and its shootdown counters.
///
/// # Protocol (attach and detach against a lock-free initiator)
///
/// Attach and detach change `cpus` under its lock, then publish a copy
/// in `published` (Release) and run a SeqCst fence. An initiator, after
/// its PTE changes, runs a SeqCst fence, then loads `published`. Attach is
/// a Dekker handshake with it: the attacher stores the list, fences, and
/// later walks (loads PTEs); the initiator stores PTEs, fences, and loads
/// the list. Either the initiator sees the new CPU and posts to it, or the
/// CPU's walks see the changed PTEs (its TLB starts empty): what the lock
/// stood for, without the lock. A detached CPU the initiator still sees
/// gets a needless request (detach empties its TLB and acknowledges).
/// `tlb/loom_tests.rs` models an attach racing a lock-free flush, and shows
/// that without the initiator's fence ([`broken::NO_LIST_FENCE`]) a CPU
/// attaching meanwhile reads a freed frame.
pub struct TlbDomain {
    /// Number of attached CPUs, readable without the list's lock.
    nr_cpus: AtomicU64,
    /// Locked to attach and to detach, and, under [`PostingPolicy::Locked`],
    /// for [`TlbDomain::flush_begin`]'s look at the CPUs; never while
    /// waiting.
    cpus: Mutex<CpuList>,
    /// `cpus` as the lock-free initiators read it.
    published: crossbeam_epoch::Atomic<CpuList>,
    /// Statistics, one stripe per group of initiating threads.
    stats: Stripes,
    policy: ShootdownPolicy,
    posting: PostingPolicy,
}

impl Default for TlbDomain {
    fn default() -> Self {
        Self::new()
    }
}

impl TlbDomain {
    /// A domain with no CPU attached, under the default policies.
    pub fn new() -> TlbDomain {
        TlbDomain::with_policy(ShootdownPolicy::default())
    }

    /// A domain with no CPU attached, whose shootdowns wait as `policy` says.
    pub fn with_policy(policy: ShootdownPolicy) -> TlbDomain {
        TlbDomain::with_policies(policy, PostingPolicy::default())
    }

    /// A domain with no CPU attached, whose shootdowns wait as `policy`
    /// says and post as `posting` says.
    pub fn with_policies(policy: ShootdownPolicy, posting: PostingPolicy) -> TlbDomain {
        TlbDomain {
            policy,
            posting,
            nr_cpus: AtomicU64::new(0),
            cpus: Mutex::new(Vec::new()),
            published: crossbeam_epoch::Atomic::new(Vec::new()),
            stats: (0..STRIPES).map(|_| Default::default()).collect(),
        }
    }

    /// Publishes `cpus` for the lock-free initiators (under the list's
    /// lock), then fences: the attacher's half of the handshake in the
    /// type's protocol.
    fn publish(&self, cpus: &CpuList) {
        self.nr_cpus.store(cpus.len() as u64, Ordering::Relaxed);
        let guard = crossbeam_epoch::pin();
        // Release: the copy's contents before its pointer.
        let old = self.published.swap(crossbeam_epoch::Owned::new(cpus.clone()), Ordering::Release, &guard);
        // SAFETY: `old` is unreachable from `published` now; initiators
        // that loaded it hold a guard the destruction waits for.
        unsafe { crate::sync::rcu::defer_destroy(&guard, old) };
        // Pairs with the fence in `flush_begin_lock_free`: the list before
        // the CPU's first walk.
        fence(Ordering::SeqCst);
    }

    /// Attaches a CPU (attached to no other domain, outside any access,
    /// with an empty TLB); returns its flush requests so far, the count its
    /// TLB is current for. A shootdown that missed the CPU in the list
    /// changed its PTEs before the CPU's first walk (under the list's lock,
    /// or by the type's protocol).
    pub fn attach(&self, cpu: &Arc<CpuTlbState>) -> u64 {
        let mut cpus = self.cpus.lock();
        let seen = cpu.flush_requests();
        cpus.push(cpu.clone());
        self.publish(&cpus);
        seen
    }

    /// Detaches a CPU (outside any access); it must hold no translation of
    /// this domain afterwards. A CPU that is not attached here is left alone.
    pub fn detach(&self, cpu: &Arc<CpuTlbState>) {
        let mut cpus = self.cpus.lock();
        if let Some(i) = cpus.iter().position(|c| Arc::ptr_eq(c, cpu)) {
            cpus.swap_remove(i);
        }
        self.publish(&cpus);
    }

    /// Number of attached CPUs (a racy snapshot; takes no lock).
    #[inline]
    pub fn attached(&self) -> usize {
        self.nr_cpus.load(Ordering::Relaxed) as usize
    }

    /// Starts a shootdown of every attached CPU's TLB: bumps each CPU's
    /// flush requests (CPUs drop their entries at the start of their next
    /// access) and notes the CPUs that are inside an access right now, the
    /// only ones that must be waited for. `mine` are the
    /// caller's own CPUs, never waited for (they flush at their next
    /// access) and not counted as requests.
    ///
    /// The flush is complete only when the returned ticket has been waited
    /// for (or dropped); the caller may begin flushes of other domains
    /// meanwhile. No lock is held between the two: CPUs may attach, detach
    /// and run in between.
    pub fn flush_begin(&self, mine: &[Arc<CpuTlbState>]) -> FlushTicket {
        self.flush_begin_filtered(mine, &CpuSet::all(), FlushRange::ALL)
    }

    /// [`TlbDomain::flush_begin`] for the CPUs of `targets` only: the
    /// attached CPUs whose slot it holds (every attached CPU if it is
    /// [`CpuSet::all`]). The caller guarantees that no other CPU caches a
    /// translation the flush removes: `targets` holds the fill owners of
    /// every entry it cleared or narrowed (`pgtable/pte.rs`), collected by
    /// the swaps that changed them.
    ///
    /// The caller's own CPUs in the set get their request directly, with no
    /// barrier and no wait; if no other CPU is in it, nothing else is done:
    /// no list, no barrier, no wait. That is sound under every posting
    /// policy because a CPU that attaches meanwhile is not in the set: it
    /// has not filled from the cleared entries (a fill records its slot with
    /// a compare-exchange on the entry, which fails on a cleared one, or
    /// finds its slot already there, which the clear's swap then returned).
    ///
    /// `range` is what the requests ask the CPUs to drop: the pages the
    /// changes covered, or [`FlushRange::ALL`].
    pub fn flush_begin_targets(&self, mine: &[Arc<CpuTlbState>], targets: &CpuSet, range: FlushRange) -> FlushTicket {
        if !targets.is_all() {
            let remote = targets.without(mine.iter().map(|m| m.slot()));
            if remote.is_empty() {
                let c = &self.stats[stripe()];
                count(&c.flushes, 1);
                count(&c.local_flushes, 1);
                // They flush at their next access, like any CPU outside one.
                for m in mine.iter().filter(|m| targets.contains(m.slot())) {
                    m.request_flush(range);
                }
                return FlushTicket { pending: Vec::new(), barrier: false, wait_ns: None };
            }
        }
        self.flush_begin_filtered(mine, targets, range)
    }

    /// [`TlbDomain::flush_begin_targets`] past its local case: the posting
    /// policy's list of attached CPUs, narrowed to `targets`.
    fn flush_begin_filtered(&self, mine: &[Arc<CpuTlbState>], targets: &CpuSet, range: FlushRange) -> FlushTicket {
        let writes = crate::sync::shared_writes_so_far();
        let c = &self.stats[stripe()];
        count(&c.flushes, 1);
        let mut ticket = match self.posting {
            PostingPolicy::Locked => {
                // Under the lock, so that a CPU attaching after us starts
                // empty after our PTE changes, and none detaches and is
                // dropped while we look at it.
                let cpus = self.cpus.lock();
                crate::sync::shared_write(2);
                self.post(&cpus, mine, targets, range, || {
                    barrier::initiator_barrier();
                    Covered::Issued
                })
            }
            _ => {
                let guard = crossbeam_epoch::pin();
                // The initiator's half of the type's protocol: our PTE
                // changes before the list's load.
                if !broken::no_list_fence() {
                    fence(Ordering::SeqCst);
                }
                let list = self.published.load(Ordering::Acquire, &guard);
                // SAFETY: published lists are never null, and are freed
                // only after every guard that may have loaded them.
                let cpus = unsafe { list.deref() };
                let shared = matches!(self.posting, PostingPolicy::SharedBarrier | PostingPolicy::Adaptive);
                self.post(cpus, mine, targets, range, || {
                    if !shared {
                        barrier::initiator_barrier();
                        return Covered::Issued;
                    }
                    // Our posts before the barrier's start: see
                    // `shared_barrier.rs`.
                    fence(Ordering::SeqCst);
                    shared_barrier::shared().cover()
                })
            }
        };
        let waits = ticket.pending.len() as u64;
        count(&c.flush_waits, waits);
        if waits != 0 {
            ticket.wait_ns = Some(self.stats.clone());
        }
        count(&c.shared_writes, crate::sync::shared_writes_so_far() - writes);
        ticket
    }

    /// Posts this flush's requests for `range` to the CPUs of `cpus` (the
    /// attached CPUs, by the policy's means) that `targets` holds, has
    /// `barrier` cover them if any CPU of another thread got one, then
    /// notes the CPUs to wait for.
    fn post(
        &self,
        cpus: &[Arc<CpuTlbState>],
        mine: &[Arc<CpuTlbState>],
        targets: &CpuSet,
        range: FlushRange,
        barrier: impl FnOnce() -> Covered,
    ) -> FlushTicket {
        let c = &self.stats[stripe()];
        let is_mine = |cpu: &Arc<CpuTlbState>| mine.iter().any(|m| Arc::ptr_eq(m, cpu));
        // Before the barrier: the request is the initiator's store of the
        // handshake. Each CPU's request number, for its wait.
        let mut others: Vec<(&Arc<CpuTlbState>, u64)> = Vec::new();
        let mut all_fence = true;
        for cpu in cpus.iter().filter(|c| targets.contains(c.slot())) {
            let (req, fences) = cpu.request_flush(range);
            if !is_mine(cpu) {
                others.push((cpu, req));
                all_fence &= fences;
            }
        }
        let mut pending = Vec::new();
        let mut forced = false;
        if !others.is_empty() {
            if all_fence && self.posting == PostingPolicy::Adaptive {
                // Every target's entries fence (`fence_mode.rs`): our own
                // fence is the other half, and it acquires the mode (and a
                // section open at the switch) from the posts' reads.
                if !fence_mode::broken::skip_without_fence() {
                    fence(Ordering::SeqCst);
                }
                count(&c.barriers_skipped, 1);
            } else {
                forced = true;
                // Pairs with `CpuTlbState::section_begin`'s barrier.
                match barrier() {
                    Covered::Issued => count(&c.barriers, 1),
                    Covered::Joined => count(&c.barriers_joined, 1),
                }
            }
            for &(cpu, req) in &others {
                // A CPU outside an access now flushes before its next one.
                if let Some(until) = cpu.wait_until(self.policy, req) {
                    pending.push(PendingCpu { cpu: cpu.clone(), until });
                }
            }
        } else {
            count(&c.local_flushes, 1);
        }
        count(&c.flush_requests, others.len() as u64);
        FlushTicket { pending, barrier: forced, wait_ns: None }
    }

    /// Shoots down every attached CPU's TLB and returns once each CPU that
    /// was inside an access when it began has left it, acknowledged the
    /// request, or become quiescent: [`TlbDomain::flush_begin`] then
    /// [`FlushTicket::wait`].
    pub fn flush(&self, mine: &[Arc<CpuTlbState>]) {
        self.flush_begin(mine).wait();
    }

    /// Shootdown counters so far (the stripes summed: a racy snapshot).
    pub fn stats(&self) -> TlbStats {
        let sum = |f: fn(&FlushCounters) -> &std::sync::atomic::AtomicU64| {
            self.stats.iter().map(|c| f(c).load(std::sync::atomic::Ordering::Relaxed)).sum()
        };
        TlbStats {
            flushes: sum(|c| &c.flushes),
            flush_requests: sum(|c| &c.flush_requests),
            flush_waits: sum(|c| &c.flush_waits),
            barriers: sum(|c| &c.barriers),
            barriers_joined: sum(|c| &c.barriers_joined),
            barriers_skipped: sum(|c| &c.barriers_skipped),
            flush_wait_ns: sum(|c| &c.flush_wait_ns),
            shared_writes: sum(|c| &c.shared_writes),
            local_flushes: sum(|c| &c.local_flushes),
        }
    }
}

impl Drop for TlbDomain {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no initiator is left to hold the list.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        let p = self.published.swap(crossbeam_epoch::Shared::null(), Ordering::Relaxed, guard);
        if !p.is_null() {
            // SAFETY: owned by `published` alone (see `publish`).
            drop(unsafe { p.into_owned() });
        }
    }
}

// The loom models' broken switches: `sync/broken.rs`.
pub(crate) use crate::sync::broken::shootdown as broken;

/// What a ticket waits for a CPU to do: acknowledge the request `ack`
/// (the count of requests sent to it, this shootdown's included) at a
/// section's entry, or, if `or_exit`, leave the section it was in.
#[derive(Clone, Copy)]
struct WaitFor {
    ack: u64,
    or_exit: bool,
}

/// A CPU a ticket waits for, and what for.
struct PendingCpu {
    cpu: Arc<CpuTlbState>,
    until: WaitFor,
}

/// A shootdown begun by [`TlbDomain::flush_begin`]. Once [`FlushTicket::wait`]
/// returns, no CPU uses a translation that was removed before the flush
/// began, so what it pointed to may be freed.
///
/// Dropping the ticket waits as well, so a ticket never lets a caller go on
/// believing a flush complete that is not (including on unwinding).
#[must_use = "the flush is complete only after FlushTicket::wait"]
pub struct FlushTicket {
    /// The CPUs that were attached, not the initiator's, inside an access
    /// and not quiescent when the flush began.
    pending: Vec<PendingCpu>,
    /// This flush forced a barrier on the other running threads (an IPI
    /// each, with `membarrier`): it counts in [`TlbStats::barriers`].
    barrier: bool,
    /// The domain's counters, to add the wait to, if there is anyone to
    /// wait for.
    wait_ns: Option<Stripes>,
}

impl FlushTicket {
    /// True if beginning this flush forced a barrier on the other running
    /// threads of the process (there was a CPU of another thread to shoot
    /// down): the unmap statistics count these, the cost of a shootdown
    /// of a running CPU.
    pub(crate) fn forced_barrier(&self) -> bool {
        self.barrier
    }

    /// Waits until each CPU that was inside an access when the flush began
    /// has left that access, or acknowledged the request (at the entry of a
    /// later access, or at that access's own entry, which then emptied the
    /// TLB before any lookup), or become quiescent. A CPU outside an access
    /// is never waited for, however long its thread blocks.
    pub fn wait(self) {
        drop(self);
    }

    fn wait_pending(&mut self) {
        let Some(wait_ns) = self.wait_ns.take() else { return };
        let t0 = std::time::Instant::now();
        for p in self.pending.drain(..) {
            let mut i = 0;
            while !p.cpu.done(p.until) {
                spin_hint(i);
                i = i.saturating_add(1);
            }
        }
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        count(&wait_ns[stripe()].flush_wait_ns, ns);
    }
}

impl Drop for FlushTicket {
    fn drop(&mut self) {
        self.wait_pending();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A section's entry as `Cpu` makes it (with the fence): in, then,
    /// if a request is marked, the catch-up with the requests `seen`.
    fn enter(cpu: &CpuTlbState, seen: &mut u64) {
        cpu.section_begin(false);
        if cpu.flush_pending() != 0 {
            cpu.catch_up(seen, false);
        }
    }

    /// Runs `f` on another thread and fails if it does not return within a
    /// generous delay (a ticket that waits for a CPU that will never leave
    /// its access would otherwise hang the test).
    #[track_caller]
    fn returns(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok(), "the wait never returned");
    }

    #[test]
    fn only_a_cpu_inside_an_access_is_waited_for() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let (inside, outside, parked) = (CpuTlbState::new(), CpuTlbState::new(), CpuTlbState::new());
            [&inside, &outside, &parked].iter().for_each(|c| _ = dom.attach(c));
            parked.enter_quiescent();
            let light = barrier::reader_is_light();
            inside.section_begin(light);
            // `outside` entered and left an access: its thread may now block
            // anywhere for as long as it likes.
            outside.section_begin(light);
            outside.section_end();
            let ticket = dom.flush_begin(&[]);
            let s = dom.stats();
            assert_eq!((s.flushes, s.flush_requests, s.flush_waits, s.barriers + s.barriers_joined), (1, 3, 1, 1));
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                let start = std::time::Instant::now();
                ticket.wait();
                let waited = start.elapsed();
                tx.send(()).unwrap();
                waited
            });
            assert!(rx.recv_timeout(std::time::Duration::from_millis(50)).is_err(), "returned during the access");
            inside.section_end();
            assert!(rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok(), "the wait never returned");
            let waited = waiter.join().unwrap();
            // The wait is counted, and no longer than the waiter saw it take.
            // (Not "at least the 50 ms above": the waiter may start its wait
            // late on a loaded machine; 47.96 ms was seen.)
            let wait_ns = dom.stats().flush_wait_ns;
            assert!(wait_ns > 0 && u128::from(wait_ns) <= waited.as_nanos(), "{wait_ns} ns counted, {waited:?} seen");
            let before = dom.stats().flush_wait_ns;
            dom.flush(&[]);
            assert_eq!(dom.stats().flush_wait_ns, before, "a flush that waits for nobody adds nothing");
            [&inside, &outside, &parked].iter().for_each(|c| dom.detach(c));
            assert_eq!(dom.attached(), 0);
        }
    }

    #[test]
    fn the_next_access_policy_waits_for_an_idle_cpus_next_access() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::NextAccess, posting);
            let cpu = CpuTlbState::new();
            let mut seen = dom.attach(&cpu);
            let ticket = dom.flush_begin(&[]);
            assert_eq!(dom.stats().flush_waits, 1, "an idle, unparked CPU is waited for");
            // Entering the next access is not enough (its flush-request load
            // may predate the bump); its entry's acknowledgement is.
            cpu.section_begin(false);
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                ticket.wait();
                tx.send(()).unwrap();
            });
            assert!(rx.recv_timeout(std::time::Duration::from_millis(50)).is_err(), "returned during the access");
            cpu.section_end();
            assert!(rx.recv_timeout(std::time::Duration::from_millis(50)).is_err(), "returned with no acknowledgement");
            enter(&cpu, &mut seen);
            assert!(rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok(), "the wait never returned");
            cpu.section_end();
            waiter.join().unwrap();
            // Parked: not waited for.
            cpu.enter_quiescent();
            dom.flush(&[]);
            assert_eq!(dom.stats().flush_waits, 1);
        }
    }

    #[test]
    fn a_ticket_ends_with_the_section_even_if_the_cpu_enters_another() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let cpu = CpuTlbState::new();
            let mut seen = dom.attach(&cpu);
            cpu.section_begin(false);
            let ticket = dom.flush_begin(&[]);
            assert_eq!(dom.stats().flush_waits, 1);
            // Out of the access and into the next before the waiter looks: it
            // never sees the CPU outside, but the next entry acknowledged.
            cpu.section_end();
            enter(&cpu, &mut seen);
            returns(move || ticket.wait());
            cpu.section_end();
        }
    }

    /// The entry of the very section a ticket saw may be the one that
    /// acknowledges: the CPU had stored `inside` but not yet loaded its
    /// mark when the flush began (where membarrier's barrier may land). It
    /// then sees the request and empties its TLB before any lookup, so
    /// nothing the section does can use a translation from before it, and
    /// the ticket need not wait for its end.
    #[test]
    fn a_ticket_ends_at_the_entry_of_the_section_it_saw_once_that_entry_saw_the_request() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let cpu = CpuTlbState::new();
            let mut seen = dom.attach(&cpu);
            cpu.section_begin(false);
            let ticket = dom.flush_begin(&[]);
            assert_eq!(dom.stats().flush_waits, 1, "the CPU was seen inside");
            // The rest of the same entry.
            assert_ne!(cpu.flush_pending(), 0);
            assert!(cpu.catch_up(&mut seen, false), "the entry sees the request");
            returns(move || ticket.wait());
            assert!(cpu.in_section());
            cpu.section_end();
        }
    }

    #[test]
    fn a_cpu_quiescent_inside_an_access_is_not_waited_for() {
        for &posting in PostingPolicy::ALL {
            // A `with_slice` callback that calls into softmm: its section is
            // open, but its thread is in softmm, blocked perhaps on a lock the
            // initiator holds.
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let cpu = CpuTlbState::new();
            dom.attach(&cpu);
            cpu.section_begin(false);
            cpu.enter_quiescent();
            let t = dom.flush_begin(&[]);
            assert_eq!(dom.stats().flush_waits, 0);
            t.wait();
            // Quiescent only after begin noted it: the wait ends then.
            cpu.exit_quiescent();
            let t = dom.flush_begin(&[]);
            assert_eq!(dom.stats().flush_waits, 1);
            cpu.enter_quiescent();
            returns(move || t.wait());
            cpu.exit_quiescent();
            cpu.section_end();
        }
    }

    /// A section entered while its CPU is quiescent (a callback's, inside
    /// a call of its thread) lifts the levels entered so far and is waited
    /// for; a level entered inside it (a call from the section) counts
    /// again; a lifted level whose guard ends while the section is open
    /// leaves no level lifted that a later call entered; once the section
    /// ends, the CPU is quiescent again.
    #[test]
    fn a_section_entered_while_quiescent_is_waited_for() {
        let dom = TlbDomain::with_policies(ShootdownPolicy::default(), PostingPolicy::Locked);
        let cpu = CpuTlbState::new();
        dom.attach(&cpu);
        // Each flush's ticket, kept (dropping one waits) until the section
        // ends, with the flushes that noted the CPU so far.
        let mut tickets = Vec::new();
        let mut flush = |n| {
            tickets.push(dom.flush_begin(&[]));
            assert_eq!(dom.stats().flush_waits, n);
        };
        cpu.enter_quiescent();
        cpu.enter_quiescent();
        assert_ne!(cpu.flush_pending() & PENDING_QUIESCENT, 0, "the next entry takes the slow path");
        cpu.section_begin(false);
        assert!(cpu.lift_quiescence());
        flush(1);
        // A call from inside the section: quiescent, not waited for.
        cpu.enter_quiescent();
        flush(1);
        cpu.exit_quiescent();
        flush(2);
        // The guard whose level it lifted ends first.
        cpu.exit_quiescent();
        flush(3);
        // A later call's level counts.
        cpu.enter_quiescent();
        flush(3);
        cpu.exit_quiescent();
        cpu.section_end();
        // One level left, and the section over: quiescent again (a wait
        // for its next access, under `NextAccess`, ends); the bit is kept
        // in the mark for the next section, which lifts again.
        assert!(is_quiescent(cpu.quiescent.load(Ordering::Relaxed), cpu.in_section()));
        cpu.take_flush_pending(false);
        assert_ne!(cpu.flush_pending() & PENDING_QUIESCENT, 0);
        flush(3);
        returns(move || tickets.into_iter().for_each(FlushTicket::wait));
        cpu.exit_quiescent();
        // The last level's exit takes the bit back: the next entry takes
        // the slow path only for the requests.
        assert_eq!(cpu.flush_pending() & PENDING_QUIESCENT, 0);
        cpu.take_flush_pending(false);
        assert_eq!(cpu.flush_pending(), 0);
        assert!(!cpu.lift_quiescence());
        dom.detach(&cpu);
    }

    #[test]
    fn the_initiators_own_cpus_get_no_request_and_no_barrier() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let mine = CpuTlbState::new();
            dom.attach(&mine);
            mine.section_begin(false);
            dom.flush(std::slice::from_ref(&mine));
            mine.section_end();
            let s = dom.stats();
            assert_eq!((s.flushes, s.flush_requests, s.flush_waits, s.barriers + s.barriers_joined), (1, 0, 0, 0));
        }
    }

    #[test]
    fn a_targeted_flush_asks_only_its_targets_and_never_the_initiators() {
        let dom = TlbDomain::new();
        let (mine, filler, other) = (CpuTlbState::new(), CpuTlbState::new(), CpuTlbState::new());
        [&mine, &filler, &other].iter().for_each(|c| _ = dom.attach(c));
        let mine_only = |c: &Arc<CpuTlbState>| {
            let mut s = CpuSet::EMPTY;
            s.insert(c.slot().expect("a slot"));
            s
        };
        // Only the initiator's own CPU filled: its request, no other, no
        // barrier, no wait, even with the others inside an access.
        [&filler, &other].iter().for_each(|c| c.section_begin(false));
        dom.flush_begin_targets(std::slice::from_ref(&mine), &mine_only(&mine), FlushRange::ALL).wait();
        let s = dom.stats();
        assert_eq!((s.flushes, s.flush_requests, s.flush_waits, s.barriers, s.local_flushes), (1, 0, 0, 0, 1));
        assert_eq!((mine.flush_requests(), filler.flush_requests(), other.flush_requests()), (1, 0, 0));
        // Nobody filled: nothing at all.
        dom.flush_begin_targets(&[], &CpuSet::EMPTY, FlushRange::ALL).wait();
        assert_eq!(mine.flush_requests(), 1);
        // One other CPU filled: it alone is asked (and waited for).
        let t = dom.flush_begin_targets(std::slice::from_ref(&mine), &mine_only(&filler), FlushRange::ALL);
        let s = dom.stats();
        assert_eq!((s.flushes, s.flush_requests, s.flush_waits, s.barriers, s.local_flushes), (3, 1, 1, 1, 2));
        assert_eq!((mine.flush_requests(), filler.flush_requests(), other.flush_requests()), (1, 1, 0));
        filler.section_end();
        returns(move || t.wait());
        // Every CPU: as `flush_begin`.
        let t = dom.flush_begin_targets(std::slice::from_ref(&mine), &CpuSet::all(), FlushRange::ALL);
        assert_eq!((mine.flush_requests(), filler.flush_requests(), other.flush_requests()), (2, 2, 1));
        other.section_end();
        returns(move || t.wait());
        assert_eq!(dom.stats().flush_requests, 3);
    }

    #[test]
    fn flushes_of_two_domains_begin_together_and_are_waited_for() {
        for &posting in PostingPolicy::ALL {
            let doms = [
                TlbDomain::with_policies(ShootdownPolicy::default(), posting),
                TlbDomain::with_policies(ShootdownPolicy::default(), posting),
            ];
            let cpus = [CpuTlbState::new(), CpuTlbState::new()];
            doms.iter().zip(&cpus).for_each(|(d, c)| _ = d.attach(c));
            cpus.iter().for_each(|c| c.section_begin(false));
            let tickets = [doms[0].flush_begin(&[]), doms[1].flush_begin(&[])];
            // Both shootdowns were requested before either wait: the CPUs can
            // leave their accesses in parallel.
            for (d, c) in doms.iter().zip(&cpus) {
                assert_eq!((d.stats().flushes, c.flush_requests()), (1, 1));
                c.section_end();
            }
            returns(move || tickets.into_iter().for_each(FlushTicket::wait));
            let s = doms[1].stats();
            assert_eq!((s.flushes, s.flush_requests, s.flush_waits), (1, 1, 1));
        }
    }

    /// A lock-free posting reads the published list: an attach or detach
    /// holding the list's lock (here, the test) holds no shootdown up.
    #[test]
    fn a_lock_free_flush_takes_no_list_lock() {
        for &posting in &[PostingPolicy::LockFree, PostingPolicy::SharedBarrier] {
            let dom = Arc::new(TlbDomain::with_policies(ShootdownPolicy::default(), posting));
            let cpu = CpuTlbState::new();
            dom.attach(&cpu);
            let held = dom.cpus.lock();
            let d = dom.clone();
            returns(move || d.flush(&[]));
            drop(held);
            assert_eq!(cpu.flush_requests(), 1, "{posting:?}");
            let s = dom.stats();
            assert_eq!((s.flushes, s.flush_requests, s.barriers + s.barriers_joined), (1, 1, 1), "{posting:?}");
        }
    }

    /// Adaptive posting reads the mode in the mark its post returns: a CPU
    /// whose entries fence (its catch-up left `PENDING_ALWAYS`) costs no
    /// barrier, and is still waited for while inside; the other policies
    /// run the barrier all the same.
    #[test]
    fn an_adaptive_flush_of_fencing_cpus_runs_no_barrier() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let cpu = CpuTlbState::new();
            let mut seen = dom.attach(&cpu);
            dom.flush(&[]);
            let s = dom.stats();
            assert_eq!((s.barriers + s.barriers_joined, s.barriers_skipped), (1, 0), "{posting:?}: a light CPU");
            // The CPU switches to fence mode in a section's entry, and
            // stays inside.
            cpu.section_begin(false);
            assert!(cpu.catch_up(&mut seen, true));
            let ticket = dom.flush_begin(&[]);
            let s = dom.stats();
            let skipped = posting == PostingPolicy::Adaptive;
            assert_eq!(s.barriers + s.barriers_joined, if skipped { 1 } else { 2 }, "{posting:?}");
            assert_eq!(s.barriers_skipped, u64::from(skipped), "{posting:?}");
            assert_eq!(s.flush_waits, 1, "{posting:?}: the section open at the switch is waited for");
            assert!(!ticket.forced_barrier() || !skipped);
            cpu.section_end();
            returns(move || ticket.wait());
        }
    }

    #[test]
    fn a_dropped_ticket_waits_too() {
        for &posting in PostingPolicy::ALL {
            let dom = TlbDomain::with_policies(ShootdownPolicy::default(), posting);
            let cpu = CpuTlbState::new();
            dom.attach(&cpu);
            cpu.section_begin(false);
            let ticket = dom.flush_begin(&[]);
            let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let waiter = {
                let ended = ended.clone();
                std::thread::spawn(move || {
                    drop(ticket);
                    // Only the section's end below can have let the drop return.
                    assert!(ended.load(std::sync::atomic::Ordering::SeqCst));
                })
            };
            std::thread::sleep(std::time::Duration::from_millis(20));
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            cpu.section_end();
            waiter.join().unwrap();
        }
    }
}
