//! The softmm calls a replay makes, as values: the sequential replay runs
//! each through [`Op::run`] and, for `--bench`, keeps it with its thread and
//! result ([`Planned`]), so that the bench runs exactly the same calls again
//! under each policy and checks each result.

use std::sync::Arc;

use softmm::{page_align, Access, AddressSpace, Cpu, OpenFile, PAGE_SIZE};

/// One softmm call of a replay.
#[derive(Clone)]
pub(super) enum Op {
    Mmap {
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        file: Option<OpenFile>,
        off: u64,
    },
    Munmap {
        addr: u64,
        len: u64,
    },
    Mprotect {
        addr: u64,
        len: u64,
        prot: i32,
    },
    Madvise {
        addr: u64,
        len: u64,
        advice: i32,
    },
    Mremap {
        old: u64,
        old_len: u64,
        new_len: u64,
        flags: i32,
        new_addr: u64,
    },
    Brk {
        addr: u64,
    },
    /// `mlock` (no flags) or `mlock2`.
    Mlock {
        addr: u64,
        len: u64,
        flags: Option<i32>,
    },
    Munlock {
        addr: u64,
        len: u64,
    },
    Mlockall {
        flags: i32,
    },
    Munlockall,
    Mseal {
        addr: u64,
        len: u64,
        flags: u64,
    },
    /// `prctl(PR_SET_MDWE, ...)`, or `PR_GET_MDWE` with `get`.
    Mdwe {
        get: bool,
        args: [u64; 4],
    },
    /// A `fork` of the address space: its pages become copy-on-write. The
    /// child is the replay's process of that index, whose plan the bench
    /// runs on the copy when it runs processes at once (else it drops the
    /// copy).
    Fork {
        child: usize,
    },
    /// A recorded page fault: an access of its kind at `addr`.
    Fault {
        addr: u64,
        access: Access,
    },
}

/// An op of a replay's plan: the thread that made it and what it returned
/// in the sequential replay (a fault: `Ok(0)`, or `Err(1)` where softmm
/// raised a signal).
#[derive(Clone)]
pub(super) struct Planned {
    pub tid: u64,
    pub op: Op,
    pub result: Result<u64, i32>,
    /// Whether it is one of the log's calls (else an op the replay added:
    /// a placeholder for pre-trace memory, an undo, a fault).
    pub call: bool,
    /// Whether its result depends on the hugetlb pool or it changes the
    /// pool ([`Op::uses_hugetlb_pool`], asked before it ran): the bench
    /// runs such ops in the log's order, whatever their ranges.
    pub pool: bool,
}

impl Op {
    /// Runs it on `mm` (a fault on `cpu`, attached to `mm`).
    pub(super) fn run(&self, mm: &Arc<AddressSpace>, cpu: Option<&mut Cpu>) -> Result<u64, i32> {
        let code = |e: softmm::Errno| e.code();
        match *self {
            Op::Mmap { addr, len, prot, flags, ref file, off } => {
                mm.mmap(addr, len, prot, flags, file.as_ref(), off).map_err(code)
            }
            Op::Munmap { addr, len } => mm.munmap(addr, len).map(|()| 0).map_err(code),
            Op::Mprotect { addr, len, prot } => mm.mprotect(addr, len, prot).map(|()| 0).map_err(code),
            Op::Madvise { addr, len, advice } => mm.madvise(addr, len, advice).map(|()| 0).map_err(code),
            Op::Mremap { old, old_len, new_len, flags, new_addr } => {
                mm.mremap(old, old_len, new_len, flags, new_addr).map_err(code)
            }
            Op::Brk { addr } => Ok(mm.brk(addr)),
            Op::Mlock { addr, len, flags: None } => mm.mlock(addr, len).map(|()| 0).map_err(code),
            Op::Mlock { addr, len, flags: Some(f) } => mm.mlock2(addr, len, f).map(|()| 0).map_err(code),
            Op::Munlock { addr, len } => mm.munlock(addr, len).map(|()| 0).map_err(code),
            Op::Mlockall { flags } => mm.mlockall(flags).map(|()| 0).map_err(code),
            Op::Munlockall => mm.munlockall().map(|()| 0).map_err(code),
            Op::Mseal { addr, len, flags } => mm.mseal(addr, len, flags).map(|()| 0).map_err(code),
            Op::Mdwe { get: true, args: [a, b, c, d] } => mm.prctl_get_mdwe(a, b, c, d).map_err(code),
            Op::Mdwe { get: false, args: [a, b, c, d] } => mm.prctl_set_mdwe(a, b, c, d).map(|()| 0).map_err(code),
            Op::Fork { .. } => mm.fork().map(|_child| 0).map_err(|e| e.code()),
            Op::Fault { addr, access } => {
                let cpu = cpu.expect("a fault runs on a CPU");
                cpu.translate(addr, access).map(|_| 0).map_err(|_| 1)
            }
        }
    }

    /// Whether, run now on `mm`, it may take huge pages or reservations from
    /// the hugetlb pool, give some back, or fail for want of them: an
    /// `mmap` with `MAP_HUGETLB` or of a file (which may be on hugetlbfs),
    /// or an op whose range meets a hugetlb mapping (its `munmap`, a
    /// `MAP_FIXED` over it, `MADV_DONTNEED`, a fault). The pool is one for
    /// the whole arena, so two such ops on disjoint ranges still depend on
    /// each other: a `munmap` that frees the pool's last page and another
    /// thread's `mmap` that the log saw fail with `ENOMEM` must run in the
    /// log's order. Always `false` without a pool.
    pub(super) fn uses_hugetlb_pool(&self, mm: &AddressSpace) -> bool {
        if mm.phys().huge_page_stats().total == 0 {
            return false;
        }
        if let Op::Mmap { flags, ref file, .. } = *self {
            if flags & libc::MAP_HUGETLB != 0 || file.is_some() {
                return true;
            }
        }
        let Some((s, e)) = self.range() else {
            // Ordered against every op anyway.
            return false;
        };
        mm.maps().iter().any(|m| m.start < e && s < m.end && m.vm_flags.split(' ').any(|f| f == "ht"))
    }

    /// The addresses it reads or changes (`[start, end)`), for the bench's
    /// ordering across threads; `None`: all of them (`fork`, `brk`).
    pub(super) fn range(&self) -> Option<(u64, u64)> {
        let span = |a: u64, l: u64| (a, a.saturating_add(page_align(l).max(PAGE_SIZE)));
        match *self {
            Op::Mmap { addr, len, .. }
            | Op::Munmap { addr, len }
            | Op::Mprotect { addr, len, .. }
            | Op::Madvise { addr, len, .. }
            | Op::Mlock { addr, len, .. }
            | Op::Munlock { addr, len }
            | Op::Mseal { addr, len, .. } => Some(span(addr, len)),
            // Both ends: the new place is only known where it is fixed, so
            // a moving mremap orders against everything.
            Op::Mremap { old, old_len, new_len, flags, new_addr } => {
                if flags & softmm::uapi::MREMAP_MAYMOVE != 0 && flags & softmm::uapi::MREMAP_FIXED == 0 {
                    return None;
                }
                let (a, b) = span(old, old_len.max(new_len));
                if flags & softmm::uapi::MREMAP_FIXED != 0 {
                    let (c, d) = span(new_addr, new_len);
                    return Some((a.min(c), b.max(d)));
                }
                Some((a, b))
            }
            Op::Fault { addr, .. } => Some(span(addr & !(PAGE_SIZE - 1), PAGE_SIZE)),
            Op::Brk { .. } | Op::Fork { .. } | Op::Mlockall { .. } | Op::Munlockall | Op::Mdwe { .. } => None,
        }
    }

    /// The op's name in reports.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Op::Mmap { .. } => "mmap",
            Op::Munmap { .. } => "munmap",
            Op::Mprotect { .. } => "mprotect",
            Op::Madvise { .. } => "madvise",
            Op::Mremap { .. } => "mremap",
            Op::Brk { .. } => "brk",
            Op::Mlock { .. } => "mlock",
            Op::Munlock { .. } => "munlock",
            Op::Mlockall { .. } => "mlockall",
            Op::Munlockall => "munlockall",
            Op::Mseal { .. } => "mseal",
            Op::Mdwe { .. } => "prctl",
            Op::Fork { .. } => "fork",
            Op::Fault { .. } => "fault",
        }
    }
}
