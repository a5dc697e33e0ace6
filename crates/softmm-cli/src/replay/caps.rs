//! What a log says of the recorded process's privileges, which strace does
//! not print: a call Linux refuses without a capability or past a limit,
//! recorded as a success, implies it. `CAP_SYS_RAWIO`: a fixed `mmap` or
//! `mremap` target below `mmap_min_addr`. `CAP_IPC_LOCK` (or a memlock
//! limit high enough, which the replay cannot tell apart): a successful
//! `mlock`, `mlock2` or `MAP_LOCKED` mapping longer than the default
//! limit by itself.

use softmm::uapi::*;
use softmm::MmConfig;

use super::parse::{Call, Record, Ret};

/// The privileges the replayed address spaces get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Caps {
    pub(super) sys_rawio: bool,
    pub(super) ipc_lock: bool,
}

impl Caps {
    /// What the successful calls of `recs` imply under `config`'s limits.
    pub(super) fn infer(recs: &[Record], config: &MmConfig) -> Caps {
        let mut caps = Caps::default();
        for r in recs {
            let Ret::Val(v) = r.ret else { continue };
            match r.call {
                Call::Mmap { flags, len, .. } => {
                    caps.sys_rawio |= flags & MAP_FIXED != 0 && v < config.mmap_min_addr;
                    caps.ipc_lock |= flags & MAP_LOCKED != 0 && len > config.memlock_limit;
                }
                Call::Mremap { flags, .. } => caps.sys_rawio |= flags & MREMAP_FIXED != 0 && v < config.mmap_min_addr,
                Call::Mlock { addr, len, .. } => caps.ipc_lock |= locked_bytes(addr, len) > config.memlock_limit,
                _ => {}
            }
        }
        caps
    }

    /// `config` with these privileges.
    pub(super) fn apply(self, config: MmConfig) -> MmConfig {
        let (rawio, ipc_lock) = (config.cap_sys_rawio || self.sys_rawio, config.cap_ipc_lock || self.ipc_lock);
        config.cap_sys_rawio(rawio).cap_ipc_lock(ipc_lock)
    }
}

/// The bytes an `mlock(addr, len)` locks: Linux's `PAGE_ALIGN(len +
/// offset_in_page(addr))`, wrapping (a length near 2^64 locks nothing).
fn locked_bytes(addr: u64, len: u64) -> u64 {
    softmm::page_align(len.wrapping_add(addr & (softmm::PAGE_SIZE - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_linux_refuses_without_the_capability_implies_it() {
        let log = super::super::parse::parse(
            "7 mmap(NULL, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = 0\n\
             7 mlock(0x7f0000000000, 16777216) = 0\n",
        );
        let config = MmConfig::default();
        assert_eq!(Caps::infer(&log.records, &config), Caps { sys_rawio: true, ipc_lock: true });
        let refused = super::super::parse::parse(
            "7 mmap(NULL, 4096, PROT_READ, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED, -1, 0) = -1 EPERM (Operation not permitted)\n\
             7 mlock(0x7f0000000000, 4096) = 0\n",
        );
        assert_eq!(Caps::infer(&refused.records, &config), Caps::default());
        let c = Caps { sys_rawio: true, ipc_lock: false }.apply(config);
        assert!(c.cap_sys_rawio && !c.cap_ipc_lock);
    }

    /// Found by `tests/replay_random` with locks: Linux locks
    /// `PAGE_ALIGN(len + offset in page)` bytes, so a length of 2^64 - 4095
    /// locks nothing (it succeeds without the capability); read as the
    /// number strace prints, it implied `CAP_IPC_LOCK`, and a later lock
    /// refused for the limit (ENOMEM) then failed on its wrapping range
    /// (EINVAL) in the replay.
    #[test]
    fn a_lock_whose_length_rounds_to_nothing_implies_no_capability() {
        let log = super::super::parse::parse(
            "7 mlock(0x3000f6000, 18446744073709547521) = 0\n\
             7 mlock2(0x3000f6000, 18446744073709547521, MLOCK_ONFAULT) = 0\n\
             7 mlock(0x3000f6000, 0) = 0\n",
        );
        assert_eq!(Caps::infer(&log.records, &MmConfig::default()), Caps::default());
        // Past the limit by its offset in the page: 2049 pages.
        let log = super::super::parse::parse("7 mlock(0x3000f6800, 8388608) = 0\n");
        assert!(Caps::infer(&log.records, &MmConfig::default()).ipc_lock);
    }
}
