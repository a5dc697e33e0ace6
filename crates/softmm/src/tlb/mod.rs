//! TLB shootdown: how a change that removes or narrows a translation makes
//! every CPU drop its cached copy before the frame or page table is reused.
//!
//! # Protocol
//!
//! Each address space has a [`TlbDomain`]: a flush generation `gen` and the
//! list of attached CPUs. Each CPU has a [`CpuTlbState`]: an `acked`
//! generation, a `quiescent` depth and a `detaches` count.
//!
//! * **Initiator** (after clearing or narrowing PTEs under their locks), in
//!   two steps so that it can shoot down several address spaces at once:
//!   1. [`TlbDomain::flush_begin`]: `target = gen.fetch_add(1) + 1`, a
//!      SeqCst fence, then, under the CPU-list lock, for every attached CPU
//!      but its own: count one flush request, and if neither
//!      `acked >= target` nor `quiescent > 0`, note the CPU and its
//!      `detaches` count in the [`FlushTicket`]. The lock is dropped before
//!      returning.
//!   2. [`FlushTicket::wait`]: for each noted CPU, wait until
//!      `acked >= target`, `quiescent > 0`, or its `detaches` count moved.
//!      Only then may it free frames and tables.
//!
//!   [`TlbDomain::flush`] is the two back to back.
//! * **CPU, at every MMU call** (the start of each translation): load `gen`
//!   (Acquire); if it moved, drop every TLB entry, then publish `acked = gen`
//!   (Release). The access that was in flight when the initiator cleared the
//!   PTE finished before this MMU call, so after the ack no stale translation
//!   is in use.
//! * **Quiescent CPU** (parked, or blocked inside softmm: in a fault's slow
//!   path or a syscall): `quiescent += 1` on entry; on exit `quiescent -= 1`
//!   and a SeqCst fence, so the next MMU call's load of `gen` is ordered after
//!   it. The two fenced pairs (initiator: store `gen`, fence, load
//!   `quiescent`, at begin or at any later time in the wait; CPU: store
//!   `quiescent`, fence, load `gen`) form a Dekker handshake: either the
//!   initiator sees the CPU running and waits for its ack, or the CPU sees
//!   the new generation and flushes before it uses a stale entry. Fences
//!   rather than SeqCst accesses because that is the form loom can check.
//! * **Attach** (under the list lock): `acked = gen`, with an empty TLB.
//!   **Detach** (under the list lock, with the CPU's TLB dropped before its
//!   next access): remove it from the list, then `detaches += 1` (Release).
//!
//! Because no lock is held between begin and wait, a CPU may leave the
//! domain while a ticket waits for it, and attach to another domain whose
//! generations then fill its `acked`: compared with this domain's target,
//! that value could keep the wait spinning forever. The `detaches` count
//! read under the lock at begin ends the wait instead: once it moves, the
//! CPU has left and holds nothing of this domain; its accesses through the
//! domain happen before the increment (Release), which the waiter reads
//! with Acquire. The converse confusion is harmless: an `acked` at or above
//! the target written while the CPU was elsewhere was written after it left.
//! A CPU that attaches after begin has read the list is not waited for: it
//! starts with an empty TLB, and its attach takes the lock after begin
//! released it, so its walks see the entries cleared before begin.
//!
//! A thread's own CPUs are made quiescent for every call into softmm and are
//! passed as `mine` (`quiescent.rs`), so no shootdown waits for a CPU whose
//! thread is the one waiting, or is blocked on a lock the waiter holds.
//!
//! The protocol is modelled with loom in `loom_tests.rs`, on this code.

#[cfg(all(test, loom))]
mod loom_tests;
// Without the rest of the crate (a loom build), only the models use it.
#[cfg_attr(loom, allow(dead_code))]
mod quiescent;
mod shootdown;

#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use quiescent::{register_thread_cpu, unregister_thread_cpu, with_thread_cpus, QuiescentGuard};
pub use shootdown::{CpuTlbState, FlushTicket, TlbDomain, TlbStats};
