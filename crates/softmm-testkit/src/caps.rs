//! Dropping the calling process's capabilities, for tests that compare
//! softmm with the host kernel as an ordinary process sees it (the host
//! differential's unprivileged runner, `replay_random`'s runner without
//! `CAP_IPC_LOCK`).
//!
//! Raw system calls on the stack only: callable in a forked child that must
//! not allocate.

/// `CAP_IPC_LOCK`: locking memory past `RLIMIT_MEMLOCK`.
pub const CAP_IPC_LOCK: u32 = 14;

/// The set a [`drop_capabilities`] takes away, one bit per capability
/// (`1 << CAP_*`): the two 32-bit words of `_LINUX_CAPABILITY_VERSION_3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps(pub u64);

impl Caps {
    /// Every capability.
    pub const ALL: Caps = Caps(u64::MAX);

    /// Capability `cap` (`CAP_*`) alone.
    pub const fn one(cap: u32) -> Caps {
        Caps(1 << cap)
    }
}

/// `_LINUX_CAPABILITY_VERSION_3`'s header (`cap_user_header_t`).
#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

/// One word of `_LINUX_CAPABILITY_VERSION_3`'s data (`cap_user_data_t`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const VERSION_3: u32 = 0x2008_0522;

/// Removes `drop` from the calling thread's effective, permitted and
/// inheritable sets (`capget`, then `capset`), and, with `bounding`, from
/// the bounding set too (`PR_CAPBSET_DROP`), so that a program it execs
/// does not regain them as root regains its permitted set at `execve`.
/// Keeps every other capability. A bounding set's drop that fails is not
/// reported: it needs `CAP_SETPCAP`, which a process that is not root
/// lacks, along with what it would drop; so does a capability the kernel
/// does not know.
///
/// Allocates nothing. On failure, returns the system call's name and
/// `errno`, and the sets are as they were.
pub fn drop_capabilities(drop: Caps, bounding: bool) -> Result<(), (&'static str, i32)> {
    if bounding {
        for cap in (0..64).filter(|c| drop.0 & (1 << c) != 0) {
            // SAFETY: a plain system call with integer arguments.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        }
    }
    let mut hdr = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capget writes the header and two data structures of the
    // _LINUX_CAPABILITY_VERSION_3 layout, which these are.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) } != 0 {
        return Err(("capget", errno()));
    }
    for (word, d) in data.iter_mut().enumerate() {
        let keep = !((drop.0 >> (32 * word)) as u32);
        d.effective &= keep;
        d.permitted &= keep;
        d.inheritable &= keep;
    }
    // SAFETY: capset reads the same structures.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) } != 0 {
        return Err(("capset", errno()));
    }
    Ok(())
}

fn errno() -> i32 {
    // SAFETY: errno's location is valid for the calling thread.
    unsafe { *libc::__errno_location() }
}
