//! The accessors [`Cpu`] and [`Section`] share, each written once: a
//! `Cpu` accessor is a section of one access (it opens one, makes the
//! access through the [`Section`] method of the same name, and closes it),
//! and the accessors derived from the primitive ones (the fixed widths, big
//! endian, plain-old-data values) are defined alike on both types. All are
//! inlined as they were when written out by hand: the benchmarks' hit path
//! is one compare and one load in the caller.

use std::sync::atomic::Ordering;

use super::{Cpu, Scalar, Section};
use crate::error::Fault;

/// Defines on [`Cpu`] each listed accessor as a one-access section: open a
/// section, make the access through [`Section`]'s method of the same name,
/// close the section when it is dropped.
macro_rules! one_access_section {
    ($(
        $(#[$attr:meta])*
        fn $name:ident<T: $bound:ident>(&mut self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
    )*) => {
        impl Cpu {
            $(
                $(#[$attr])*
                pub fn $name<T: $bound>(&mut self $(, $arg: $ty)*) -> $ret {
                    self.section().$name::<T>($($arg),*)
                }
            )*
        }
    };
}

one_access_section! {
    /// Reads the little-endian `T` at `addr` (any alignment). Naturally
    /// aligned, it is one atomic load (no other guest thread's aligned
    /// store is seen halfway, as on x86-64); inside a page it costs one
    /// translation and one or two word loads; across a page boundary it is
    /// read page by page, and faults at the first byte it cannot read.
    ///
    /// ```
    /// # use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// let mut cpu = Cpu::attached(&mm);
    /// cpu.write_le::<u32>(a + 1, 0x1122_3344).unwrap();
    /// assert_eq!(cpu.read_le::<u16>(a + 1).unwrap(), 0x3344);
    /// assert_eq!(cpu.read_be::<u32>(a + 1).unwrap(), 0x4433_2211);
    /// assert_eq!(cpu.read_le::<i8>(a + 4).unwrap(), 0x11);
    /// ```
    #[inline(always)]
    fn read_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault>;

    /// Writes `v` little-endian at `addr` (any alignment). Naturally
    /// aligned, it is one atomic store; unaligned inside a page, the widest
    /// aligned stores that make it up (never a byte outside it); across a
    /// page boundary, page by page: on a fault the bytes before the
    /// faulting page have been written, as with [`Cpu::write`].
    #[inline(always)]
    fn write_le<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), Fault>;

    /// Fetches the little-endian instruction unit `T` at `addr` (any
    /// alignment): [`Cpu::read_le`] with [`Cpu::fetch`]'s permission check.
    #[inline(always)]
    fn fetch_le<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault>;

    /// Atomically loads the naturally aligned `T` at `addr` with `order`
    /// (host byte order, as every atomic here). An unaligned address is
    /// `Fault::Unaligned` under [`AtomicAlignment::Strict`](crate::AtomicAlignment::Strict)
    /// (the default); under [`AtomicAlignment::Split`](crate::AtomicAlignment::Split)
    /// every atomic here is made at any alignment, inside a page or across
    /// two, as x86's split locks (`SeqCst`; see that policy for what it is
    /// atomic with). An atomic on an MMIO region is `Fault::Mmio`. An
    /// ordering that a load cannot have is reduced
    /// to its load part (`Release` to `Relaxed`, `AcqRel` to `Acquire`)
    /// instead of panicking as `std`'s atomics do.
    ///
    /// ```
    /// # use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
    /// use std::sync::atomic::Ordering;
    /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
    /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    /// # let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    /// # let mut cpu = Cpu::attached(&mm);
    /// cpu.atomic_store::<u16>(a + 2, 7, Ordering::Release).unwrap();
    /// assert_eq!(cpu.atomic_fetch_or::<u16>(a + 2, 8, Ordering::AcqRel).unwrap(), 7);
    /// assert_eq!(cpu.atomic_load::<u16>(a + 2, Ordering::Acquire).unwrap(), 15);
    /// assert!(cpu.atomic_load::<u32>(a + 2, Ordering::Relaxed).is_err()); // unaligned
    /// ```
    fn atomic_load<T: Scalar>(&mut self, addr: u64, order: Ordering) -> Result<T, Fault>;

    /// Atomically stores `v` at the naturally aligned `addr` with `order`
    /// (`Acquire` reduced to `Relaxed`, `AcqRel` to `Release`).
    fn atomic_store<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<(), Fault>;

    /// Atomically swaps the `T` at the naturally aligned `addr` for `v`;
    /// returns the old value.
    fn atomic_swap<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault>;

    /// Atomic compare-and-exchange of the naturally aligned `T` at `addr`:
    /// `Ok(Ok(old))` on success, `Ok(Err(actual))` on a mismatch. Needs
    /// write access even when the comparison fails, like x86's `lock
    /// cmpxchg`. A `failure` ordering a load cannot have is reduced to its
    /// load part.
    fn atomic_compare_exchange<T: Scalar>(&mut self, addr: u64, current: T, new: T, success: Ordering, failure: Ordering) -> Result<Result<T, T>, Fault>;

    /// Atomic wrapping add at the naturally aligned `addr`; returns the old value.
    fn atomic_fetch_add<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault>;

    /// Atomic wrapping subtract at the naturally aligned `addr`; returns the old value.
    fn atomic_fetch_sub<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault>;

    /// Atomic bitwise and at the naturally aligned `addr`; returns the old value.
    fn atomic_fetch_and<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault>;

    /// Atomic bitwise or at the naturally aligned `addr`; returns the old value.
    fn atomic_fetch_or<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault>;

    /// Atomic bitwise exclusive or at the naturally aligned `addr`; returns the old value.
    fn atomic_fetch_xor<T: Scalar>(&mut self, addr: u64, v: T, order: Ordering) -> Result<T, Fault>;
}

/// Defines the accessors derived from `read_le`, `write_le`, `fetch_le`,
/// `read` and `write` on each listed type (`Cpu` and `Section`, which have
/// those five with the same signatures and semantics).
macro_rules! derived_accessors {
    ($($target:ty),*) => {$(
        impl $target {
        /// Reads the big-endian `T` at `addr`, as [`Cpu::read_le`].
        #[inline(always)]
        pub fn read_be<T: Scalar>(&mut self, addr: u64) -> Result<T, Fault> {
            Ok(self.read_le::<T>(addr)?.swap_bytes())
        }

        /// Writes `v` big-endian at `addr`, as [`Cpu::write_le`].
        #[inline(always)]
        pub fn write_be<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), Fault> {
            self.write_le(addr, v.swap_bytes())
        }

        /// Fetches a little-endian `u16` instruction unit (a RISC-V compressed
        /// instruction, a Thumb half-word), as [`Cpu::fetch_le`].
        #[inline(always)]
        pub fn fetch_u16(&mut self, addr: u64) -> Result<u16, Fault> {
            self.fetch_le(addr)
        }

        /// Fetches a little-endian `u32` instruction word, as [`Cpu::fetch_le`].
        #[inline(always)]
        pub fn fetch_u32(&mut self, addr: u64) -> Result<u32, Fault> {
            self.fetch_le(addr)
        }

        /// Reads a `u8`.
        #[inline(always)]
        pub fn read_u8(&mut self, addr: u64) -> Result<u8, Fault> {
            self.read_le(addr)
        }

        /// Writes a `u8`.
        #[inline(always)]
        pub fn write_u8(&mut self, addr: u64, v: u8) -> Result<(), Fault> {
            self.write_le(addr, v)
        }

        /// Reads a little-endian `u16` (any alignment), as [`Cpu::read_le`].
        #[inline(always)]
        pub fn read_u16(&mut self, addr: u64) -> Result<u16, Fault> {
            self.read_le(addr)
        }

        /// Writes a little-endian `u16` (any alignment), as [`Cpu::write_le`].
        #[inline(always)]
        pub fn write_u16(&mut self, addr: u64, v: u16) -> Result<(), Fault> {
            self.write_le(addr, v)
        }

        /// Reads a little-endian `u32` (any alignment), as [`Cpu::read_le`].
        #[inline(always)]
        pub fn read_u32(&mut self, addr: u64) -> Result<u32, Fault> {
            self.read_le(addr)
        }

        /// Writes a little-endian `u32` (any alignment), as [`Cpu::write_le`].
        #[inline(always)]
        pub fn write_u32(&mut self, addr: u64, v: u32) -> Result<(), Fault> {
            self.write_le(addr, v)
        }

        /// Reads a little-endian `u64` (any alignment), as [`Cpu::read_le`].
        #[inline(always)]
        pub fn read_u64(&mut self, addr: u64) -> Result<u64, Fault> {
            self.read_le(addr)
        }

        /// Writes a little-endian `u64` (any alignment), as [`Cpu::write_le`].
        #[inline(always)]
        pub fn write_u64(&mut self, addr: u64, v: u64) -> Result<(), Fault> {
            self.write_le(addr, v)
        }

        /// Reads a plain-old-data value (any [`bytemuck::Pod`] type: integers,
        /// arrays of them, `#[repr(C)]` structs deriving `Pod`) at `addr`, in
        /// host byte order (little-endian on x86-64, like the guest). The copy
        /// is not one atomic access: another guest thread's concurrent store
        /// may be seen in part, as with `memcpy`.
        ///
        /// ```
        /// # use softmm::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, uapi::*};
        /// # let phys = PhysMem::new(PhysConfig::new(1 << 20)).unwrap();
        /// # let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
        /// # let a = mm.mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
        /// # let mut cpu = Cpu::attached(&mm);
        /// cpu.write_obj(a, &[1u32, 2, 3]).unwrap();
        /// let v: [u32; 3] = cpu.read_obj(a).unwrap();
        /// assert_eq!(v, [1, 2, 3]);
        /// ```
        pub fn read_obj<T: bytemuck::Pod>(&mut self, addr: u64) -> Result<T, Fault> {
            let mut v = T::zeroed();
            self.read(addr, bytemuck::bytes_of_mut(&mut v))?;
            Ok(v)
        }

        /// Writes a plain-old-data value at `addr`, as [`Cpu::write`] writes
        /// its bytes (in host byte order; not one atomic access).
        pub fn write_obj<T: bytemuck::Pod>(&mut self, addr: u64, v: &T) -> Result<(), Fault> {
            self.write(addr, bytemuck::bytes_of(v))
        }
        }
    )*};
}

derived_accessors!(Cpu, Section<'_>);
