//! Asymmetric fences for the access-section handshake of [`super`].
//!
//! A CPU entering an access publishes that it is inside, then loads the
//! mark of its pending flush requests; an initiator bumps and marks the
//! requests, then loads whether each CPU is inside. That store-then-load on both sides (a Dekker handshake) needs a
//! full fence on both sides, and a fence on every access would cost the TLB
//! hit several times its budget. The known way out, userspace RCU's: the
//! reader side is only a compiler barrier, and the initiator, which is rare,
//! forces a full barrier on every running thread of the process with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (an IPI to each CPU
//! running one of its threads; a thread not running passes a full barrier
//! when it is scheduled in). Either the reader's store is visible to the
//! initiator's later load, or the reader's later load of its mark sees the
//! new one.
//!
//! Where the expedited command cannot be registered (an old kernel, a
//! seccomp filter, another OS), under loom (which models fences, not
//! system calls) and under Miri, both sides use a SeqCst fence. The choice
//! is made once per process, before the first CPU exists, and every CPU
//! copies it at creation ([`reader_is_light`]), so the fast path branches on
//! a field it already has in cache. The `membarrier` crate does the same
//! thing, but decides on every call through a lazy static, falls back to an
//! `mprotect` trick instead of a fence, and has no loom or Miri path.
//!
//! Under loom the light reader is modelled too, so that the models can
//! check protocols whose soundness rests on membarrier (a barrier shared
//! by several initiators): the reader's compiler barrier is an AcqRel RMW
//! of one model-wide word, and the initiator's barrier a SeqCst fence then
//! an AcqRel RMW of the same word. The RMWs are ordered one way or the
//! other, as the IPI's full barrier lands before or after the reader's
//! barrier point: either what the initiator did before its barrier
//! happens before the reader's next load, or the reader's store before the
//! point happens before the initiator's later loads. (An IPI landing
//! elsewhere in the reader's code gives one of the same two orders to the
//! accesses around the point.) A light reader against an initiator that
//! runs no barrier is then a store-buffering race loom finds. The real
//! `Cpu` is never light under loom ([`reader_is_light`] is false there).

use crate::sync::{fence, Ordering};

// The word whose RMWs model membarrier's IPI against light readers.
#[cfg(loom)]
loom::lazy_static! {
    static ref MODEL_IPI: crate::sync::AtomicU64 = crate::sync::AtomicU64::new(0);
}

/// True if readers may use a compiler barrier alone, because
/// [`initiator_barrier`] forces a full barrier on every running thread.
/// Decided once per process; the first call registers the process with the
/// kernel, unless the environment variable `SOFTMM_SYMMETRIC_FENCES` is
/// set, which selects SeqCst fences on both sides.
pub(crate) fn reader_is_light() -> bool {
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    {
        static LIGHT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // `SOFTMM_SYMMETRIC_FENCES` (any value) selects the fallback, so the
        // lab and the benches can show both designs side by side.
        *LIGHT.get_or_init(|| std::env::var_os("SOFTMM_SYMMETRIC_FENCES").is_none() && membarrier::register())
    }
    #[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
    {
        false
    }
}

/// The reader's half: a compiler barrier where the initiator forces the
/// full barrier (`light`, from [`reader_is_light`]), a SeqCst fence where it
/// cannot.
#[inline(always)]
pub(crate) fn reader_barrier(light: bool) {
    if light {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        #[cfg(loom)]
        MODEL_IPI.fetch_add(0, Ordering::AcqRel);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The initiator's half: a full barrier on the calling thread and on every
/// running thread of the process (with [`reader_is_light`]), or a SeqCst
/// fence on the calling thread (without, every reader fencing itself).
pub(crate) fn initiator_barrier() {
    // SeqCst fence first in any case: it orders the requests' bumps before
    // the loads of the sections on this thread, which is all the fallback
    // needs and what loom checks.
    fence(Ordering::SeqCst);
    #[cfg(loom)]
    MODEL_IPI.fetch_add(1, Ordering::AcqRel);
    if reader_is_light() {
        #[cfg(all(target_os = "linux", not(loom), not(miri)))]
        membarrier::expedited();
    }
}

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
mod membarrier {
    // From include/uapi/linux/membarrier.h.
    const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    fn sys_membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier(2) takes two integers (command, flags) and a
        // CPU id ignored without MEMBARRIER_CMD_FLAG_CPU; it touches no
        // memory of ours.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long, 0 as libc::c_long) }
    }

    /// Registers the process for private expedited barriers; true if the
    /// kernel supports them and the registration succeeded.
    pub(super) fn register() -> bool {
        let cmds = sys_membarrier(MEMBARRIER_CMD_QUERY);
        cmds >= 0
            && cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
            && sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    }

    /// A full barrier on every running thread of the process.
    pub(super) fn expedited() {
        // The only documented failures are an unregistered process (EPERM)
        // and an unknown command (EINVAL), both excluded by `register`.
        // Readers already rely on it, so there is no safe way to go on.
        if sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 {
            eprintln!("softmm: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after registration");
            std::process::abort();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn the_initiator_barrier_works_in_either_mode() {
        // Registration is idempotent and the barrier returns (an abort
        // would fail the test binary).
        let light = super::reader_is_light();
        assert_eq!(super::reader_is_light(), light);
        super::initiator_barrier();
        super::reader_barrier(light);
    }
}
