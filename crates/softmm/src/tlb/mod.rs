//! TLB shootdown: how a change that removes or narrows a translation makes
//! every CPU drop its cached copy before the frame or page table is reused.
//!
//! # Protocol
//!
//! Each address space has a [`TlbDomain`]: the list of attached CPUs. Each
//! CPU has a [`CpuTlbState`]: an `inside` word, 1 while the CPU is inside
//! an access; `flush_req`, the flush requests sent to it; `flush_pending`,
//! non-zero when a request came since the CPU last looked; `flush_ack`, the
//! requests it has acted on; and a `quiescent` depth. A CPU is quiescent,
//! and never waited for, whenever it is outside an access: its thread may
//! block anywhere for as long as it likes. This is RCU's read-side critical
//! section, with the TLB as the protected data.
//!
//! * **CPU, each access section** (one accessor call, one page of a copy,
//!   one `with_slice` callback, one held [`crate::Translation`], one
//!   [`crate::Section`] of many accesses):
//!   [`CpuTlbState::section_begin`] (`inside = 1`, then a barrier), load
//!   `flush_pending`; if it is not zero, take it (swap in 0), load
//!   `flush_req` and, if it moved, drop the TLB entries the requests
//!   cover (every entry, or the pages each ranged request names, see
//!   [`FlushRange`]) and store
//!   `flush_ack = flush_req` (Release); translate (TLB or walk) and access;
//!   [`CpuTlbState::section_end`] (`inside = 0`, Release). A page fault
//!   leaves the section for the fault handler and begins a new one after
//!   it. Entry and exit each store a constant and load nothing but the
//!   mark: a one-access section costs two stores, a compiler barrier and a
//!   compare with zero.
//! * **Initiator** (after clearing or narrowing PTEs under their locks), in
//!   two steps so that it can shoot down several address spaces at once:
//!   1. [`TlbDomain::flush_begin`]: on every attached CPU (the list read
//!      under the CPU-list lock, or, under a lock-free [`PostingPolicy`],
//!      from its epoch-published copy after a SeqCst fence), `flush_req +=
//!      1`, then `flush_pending |= 1` (Release); if any attached CPU is not
//!      its own, one process-wide barrier (its own, or, under
//!      [`PostingPolicy::SharedBarrier`], one that began after it posted,
//!      `shared_barrier.rs`), then for each such CPU count one flush
//!      request, and note it in the [`FlushTicket`], with its request's
//!      number `R`, if it is inside an access and not quiescent.
//!   2. [`FlushTicket::wait`]: for each noted CPU, wait until `inside` is 0
//!      (the section seen is over: a 0 read after the 1 is a later store)
//!      or `flush_ack >= R` (an entry saw the request and emptied the TLB
//!      before any lookup: a later section's, or the seen section's own,
//!      which then uses no translation from before the request), or it
//!      became quiescent. Only
//!      then may it free frames and tables. The acknowledgement is what
//!      bounds the wait for a CPU that runs one section after another and
//!      is outside for a few instructions at a time.
//!
//!   [`TlbDomain::flush`] is the two back to back.
//! * **The handshake.** CPU: store `inside`, barrier, load the mark.
//!   Initiator: store the request and the mark, barrier, load `inside`.
//!   Either the initiator sees the CPU inside (and waits for the section to
//!   end or the request to be acknowledged, whose stores then happen before
//!   the free by Release/Acquire), or the CPU's load sees the mark and it
//!   drops its entries before using one; its walks then see the PTEs
//!   cleared before the bump (Acquire). The mark is taken before the
//!   requests are loaded, so a request sent in between marks the next
//!   entry again. The barriers are asymmetric (`barrier.rs`): a compiler
//!   barrier on the CPU's side and `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`
//!   on the initiator's, which runs a full barrier on every thread of the
//!   process; where that is unavailable (and under loom and Miri), a SeqCst
//!   fence on both, and the mark is never taken down to zero, so that
//!   every entry takes the path that fences.
//! * **Quiescent CPU** (parked, or its thread inside softmm: a syscall, a
//!   fault, an attach): `quiescent += 1` on entry, `-= 1` on exit. This
//!   matters only for a CPU whose section is open while its thread calls
//!   into softmm (a `with_slice` callback that unmaps, or faults through
//!   another CPU): the call may block on a lock the initiator holds, so the
//!   initiator must not wait for it, and the callback's frame is kept by a
//!   frame reference instead. When the thread leaves softmm, every one of
//!   its CPUs whose section is still open has its TLB emptied
//!   ([`QuiescentGuard`]'s drop): a flush may have skipped it meanwhile,
//!   and the accesses of a [`crate::Section`] do not check the requests.
//!   A section *entered* while its CPU is quiescent (a callback that
//!   softmm runs inside the call accesses memory through a CPU of the
//!   thread) is an access like any other: each level entered marks the
//!   CPU's pending word, so that the entry takes the slow path, where
//!   [`CpuTlbState::lift_quiescence`] counts the levels entered as lifted
//!   (a CPU is quiescent while more are entered than lifted, or while any
//!   is entered and no section is open), fences, and only then catches up.
//! * **Attach** (under the list lock): read `flush_req`, with an empty TLB;
//!   publish the list, then a SeqCst fence.
//!   **Detach** (under the list lock): remove it from the list and publish
//!   it; then, with the TLB emptied, acknowledge every request so far. Both
//!   happen outside any access of the CPU (they take it by `&mut`). A CPU
//!   that attaches after begin has read the list starts empty, and its
//!   walks see the cleared entries: under the lock, it takes the lock after
//!   begin released it; without, the publication and the initiator's load
//!   of the list are Dekker's, each after its own fence ([`TlbDomain`]'s
//!   `# Protocol`). A lock-free initiator that still sees a detached CPU
//!   sends it a needless request.
//!   A ticket may outlive the CPU's stay in the domain: the detach's
//!   acknowledgement ends its wait.
//!
//! * **Fence mode** ([`PostingPolicy::Adaptive`], `fence_mode.rs`): a CPU
//!   shot down often leaves `PENDING_ALWAYS` in its mark with the swap that
//!   takes it, so that its entries fence; an initiator reads the mode in
//!   the old mark its post returns and, when every CPU of another thread
//!   it posted to fences, runs a SeqCst fence of its own instead of the
//!   barrier.
//!
//! [`ShootdownPolicy::NextAccess`] keeps softmm's first protocol beside
//! this one for the lab: it also waits for a CPU outside an access, until
//! its next entry acknowledges the request (the acknowledgement at the
//! next MMU call), so a thread that blocks with an unparked CPU holds
//! shootdowns up.
//!
//! A thread's own CPUs are passed as `mine` (`quiescent.rs`), so no
//! shootdown waits for a CPU whose thread is the one waiting.
//!
//! [`TlbDomain::flush_begin_targets`] runs the same handshake with only the
//! CPUs that filled from the changed entries ([`CpuSet`], `targets.rs`,
//! which states how fills and changes record and collect them); with none
//! but the initiator's, it sends no request and issues no barrier. Its
//! requests may name a range ([`FlushRange`]): the initiator bumps
//! `flush_req`, then stores the range in the CPU's slot for that request
//! number, tagged with it; a catch-up drops only the ranges of its
//! requests if every slot still holds its request's tag, else everything.
//! A slot read before its store holds an older tag: a whole flush, never a
//! kept entry.
//!
//! The protocol is modelled with loom in `loom_tests.rs`, on this code.

mod barrier;
mod fence_mode;
#[cfg(all(test, loom))]
mod loom_tests;
// Without the rest of the crate (a loom build), only the models use it.
#[cfg_attr(loom, allow(dead_code))]
mod quiescent;
mod shared_barrier;
mod shootdown;
mod soft_tlb;
mod targets;
mod unreachable;

// The loom models' broken switches: `sync/broken.rs`.
#[cfg(loom)]
pub(crate) use crate::sync::broken::tlb as broken;

pub(crate) use barrier::{initiator_barrier, reader_barrier, reader_is_light};
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use fence_mode::{EntryBarrier, TUNING};
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use quiescent::{register_thread_cpu, unregister_thread_cpu, with_thread_cpus, QuiescentGuard};
pub use shootdown::{CpuTlbState, FlushRange, FlushTicket, PostingPolicy, ShootdownPolicy, TlbDomain, TlbStats};
pub use soft_tlb::TlbEntryAbi;
pub(crate) use soft_tlb::{SoftTlb, TLB_ENTRIES};
pub use targets::{CpuSet, ShootdownTargets};
pub(crate) use unreachable::UnreachableRanges;

/// True if shootdowns use asymmetric fences in this process: accesses pay
/// a compiler barrier only, and each flush that has another thread's CPU
/// to ask issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`. False
/// where the kernel refuses it, or when the environment variable
/// `SOFTMM_SYMMETRIC_FENCES` is set when the first `Cpu` is made: every
/// access then pays a SeqCst fence. Decided once per process.
pub fn fences_are_asymmetric() -> bool {
    barrier::reader_is_light()
}
