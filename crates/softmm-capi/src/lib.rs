//! The C API of softmm (`include/softmm.h`, generated from this crate by
//! cbindgen).
//!
//! # Conventions
//!
//! * **Handles** are opaque pointers made by a `*_new`/`*_create` function
//!   and released by the matching `*_free` (which accepts `NULL`):
//!   [`softmm_phys`] (a frame arena), [`softmm_mm`] (an address space),
//!   [`softmm_file`] (an in-memory file opened with an access mode, like a
//!   file descriptor, or a host file: [`softmm_file_open_host`]),
//!   [`softmm_cpu`] (a CPU with its software TLB), [`softmm_pinned`]
//!   (pages pinned for a device). An address space keeps its arena alive,
//!   a file its arena, a CPU its address space, pinned pages their frames:
//!   they may be freed in any order.
//! * **Results** are `0` (or a non-negative value: an address, a byte
//!   count) on success and `-errno` on failure, with Linux's errno for the
//!   same call; a failed call changes nothing. A `NULL` handle or output
//!   pointer is `-EINVAL`.
//! * **Faults**: a guest access that does not complete returns
//!   [`SOFTMM_FAULTED`] and, if `fault` is not `NULL`, fills it with the
//!   signal Linux would deliver ([`softmm_fault`]: `SIGSEGV` with
//!   `SEGV_MAPERR`/`SEGV_ACCERR`, `SIGBUS` with `BUS_ADRERR`/`BUS_ADRALN`,
//!   `SIGKILL` for out of memory), with the access's kind, first byte and
//!   size; `signo` 0 is the embedder's own event, a store stopped by a
//!   write watch ([`softmm_mm_write_watch`], `code`
//!   [`SOFTMM_EVENT_WRITE_WATCH`]).
//! * **Configuration**: `softmm_phys_new`/`softmm_mm_new` take the
//!   defaults; [`softmm_phys_new_config`]/[`softmm_mm_new_config`] take a
//!   struct filled by its `*_default` function first (which sets its
//!   `size`), then changed.
//! * **Size-versioned structs**: every struct that may grow starts with
//!   its `size`. One the library reads (a configuration) is set by its
//!   `*_default` or taken from a `*_get_*` call; one the library writes
//!   (statistics) has its `size` set by the caller to `sizeof` it, and the
//!   call stores how many bytes it wrote. Older and newer headers work
//!   with either library as Linux's `sched_setattr`/`sched_getattr` do
//!   (see `sized.rs`).
//! * **Arrays** ([`softmm_mm_regions`]) are the caller's, with an in/out
//!   count: `listxattr`'s convention (a zero count asks for the number, a
//!   too small one is `-ERANGE` with the number needed stored).
//! * **Threads**: arenas, address spaces and files may be used from any
//!   thread at once. A CPU belongs to the thread that made it (it is one
//!   hardware thread's TLB): every `softmm_cpu_*` call, `free` included,
//!   must come from that thread, and is refused with `-EPERM` otherwise;
//!   free a CPU before its thread exits. Make one CPU per guest thread on
//!   the host thread that runs it. A thread may block between calls with
//!   its CPU attached and need not park it: each access call is a whole
//!   access section, and a munmap elsewhere waits only for CPUs inside one
//!   (`softmm_cpu_park` stays, optional).
//! * **Sections**: [`softmm_cpu_section_begin`] opens an access section
//!   on a CPU ([`softmm_section`]) across many accesses (a basic block),
//!   each of which then pays the TLB lookup alone; [`softmm_section_end`]
//!   closes it. Another thread's munmap waits for an open section: keep
//!   it short and never block inside it. Misuse is an errno, never
//!   undefined behaviour: a second section on the CPU or a CPU call while
//!   one is open `-EBUSY`, another thread `-EPERM`, an ended section
//!   `-EINVAL`.
//! * **Signals**: no function is async-signal-safe; do not call one from a
//!   signal handler that may interrupt another.
//! * **Panics** never cross the boundary: each function catches them and
//!   returns `-ENOTRECOVERABLE` (a bug in softmm, to be reported).

#![allow(non_camel_case_types)]

mod config;
mod cpu;
mod file;
mod host_mem;
mod info;
mod mempolicy;
mod mm;
mod mmio;
mod phys;
mod pin;
mod regions;
mod remote;
mod section;
mod settings;
mod sized;
mod stats;
mod tlb;
mod watch;

/// `docs/embedding.md`: its Rust examples run as this crate's doctests,
/// its C ones (those with a `main`) are built and run by `tests/c.rs`.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/embedding.md")]
mod embedding_guide {}

pub use config::*;
pub use cpu::*;
pub use file::*;
pub use host_mem::*;
pub use info::*;
pub use mempolicy::*;
pub use mm::*;
pub use mmio::*;
pub use phys::*;
pub use pin::*;
pub use regions::*;
pub use remote::*;
pub use section::*;
pub use settings::*;
pub use stats::*;
pub use tlb::*;
pub use watch::*;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use softmm::{Access, Errno, Fault, FaultInfo};

/// Returned by a guest access that faulted; the fault is in its `fault`
/// argument.
pub const SOFTMM_FAULTED: i32 = 1;

/// `softmm_fault.access` of a load.
pub const SOFTMM_ACCESS_READ: u32 = 1;
/// `softmm_fault.access` of a store (an atomic read-modify-write is one).
pub const SOFTMM_ACCESS_WRITE: u32 = 2;
/// `softmm_fault.access` of an instruction fetch.
pub const SOFTMM_ACCESS_FETCH: u32 = 4;

/// A guest fault: the signal Linux would deliver for the access (or, with
/// `signo` 0, an embedder's event: `code` [`SOFTMM_EVENT_WRITE_WATCH`],
/// [`SOFTMM_EVENT_WATCHPOINT`] or [`SOFTMM_EVENT_MMIO`]), and what
/// the access was (the page-fault error code's kind, and the access's
/// extent). Grew `access`, `access_addr` and `size` in 0.2 (a new
/// soname: a program built against 0.1's 16-byte struct keeps 0.1's
/// library).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct softmm_fault {
    /// `SIGSEGV`, `SIGBUS`, or `SIGKILL` (out of memory).
    pub signo: i32,
    /// `si_code`: `SEGV_MAPERR` (1), `SEGV_ACCERR` (2), `SI_KERNEL` (0x80,
    /// a non-canonical address), `BUS_ADRALN` (1), `BUS_ADRERR` (2); 0 for
    /// `SIGKILL`.
    pub code: i32,
    /// The faulting guest address (`si_addr`; 0 for `SI_KERNEL`).
    pub addr: u64,
    /// `SOFTMM_ACCESS_READ`, `_WRITE` or `_FETCH`.
    pub access: u32,
    /// The access's size in bytes: the scalar's width, the copy's length.
    pub size: u32,
    /// The access's first byte (`addr` is the byte that faulted: for an
    /// access across a page boundary, possibly in the second page).
    pub access_addr: u64,
}

impl From<Fault> for softmm_fault {
    fn from(f: Fault) -> Self {
        let (code, addr) = match f {
            Fault::Segv { addr, code } => (code.code(), addr),
            Fault::Bus { addr } => (libc::BUS_ADRERR, addr),
            Fault::Unaligned { addr } => (libc::BUS_ADRALN, addr),
            Fault::Oom { addr } => (0, addr),
            Fault::WriteWatch { addr } => (SOFTMM_EVENT_WRITE_WATCH, addr),
            Fault::Watchpoint { addr } => (SOFTMM_EVENT_WATCHPOINT, addr),
            Fault::Mmio { addr } => (SOFTMM_EVENT_MMIO, addr),
            // A signal added later: its number at least.
            _ => (0, 0),
        };
        softmm_fault { signo: f.signal(), code, addr, ..Default::default() }
    }
}

impl From<FaultInfo> for softmm_fault {
    fn from(i: FaultInfo) -> Self {
        let access = match i.access {
            Access::Read => SOFTMM_ACCESS_READ,
            Access::Write => SOFTMM_ACCESS_WRITE,
            _ => SOFTMM_ACCESS_FETCH,
        };
        // A size past 4 GiB (a copy that long) saturates.
        let size = u32::try_from(i.size).unwrap_or(u32::MAX);
        softmm_fault { access, size, access_addr: i.addr, ..softmm_fault::from(i.fault) }
    }
}

/// The byte slice of a C buffer to write into: empty for `len == 0`
/// (whatever `buf`), `None` for a null `buf` otherwise (the caller's
/// `-EFAULT`).
///
/// # Safety
///
/// `buf` is valid for `len` bytes of writes, or `len == 0`.
pub(crate) unsafe fn buf_mut<'a>(buf: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    // SAFETY: valid for `len` bytes (the caller's contract).
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) })
}

/// [`buf_mut`] for a buffer to read from.
///
/// # Safety
///
/// `buf` is valid for `len` bytes of reads, or `len == 0`.
pub(crate) unsafe fn buf_ref<'a>(buf: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: valid for `len` bytes (the caller's contract).
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts(buf.cast(), len) })
}

/// `-errno` of an error.
pub(crate) fn neg(e: Errno) -> i32 {
    -e.code()
}

/// Runs `f`, turning a panic into `-ENOTRECOVERABLE`.
pub(crate) fn guard(f: impl FnOnce() -> i32) -> i32 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-libc::ENOTRECOVERABLE)
}

/// [`guard`] for calls that return a value or `-errno` as an `i64`.
pub(crate) fn guard64(f: impl FnOnce() -> i64) -> i64 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-i64::from(libc::ENOTRECOVERABLE))
}

/// Stores `v` through the output pointer `out`, `-EINVAL` if it is null.
///
/// # Safety
///
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> i32 {
    if out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: not null, and valid for a write (the caller's contract).
    unsafe { out.write(v) };
    0
}

/// The result of a guest access: `0`, or [`SOFTMM_FAULTED`] with the fault
/// stored through `fault` (if not null), completed by `info`, the CPU's
/// record of it (`Cpu::last_fault`).
///
/// # Safety
///
/// `fault` is null or valid for a write of a `softmm_fault`.
pub(crate) unsafe fn access_result(r: Result<(), Fault>, info: Option<FaultInfo>, fault: *mut softmm_fault) -> i32 {
    match r {
        Ok(()) => 0,
        Err(f) => {
            if !fault.is_null() {
                let v = match info {
                    Some(i) if i.fault == f => i.into(),
                    _ => f.into(),
                };
                // SAFETY: not null, and valid for a write (the caller's contract).
                unsafe { fault.write(v) };
            }
            SOFTMM_FAULTED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_enotrecoverable_at_the_boundary() {
        assert_eq!(guard(|| panic!("a bug")), -libc::ENOTRECOVERABLE);
        assert_eq!(guard64(|| panic!("a bug")), -i64::from(libc::ENOTRECOVERABLE));
        assert_eq!(guard(|| 7), 7);
    }

    #[test]
    fn faults_map_to_their_signal_code_and_address() {
        let f = |signo, code, addr| softmm_fault { signo, code, addr, ..Default::default() };
        let segv = softmm_fault::from(Fault::Segv { addr: 0x1000, code: softmm::SegvCode::AccErr });
        assert_eq!(segv, f(libc::SIGSEGV, 2, 0x1000));
        let bus = softmm_fault::from(Fault::Bus { addr: 8 });
        assert_eq!(bus, f(libc::SIGBUS, libc::BUS_ADRERR, 8));
        let aln = softmm_fault::from(Fault::Unaligned { addr: 9 });
        assert_eq!(aln, f(libc::SIGBUS, libc::BUS_ADRALN, 9));
        let watch = softmm_fault::from(Fault::WriteWatch { addr: 0x2000 });
        assert_eq!(watch, f(0, SOFTMM_EVENT_WRITE_WATCH, 0x2000));
        let point = softmm_fault::from(Fault::Watchpoint { addr: 0x3000 });
        assert_eq!(point, f(0, SOFTMM_EVENT_WATCHPOINT, 0x3000));
        let mmio = softmm_fault::from(Fault::Mmio { addr: 0x4000 });
        assert_eq!(mmio, f(0, SOFTMM_EVENT_MMIO, 0x4000));
    }
}
