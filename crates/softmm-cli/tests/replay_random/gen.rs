//! Generation: random sequences of memory calls inside the window, and
//! their text form for the runner.

use super::*;

pub(super) struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// A page-aligned address in the window.
pub(super) fn waddr(r: &mut Rng) -> u64 {
    W + r.below(W_PAGES) * P
}

/// A length from `addr` that stays in the window (whole pages, sometimes a
/// byte short).
pub(super) fn wlen(r: &mut Rng, addr: u64) -> u64 {
    let room = (W_END.saturating_sub(addr) / P).max(1);
    let most = if r.chance(20) { 64 } else { 16 };
    let pages = 1 + r.below(room.min(most));
    let len = pages * P;
    if r.chance(10) {
        len - 1 - r.below(P - 1)
    } else {
        len
    }
}

/// A length the kernel refuses before it looks at any mapping (for munmap
/// and a shrinking mremap), or that runs past `TASK_SIZE` (fixed mmap).
pub(super) fn refused_len(r: &mut Rng, addr: u64) -> u64 {
    r.pick(&[
        u64::MAX,
        u64::MAX - P + 2,
        0u64.wrapping_sub(addr).wrapping_add(P),
        TASK_SIZE,
        TASK_SIZE - addr + P,
        1 << 63,
    ])
}

pub(super) fn prot(r: &mut Rng) -> i32 {
    let p = r.pick(&[
        libc::PROT_READ,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::PROT_NONE,
        libc::PROT_WRITE,
        libc::PROT_READ | libc::PROT_EXEC,
    ]);
    if r.chance(3) {
        p | 0x10
    } else {
        p
    }
}

/// A length for a lock or a seal at `addr`: mostly in the window; else one
/// past the memlock limit (refused before any change, the runner has no
/// `CAP_IPC_LOCK`), one whose end wraps past 2^64, one that page-aligns to
/// 0, or one whose walk meets the hole above the window (munlock, mseal).
fn lock_len(r: &mut Rng, addr: u64) -> u64 {
    if r.chance(85) {
        return wlen(r, addr);
    }
    r.pick(&[0, 1 << 40, u64::MAX - P + 2, 0u64.wrapping_sub(addr).wrapping_add(P), TASK_SIZE])
}

pub(super) fn gen_op(r: &mut Rng) -> Op {
    match r.below(116) {
        103..=105 => {
            let addr = waddr(r) + if r.chance(5) { 1 } else { 0 };
            let len = lock_len(r, addr);
            let flags = r.chance(50).then(|| r.pick(&[0, 1, 1, 2]));
            Op::Mlock { addr, len, flags }
        }
        106 | 107 => {
            let addr = waddr(r) + if r.chance(5) { 1 } else { 0 };
            Op::Munlock { addr, len: lock_len(r, addr) }
        }
        108 => Op::Mlockall {
            flags: r.pick(&[
                libc::MCL_FUTURE,
                libc::MCL_FUTURE | libc::MCL_ONFAULT,
                libc::MCL_FUTURE,
                libc::MCL_ONFAULT,
                0,
                8,
                libc::MCL_CURRENT | 8,
            ]),
        },
        109 => Op::Munlockall,
        110..=112 => {
            let addr = waddr(r) + if r.chance(5) { 1 } else { 0 };
            Op::Mseal { addr, len: lock_len(r, addr), flags: if r.chance(5) { 1 } else { 0 } }
        }
        113 | 114 => {
            Op::Mdwe { get: false, arg2: r.pick(&[1, 1, 1, 3, 3, 0, 2, 4]), arg3: if r.chance(10) { 1 } else { 0 } }
        }
        115 => Op::Mdwe { get: true, arg2: if r.chance(10) { 1 } else { 0 }, arg3: 0 },
        102 => Op::Exec,
        100 | 101 => Op::Fork,
        0..=7 => Op::Open {
            slot: r.below(SLOTS as u64) as usize,
            file: r.below(FILES as u64) as usize,
            mode: r.pick(&[libc::O_RDWR, libc::O_RDONLY, libc::O_WRONLY, libc::O_RDONLY])
                | if r.chance(25) { libc::O_CLOEXEC } else { 0 },
        },
        8..=10 => Op::Close { slot: r.below(SLOTS as u64) as usize },
        11..=44 => {
            let fd = match r.below(10) {
                0..=3 => FdSrc::Anon,
                4..=6 => FdSrc::Inherited(r.below(4) as usize),
                _ => FdSrc::Slot(r.below(SLOTS as u64) as usize),
            };
            let kind = r.pick(&[libc::MAP_PRIVATE, libc::MAP_SHARED, libc::MAP_SHARED_VALIDATE, libc::MAP_PRIVATE]);
            let mut flags = kind | if matches!(fd, FdSrc::Anon) { libc::MAP_ANONYMOUS } else { 0 };
            let placement = r.below(10);
            let mut addr = waddr(r);
            match placement {
                0..=3 => flags |= libc::MAP_FIXED,
                4..=6 => flags |= libc::MAP_FIXED_NOREPLACE,
                7 => {}        // a hint in the window
                _ => addr = 0, // anywhere
            }
            let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
            let mut len = if addr == 0 { (1 + r.below(16)) * P } else { wlen(r, addr) };
            if r.chance(8) {
                len = match r.below(4) {
                    0 => 0,
                    1 if !fixed => 1 << 40,
                    _ => refused_len(r, addr),
                };
            }
            if r.chance(4) {
                flags |= r.pick(&[
                    libc::MAP_POPULATE,
                    0x0400_0000,
                    libc::MAP_NORESERVE,
                    0x40, /* MAP_32BIT */
                    libc::MAP_LOCKED,
                ]);
            }
            if len >= 1 << 30 {
                // Never populate a huge mapping (NORESERVE would let it be
                // made; a locked one is refused past the memlock limit).
                flags &= !libc::MAP_POPULATE;
            }
            if r.chance(3) {
                flags &= !libc::MAP_TYPE;
            }
            let off =
                if r.chance(85) { r.below(4) * P } else { r.pick(&[1, 1 << 40, (1 << 63) - P, u64::MAX - P + 1]) };
            if r.chance(3) && fixed {
                addr += 1;
            }
            Op::Mmap { addr, len, prot: prot(r), flags, fd, off }
        }
        45..=57 => {
            let addr = waddr(r);
            let len = if r.chance(8) { refused_len(r, addr) } else { wlen(r, addr) };
            Op::Munmap { addr: if r.chance(3) { addr + 1 } else { addr }, len }
        }
        58..=71 => {
            let addr = waddr(r);
            // A walk leaving the window meets the hole above it.
            let len = if r.chance(8) { r.pick(&[1 << 40, u64::MAX - P + 2, TASK_SIZE]) } else { wlen(r, addr) };
            Op::Mprotect { addr, len, prot: prot(r) }
        }
        72..=81 => {
            let addr = waddr(r);
            let len = if r.chance(8) { r.pick(&[1 << 40, u64::MAX - P + 2, 0]) } else { wlen(r, addr) };
            let advice = r.pick(&[
                libc::MADV_DONTNEED,
                libc::MADV_NORMAL,
                libc::MADV_WILLNEED,
                libc::MADV_FREE,
                libc::MADV_RANDOM,
                libc::MADV_DONTFORK,
                libc::MADV_REMOVE,
                libc::MADV_WIPEONFORK,
                libc::MADV_DOFORK,
                12345,
            ]);
            Op::Madvise { addr, len, advice }
        }
        _ => {
            let old = waddr(r);
            let flags = r.pick(&[
                0,
                libc::MREMAP_MAYMOVE,
                libc::MREMAP_MAYMOVE,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
                libc::MREMAP_FIXED,
                8,
            ]);
            let mut old_len = wlen(r, old);
            let mut new_len = wlen(r, old);
            if r.chance(15) {
                // A shrink (over holes and VMAs); sometimes with an old
                // length past TASK_SIZE or 2^64.
                if old_len < new_len {
                    std::mem::swap(&mut old_len, &mut new_len);
                }
                if r.chance(40) {
                    old_len = refused_len(r, old);
                }
            }
            if r.chance(5) {
                old_len = 0;
            }
            if r.chance(4) && flags & libc::MREMAP_FIXED == 0 {
                new_len = r.pick(&[1 << 40, u64::MAX - P + 2, 0]);
            }
            let mut new_addr = if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 { waddr(r) } else { 0 };
            if flags & libc::MREMAP_FIXED != 0 && new_addr.saturating_add(new_len) > W_END {
                new_addr = W_END - (new_len.div_ceil(P) * P).min(W_END - W);
            }
            Op::Mremap { old, old_len, new_len, flags, new_addr }
        }
    }
}

pub(super) fn gen_sequence(seed: u64) -> Vec<Op> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let n = 5 + r.below(56);
    let (mut forks, mut execs) = (0, 0);
    let mut out = Vec::new();
    for _ in 0..n {
        let op = gen_op(&mut r);
        if matches!(op, Op::Fork) {
            // At most two forks: four processes.
            if forks == 2 {
                continue;
            }
            forks += 1;
        }
        if matches!(op, Op::Exec) {
            // At most one exec (made by every process that reaches it).
            if execs == 1 {
                continue;
            }
            execs += 1;
        }
        out.push(op);
    }
    out
}

pub(super) fn encode(seqs: &[Vec<Op>]) -> String {
    let mut o = String::new();
    for s in seqs {
        o.push_str("seq\n");
        for op in s {
            let line = match *op {
                Op::Open { slot, file, mode } => format!("open {slot} {file} {mode}"),
                Op::Close { slot } => format!("close {slot}"),
                Op::Mmap { addr, len, prot, flags, fd, off } => {
                    let (k, i) = match fd {
                        FdSrc::Anon => ("a", 0),
                        FdSrc::Inherited(i) => ("i", i),
                        FdSrc::Slot(i) => ("s", i),
                    };
                    format!("mmap {addr:x} {len:x} {prot:x} {flags:x} {k} {i} {off:x}")
                }
                Op::Munmap { addr, len } => format!("munmap {addr:x} {len:x}"),
                Op::Mprotect { addr, len, prot } => format!("mprotect {addr:x} {len:x} {prot:x}"),
                Op::Madvise { addr, len, advice } => format!("madvise {addr:x} {len:x} {advice:x}"),
                Op::Mremap { old, old_len, new_len, flags, new_addr } => {
                    format!("mremap {old:x} {old_len:x} {new_len:x} {flags:x} {new_addr:x}")
                }
                Op::Fork => "fork".to_string(),
                Op::Exec => "exec".to_string(),
                Op::Mlock { addr, len, flags: None } => format!("mlock {addr:x} {len:x}"),
                Op::Mlock { addr, len, flags: Some(f) } => format!("mlock2 {addr:x} {len:x} {f:x}"),
                Op::Munlock { addr, len } => format!("munlock {addr:x} {len:x}"),
                Op::Mlockall { flags } => format!("mlockall {flags:x}"),
                Op::Munlockall => "munlockall".to_string(),
                Op::Mseal { addr, len, flags } => format!("mseal {addr:x} {len:x} {flags:x}"),
                Op::Mdwe { get: false, arg2, arg3 } => format!("setmdwe {arg2:x} {arg3:x}"),
                Op::Mdwe { get: true, arg2, .. } => format!("getmdwe {arg2:x}"),
            };
            o.push_str(&line);
            o.push('\n');
        }
    }
    o
}

pub(super) fn decode(text: &str) -> Vec<Vec<Op>> {
    let mut out: Vec<Vec<Op>> = Vec::new();
    for l in text.lines() {
        let t: Vec<&str> = l.split_whitespace().collect();
        let h = |i: usize| u64::from_str_radix(t[i], 16).expect("hex");
        let d = |i: usize| t[i].parse::<usize>().expect("number");
        let op = match t[0] {
            "seq" => {
                out.push(Vec::new());
                continue;
            }
            "open" => Op::Open { slot: d(1), file: d(2), mode: t[3].parse().expect("mode") },
            "close" => Op::Close { slot: d(1) },
            "mmap" => Op::Mmap {
                addr: h(1),
                len: h(2),
                prot: h(3) as i32,
                flags: h(4) as i32,
                fd: match t[5] {
                    "a" => FdSrc::Anon,
                    "i" => FdSrc::Inherited(d(6)),
                    _ => FdSrc::Slot(d(6)),
                },
                off: h(7),
            },
            "munmap" => Op::Munmap { addr: h(1), len: h(2) },
            "mprotect" => Op::Mprotect { addr: h(1), len: h(2), prot: h(3) as i32 },
            "madvise" => Op::Madvise { addr: h(1), len: h(2), advice: h(3) as i32 },
            "mremap" => Op::Mremap { old: h(1), old_len: h(2), new_len: h(3), flags: h(4) as i32, new_addr: h(5) },
            "fork" => Op::Fork,
            "exec" => Op::Exec,
            "mlock" => Op::Mlock { addr: h(1), len: h(2), flags: None },
            "mlock2" => Op::Mlock { addr: h(1), len: h(2), flags: Some(h(3) as i32) },
            "munlock" => Op::Munlock { addr: h(1), len: h(2) },
            "mlockall" => Op::Mlockall { flags: h(1) as i32 },
            "munlockall" => Op::Munlockall,
            "mseal" => Op::Mseal { addr: h(1), len: h(2), flags: h(3) },
            "setmdwe" => Op::Mdwe { get: false, arg2: h(1), arg3: h(2) },
            "getmdwe" => Op::Mdwe { get: true, arg2: h(1), arg3: 0 },
            other => panic!("bad op {other}"),
        };
        out.last_mut().expect("seq first").push(op);
    }
    out
}
