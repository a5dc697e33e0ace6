//! TLB shootdown: how a change that removes or narrows a translation makes
//! every CPU drop its cached copy before the frame or page table is reused.
//!
//! # Protocol
//!
//! Each address space has a flush generation `gen`. Each attached CPU has an
//! `acked` generation and a `quiescent` depth.
//!
//! * **Initiator** (after clearing or narrowing PTEs under their locks):
//!   `target = gen.fetch_add(1) + 1`, a SeqCst fence, then for every attached
//!   CPU but its own: count one flush request, and wait until
//!   `acked >= target` or `quiescent > 0`. Only then may it free frames and
//!   tables.
//! * **CPU, at every MMU call** (the start of each translation): load `gen`
//!   (Acquire); if it moved, drop every TLB entry, then publish `acked = gen`
//!   (Release). The access that was in flight when the initiator cleared the
//!   PTE finished before this MMU call, so after the ack no stale translation
//!   is in use.
//! * **Quiescent CPU** (parked, or blocked inside softmm: in a fault's slow
//!   path or a syscall): `quiescent += 1` on entry; on exit `quiescent -= 1`
//!   and a SeqCst fence, so the next MMU call's load of `gen` is ordered after
//!   it. The two fenced pairs (initiator: store `gen`, fence, load
//!   `quiescent`; CPU: store `quiescent`, fence, load `gen`) form a Dekker
//!   handshake: either the initiator sees the CPU running and waits for its
//!   ack, or the CPU sees the new generation and flushes before it uses a
//!   stale entry. Fences rather than SeqCst accesses because that is the form
//!   loom can check.
//!
//! A thread's own CPUs are made quiescent for every call into softmm and are
//! passed as `mine` ([`quiescent`]), so no shootdown waits for a CPU whose
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
pub use shootdown::{CpuTlbState, TlbDomain, TlbStats};
