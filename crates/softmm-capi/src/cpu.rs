//! `softmm_cpu`: a CPU and the guest accesses through it.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

use softmm::{Cpu, Fault, Scalar};

use crate::{access_result, buf_mut, buf_ref, guard, put, softmm_fault, softmm_mm};

/// A CPU: one host thread's software TLB, attached to at most one address
/// space. **Thread-bound**: only the thread that made it may use or free
/// it (other threads get `-EPERM`), and it must be freed before that
/// thread exits.
pub struct softmm_cpu {
    /// The identity of the thread that made it (see [`thread_id`]). Never
    /// written after creation, and read by any thread that passes the
    /// handle, so it lives outside the cell that only the owner borrows.
    owner: usize,
    /// Borrowed mutably only by the owner thread, after the owner check.
    state: UnsafeCell<CpuState>,
}

/// The owner thread's part of a [`softmm_cpu`].
struct CpuState {
    cpu: Cpu,
    parked: bool,
}

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// A number that differs between live threads: the address of a
/// thread-local. (A thread that exits may hand its number to a later one,
/// hence "free a CPU before its thread exits".)
fn thread_id() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

/// The CPU of a live handle, if the calling thread owns it and it is
/// attached and running; else `-EINVAL` (null, detached, parked) or
/// `-EPERM` (another thread's).
///
/// # Safety
///
/// `cpu` is null or a live handle.
unsafe fn running<'a>(cpu: *mut softmm_cpu) -> Result<&'a mut Cpu, i32> {
    // SAFETY: the caller's contract.
    let c = unsafe { owned(cpu) }?;
    if c.parked || c.cpu.mm().is_none() {
        return Err(-libc::EINVAL);
    }
    Ok(&mut c.cpu)
}

/// The owner's state of a handle, if the calling thread owns it; `-EINVAL`
/// for null, `-EPERM` for another thread's.
///
/// # Safety
///
/// `cpu` is null or a live handle.
unsafe fn owned<'a>(cpu: *mut softmm_cpu) -> Result<&'a mut CpuState, i32> {
    // A shared reference: other threads may hold one too (to be refused
    // here), and the owner's mutable borrow is of `state` only.
    // SAFETY: null or live (the caller's contract).
    let h = unsafe { cpu.as_ref() }.ok_or(-libc::EINVAL)?;
    if h.owner != thread_id() {
        return Err(-libc::EPERM);
    }
    // SAFETY: only the owner thread gets past the check, and no call of
    // this API runs another one on its thread (there are no callbacks), so
    // this is the one reference to the state while the call lasts.
    Ok(unsafe { &mut *h.state.get() })
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
        let h = Box::new(softmm_cpu { owner: thread_id(), state: UnsafeCell::new(CpuState { cpu, parked: false }) });
        // SAFETY: not null and valid (the caller's contract).
        unsafe { put(out, Box::into_raw(h)) }
    })
}

/// Frees a CPU (detaching it). `0`; `-EPERM` from another thread, which
/// leaves it alive; `NULL` is ignored.
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
        // SAFETY: live (the caller's contract).
        if let Err(e) = unsafe { owned(cpu) } {
            return e;
        }
        // SAFETY: a live handle made by `Box::into_raw`, owned by this thread.
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
        let c = match unsafe { owned(cpu) } {
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
            Ok(c) => {
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
            Ok(c) => {
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
            Ok(c) => {
                c.cpu.resume();
                c.parked = false;
                0
            }
            Err(e) => e,
        }
    })
}

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
            Ok(c) => unsafe { access_result(f(c), fault) },
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
    // SAFETY: the caller's contract.
    unsafe { load_uint(cpu, addr, size, out, fault, false) }
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
    unsafe {
        access(cpu, fault, |c| match size {
            1 => c.write_le(addr, value as u8),
            2 => c.write_le(addr, value as u16),
            4 => c.write_le(addr, value as u32),
            _ => c.write_le(addr, value),
        })
    }
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
    // SAFETY: the caller's contract.
    unsafe { load_uint(cpu, addr, size, out, fault, true) }
}

/// The body of `softmm_cpu_read_uint` and `softmm_cpu_fetch_uint`: a data
/// read, or an instruction fetch when `fetch`, at the width `size` picks.
///
/// # Safety
///
/// As `softmm_cpu_read_uint`.
unsafe fn load_uint(
    cpu: *mut softmm_cpu,
    addr: u64,
    size: u32,
    out: *mut u64,
    fault: *mut softmm_fault,
    fetch: bool,
) -> i32 {
    fn load<T: Scalar + Into<u64>>(c: &mut Cpu, addr: u64, fetch: bool) -> Result<u64, Fault> {
        if fetch { c.fetch_le::<T>(addr) } else { c.read_le::<T>(addr) }.map(Into::into)
    }
    if out.is_null() {
        return -libc::EINVAL;
    }
    if !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    let mut v = 0u64;
    // SAFETY: the caller's contract.
    let r = unsafe {
        access(cpu, fault, |c| {
            v = match size {
                1 => load::<u8>(c, addr, fetch)?,
                2 => load::<u16>(c, addr, fetch)?,
                4 => load::<u32>(c, addr, fetch)?,
                _ => load::<u64>(c, addr, fetch)?,
            };
            Ok(())
        })
    };
    if r == 0 {
        // SAFETY: not null and valid (the caller's contract).
        unsafe { out.write(v) };
    }
    r
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
fn ordering(order: i32) -> Option<Ordering> {
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
fn rmw<T: Scalar + TryFrom<u64> + Into<u64>>(
    c: &mut Cpu,
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

/// Atomic read-modify-write `op` ([`softmm_atomic_op`]) of the naturally
/// aligned unsigned integer of `size` bytes (1, 2, 4, 8) at `addr` with
/// the low `size` bytes of `value`, ordered by the C11 `memory_order`
/// `order`; the old value goes to `*old` (if not null). An unaligned
/// address faults with `SIGBUS`/`BUS_ADRALN`; a bad size, operation or
/// order is `-EINVAL`.
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
    if !(0..=5).contains(&op) || !matches!(size, 1 | 2 | 4 | 8) {
        return -libc::EINVAL;
    }
    let mut prev = 0;
    // SAFETY: the caller's contract.
    let r = unsafe {
        access(cpu, fault, |c| {
            let r = match size {
                1 => rmw::<u8>(c, addr, op, value, o),
                2 => rmw::<u16>(c, addr, op, value, o),
                4 => rmw::<u32>(c, addr, op, value, o),
                _ => rmw::<u64>(c, addr, op, value, o),
            };
            // Size and operation were checked above.
            r.expect("valid operation").map(|p| prev = p)
        })
    };
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
    macro_rules! cas {
        ($t:ty, $c:expr) => {{
            let mask = u64::MAX >> (64 - 8 * std::mem::size_of::<$t>());
            $c.atomic_compare_exchange::<$t>(addr, (cur & mask) as $t, (desired & mask) as $t, o, o)
                .map(|r| found = u64::from(r.unwrap_or_else(|x| x)))
        }};
    }
    // SAFETY: the caller's contract.
    let r = unsafe {
        access(cpu, fault, |c| match size {
            1 => cas!(u8, c),
            2 => cas!(u16, c),
            4 => cas!(u32, c),
            _ => cas!(u64, c),
        })
    };
    if r == 0 {
        // SAFETY: not null and valid (the caller's contract).
        unsafe { expected.write(found) };
    }
    r
}
