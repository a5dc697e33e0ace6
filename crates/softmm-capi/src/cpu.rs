//! `softmm_cpu`: a CPU and the guest accesses through it.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use softmm::{Cpu, Fault, Scalar, Section};

use crate::section::{softmm_section, InCall};
use crate::{access_result, buf_mut, buf_ref, guard, put, softmm_fault, softmm_mm};

/// A CPU: one host thread's software TLB, attached to at most one address
/// space. **Thread-bound**: only the thread that made it may use or free
/// it (other threads get `-EPERM`), and it must be freed before that
/// thread exits. While an access section is open on it
/// (`softmm_cpu_section_begin`) every `softmm_cpu_*` call on it is
/// refused with `-EBUSY`, and so is every call on it or its section from a
/// callback that a call on it runs (a device's `read` or `write`, a
/// release run by its `softmm_cpu_free`, `softmm_cpu_attach` or
/// `softmm_cpu_detach` ending an address space it held last): a callback
/// may use other CPUs, and make new
/// ones, but not the one whose access called it.
pub struct softmm_cpu {
    /// The identity of the thread that made it (see [`thread_id`]). Never
    /// written after creation, and read by any thread that passes the
    /// handle, so it lives outside the cell that only the owner borrows.
    pub(crate) owner: usize,
    /// The CPU's section handle, whose address `softmm_cpu_section_begin`
    /// hands out; while it is open it borrows `state.cpu` mutably.
    pub(crate) section: softmm_section,
    /// Borrowed mutably only by the owner thread, after the owner check,
    /// and only while no section is open.
    pub(crate) state: UnsafeCell<CpuState>,
}

/// The owner thread's part of a [`softmm_cpu`].
pub(crate) struct CpuState {
    pub(crate) cpu: Cpu,
    pub(crate) parked: bool,
}

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// A number that differs between live threads: the address of a
/// thread-local. (A thread that exits may hand its number to a later one,
/// hence "free a CPU before its thread exits".)
pub(crate) fn thread_id() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

/// [`owned`], if the CPU is attached and running; else `-EINVAL`
/// (detached, parked) or `owned`'s error.
///
/// # Safety
///
/// `cpu` is null or a live handle.
pub(crate) unsafe fn running<'a>(cpu: *mut softmm_cpu) -> Result<InCall<'a, CpuState>, i32> {
    // SAFETY: the caller's contract.
    let c = unsafe { owned(cpu) }?;
    if c.parked || c.cpu.mm().is_none() {
        return Err(-libc::EINVAL);
    }
    Ok(c)
}

/// The owner's state of a handle, if the calling thread owns it, no
/// section is open on it and no other call on it runs; `-EINVAL` for
/// null, `-EPERM` for another thread's, `-EBUSY` while a section is open
/// or from a callback of a running call on it (a device's, a release).
///
/// # Safety
///
/// `cpu` is null or a live handle.
pub(crate) unsafe fn owned<'a>(cpu: *mut softmm_cpu) -> Result<InCall<'a, CpuState>, i32> {
    // A shared reference: other threads may hold one too (to be refused
    // here), and the owner's mutable borrow is of `state` only.
    // SAFETY: null or live (the caller's contract).
    let h = unsafe { cpu.as_ref() }.ok_or(-libc::EINVAL)?;
    if h.owner != thread_id() {
        return Err(-libc::EPERM);
    }
    // An open section holds the one mutable borrow of `state.cpu`.
    if h.section.is_open() {
        return Err(-libc::EBUSY);
    }
    // SAFETY: only the owner thread gets past the check, no section holds
    // a borrow of the state, and no other call of this API on the CPU
    // runs (both checked, the second by `enter` first: a callback that a
    // running call made is refused), so this is the one reference to the
    // state while the call lasts.
    h.section.enter(|| Ok(unsafe { &mut *h.state.get() }))
}

/// Makes a CPU on the calling thread, attached to `mm` unless `mm` is null.
///
/// # Safety
///
/// `mm` is null or a live handle; `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_new(mm: *const softmm_mm, out: *mut *mut softmm_cpu) -> i32 {
    guard(|| {
        if out.is_null() {
            return -libc::EINVAL;
        }
        let mut cpu = Cpu::new();
        // SAFETY: null or live (the caller's contract).
        if let Some(mm) = unsafe { mm.as_ref() } {
            cpu.attach(&mm.inner);
        }
        let h = Box::new(softmm_cpu {
            owner: thread_id(),
            section: softmm_section::closed(),
            state: UnsafeCell::new(CpuState { cpu, parked: false }),
        });
        // SAFETY: not null and valid (the caller's contract).
        unsafe { put(out, Box::into_raw(h)) }
    })
}

/// Frees a CPU (detaching it). `0`; `-EPERM` from another thread and
/// `-EBUSY` while a section is open on it, which leave it alive; `NULL` is
/// ignored.
///
/// # Safety
///
/// `cpu` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_free(cpu: *mut softmm_cpu) -> i32 {
    guard(|| {
        if cpu.is_null() {
            return 0;
        }
        {
            // SAFETY: live (the caller's contract).
            let mut state = match unsafe { owned(cpu) } {
                Ok(state) => state,
                Err(e) => return e,
            };
            // The detach may drop the address space's last reference, whose
            // teardown runs device and host-memory releases on this thread:
            // under the in-call mark, so that one calling in on this CPU
            // (to free it again) is refused.
            state.cpu.detach();
        }
        // SAFETY: a live handle made by `Box::into_raw`, owned by this
        // thread, and detached: its drop runs no callback.
        drop(unsafe { Box::from_raw(cpu) });
        0
    })
}

/// Switches the CPU to `mm` (like loading CR3): its TLB starts empty.
///
/// # Safety
///
/// `cpu` and `mm` are null or live handles.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_attach(cpu: *mut softmm_cpu, mm: *const softmm_mm) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        let mut c = match unsafe { owned(cpu) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        // SAFETY: null or live (the caller's contract).
        let Some(mm) = (unsafe { mm.as_ref() }) else { return -libc::EINVAL };
        c.cpu.attach(&mm.inner);
        0
    })
}

/// Detaches the CPU from its address space (a no-op if none).
///
/// # Safety
///
/// `cpu` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_detach(cpu: *mut softmm_cpu) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        match unsafe { owned(cpu) } {
            Ok(mut c) => {
                c.cpu.detach();
                0
            }
            Err(e) => e,
        }
    })
}

/// Parks the CPU. Optional: a CPU between access calls is never waited
/// for by shootdowns, parked or not. Accesses are refused (`-EINVAL`)
/// until `softmm_cpu_resume`. Idempotent.
///
/// # Safety
///
/// `cpu` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_park(cpu: *mut softmm_cpu) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        match unsafe { owned(cpu) } {
            Ok(mut c) => {
                c.cpu.park();
                c.parked = true;
                0
            }
            Err(e) => e,
        }
    })
}

/// Resumes a parked CPU. Idempotent.
///
/// # Safety
///
/// `cpu` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_resume(cpu: *mut softmm_cpu) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        match unsafe { owned(cpu) } {
            Ok(mut c) => {
                c.cpu.resume();
                c.parked = false;
                0
            }
            Err(e) => e,
        }
    })
}

/// The scalar and atomic accessors of a [`Cpu`] and of an open
/// [`Section`] of one (the same results and faults): lets each of those
/// functions of the C API have one body for `softmm_cpu_*` and
/// `softmm_section_*`.
pub(crate) trait Accessor {
    fn read_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault>;
    fn fetch_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault>;
    fn write_le<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), Fault>;
    fn atomic_swap<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault>;
    fn atomic_fetch_add<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault>;
    fn atomic_fetch_sub<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault>;
    fn atomic_fetch_and<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault>;
    fn atomic_fetch_or<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault>;
    fn atomic_fetch_xor<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault>;
    fn atomic_compare_exchange<T: Scalar>(
        &mut self,
        addr: u64,
        current: T,
        new: T,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Result<T, T>, Fault>;
}

/// Implements [`Accessor`] by calling the type's own accessors of the same
/// names.
macro_rules! forward_accessor {
    ($($ty:ty),*) => {$(
        impl Accessor for $ty {
            #[inline(always)]
            fn read_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault> {
                <$ty>::read_le(self, addr)
            }
            #[inline(always)]
            fn fetch_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault> {
                <$ty>::fetch_le(self, addr)
            }
            #[inline(always)]
            fn write_le<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), Fault> {
                <$ty>::write_le(self, addr, v)
            }
            fn atomic_swap<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault> {
                <$ty>::atomic_swap(self, addr, v, o)
            }
            fn atomic_fetch_add<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault> {
                <$ty>::atomic_fetch_add(self, addr, v, o)
            }
            fn atomic_fetch_sub<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault> {
                <$ty>::atomic_fetch_sub(self, addr, v, o)
            }
            fn atomic_fetch_and<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault> {
                <$ty>::atomic_fetch_and(self, addr, v, o)
            }
            fn atomic_fetch_or<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault> {
                <$ty>::atomic_fetch_or(self, addr, v, o)
            }
            fn atomic_fetch_xor<T: Scalar>(&mut self, addr: u64, v: T, o: Ordering) -> Result<T, Fault> {
                <$ty>::atomic_fetch_xor(self, addr, v, o)
            }
            fn atomic_compare_exchange<T: Scalar>(
                &mut self,
                addr: u64,
                current: T,
                new: T,
                success: Ordering,
                failure: Ordering,
            ) -> Result<Result<T, T>, Fault> {
                <$ty>::atomic_compare_exchange(self, addr, current, new, success, failure)
            }
        }
    )*};
}

forward_accessor!(Cpu, Section<'_>);

/// Runs a guest access on a running CPU: `0`, [`crate::SOFTMM_FAULTED`]
/// (with `fault` filled), or `-errno` for a bad call.
///
/// # Safety
///
/// `cpu` is null or a live handle; `fault` is null or valid for a write.
unsafe fn access(cpu: *mut softmm_cpu, fault: *mut softmm_fault, f: impl FnOnce(&mut Cpu) -> Result<(), Fault>) -> i32 {
    guard(|| {
        // SAFETY: null or live (the caller's contract).
        match unsafe { running(cpu) } {
            // SAFETY: null or valid (the caller's contract).
            Ok(mut c) => {
                let r = f(&mut c.cpu);
                // SAFETY: null or valid (the caller's contract).
                unsafe { access_result(r, c.cpu.last_fault(), fault) }
            }
            Err(e) => e,
        }
    })
}

/// Reads `len` guest bytes at `addr` into `buf`.
///
/// # Safety
///
/// `cpu` is null or a live handle; `buf` is valid for writes of `len`
/// bytes; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_read(
    cpu: *mut softmm_cpu,
    addr: u64,
    buf: *mut c_void,
    len: usize,
    fault: *mut softmm_fault,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(b) = (unsafe { buf_mut(buf, len) }) else { return -libc::EFAULT };
    // SAFETY: the caller's contract.
    unsafe { access(cpu, fault, |c| c.read(addr, b)) }
}

/// Fetches `len` bytes of instructions at `addr` into `buf`: as
/// `softmm_cpu_read`, but every page must be executable (`SIGSEGV` with
/// `SEGV_ACCERR` otherwise).
///
/// # Safety
///
/// As `softmm_cpu_read`.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_fetch(
    cpu: *mut softmm_cpu,
    addr: u64,
    buf: *mut c_void,
    len: usize,
    fault: *mut softmm_fault,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(b) = (unsafe { buf_mut(buf, len) }) else { return -libc::EFAULT };
    // SAFETY: the caller's contract.
    unsafe { access(cpu, fault, |c| c.fetch(addr, b)) }
}

/// Writes `len` bytes of `buf` at guest address `addr`; on a fault the
/// bytes before the faulting page have been written, as with `memcpy`.
///
/// # Safety
///
/// `cpu` is null or a live handle; `buf` is valid for reads of `len`
/// bytes; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_write(
    cpu: *mut softmm_cpu,
    addr: u64,
    buf: *const c_void,
    len: usize,
    fault: *mut softmm_fault,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(b) = (unsafe { buf_ref(buf, len) }) else { return -libc::EFAULT };
    // SAFETY: the caller's contract.
    unsafe { access(cpu, fault, |c| c.write(addr, b)) }
}

/// Reads the little-endian integer of `size` bytes (1, 2, 4 or 8; any
/// alignment; one atomic load when naturally aligned) at `addr` into
/// `*out`, zero-extended. `-EINVAL` for another size.
///
/// # Safety
///
/// `cpu` is null or a live handle; `out` and `fault` are null or valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_read_uint(
    cpu: *mut softmm_cpu,
    addr: u64,
    size: u32,
    out: *mut u64,
    fault: *mut softmm_fault,
) -> i32 {
    if out.is_null() || !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    unsafe { access(cpu, fault, |c| load_uint(c, addr, size, false, out)) }
}

/// Writes the low `size` bytes (1, 2, 4 or 8) of `value` little-endian at
/// `addr` (any alignment; one atomic store when naturally aligned).
///
/// # Safety
///
/// `cpu` is null or a live handle; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_write_uint(
    cpu: *mut softmm_cpu,
    addr: u64,
    size: u32,
    value: u64,
    fault: *mut softmm_fault,
) -> i32 {
    if !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    unsafe { access(cpu, fault, |c| store_uint(c, addr, size, value)) }
}

/// Fetches the little-endian instruction unit of `size` bytes (1, 2, 4 or
/// 8) at `addr` into `*out`, with `softmm_cpu_fetch`'s permission check.
///
/// # Safety
///
/// As `softmm_cpu_read_uint`.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_fetch_uint(
    cpu: *mut softmm_cpu,
    addr: u64,
    size: u32,
    out: *mut u64,
    fault: *mut softmm_fault,
) -> i32 {
    if out.is_null() || !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    unsafe { access(cpu, fault, |c| load_uint(c, addr, size, true, out)) }
}

/// The body of the `*_read_uint` and `*_fetch_uint` functions: a data
/// read, or an instruction fetch when `fetch`, at the width `size` (1, 2,
/// 4 or 8, checked by the caller) picks, stored through `out` when it
/// completes.
///
/// # Safety
///
/// `out` is valid for a write.
#[inline(always)]
pub(crate) unsafe fn load_uint<A: Accessor>(
    c: &mut A,
    addr: u64,
    size: u32,
    fetch: bool,
    out: *mut u64,
) -> Result<(), Fault> {
    #[inline(always)]
    fn load<T: Scalar + Into<u64>, A: Accessor>(c: &mut A, addr: u64, fetch: bool) -> Result<u64, Fault> {
        if fetch { c.fetch_le::<T>(addr) } else { c.read_le::<T>(addr) }.map(Into::into)
    }
    let v = match size {
        1 => load::<u8, A>(c, addr, fetch)?,
        2 => load::<u16, A>(c, addr, fetch)?,
        4 => load::<u32, A>(c, addr, fetch)?,
        _ => load::<u64, A>(c, addr, fetch)?,
    };
    // SAFETY: valid for a write (the caller's contract).
    unsafe { out.write(v) };
    Ok(())
}

/// The body of the `*_write_uint` functions: the low `size` bytes (1, 2, 4
/// or 8, checked by the caller) of `value`.
#[inline(always)]
pub(crate) fn store_uint<A: Accessor>(c: &mut A, addr: u64, size: u32, value: u64) -> Result<(), Fault> {
    match size {
        1 => c.write_le(addr, value as u8),
        2 => c.write_le(addr, value as u16),
        4 => c.write_le(addr, value as u32),
        _ => c.write_le(addr, value),
    }
}

/// An atomic read-modify-write operation for `softmm_cpu_atomic_rmw`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum softmm_atomic_op {
    /// Exchange.
    SOFTMM_ATOMIC_XCHG = 0,
    /// Wrapping add.
    SOFTMM_ATOMIC_ADD = 1,
    /// Wrapping subtract.
    SOFTMM_ATOMIC_SUB = 2,
    /// Bitwise and.
    SOFTMM_ATOMIC_AND = 3,
    /// Bitwise or.
    SOFTMM_ATOMIC_OR = 4,
    /// Bitwise exclusive or.
    SOFTMM_ATOMIC_XOR = 5,
}

/// A C11 `memory_order` value (`memory_order_relaxed` = 0 …
/// `memory_order_seq_cst` = 5; consume is acquire), `None` otherwise.
pub(crate) fn ordering(order: i32) -> Option<Ordering> {
    Some(match order {
        0 => Ordering::Relaxed,
        1 | 2 => Ordering::Acquire,
        3 => Ordering::Release,
        4 => Ordering::AcqRel,
        5 => Ordering::SeqCst,
        _ => return None,
    })
}

/// One atomic operation on the `T` at `addr`; returns the old value.
fn rmw<T: Scalar + TryFrom<u64> + Into<u64>, A: Accessor>(
    c: &mut A,
    addr: u64,
    op: i32,
    v: u64,
    o: Ordering,
) -> Option<Result<u64, Fault>> {
    // Truncation to the operand's width, as the C caller expects.
    let v: T = T::try_from(v & (u64::MAX >> (64 - 8 * std::mem::size_of::<T>()))).ok()?;
    let r = match op {
        0 => c.atomic_swap(addr, v, o),
        1 => c.atomic_fetch_add(addr, v, o),
        2 => c.atomic_fetch_sub(addr, v, o),
        3 => c.atomic_fetch_and(addr, v, o),
        4 => c.atomic_fetch_or(addr, v, o),
        5 => c.atomic_fetch_xor(addr, v, o),
        _ => return None,
    };
    Some(r.map(Into::into))
}

/// Whether `softmm_*_atomic_rmw`'s `size` and `op` are valid.
pub(crate) fn rmw_args_valid(size: u32, op: i32) -> bool {
    (0..=5).contains(&op) && matches!(size, 1 | 2 | 4 | 8)
}

/// The body of the `*_atomic_rmw` functions (size and operation checked
/// by the caller with [`rmw_args_valid`]): the old value.
pub(crate) fn atomic_rmw<A: Accessor>(
    c: &mut A,
    addr: u64,
    size: u32,
    op: i32,
    value: u64,
    o: Ordering,
) -> Result<u64, Fault> {
    let r = match size {
        1 => rmw::<u8, A>(c, addr, op, value, o),
        2 => rmw::<u16, A>(c, addr, op, value, o),
        4 => rmw::<u32, A>(c, addr, op, value, o),
        _ => rmw::<u64, A>(c, addr, op, value, o),
    };
    // Size and operation were checked by the caller.
    r.expect("valid operation")
}

/// The body of the `*_atomic_cmpxchg` functions (size checked by the
/// caller): the value found.
pub(crate) fn atomic_cmpxchg<A: Accessor>(
    c: &mut A,
    addr: u64,
    size: u32,
    cur: u64,
    desired: u64,
    o: Ordering,
) -> Result<u64, Fault> {
    macro_rules! cas {
        ($t:ty) => {{
            let mask = u64::MAX >> (64 - 8 * std::mem::size_of::<$t>());
            c.atomic_compare_exchange::<$t>(addr, (cur & mask) as $t, (desired & mask) as $t, o, o)
                .map(|r| u64::from(r.unwrap_or_else(|x| x)))
        }};
    }
    match size {
        1 => cas!(u8),
        2 => cas!(u16),
        4 => cas!(u32),
        _ => cas!(u64),
    }
}

/// Atomic read-modify-write `op` ([`softmm_atomic_op`]) of the naturally
/// aligned unsigned integer of `size` bytes (1, 2, 4, 8) at `addr` with
/// the low `size` bytes of `value`, ordered by the C11 `memory_order`
/// `order`; the old value goes to `*old` (if not null). An unaligned
/// address faults with `SIGBUS`/`BUS_ADRALN`, unless the address space's
/// `atomic_alignment` is "split" (`softmm_mm_config`): the atomic is then
/// made, as x86's split locks; a bad size, operation or order is
/// `-EINVAL`.
///
/// # Safety
///
/// `cpu` is null or a live handle; `old` and `fault` are null or valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_atomic_rmw(
    cpu: *mut softmm_cpu,
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
    let r = unsafe { access(cpu, fault, |c| atomic_rmw(c, addr, size, op, value, o).map(|p| prev = p)) };
    if r == 0 && !old.is_null() {
        // SAFETY: not null and valid (the caller's contract).
        unsafe { old.write(prev) };
    }
    r
}

/// Atomic compare-and-exchange of the naturally aligned unsigned integer
/// of `size` bytes at `addr`: if it equals `*expected`, `desired` is
/// stored; either way `*expected` receives the value found (so the
/// exchange happened iff it did not change), as C11's
/// `atomic_compare_exchange_strong`. Write access is needed even when the
/// comparison fails (x86's `lock cmpxchg`). `order` is the C11 order of
/// the success case; the failure case uses its load part.
///
/// # Safety
///
/// `cpu` is null or a live handle; `expected` is valid for a read and a
/// write; `fault` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn softmm_cpu_atomic_cmpxchg(
    cpu: *mut softmm_cpu,
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
    let r = unsafe { access(cpu, fault, |c| atomic_cmpxchg(c, addr, size, cur, desired, o).map(|f| found = f)) };
    if r == 0 {
        // SAFETY: not null and valid (the caller's contract).
        unsafe { expected.write(found) };
    }
    r
}
