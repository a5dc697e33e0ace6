//! Errors with Linux's errno semantics, and the signals a faulting access raises.

/// The error of a syscall-like call: each variant is the errno Linux returns for
/// the same input, and [`Errno::code`] gives its number. New calls may bring
/// new errnos, so a `match` on it needs a wildcard arm (or use `code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Errno {
    /// `EPERM`: operation not permitted (e.g. a fixed mapping below `mmap_min_addr`).
    #[error("EPERM: operation not permitted")]
    Perm,
    /// `EBADF`: the file cannot be used this way.
    #[error("EBADF: bad file descriptor")]
    BadF,
    /// `EAGAIN`: a resource limit would be exceeded (e.g. the memlock limit).
    #[error("EAGAIN: resource temporarily unavailable")]
    Again,
    /// `ENOMEM`: no memory, no room in the address space, or an unmapped range.
    #[error("ENOMEM: cannot allocate memory")]
    NoMem,
    /// `EACCES`: the file's open mode forbids the requested protection.
    #[error("EACCES: permission denied")]
    Acces,
    /// `EFAULT`: a bad address.
    #[error("EFAULT: bad address")]
    Fault,
    /// `EBUSY`: the resource is busy (e.g. pinned pages).
    #[error("EBUSY: device or resource busy")]
    Busy,
    /// `EEXIST`: the range is already mapped (`MAP_FIXED_NOREPLACE`).
    #[error("EEXIST: file exists")]
    Exist,
    /// `ENODEV`: the file type does not support mapping.
    #[error("ENODEV: no such device")]
    NoDev,
    /// `EINVAL`: an invalid argument.
    #[error("EINVAL: invalid argument")]
    Inval,
    /// `EFBIG`: the file would grow past its limit.
    #[error("EFBIG: file too large")]
    FBig,
    /// `EOVERFLOW`: an offset plus a length overflows.
    #[error("EOVERFLOW: value too large for defined data type")]
    Overflow,
    /// `EOPNOTSUPP`: unknown flags with `MAP_SHARED_VALIDATE`.
    #[error("EOPNOTSUPP: operation not supported")]
    OpNotSupp,
    /// `EIO`: `mbind` with `MPOL_MF_STRICT` found pages it could not place.
    #[error("EIO: input/output error")]
    Io,
    /// `ENOSPC`: a hugetlbfs `fallocate` found no free huge page.
    #[error("ENOSPC: no space left on device")]
    NoSpc,
    /// `ENOENT`: no such watchpoint (`watchpoint_remove`).
    #[error("ENOENT: no such file or directory")]
    NoEnt,
}

impl Errno {
    /// Every errno softmm returns, for tables that map numbers back.
    pub const ALL: &'static [Errno] = &[
        Errno::Perm,
        Errno::BadF,
        Errno::Again,
        Errno::NoMem,
        Errno::Acces,
        Errno::Fault,
        Errno::Busy,
        Errno::Exist,
        Errno::NoDev,
        Errno::Inval,
        Errno::FBig,
        Errno::Overflow,
        Errno::OpNotSupp,
        Errno::Io,
        Errno::NoSpc,
        Errno::NoEnt,
    ];

    /// The errno whose number ([`Errno::code`]) is `code`, if softmm
    /// returns it.
    pub fn from_code(code: i32) -> Option<Errno> {
        Errno::ALL.iter().copied().find(|e| e.code() == code)
    }

    /// The errno number, as `libc` defines it.
    pub fn code(self) -> i32 {
        match self {
            Errno::Perm => libc::EPERM,
            Errno::BadF => libc::EBADF,
            Errno::Again => libc::EAGAIN,
            Errno::NoMem => libc::ENOMEM,
            Errno::Acces => libc::EACCES,
            Errno::Fault => libc::EFAULT,
            Errno::Busy => libc::EBUSY,
            Errno::Exist => libc::EEXIST,
            Errno::NoDev => libc::ENODEV,
            Errno::Inval => libc::EINVAL,
            Errno::FBig => libc::EFBIG,
            Errno::Overflow => libc::EOVERFLOW,
            Errno::OpNotSupp => libc::EOPNOTSUPP,
            Errno::Io => libc::EIO,
            Errno::NoSpc => libc::ENOSPC,
            Errno::NoEnt => libc::ENOENT,
        }
    }
}

/// The result of a syscall-like call.
pub type Result<T> = core::result::Result<T, Errno>;

/// The `si_code` of a SIGSEGV. More codes may come (`SEGV_PKUERR`), so a
/// `match` on it needs a wildcard arm (or use [`SegvCode::code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SegvCode {
    /// `SEGV_MAPERR`: no mapping at the address.
    MapErr,
    /// `SEGV_ACCERR`: a mapping exists but forbids the access.
    AccErr,
    /// `SI_KERNEL`: a non-canonical address (x86-64 raises a general
    /// protection fault, not a page fault); Linux reports address 0.
    Kernel,
}

impl SegvCode {
    /// The `si_code` number.
    pub fn code(self) -> i32 {
        match self {
            SegvCode::MapErr => 1,
            SegvCode::AccErr => 2,
            SegvCode::Kernel => 0x80,
        }
    }
}

/// Why a guest memory access did not complete: the signal Linux would deliver.
/// More signals may come, so a `match` on it needs a wildcard arm (or use
/// [`Fault::signal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Fault {
    /// SIGSEGV at `addr`.
    #[error("SIGSEGV ({code:?}) at {addr:#x}")]
    Segv {
        /// The faulting guest address.
        addr: u64,
        /// `SEGV_MAPERR` or `SEGV_ACCERR`.
        code: SegvCode,
    },
    /// SIGBUS with `BUS_ADRERR` at `addr`: a file page past the end of the file.
    #[error("SIGBUS (BUS_ADRERR) at {addr:#x}")]
    Bus {
        /// The faulting guest address.
        addr: u64,
    },
    /// SIGBUS with `BUS_ADRALN`: an atomic access that is not naturally aligned.
    #[error("SIGBUS (BUS_ADRALN) at {addr:#x}")]
    Unaligned {
        /// The faulting guest address.
        addr: u64,
    },
    /// The fault needed a frame and none was free (`VM_FAULT_OOM`).
    #[error("out of memory at {addr:#x}")]
    Oom {
        /// The faulting guest address.
        addr: u64,
    },
    /// Not a signal: an access that overlaps a watchpoint trapping its kind
    /// (`AddressSpace::watchpoint_insert`), reported before the access is
    /// made; [`crate::Cpu::last_fault`] says its kind, first byte and size.
    /// The embedder reports it, and resumes with
    /// [`crate::Cpu::pass_watchpoint`] or removes the watchpoint.
    #[error("watchpoint at {addr:#x}")]
    Watchpoint {
        /// The access's first byte in the page that holds the watchpoint.
        addr: u64,
    },
    /// Not a signal: a store to a page the embedder watches for notify
    /// (`AddressSpace::write_watch`), reported before the store is made.
    /// The embedder invalidates what it derived from the page (its
    /// translations), unwatches the page or not, and retries the store.
    #[error("write watch at {addr:#x}")]
    WriteWatch {
        /// The store's first byte in the watched page.
        addr: u64,
    },
    /// Not a signal: the bytes are a device's registers
    /// (`AddressSpace::mmap_io`), which have no host address. Returned only
    /// by the calls that hand out host memory or make an atomic
    /// read-modify-write ([`crate::Section::probe`], [`crate::Cpu::translate`],
    /// [`crate::Cpu::with_slice`], the `atomic_*` accessors); the loads,
    /// stores and copies call the device instead. The embedder makes the
    /// access through one of those.
    #[error("MMIO at {addr:#x}")]
    Mmio {
        /// The access's first byte in the device's region.
        addr: u64,
    },
}

impl Fault {
    /// The signal number Linux would deliver (`SIGSEGV`, `SIGBUS`, or
    /// `SIGKILL` for OOM); 0 for an embedder's event that is no guest
    /// signal ([`Fault::WriteWatch`], [`Fault::Watchpoint`]).
    pub fn signal(&self) -> i32 {
        match self {
            Fault::Segv { .. } => libc::SIGSEGV,
            Fault::Bus { .. } | Fault::Unaligned { .. } => libc::SIGBUS,
            Fault::Oom { .. } => libc::SIGKILL,
            Fault::WriteWatch { .. } | Fault::Watchpoint { .. } | Fault::Mmio { .. } => 0,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_errno_maps_back_from_its_number() {
        // No wildcard: a new variant fails to compile here until it is
        // counted, and then `ALL` must list it for the length to match.
        let count = |e: Errno| match e {
            Errno::Perm
            | Errno::BadF
            | Errno::Again
            | Errno::NoMem
            | Errno::Acces
            | Errno::Fault
            | Errno::Busy
            | Errno::Exist
            | Errno::NoDev
            | Errno::Inval
            | Errno::FBig
            | Errno::Overflow
            | Errno::OpNotSupp
            | Errno::Io
            | Errno::NoSpc
            | Errno::NoEnt => 16,
        };
        assert_eq!(Errno::ALL.len(), count(Errno::Perm));
        for &e in Errno::ALL {
            assert_eq!(Errno::from_code(e.code()), Some(e));
        }
        assert_eq!(Errno::from_code(0), None);
        assert_eq!(Errno::from_code(-libc::ENOMEM), None);
    }
}
