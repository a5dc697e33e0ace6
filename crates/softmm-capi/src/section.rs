//! `softmm_section`: an access section of a CPU held open across many
//! accesses (an emulator's basic block), so that each access pays the TLB
//! lookup alone, as `softmm::Section` does for Rust callers.
//!
//! The handle is a field of its [`softmm_cpu`] (no allocation per
//! section). While it is open it holds the one mutable borrow of the
//! CPU's `Cpu`, as a `Section<'static>` made from a pointer into the CPU's
//! box: every `softmm_cpu_*` call on that CPU is refused with `-EBUSY`
//! until `softmm_section_end`, and the CPU cannot be freed, so the borrow
//! never outlives the `Cpu` nor aliases another reference to it.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;

use softmm::{Fault, Section};

use crate::cpu::{
    atomic_cmpxchg, atomic_rmw, load_uint, ordering, rmw_args_valid, running, softmm_cpu, store_uint, thread_id,
};
use crate::{access_result, buf_mut, buf_ref, guard, put, softmm_fault};

/// An open access section of a [`softmm_cpu`], made by
/// [`softmm_cpu_section_begin`] and ended by [`softmm_section_end`].
/// Its accessors are the CPU's (same results, faults and errno); inside
/// it a shootdown from **another** thread (a munmap, mprotect, fork, COW
/// break...) waits until the section ends, so: keep it short (a basic
/// block), never block while it is open (a join, a lock, host I/O), and
/// end it before the thread waits for anything. Calling into softmm from
/// inside it on the same thread (a munmap, another CPU's access) is
/// allowed: the next access of the section sees its effect.
///
/// Contract: only the CPU's thread uses it (others get `-EPERM`); one
/// section per CPU at a time (a second `begin` is `-EBUSY`); while it is
/// open the CPU's own calls, `softmm_cpu_free` included, are `-EBUSY`, and
/// so are its own calls from a callback that one of its accesses runs;
/// after `softmm_section_end` its accessors are `-EINVAL` until the next
/// `begin` returns the same handle; it must be ended before its thread
/// exits. The handle lives as long as its CPU: using it after
/// `softmm_cpu_free` is a use after free.
pub struct softmm_section {
    /// The identity of the CPU's thread, copied here so that the section
    /// calls need not reach the CPU.
    owner: usize,
    /// Whether `open` holds a section; read by the owner thread only.
    is_open: Cell<bool>,
    /// Whether a call of this API on the CPU or its section is running
    /// ([`InCall`]); read by the owner thread only.
    in_call: Cell<bool>,
    /// The open section, borrowing the CPU's `state.cpu` mutably.
    open: UnsafeCell<Option<Section<'static>>>,
}

impl softmm_section {
    /// The closed section of a CPU being made on the calling thread.
    pub(crate) fn closed() -> Self {
        softmm_section {
            owner: thread_id(),
            is_open: Cell::new(false),
            in_call: Cell::new(false),
            open: UnsafeCell::new(None),
        }
    }

    /// Whether a section is open (meaningful to the owner thread only).
    pub(crate) fn is_open(&self) -> bool {
        self.is_open.get()
    }

    /// Marks a call of this API on the CPU or its section as running,
    /// with the one reference to the state it uses, which `value` makes
    /// (or refuses) only once no other call runs; `-EBUSY` if one is
    /// already running on this thread: a callback that the running call
    /// made (a device's `read` or `write`, a host-memory `release`) and
    /// that calls in again on the same CPU or section, which would
    /// otherwise take a second reference to the state in use (or free it).
    pub(crate) fn enter<'a, T>(&'a self, value: impl FnOnce() -> Result<&'a mut T, i32>) -> Result<InCall<'a, T>, i32> {
        if self.in_call.get() {
            return Err(-libc::EBUSY);
        }
        let value = value()?;
        self.in_call.set(true);
        Ok(InCall { flag: &self.in_call, value })
    }
}

/// The one reference of a running call to a CPU's state or its open
/// section (see [`softmm_section::enter`]); the call is over when it drops.
pub(crate) struct InCall<'a, T> {
    flag: &'a Cell<bool>,
    value: &'a mut T,
}

impl<T> std::ops::Deref for InCall<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> std::ops::DerefMut for InCall<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

impl<T> Drop for InCall<'_, T> {
    fn drop(&mut self) {
        self.flag.set(false);
    }
}

/// The open section behind a handle, if the calling thread owns it and no
/// other call on it runs; `-EINVAL` for null or a closed section, `-EPERM`
/// for another thread's, `-EBUSY` from a callback of a running call on it.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU.
#[inline(always)]
pub(crate) unsafe fn open<'a>(s: *mut softmm_section) -> Result<InCall<'a, Section<'static>>, i32> {
    // SAFETY: null or live (the caller's contract); shared, as in
    // `cpu::owned`: another thread may pass it too, to be refused.
    let h = unsafe { s.as_ref() }.ok_or(-libc::EINVAL)?;
    if h.owner != thread_id() {
        return Err(-libc::EPERM);
    }
    // SAFETY: only the owner thread gets here, and no other call of this
    // API on the CPU runs (`enter` checks first: a callback of one is
    // refused), so this is the one reference to `open` while the call lasts.
    h.enter(|| unsafe { &mut *h.open.get() }.as_mut().ok_or(-libc::EINVAL))
}

/// Opens an access section on `cpu` and stores its handle in `*out`
/// (the same handle every time for a CPU). `-EINVAL` if `cpu` is NULL,
/// detached or parked, `-EPERM` from another thread, `-EBUSY` if a section
/// is already open on it.
///
/// ```c
/// softmm_section *s;
/// if (softmm_cpu_section_begin(cpu, &s) == 0) {
///     uint64_t insn;
///     int rc = softmm_section_fetch_uint(s, pc, 4, &insn, &fault);
///     /* ... the rest of the basic block through s ... */
///     softmm_section_end(s);
/// }
/// ```
///
/// # Safety
///
/// `cpu` is null or a live handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_section_begin(cpu: *mut softmm_cpu, out: *mut *mut softmm_section) -> i32 {
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: null or live (the caller's contract); refuses another
        // thread, an open section and a callback of a running call.
        let mut c = match unsafe { running(cpu) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        let c: *mut softmm::Cpu = &mut c.cpu;
        // SAFETY: `cpu` is live (the caller's contract), and `running`
        // passed, so this is its owner thread.
        let h = unsafe { &*cpu };
        // SAFETY:
        // 1. `c` points into the CPU's box, which does not move and is not
        //    freed while the section is open (`softmm_cpu_free` refuses);
        // 2. no other reference to the `Cpu` is made while it is open: every
        //    `softmm_cpu_*` call checks `is_open` first and refuses;
        // 3. the section is dropped (by `softmm_section_end`) before
        //    `is_open` is cleared, so the borrow ends before anything else
        //    may borrow the `Cpu` again.
        let section = unsafe { &mut *c }.section();
        // SAFETY: owner thread, no other reference to `open` (as in `open`).
        unsafe { *h.section.open.get() = Some(section) };
        h.section.is_open.set(true);
        // SAFETY: not null and valid (the caller's contract).
        unsafe { put(out, std::ptr::addr_of!(h.section).cast_mut()) }
    })
}

/// Ends the section: the CPU counts as outside any access again, and its
/// own calls are accepted. `-EINVAL` for NULL or a section not open,
/// `-EPERM` from another thread (the section stays open).
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_end(s: *mut softmm_section) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        if let Err(e) = unsafe { open(s) } {
            return e;
        }
        // SAFETY: live and owned by this thread (checked by `open`).
        let h = unsafe { &*s };
        // Drop the section (its exit) before the CPU may be borrowed again.
        // SAFETY: owner thread, the one reference to `open` (as in `open`).
        drop(unsafe { (*h.open.get()).take() });
        h.is_open.set(false);
        0
    })
}

/// Runs a guest access in an open section: `0`, `SOFTMM_FAULTED` with
/// `fault` filled, or `-errno` for a bad call.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `fault` is null or
/// valid for a write.
#[inline(always)]
pub(crate) unsafe fn access(
    s: *mut softmm_section,
    fault: *mut softmm_fault,
    f: impl FnOnce(&mut Section<'static>) -> Result<(), Fault>,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        match unsafe { open(s) } {
            // SAFETY: null or valid (the caller's contract).
            Ok(mut c) => {
                let r = f(&mut c);
                // SAFETY: null or valid (the caller's contract).
                unsafe { access_result(r, c.last_fault(), fault) }
            }
            Err(e) => e,
        }
    })
}

/// `softmm_cpu_read` in a section.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `buf` is valid for
/// writes of `len` bytes; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_read(
    s: *mut softmm_section,
    addr: u64,
    buf: *mut c_void,
    len: usize,
    fault: *mut softmm_fault,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(b) = (unsafe { buf_mut(buf, len) }) else { return -libc::EFAULT };
    // SAFETY: the caller's contract.
    unsafe { access(s, fault, |c| c.read(addr, b)) }
}

/// `softmm_cpu_fetch` in a section.
///
/// # Safety
///
/// As `softmm_section_read`.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_fetch(
    s: *mut softmm_section,
    addr: u64,
    buf: *mut c_void,
    len: usize,
    fault: *mut softmm_fault,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(b) = (unsafe { buf_mut(buf, len) }) else { return -libc::EFAULT };
    // SAFETY: the caller's contract.
    unsafe { access(s, fault, |c| c.fetch(addr, b)) }
}

/// `softmm_cpu_write` in a section.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `buf` is valid for
/// reads of `len` bytes; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_write(
    s: *mut softmm_section,
    addr: u64,
    buf: *const c_void,
    len: usize,
    fault: *mut softmm_fault,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(b) = (unsafe { buf_ref(buf, len) }) else { return -libc::EFAULT };
    // SAFETY: the caller's contract.
    unsafe { access(s, fault, |c| c.write(addr, b)) }
}

/// `softmm_cpu_read_uint` in a section: a TLB hit is one lookup and one
/// load.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `out` and `fault` are
/// null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_read_uint(
    s: *mut softmm_section,
    addr: u64,
    size: u32,
    out: *mut u64,
    fault: *mut softmm_fault,
) -> i32 {
    if out.is_null() || !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract (`out` valid, checked not null).
    unsafe { access(s, fault, |c| load_uint(c, addr, size, false, out)) }
}

/// `softmm_cpu_fetch_uint` in a section.
///
/// # Safety
///
/// As `softmm_section_read_uint`.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_fetch_uint(
    s: *mut softmm_section,
    addr: u64,
    size: u32,
    out: *mut u64,
    fault: *mut softmm_fault,
) -> i32 {
    if out.is_null() || !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract (`out` valid, checked not null).
    unsafe { access(s, fault, |c| load_uint(c, addr, size, true, out)) }
}

/// `softmm_cpu_write_uint` in a section.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `fault` is null or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_write_uint(
    s: *mut softmm_section,
    addr: u64,
    size: u32,
    value: u64,
    fault: *mut softmm_fault,
) -> i32 {
    if !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    unsafe { access(s, fault, |c| store_uint(c, addr, size, value)) }
}

/// `softmm_cpu_atomic_rmw` in a section.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `old` and `fault` are
/// null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_atomic_rmw(
    s: *mut softmm_section,
    addr: u64,
    size: u32,
    op: i32,
    value: u64,
    order: i32,
    old: *mut u64,
    fault: *mut softmm_fault,
) -> i32 {
    let Some(o) = ordering(order) else { return -libc::EINVAL };
    if !rmw_args_valid(size, op) {
        return -libc::EINVAL;
    }
    let mut prev = 0;
    // SAFETY: the caller's contract.
    let r = unsafe { access(s, fault, |c| atomic_rmw(c, addr, size, op, value, o).map(|p| prev = p)) };
    if r == 0 && !old.is_null() {
        // SAFETY: not null and valid (the caller's contract).
        unsafe { old.write(prev) };
    }
    r
}

/// `softmm_cpu_atomic_cmpxchg` in a section.
///
/// # Safety
///
/// `s` is null or the section handle of a live CPU; `expected` is valid
/// for a read and a write; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_section_atomic_cmpxchg(
    s: *mut softmm_section,
    addr: u64,
    size: u32,
    expected: *mut u64,
    desired: u64,
    order: i32,
    fault: *mut softmm_fault,
) -> i32 {
    let Some(o) = ordering(order) else { return -libc::EINVAL };
    if expected.is_null() || !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: not null and valid (the caller's contract).
    let cur = unsafe { expected.read() };
    let mut found = 0u64;
    // SAFETY: the caller's contract.
    let r = unsafe { access(s, fault, |c| atomic_cmpxchg(c, addr, size, cur, desired, o).map(|f| found = f)) };
    if r == 0 {
        // SAFETY: not null and valid (the caller's contract).
        unsafe { expected.write(found) };
    }
    r
}
