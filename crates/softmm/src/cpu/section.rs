//! Access sections several accesses long: [`Section`], what an emulator
//! opens around a basic block so that its accesses pay the TLB lookup
//! alone.
//!
//! A section is the read-side critical section of the shootdown protocol
//! (`crate::tlb`): entering stores 1 in the CPU's `inside` word, passes
//! the reader barrier and checks the mark of pending flush requests
//! (dropping the TLB, and acknowledging, if they moved); leaving stores 0.
//! A [`Cpu`] accessor is a section of one access. A [`Section`] pays the entry and the exit once
//! for all its accesses; each access inside it pays only the TLB lookup
//! (an index and one compare, which also tests the permission and, for a
//! scalar, the alignment).
//!
//! Why no access needs to look at the requests again: while the section
//! is open, a shootdown from another thread waits for its end. The one way
//! around that is the thread itself calling into softmm from inside the
//! section (a `munmap`, another CPU's fault): then (a) its own flushes
//! do not wait for its own CPUs (they are sent the request, which a
//! section's accesses do not look at), and (b) every one of its CPUs is quiescent for
//! the call, so other threads' flushes do not wait for this one either and
//! may free frames it has cached. The thread's `QuiescentGuard` empties the
//! TLB of every CPU of the thread whose section is open when the call
//! returns (the entries live in the CPU's shared state for that reason,
//! `tlb/soft_tlb.rs`), so the next access walks the page table anew.

use std::sync::atomic::Ordering;

use super::{load_part, scalar, store_part, Cpu, Scalar};
use crate::error::Fault;
use crate::fault::Access;
use crate::mmio::IoBytes;
use crate::tlb::{CpuTlbState, SoftTlb, TlbEntryAbi, TLB_ENTRIES};
use crate::PAGE_SIZE;

/// An access section of a [`Cpu`] held open across many accesses (an
/// emulator's basic block, a loader's run of stores): made by
/// [`Cpu::section`], ended when dropped. Inside it each access costs a
/// TLB lookup; the section's entry (a store, a check of the flush requests)
/// and exit (a store each to a line only this thread writes, and a
/// compiler barrier) are paid once.
///
/// The accessors are [`Cpu`]'s, with the same semantics, results and
/// faults: a TLB miss walks the page table, a page fault leaves the section
/// for the fault handler and re-enters it, and a shootdown that began
/// meanwhile is honoured before the next access. What differs is only how
/// long the CPU counts as inside an access: for the whole life of the
/// section. A `munmap`, `mprotect`, `fork`, COW break... on **another**
/// thread that begins while the section is open waits for it to end
/// before freeing anything, so:
///
/// * keep it short: a basic block, a bounded run of accesses, then drop it
///   (a dispatch loop re-opens one per block; the entry and exit cost a few
///   accesses' worth, not a system call);
/// * **never block while it is open** (a channel, a join, a lock another
///   guest thread may hold, host I/O): other threads' shootdowns would wait
///   as long, and deadlock if what it waits for is one of them. A section
///   forgotten with `mem::forget` stays open until the CPU's next access
///   ends, or it is detached or dropped (forget the CPU too, and every
///   later shootdown of its address space waits forever, as the lockers of
///   a forgotten `MutexGuard` do).
///
/// Calling into softmm from inside a section (a syscall on the same
/// thread, an access through another `Cpu` of the thread) is allowed: the
/// thread's CPUs are quiescent for the call, and the next access of the
/// section drops whatever was shot down meanwhile.
///
/// ```
/// use softmm::{uapi::*, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem};
/// let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
/// let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
/// let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
/// let mut cpu = Cpu::attached(&mm);
/// cpu.write_u64(a, 40).unwrap();
/// // One "basic block": three accesses, one section.
/// let mut s = cpu.section();
/// let x = s.read_u64(a).unwrap();
/// s.write_u64(a + 8, x + 2).unwrap();
/// assert_eq!(s.read_u64(a + 8).unwrap(), 42);
/// drop(s); // the section ends here; the CPU may now block anywhere
/// assert_eq!(cpu.read_u64(a + 8).unwrap(), 42);
/// ```
///
/// The section borrows the CPU: no accessor of the CPU itself while it is
/// open,
///
/// ```compile_fail,E0499
/// # use softmm::{uapi::*, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem};
/// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
/// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
/// # let a = mm.mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
/// # let mut cpu = Cpu::attached(&mm);
/// let mut s = cpu.section();
/// cpu.read_u8(a).unwrap();
/// s.read_u8(a).unwrap();
/// ```
///
/// and it stays on the CPU's thread:
///
/// ```compile_fail,E0277
/// # use softmm::{uapi::*, AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem};
/// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
/// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
/// # let mut cpu = Cpu::attached(&mm);
/// let s = cpu.section();
/// std::thread::scope(|t| { t.spawn(move || drop(s)); });
/// ```
#[must_use = "the section ends when dropped; open one around the accesses it covers"]
pub struct Section<'a> {
    cpu: &'a mut Cpu,
    /// `cpu.state`, kept at hand so that a hit and the exit load no
    /// pointer to reach the TLB and the `inside` word (the `Arc` that holds
    /// it is borrowed through `cpu`).
    state: std::ptr::NonNull<CpuTlbState>,
}

/// A CPU's 4 KiB TLB as C and generated code read it inside an open
/// [`Section`] ([`Section::tlb_abi`]; C's `softmm_section_tlb_abi`): a
/// direct-mapped table of [`TlbEntryAbi`] entries. The hit test and the
/// host address are [`TlbEntryAbi`]'s.
///
/// # Rules for a reader
///
/// The section protocol is unchanged: an inline hit is exactly what the
/// section's own accessors do, so it is sound under theirs, which are:
///
/// 1. Read the table only on the CPU's thread while the section it came
///    from is open; never write it (only the CPU's thread writes it, in
///    softmm's calls, so plain loads race with nothing).
/// 2. Read the entry anew for every access: any call into softmm on the
///    thread (a miss through [`Section::probe`], a `munmap`, another CPU's
///    access) may empty or refill it.
/// 3. A hit's host address is valid for the access's bytes (inside one
///    page) until the section ends or the thread calls into softmm; access
///    those bytes only atomically (a relaxed load or store: other guest
///    threads may access them), and never block meanwhile.
/// 4. A miss is not a fault: call [`Section::probe`] (or an accessor),
///    which walks, fills and faults as the accessors do.
///
/// The table's address is fixed for the CPU's life; its layout and
/// [`TlbAbi::entries`] change only with the C library's SONAME.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlbAbi {
    /// The first of [`TlbAbi::entries`] entries.
    pub table: *const TlbEntryAbi,
    /// The table's length, a power of two: a page's entry is
    /// `table[(va >> page_shift) & (entries - 1)]`.
    pub entries: usize,
    /// `log2` of the page size the table maps (12).
    pub page_shift: u32,
}

impl Cpu {
    /// Opens an access section for several accesses ([`Section`]): the
    /// CPU counts as inside an access until the section is dropped.
    ///
    /// # Panics
    ///
    /// Its first access does, if the CPU is not attached.
    #[inline(always)]
    pub fn section(&mut self) -> Section<'_> {
        // Taken before the entry's compiler barrier, which would make the
        // compiler load the `Arc`'s pointer again after it.
        let state = std::ptr::NonNull::from(&*self.state);
        // Inside, the reader barrier, then the flush-request check.
        self.section_begin();
        Section { cpu: self, state }
    }
}

/// The parts of the section's accessors that are not inlined, on the `Cpu`
/// rather than the [`Section`]: a section handed by reference to an
/// out-of-line call would live in memory, and every hit after the call site
/// in a loop would load its TLB pointer back from the stack. Each is called
/// with a section of the CPU open.
impl Cpu {
    /// Copies guest bytes at `addr` into `buf`, each page translated for
    /// `access` (a read or a fetch).
    pub(super) fn section_copy_in(&mut self, addr: u64, buf: &mut [u8], access: Access) -> Result<(), Fault> {
        let r = self.section_copy_in_pages(addr, buf, access);
        self.sized(r, access, addr, buf.len())
    }

    /// [`Cpu::section_copy_in`]'s copy.
    fn section_copy_in_pages(&mut self, addr: u64, buf: &mut [u8], access: Access) -> Result<(), Fault> {
        let mut done = 0;
        while done < buf.len() {
            let a = addr.wrapping_add(done as u64);
            let n = ((PAGE_SIZE - a % PAGE_SIZE) as usize).min(buf.len() - done);
            let dst = &mut buf[done..done + n];
            match self.lookup(a, n, access) {
                // SAFETY: `lookup` gives a pointer into an arena frame of
                // the attached address space, which holds its `PhysMem`
                // (hence the arena mapping) alive; `n` stops at the page
                // end; the open section keeps the frame from being freed
                // until the copy is done, and the copy makes no call into
                // softmm.
                Ok(p) => unsafe { crate::access::copy_from_host(p, dst) },
                Err(Fault::Mmio { .. }) => match self.mmio_access(a, access, IoBytes::Load(dst)) {
                    Some(r) => r?,
                    None => continue,
                },
                Err(f) => return Err(f),
            }
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr`, page by page.
    pub(super) fn section_write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let r = self.section_write_pages(addr, data);
        self.sized(r, Access::Write, addr, data.len())
    }

    /// [`Cpu::section_write`]'s copy.
    fn section_write_pages(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let mut done = 0;
        while done < data.len() {
            let a = addr.wrapping_add(done as u64);
            let n = ((PAGE_SIZE - a % PAGE_SIZE) as usize).min(data.len() - done);
            let src = &data[done..done + n];
            match self.lookup(a, n, Access::Write) {
                // SAFETY: as in `section_copy_in`.
                Ok(p) => unsafe { crate::access::copy_to_host(src, p) },
                Err(Fault::Mmio { .. }) => match self.mmio_access(a, Access::Write, IoBytes::Store(src)) {
                    Some(r) => r?,
                    None => continue,
                },
                Err(f) => return Err(f),
            }
            done += n;
        }
        Ok(())
    }

    /// `Section::load_raw` for a misaligned scalar or a TLB miss.
    #[cold]
    #[inline(never)]
    fn section_load_slow(&mut self, addr: u64, n: usize, access: Access) -> Result<u64, Fault> {
        let r = self.section_load_split(addr, n, access);
        self.sized(r, access, addr, n)
    }

    /// [`Cpu::section_load_slow`]'s load: in the page or across.
    #[inline(always)]
    fn section_load_split(&mut self, addr: u64, n: usize, access: Access) -> Result<u64, Fault> {
        if addr % PAGE_SIZE <= PAGE_SIZE - n as u64 {
            loop {
                match self.lookup(addr, n, access) {
                    // SAFETY: `[p, p + n)` does not cross the page end
                    // (checked), so it and the aligned words holding it lie
                    // in one arena frame (frames are page aligned); the
                    // section keeps the frame allocated until the load is
                    // done; arena memory is only ever accessed atomically.
                    Ok(p) => return Ok(unsafe { scalar::load_in_page(p, n) }),
                    Err(Fault::Mmio { .. }) => {
                        let mut b = [0; 8];
                        if let Some(r) = self.mmio_access(addr, access, IoBytes::Load(&mut b[..n])) {
                            return r.map(|()| u64::from_le_bytes(b));
                        }
                    }
                    Err(f) => return Err(f),
                }
            }
        }
        self.section_load_across(addr, n, access)
    }

    #[cold]
    fn section_load_across(&mut self, addr: u64, n: usize, access: Access) -> Result<u64, Fault> {
        let mut b = [0; 8];
        self.section_copy_in(addr, &mut b[..n], access)?;
        Ok(u64::from_le_bytes(b))
    }

    /// `Section::store_raw` for a misaligned scalar or a TLB miss.
    #[cold]
    #[inline(never)]
    fn section_store_slow(&mut self, addr: u64, n: usize, raw: u64) -> Result<(), Fault> {
        let r = self.section_store_split(addr, n, raw);
        self.sized(r, Access::Write, addr, n)
    }

    /// [`Cpu::section_store_slow`]'s store: in the page or across.
    #[inline(always)]
    fn section_store_split(&mut self, addr: u64, n: usize, raw: u64) -> Result<(), Fault> {
        if addr % PAGE_SIZE <= PAGE_SIZE - n as u64 {
            loop {
                match self.lookup(addr, n, Access::Write) {
                    Ok(p) => {
                        // SAFETY: as in `section_load_slow`, for `[p, p + n)`.
                        unsafe { scalar::store_in_page(p, raw, n) };
                        return Ok(());
                    }
                    Err(Fault::Mmio { .. }) => {
                        let b = raw.to_le_bytes();
                        if let Some(r) = self.mmio_access(addr, Access::Write, IoBytes::Store(&b[..n])) {
                            return r;
                        }
                    }
                    Err(f) => return Err(f),
                }
            }
        }
        self.section_store_across(addr, n, raw)
    }

    #[cold]
    fn section_store_across(&mut self, addr: u64, n: usize, raw: u64) -> Result<(), Fault> {
        self.section_write(addr, &raw.to_le_bytes()[..n])
    }
}

impl Drop for Section<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.state().section_end();
    }
}

impl Section<'_> {
    /// The CPU's shootdown state.
    #[inline(always)]
    fn state(&self) -> &CpuTlbState {
        // SAFETY: `state` points to the `CpuTlbState` that `cpu.state` (an
        // `Arc`, never reassigned) keeps alive at a fixed address for as
        // long as the `Cpu` lives, which the section borrows; it is only
        // atomics, shared access is all it takes.
        unsafe { self.state.as_ref() }
    }

    /// The section's CPU.
    #[inline(always)]
    pub(super) fn cpu(&self) -> &Cpu {
        self.cpu
    }

    /// The section's CPU, mutably.
    #[inline(always)]
    pub(super) fn cpu_mut(&mut self) -> &mut Cpu {
        self.cpu
    }

    /// What the last access of the CPU that faulted was, as
    /// [`Cpu::last_fault`].
    pub fn last_fault(&self) -> Option<super::FaultInfo> {
        self.cpu.last_fault()
    }

    /// The CPU's 4 KiB TLB as an ABI, for C and generated code that test
    /// a hit themselves (QEMU's inline `tlb_hit`) and call
    /// [`Section::probe`] on a miss. See [`TlbAbi`] for the rules a reader
    /// follows.
    #[inline]
    pub fn tlb_abi(&self) -> TlbAbi {
        TlbAbi { table: self.tlb().abi_table(), entries: TLB_ENTRIES, page_shift: PAGE_SIZE.trailing_zeros() }
    }

    /// The host address of the `size` bytes at `va`, translated for
    /// `access` (QEMU's `probe_access`, its `tlb_fill` on a miss): from the
    /// TLB, else the 2 MiB TLB, else a walk that fills the entry (and a
    /// page fault, if needed; the fault is recorded with `size`, as
    /// [`Cpu::last_fault`] reports it). After an `Ok`, a lookup through
    /// [`Section::tlb_abi`] of a naturally aligned scalar in the page hits,
    /// unless the page is in the 2 MiB TLB, or must trap (a write watch)
    /// and is never cached for that access.
    ///
    /// The pointer is valid for the `size` bytes until the section ends or
    /// the thread calls into softmm (this call included); dereferencing it
    /// is the caller's `unsafe`, and must be atomic: other guest threads
    /// may access the bytes.
    ///
    /// # Panics
    ///
    /// If `size` is 0 or the bytes cross a page boundary (split such an
    /// access, or use the accessors), and as the accessors do if the CPU is
    /// not attached.
    #[inline]
    pub fn probe(&mut self, va: u64, size: usize, access: Access) -> Result<*mut u8, Fault> {
        assert!(
            size != 0 && (va % PAGE_SIZE) as usize + size <= PAGE_SIZE as usize,
            "probe of {size} bytes at {va:#x}: empty or across a page boundary"
        );
        match self.lookup(va, size, access) {
            Ok(p) => Ok(p),
            Err(f) => Err(self.cpu.note_fault(f, access, va, size)),
        }
    }

    /// The CPU's TLB.
    #[inline(always)]
    fn tlb(&self) -> &SoftTlb {
        &self.state().tlb
    }

    /// The host address of `va` for `access`, as [`Cpu::lookup`] (valid
    /// until the section ends or the thread calls into softmm), with the
    /// TLB reached through the section's own pointer.
    #[inline(always)]
    pub(super) fn lookup(&mut self, va: u64, size: usize, access: Access) -> Result<*mut u8, Fault> {
        match self.tlb().hit(va, access) {
            Some(p) => Ok(p),
            None => self.cpu.translate_slow(va, size, access),
        }
    }

    /// Copies guest bytes at `addr` into `buf`, each page translated for
    /// `access` (a read or a fetch).
    #[inline(always)]
    pub(super) fn copy_in(&mut self, addr: u64, buf: &mut [u8], access: Access) -> Result<(), Fault> {
        self.cpu.section_copy_in(addr, buf, access)
    }

    /// Reads `buf.len()` bytes at `addr`, as [`Cpu::read`].
    #[inline(always)]
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.cpu.section_copy_in(addr, buf, Access::Read)
    }

    /// Fetches `buf.len()` bytes of instructions at `addr`, as [`Cpu::fetch`].
    #[inline(always)]
    pub fn fetch(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.cpu.section_copy_in(addr, buf, Access::Execute)
    }

    /// Writes `data` at `addr`, as [`Cpu::write`].
    #[inline(always)]
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.cpu.section_write(addr, data)
    }

    /// The `n`-byte little-endian value at `addr`, translated for `access`.
    /// Always inlined: a naturally aligned scalar whose page the TLB holds
    /// is one compare and one load in the accessor.
    #[inline(always)]
    fn load_raw(&mut self, addr: u64, n: usize, access: Access) -> Result<u64, Fault> {
        if let Some(p) = self.tlb().hit_aligned(addr, n, access) {
            // SAFETY: `p` is aligned to `n` (the hit says `addr` is, and
            // frames are page aligned), so `[p, p + n)` lies in one arena
            // frame, which the section keeps allocated until the load is
            // done; arena memory is only ever accessed atomically.
            return Ok(unsafe { scalar::load_aligned(p, n) });
        }
        self.cpu.section_load_slow(addr, n, access)
    }

    /// Stores the low `n` bytes of `raw` little-endian at `addr` (always
    /// inlined, as `load_raw`).
    #[inline(always)]
    fn store_raw(&mut self, addr: u64, n: usize, raw: u64) -> Result<(), Fault> {
        if let Some(p) = self.tlb().hit_aligned(addr, n, Access::Write) {
            // SAFETY: as in `load_raw`.
            unsafe { scalar::store_aligned(p, raw, n) };
            return Ok(());
        }
        self.cpu.section_store_slow(addr, n, raw)
    }

    /// Reads the little-endian `T` at `addr`, as [`Cpu::read_le`].
    #[inline(always)]
    pub fn read_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault> {
        Ok(T::from_raw(self.load_raw(addr, T::SIZE, Access::Read)?))
    }

    /// Writes `v` little-endian at `addr`, as [`Cpu::write_le`].
    #[inline(always)]
    pub fn write_le<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), Fault> {
        self.store_raw(addr, T::SIZE, v.to_raw())
    }

    /// Fetches the little-endian instruction unit `T` at `addr`, as
    /// [`Cpu::fetch_le`].
    #[inline(always)]
    pub fn fetch_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault> {
        Ok(T::from_raw(self.load_raw(addr, T::SIZE, Access::Execute)?))
    }

    /// Runs `op` on the naturally aligned atomic `T` at `addr`, translated
    /// for `access`; an unaligned `addr` follows the address space's
    /// [`AtomicAlignment`](crate::AtomicAlignment), `split` being the
    /// operation on values (`cpu/split_atomic.rs`).
    #[inline]
    fn atomic_at<T: Scalar, R>(
        &mut self,
        addr: u64,
        access: Access,
        op: impl FnOnce(&T::Atomic) -> R,
        split: impl Fn(T) -> (Option<T>, R),
    ) -> Result<R, Fault> {
        if addr % T::SIZE as u64 != 0 {
            return self.atomic_unaligned(addr, access, split);
        }
        let p = match self.lookup(addr, T::SIZE, access) {
            Ok(p) => p,
            Err(f) => return Err(self.cpu.note_fault(f, access, addr, T::SIZE)),
        };
        // SAFETY: aligned to its width (checked), so inside one arena frame
        // (a naturally aligned scalar never crosses a page), which the
        // section keeps from being freed while `op` runs; the reference does
        // not outlive `op`.
        Ok(op(unsafe { T::atomic(p) }))
    }

    /// [`Section::atomic_at`] for an `addr` not aligned to the scalar:
    /// `Fault::Unaligned` (`Strict`), or a split atomic (`Split`).
    #[cold]
    #[inline(never)]
    fn atomic_unaligned<T: Scalar, R>(
        &mut self,
        addr: u64,
        access: Access,
        split: impl Fn(T) -> (Option<T>, R),
    ) -> Result<R, Fault> {
        let policy = self.cpu.mm.as_ref().map(|mm| mm.config.atomic_alignment);
        let r = match policy {
            Some(crate::AtomicAlignment::Split) => self.cpu.split_atomic(addr, access, split),
            _ => Err(Fault::Unaligned { addr }),
        };
        r.map_err(|f| self.cpu.note_fault(f, access, addr, T::SIZE))
    }

    /// Atomically loads the `T` at `addr`, as [`Cpu::atomic_load`].
    pub fn atomic_load<T: Scalar>(&mut self, addr: u64, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(addr, Access::Read, |a| T::load(a, load_part(order)), |old| (None, old))
    }

    /// Atomically stores `v` at `addr`, as [`Cpu::atomic_store`].
    pub fn atomic_store<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<(), Fault> {
        self.atomic_at::<T, _>(addr, Access::Write, |a| T::store(a, v, store_part(order)), |_| (Some(v), ()))
    }

    /// Atomically swaps the `T` at `addr`, as [`Cpu::atomic_swap`].
    pub fn atomic_swap<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(addr, Access::Write, |a| T::swap(a, v, order), |old| (Some(v), old))
    }

    /// Atomic compare-and-exchange, as [`Cpu::atomic_compare_exchange`].
    pub fn atomic_compare_exchange<T: Scalar>(
        &mut self,
        addr: u64,
        current: T,
        new: T,
        success: Ordering,
        failure: Ordering,
    ) -> Result<Result<T, T>, Fault> {
        self.atomic_at::<T, _>(
            addr,
            Access::Write,
            |a| T::compare_exchange(a, current, new, success, load_part(failure)),
            |old| if old == current { (Some(new), Ok(old)) } else { (None, Err(old)) },
        )
    }

    /// Atomic wrapping add, as [`Cpu::atomic_fetch_add`].
    pub fn atomic_fetch_add<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(
            addr,
            Access::Write,
            |a| T::fetch_add(a, v, order),
            |old| (Some(T::from_raw(old.to_raw().wrapping_add(v.to_raw()))), old),
        )
    }

    /// Atomic wrapping subtract, as [`Cpu::atomic_fetch_sub`].
    pub fn atomic_fetch_sub<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(
            addr,
            Access::Write,
            |a| T::fetch_sub(a, v, order),
            |old| (Some(T::from_raw(old.to_raw().wrapping_sub(v.to_raw()))), old),
        )
    }

    /// Atomic bitwise and, as [`Cpu::atomic_fetch_and`].
    pub fn atomic_fetch_and<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(
            addr,
            Access::Write,
            |a| T::fetch_and(a, v, order),
            |old| (Some(T::from_raw(old.to_raw() & v.to_raw())), old),
        )
    }

    /// Atomic bitwise or, as [`Cpu::atomic_fetch_or`].
    pub fn atomic_fetch_or<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(
            addr,
            Access::Write,
            |a| T::fetch_or(a, v, order),
            |old| (Some(T::from_raw(old.to_raw() | v.to_raw())), old),
        )
    }

    /// Atomic bitwise exclusive or, as [`Cpu::atomic_fetch_xor`].
    pub fn atomic_fetch_xor<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault> {
        self.atomic_at::<T, _>(
            addr,
            Access::Write,
            |a| T::fetch_xor(a, v, order),
            |old| (Some(T::from_raw(old.to_raw() ^ v.to_raw())), old),
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::uapi::*;
    use crate::{AddressSpace, Cpu, Fault, MmConfig, PhysConfig, PhysMem, SegvCode, PAGE_SIZE};

    const RW: i32 = PROT_READ | PROT_WRITE;
    const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

    fn setup(pages: u64) -> (Arc<PhysMem>, Arc<AddressSpace>, u64) {
        let p = PhysMem::new(PhysConfig::new(64 << 10)).unwrap();
        let mm = AddressSpace::new(&p, MmConfig::default()).unwrap();
        let a = mm.mmap(0, pages * PAGE_SIZE, RW, ANON, None, 0).unwrap();
        (p, mm, a)
    }

    #[track_caller]
    fn assert_no_leaks(phys: &PhysMem) {
        let s = phys.quiesce();
        assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "{s:?}");
    }

    #[test]
    fn a_section_faults_pages_in_and_reports_faults_like_the_cpu() {
        let (p, mm, a) = setup(2);
        let mut cpu = Cpu::attached(&mm);
        {
            let mut s = cpu.section();
            // First touches fault inside the section, which is left and
            // re-entered around each fault.
            s.write_u64(a, 7).unwrap();
            s.write_le::<u32>(a + PAGE_SIZE - 2, 0x1122_3344).unwrap();
            assert_eq!(s.read_u64(a), Ok(7));
            assert_eq!(s.read_be::<u16>(a + PAGE_SIZE), Ok(0x2211));
            assert_eq!(s.atomic_fetch_add::<u64>(a, 1, std::sync::atomic::Ordering::AcqRel), Ok(7));
            assert_eq!(s.fetch_u32(a), Err(Fault::Segv { addr: a, code: SegvCode::AccErr }));
            let end = a + 2 * PAGE_SIZE;
            assert_eq!(s.read_u8(end), Err(Fault::Segv { addr: end, code: SegvCode::MapErr }));
            // A fault does not end the section for the accesses after it.
            assert_eq!(s.read_u64(a), Ok(8));
        }
        assert_eq!(cpu.read_u64(a), Ok(8));
        drop((cpu, mm));
        assert_no_leaks(&p);
    }

    /// The hit an inline reader computes from the ABI alone.
    fn abi_hit(abi: &super::TlbAbi, va: u64, n: u64, access: crate::Access) -> Option<*mut u8> {
        // SAFETY: the index is below `entries`; the test's section is open
        // on this thread and nothing writes the table meanwhile.
        let e = unsafe { *abi.table.add(((va >> abi.page_shift) as usize) & (abi.entries - 1)) };
        let key = va & (!((1u64 << abi.page_shift) - 1) | (n - 1));
        (e.tags[access as usize >> 1] == key).then(|| (e.bias as *mut u8).wrapping_add(va as usize))
    }

    /// The ABI reads what the section's own accessors read: a probe fills
    /// the entry, the inline hit then gives the probe's address for a read
    /// (not a write of a clean page, nor a fetch of a non-executable one,
    /// nor a misaligned scalar), and a call into softmm that unmaps the
    /// page leaves no tag that matches.
    #[test]
    fn the_tlb_abi_hits_where_the_section_does_and_nowhere_else() {
        use crate::Access::{Execute, Read, Write};
        let (p, mm, a) = setup(2);
        let mut cpu = Cpu::attached(&mm);
        let mut s = cpu.section();
        let abi = s.tlb_abi();
        assert_eq!((abi.entries, abi.page_shift), (64, 12));
        assert_eq!(abi_hit(&abi, a + 8, 8, Read), None, "nothing cached yet");
        let host = s.probe(a + 8, 8, Read).unwrap();
        assert_eq!(abi_hit(&abi, a + 8, 8, Read), Some(host));
        assert_eq!(abi_hit(&abi, a + 16, 8, Read), Some(host.wrapping_add(8)));
        assert_eq!(abi_hit(&abi, a + 12, 8, Read), None, "misaligned");
        assert_eq!(abi_hit(&abi, a + 8, 8, Write), None, "a read fault maps the zero page");
        assert_eq!(abi_hit(&abi, a + 8, 8, Execute), None, "not executable");
        let w = s.probe(a + 8, 8, Write).unwrap();
        assert_eq!(abi_hit(&abi, a + 8, 8, Write), Some(w));
        // SAFETY: aligned, in the page, the section open, no call since.
        unsafe { &*(w as *const std::sync::atomic::AtomicU64) }.store(0x55, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(s.read_u64(a + 8), Ok(0x55));
        mm.munmap(a, PAGE_SIZE).unwrap();
        assert_eq!(abi_hit(&abi, a + 8, 8, Read), None, "the call emptied the entry");
        assert_eq!(s.probe(a + 8, 8, Read), Err(Fault::Segv { addr: a + 8, code: SegvCode::MapErr }));
        assert_eq!(s.last_fault().map(|f| (f.access, f.addr, f.size)), Some((Read, a + 8, 8)));
        drop(s);
        drop((cpu, mm));
        assert_no_leaks(&p);
    }

    #[test]
    #[should_panic(expected = "across a page boundary")]
    fn a_probe_across_a_page_panics() {
        let (_p, mm, a) = setup(2);
        let mut cpu = Cpu::attached(&mm);
        let _ = cpu.section().probe(a + PAGE_SIZE - 4, 8, crate::Access::Read);
    }

    /// A call into softmm from inside the section (here `munmap` on the
    /// section's own thread, which flushes nobody of this thread) must not
    /// leave the section's TLB entries usable: the quiescent guard emptied
    /// them, so the next access walks and faults, never reaches the freed frame.
    #[test]
    fn an_unmap_from_inside_a_section_is_seen_by_its_next_access() {
        let (p, mm, a) = setup(1);
        let mut cpu = Cpu::attached(&mm);
        cpu.write_u64(a, 1).unwrap();
        {
            let mut s = cpu.section();
            assert_eq!(s.read_u64(a), Ok(1));
            mm.munmap(a, PAGE_SIZE).unwrap();
            assert_eq!(s.read_u64(a), Err(Fault::Segv { addr: a, code: SegvCode::MapErr }));
        }
        let b = mm.mmap(0, PAGE_SIZE, PROT_READ, ANON, None, 0).unwrap();
        let mut s = cpu.section();
        assert_eq!(s.read_u64(b), Ok(0));
        mm.mprotect(b, PAGE_SIZE, PROT_NONE).unwrap();
        assert_eq!(s.read_u64(b), Err(Fault::Segv { addr: b, code: SegvCode::AccErr }));
        drop(s);
        drop((cpu, mm));
        assert_no_leaks(&p);
    }

    /// An open section is an access: another thread's munmap does not
    /// return before it ends; once the section is dropped the thread may
    /// block with no effect on anyone, and its next access faults.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "a fixed sleep stands for 'the unmapper is waiting', which Miri's scheduler need not honour"
    )]
    fn another_threads_munmap_waits_for_an_open_section_only() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let (p, mm, a) = setup(1);
        let unmapped = Arc::new(AtomicBool::new(false));
        let (opened_tx, opened_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let t = {
            let (mm, unmapped) = (mm.clone(), unmapped.clone());
            std::thread::spawn(move || {
                let mut cpu = Cpu::attached(&mm);
                cpu.write_u64(a, 5).unwrap();
                let mut s = cpu.section();
                assert_eq!(s.read_u64(a), Ok(5));
                opened_tx.send(()).unwrap();
                // The unmapper runs meanwhile, and must still be waiting.
                std::thread::sleep(Duration::from_millis(50));
                let returned_during_section = unmapped.load(SeqCst);
                // The PTE may already be gone (a fault), the frame not.
                let inside = s.read_u64(a);
                drop(s);
                // Out of the section: block until the unmap is done.
                done_rx.recv().unwrap();
                (returned_during_section, inside, cpu.read_u64(a))
            })
        };
        opened_rx.recv().unwrap();
        mm.munmap(a, PAGE_SIZE).unwrap();
        unmapped.store(true, SeqCst);
        done_tx.send(()).unwrap();
        let (returned_during_section, inside, after) = t.join().unwrap();
        let maperr = Err(Fault::Segv { addr: a, code: SegvCode::MapErr });
        assert!(!returned_during_section, "the munmap did not wait for the open section");
        assert!(inside == Ok(5) || inside == maperr, "{inside:?}");
        assert_eq!(after, maperr);
        assert!(mm.stats().tlb.flush_waits >= 1);
        drop(mm);
        assert_no_leaks(&p);
    }
}
