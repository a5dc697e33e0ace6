//! The Linux constants of the syscall interface softmm mirrors (x86-64 values).

pub use libc::{
    MADV_DODUMP, MADV_DOFORK, MADV_DONTDUMP, MADV_DONTFORK, MADV_DONTNEED, MADV_FREE, MADV_HUGEPAGE, MADV_KEEPONFORK,
    MADV_NOHUGEPAGE, MADV_NORMAL, MADV_RANDOM, MADV_REMOVE, MADV_SEQUENTIAL, MADV_WILLNEED, MADV_WIPEONFORK,
    MAP_ANONYMOUS, MAP_DENYWRITE, MAP_EXECUTABLE, MAP_FIXED, MAP_GROWSDOWN, MAP_HUGETLB, MAP_LOCKED, MAP_NONBLOCK,
    MAP_NORESERVE, MAP_POPULATE, MAP_PRIVATE, MAP_SHARED, MAP_STACK, MREMAP_FIXED, MREMAP_MAYMOVE, PROT_EXEC,
    PROT_GROWSDOWN, PROT_GROWSUP, PROT_NONE, PROT_READ, PROT_WRITE,
};
pub use libc::{MS_ASYNC, MS_INVALIDATE, MS_SYNC};

/// `MAP_SHARED` with unknown flags rejected.
pub const MAP_SHARED_VALIDATE: i32 = 0x03;
/// The mapping-type bits of the flags.
pub const MAP_TYPE: i32 = 0x0f;
/// Like `MAP_FIXED`, but fails with `EEXIST` instead of replacing a mapping.
pub const MAP_FIXED_NOREPLACE: i32 = 0x100000;
/// Accepted and ignored, as by Linux.
pub const MAP_UNINITIALIZED: i32 = 0x4000000;
/// Place the mapping in `[1 GiB, 2 GiB)` (x86-64), hugetlb mappings too.
pub const MAP_32BIT: i32 = 0x40;
/// Move the pages but leave the source mapping in place, empty.
pub const MREMAP_DONTUNMAP: i32 = 4;
/// Fault pages in readable.
pub const MADV_POPULATE_READ: i32 = 22;
/// Fault pages in writable.
pub const MADV_POPULATE_WRITE: i32 = 23;
/// Like `MADV_DONTNEED`, also on locked VMAs.
pub const MADV_DONTNEED_LOCKED: i32 = 24;
/// Reclaim hint: deactivate.
pub const MADV_COLD: i32 = 20;
/// Reclaim hint: page out.
pub const MADV_PAGEOUT: i32 = 21;
/// KSM may merge the range's pages (sets `VM_MERGEABLE`).
pub const MADV_MERGEABLE: i32 = 12;
/// Undoes `MADV_MERGEABLE`.
pub const MADV_UNMERGEABLE: i32 = 13;
/// Collapse the range into transparent huge pages now.
pub const MADV_COLLAPSE: i32 = 25;
/// Install guard markers: any access raises SIGSEGV (Linux 6.13+).
pub const MADV_GUARD_INSTALL: i32 = 102;
/// Remove guard markers.
pub const MADV_GUARD_REMOVE: i32 = 103;

/// `mlock2`: lock the pages as they are faulted in, populate nothing.
pub const MLOCK_ONFAULT: i32 = 0x01;
/// `mlockall`: lock every current mapping.
pub const MCL_CURRENT: i32 = 1;
/// `mlockall`: lock every future mapping (`mm->def_flags`).
pub const MCL_FUTURE: i32 = 2;
/// `mlockall`: with `MCL_CURRENT` or `MCL_FUTURE`, lock on fault.
pub const MCL_ONFAULT: i32 = 4;
/// `prctl(PR_SET_MDWE, bits)`: memory-deny-write-execute (Linux 6.3+).
pub const PR_SET_MDWE: i32 = 65;
/// `prctl(PR_GET_MDWE)`: the MDWE bits.
pub const PR_GET_MDWE: i32 = 66;
/// MDWE: refuse mappings that are writable and executable, or gain execute.
pub const PR_MDWE_REFUSE_EXEC_GAIN: u64 = 1;
/// MDWE: a child made by `fork` does not inherit the bits.
pub const PR_MDWE_NO_INHERIT: u64 = 2;

/// `fallocate`: keep the size (`FALLOC_FL_KEEP_SIZE`).
pub const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
/// `fallocate`: free the range (`FALLOC_FL_PUNCH_HOLE`, with `KEEP_SIZE`).
pub const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
