//! The decoded input: the hostile arguments and the operations that
//! `arbitrary` builds from the fuzzer's bytes.

use super::*;

// ---------------------------------------------------------------------------
// The decoded input.

/// An address argument.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Addr {
    /// A page of the window.
    Win(u8),
    /// A page of the window plus a byte offset (unaligned unless 0 mod 4096).
    WinOff(u8, u16),
    /// The `n`-th mapped page of the address space (a window page if none).
    Mapped(u16),
    /// The current break plus `n` pages.
    Brk(i8),
    /// One of [`SPECIAL_ADDRS`].
    Special(u8),
    /// Any value.
    Raw(u64),
}

/// Interesting addresses: zero, around `mmap_min_addr`, `TASK_SIZE`, 2^47,
/// 2^48, the top of the address space, non-canonical values.
pub const SPECIAL_ADDRS: [u64; 16] = [
    0,
    1,
    0xfff,
    0x1000,
    0x7fff_ffff_e000,
    0x7fff_ffff_f000,
    0x8000_0000_0000,
    0x8000_0000_1000,
    0x1_0000_0000_0000,
    0xffff_8000_0000_0000,
    0xffff_ffff_ffff_f000,
    u64::MAX,
    0x8000_0000_0000_0000,
    0x5555_5555_9000,
    0x4000_0000,
    0x7fff_f7ff_f000,
];

/// A length argument.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Len {
    /// `n` pages (0 included).
    Pages(u8),
    /// `n` bytes (usually unaligned).
    Bytes(u16),
    /// One of [`SPECIAL_LENS`].
    Special(u8),
    /// Any value.
    Raw(u64),
}

/// Interesting lengths: zero, one, around a page, around 2^64 (rounding up
/// wraps), `TASK_SIZE`, 2^63, 2 MiB, 1 GiB.
pub const SPECIAL_LENS: [u64; 16] = [
    0,
    1,
    0xfff,
    0x1001,
    u64::MAX,
    u64::MAX - 0xfff,
    u64::MAX - 0x1000,
    0x7fff_ffff_f000,
    0x7fff_ffff_e000,
    0x8000_0000_0000,
    1 << 63,
    2 << 20,
    1 << 30,
    (1 << 63) - 0x1000,
    0x1000,
    0x2000,
];

/// A file offset argument.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Off {
    /// Page `n`.
    Page(u8),
    /// Byte `n`.
    Byte(u16),
    /// One of [`SPECIAL_LENS`].
    Special(u8),
    /// Any value.
    Raw(u64),
}

/// Which file, and the open mode of the descriptor passed to `mmap`.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct FileArg {
    /// Index (modulo the number of files).
    pub file: u8,
    /// Open mode: 0 read-write, 1 read-only, 2 write-only, 3 neither (path).
    pub mode: u8,
    /// Pass no file at all (`EBADF` unless anonymous).
    pub none: bool,
}

/// `mmap` flags: a mapping type and individual bits.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct MapFlags {
    /// Selects the `MAP_TYPE` field: shared, private, shared-validate, 0, droppable, or any nibble.
    pub ty: u8,
    /// Each bit turns on one of [`MAP_BITS`].
    pub bits: u16,
    /// Bits OR-ed in when `raw_on` is set (unknown flags).
    pub raw: u32,
    /// Whether `raw` is used.
    pub raw_on: bool,
}

/// The flag bits [`MapFlags::bits`] selects from.
pub const MAP_BITS: [i32; 15] = [
    MAP_FIXED,
    MAP_ANONYMOUS,
    MAP_FIXED_NOREPLACE,
    MAP_POPULATE,
    MAP_LOCKED,
    MAP_NORESERVE,
    MAP_HUGETLB,
    MAP_32BIT,
    MAP_STACK,
    MAP_NONBLOCK,
    MAP_DENYWRITE,
    MAP_EXECUTABLE,
    MAP_UNINITIALIZED,
    MAP_SYNC,
    MAP_GROWSDOWN,
];

/// A `prot` argument.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum ProtArg {
    /// `PROT_READ|WRITE|EXEC` bits.
    Bits(u8),
    /// Any value.
    Raw(i32),
}

/// A `madvise` advice.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Advice {
    /// One of [`ADVICES`].
    Known(u8),
    /// Any value.
    Raw(i32),
}

/// Advice values: every one Linux knows that the model handles, plus a few it does not.
pub const ADVICES: [i32; 26] = [
    MADV_NORMAL,
    MADV_RANDOM,
    MADV_SEQUENTIAL,
    MADV_WILLNEED,
    MADV_DONTNEED,
    MADV_FREE,
    MADV_REMOVE,
    MADV_DONTFORK,
    MADV_DOFORK,
    MADV_MERGEABLE,
    MADV_UNMERGEABLE,
    MADV_HUGEPAGE,
    MADV_NOHUGEPAGE,
    MADV_DONTDUMP,
    MADV_DODUMP,
    MADV_WIPEONFORK,
    MADV_KEEPONFORK,
    MADV_COLD,
    MADV_PAGEOUT,
    MADV_POPULATE_READ,
    MADV_POPULATE_WRITE,
    MADV_DONTNEED_LOCKED,
    MADV_COLLAPSE,
    MADV_DONTNEED,
    MADV_GUARD_INSTALL,
    MADV_GUARD_REMOVE,
];

/// One operation.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// `mmap`.
    Mmap { asi: u8, addr: Addr, len: Len, prot: ProtArg, flags: MapFlags, file: FileArg, off: Off },
    /// `munmap`.
    Munmap { asi: u8, addr: Addr, len: Len },
    /// `mprotect`.
    Mprotect { asi: u8, addr: Addr, len: Len, prot: ProtArg },
    /// `mremap` (flags: the low three bits, or any value if `raw_flags`).
    Mremap { asi: u8, addr: Addr, old: Len, new: Len, flags: u8, raw_flags: Option<i32>, new_addr: Addr },
    /// `madvise`.
    Madvise { asi: u8, addr: Addr, len: Len, advice: Advice },
    /// `mincore` with a buffer of `needed - short` bytes (at least 0).
    Mincore { asi: u8, addr: Addr, len: Len, short: u8 },
    /// `brk`.
    Brk { asi: u8, to: Addr },
    /// `fork`.
    Fork { asi: u8 },
    /// Drop an address space (process exit), unless it is the last.
    Exit { asi: u8 },
    /// `Cpu::write` through CPU `cpu`.
    Write { asi: u8, cpu: bool, addr: Addr, len: u16, val: u8 },
    /// `Cpu::read`.
    Read { asi: u8, cpu: bool, addr: Addr, len: u16 },
    /// `Cpu::fetch_add_u64`.
    FetchAdd { asi: u8, cpu: bool, addr: Addr, v: u64 },
    /// `File::write_at`.
    FileWrite { file: u8, off: Off, len: u16, val: u8 },
    /// `File::read_at`.
    FileRead { file: u8, off: Off, len: u16 },
    /// `File::set_len`.
    FileSetLen { file: u8, size: Off },
    /// `File::punch_hole`.
    FilePunch { file: u8, off: Off, len: Len },
}

/// A whole input: the fault policy, the files' initial sizes, the operations.
#[derive(Clone, Debug)]
pub struct Input {
    /// Index into `FaultPolicy::ALL`.
    pub policy: FaultPolicy,
    /// Initial sizes of the two files, in bytes.
    pub files: [u16; 2],
    /// The operations.
    pub ops: Vec<Op>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let policy = FaultPolicy::ALL[usize::from(u.arbitrary::<u8>()?) % FaultPolicy::ALL.len()];
        let files = [u.arbitrary()?, u.arbitrary()?];
        let mut ops = Vec::new();
        while ops.len() < MAX_OPS && !u.is_empty() {
            ops.push(u.arbitrary()?);
        }
        Ok(Input { policy, files, ops })
    }
}

/// Decodes `data`; `None` if it is too short to hold the header.
pub fn decode(data: &[u8]) -> Option<Input> {
    Input::arbitrary(&mut Unstructured::new(data)).ok()
}
