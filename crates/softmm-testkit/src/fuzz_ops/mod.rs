//! The fuzz harness shared by the `cargo fuzz` target `ops`
//! (`fuzz/fuzz_targets/ops.rs`) and the corpus replay test
//! (`tests/models/fuzz_corpus.rs`): decodes bytes (with `arbitrary`) into a
//! sequence of mapping calls with hostile arguments (zero, unaligned, huge,
//! wrapping, unknown bits, every flag), forks, file writes, truncates and hole
//! punches, and guest accesses through two CPUs per address space; runs each
//! on softmm and on the reference model ([`crate::reference`]) and
//! checks after every step that results, errnos, faults, the mappings and
//! file sizes agree, at the end that every mapped page and the files hold
//! what the model says, and that dropping everything frees every frame, page
//! table and VMA.
//!
//! The model predicts every result exactly except for the input classes
//! below, where it cannot (yet) or must not compare; each is either
//! *relaxed* (softmm's success or failure is accepted, the model follows it
//! and every other check still applies) or *skipped* (not run at all, because
//! running it would be a known defect that stops the fuzzer from finding
//! others, or it is outside what the model describes):
//!
//! - skipped, a softmm defect: `MADV_KEEPONFORK` and `MADV_DODUMP` over a
//!   `MAP_DROPPABLE` mapping (Linux refuses both with `EINVAL`, softmm
//!   clears the flags; `tests/models/fuzz_findings.rs`
//!   `keeponfork_and_dodump_refuse_a_droppable_mapping`);
//! - relaxed, limits of the arena rather than semantics: `ENOMEM` for
//!   growing private writable memory by 8 MiB or more and `EAGAIN` for
//!   `MAP_LOCKED` (commit accounting and `RLIMIT_MEMLOCK`); `fork` failing
//!   with `ENOMEM`; and `MADV_COLLAPSE` (which blocks collapse is not
//!   modelled);
//! - skipped, outside the model: anonymous `MAP_HUGETLB` (this arena has no
//!   pool; the `hugetlb` target, `huge.rs`, covers hugetlb),
//!   `MADV_HWPOISON`, `MADV_SOFT_OFFLINE` (privileged);
//! - bounded for speed: `MAP_POPULATE`/`MAP_LOCKED` are cleared and
//!   `MADV_POPULATE_*`/`WILLNEED` skipped on ranges over 256 KiB; a mapping
//!   (or growth) of more than `MAX_MODEL_PAGES` that succeeds is compared
//!   (address, errno) and then unmapped on both sides, so the model never
//!   holds more than a few thousand pages; a call that would succeed on a
//!   range over `MAX_WALK` (64 GiB) is not run (softmm's zap visits every
//!   2 MiB of a range, so unmapping terabytes takes seconds);
//! - `mincore`: the errno and how far the bytes were written are exact; the
//!   bytes are checked to be 0 or 1, and 1 for every page with a private copy
//!   (residency of untouched or page-cache pages is not modelled).
//!
//! Address spaces use `MmConfig::default().thp_align(false)` (the 2 MiB alignment
//! of large anonymous mappings is not modelled).
#![allow(dead_code)]

pub use crate::reference;

pub mod huge;

use std::fmt::Write as _;
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use reference::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, FaultPolicy, File, MapEntry, MmConfig, OpenFile, PhysMem};

/// Pages of the window that most generated addresses aim at; it ends at
/// `mmap_base`, so that top-down placement fills its holes.
pub const WIN_PAGES: u64 = 128;
/// Most address spaces alive at once (a fork beyond replaces the last).
pub const MAX_AS: usize = 3;
/// Most operations decoded from one input.
pub const MAX_OPS: usize = 64;
/// A successful mapping or growth larger than this (pages) is unmapped
/// again at once on both sides.
pub const MAX_MODEL_PAGES: u64 = 1024;
/// Ranges over this many bytes do not populate (speed).
pub const MAX_POPULATE: u64 = 256 << 10;
/// Growth of accountable memory at least this large may fail with `ENOMEM`.
pub const COMMIT_SLACK: u64 = 8 << 20;
/// Successful calls over ranges longer than this are not run: softmm's zap
/// walks every 2 MiB of a range, populated or not, so unmapping 128 TiB takes
/// seconds (Linux skips empty upper-level tables).
pub const MAX_WALK: u64 = 1 << 36;
/// Bytes of the arena the harness needs.
pub const ARENA_BYTES: u64 = 32 << 20;

const MAP_32BIT: i32 = 0x40;
/// x86-64's `MAP_32BIT` window (`find_start_end`, without randomization).
const MAP_32BIT_AREA: (u64, u64) = (0x4000_0000, 0x8000_0000);
const MAP_DROPPABLE: i32 = 0x08;
const MAP_SYNC: i32 = 0x80000;
const PROT_SEM: i32 = 0x8;
const MADV_MERGEABLE: i32 = 12;
const MADV_UNMERGEABLE: i32 = 13;
const MADV_COLLAPSE: i32 = 25;
const MAX_FILE: u64 = i64::MAX as u64;

fn cfg() -> MmConfig {
    MmConfig::default().thp_align(false).force_speculative(true)
}

fn win_pg() -> u64 {
    cfg().mmap_base / PG - WIN_PAGES
}

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

// ---------------------------------------------------------------------------
// softmm's side.

/// One address space of softmm with its two CPUs (both on this thread).
struct Real {
    cpus: [Cpu; 2],
    mm: Arc<AddressSpace>,
}

impl Real {
    fn new(mm: Arc<AddressSpace>) -> Real {
        Real { cpus: [Cpu::attached(&mm), Cpu::attached(&mm)], mm }
    }
}

struct World<'a> {
    phys: &'a Arc<PhysMem>,
    model: Model,
    real: Vec<Real>,
    files: Vec<Arc<File>>,
    /// One open per file and access mode, as a process opens each file once
    /// (the model merges mappings of one file; softmm merges one open's).
    opens: std::collections::HashMap<(usize, u8), OpenFile>,
    log: Vec<String>,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

/// Runs `input` on softmm and on the model; `Err` describes the first
/// disagreement or leak, with the operations that led to it. Panics in
/// softmm propagate (the fuzzer reports them as crashes). `phys` must have
/// nothing allocated; it is left so.
pub fn run(input: &Input, phys: &Arc<PhysMem>) -> Result<(), String> {
    let mut w = World {
        phys,
        model: Model::default(),
        real: Vec::new(),
        files: Vec::new(),
        opens: std::collections::HashMap::new(),
        log: Vec::new(),
    };
    let r = w.run(input);
    let log = std::mem::take(&mut w.log);
    drop(w);
    let leak = {
        // Deferred frees wait for epochs to pass; with no other thread pinned
        // a few flushes end them, much sooner than `quiesce`'s sleeps.
        for _ in 0..64 {
            crossbeam_epoch::pin().flush();
            let s = phys.stats();
            if s.page_tables == 0 && s.vmas == 0 {
                break;
            }
        }
        let s = phys.quiesce();
        ((s.frames_used, s.page_tables, s.vmas) != (0, 0, 0)).then(|| format!("leak after dropping everything: {s:?}"))
    };
    match (r, leak) {
        (Ok(()), None) => Ok(()),
        (Err(e), _) | (Ok(()), Some(e)) => Err(format!("{e}\n--- ops ({:?}):\n{}", input.policy, log.join("\n"))),
    }
}

/// Decodes and runs `data` (inputs too short to decode pass).
pub fn run_bytes(data: &[u8], phys: &Arc<PhysMem>) -> Result<(), String> {
    match decode(data) {
        Some(input) => run(&input, phys),
        None => Ok(()),
    }
}

/// The arena the harness runs on.
pub fn arena() -> Arc<PhysMem> {
    PhysMem::new(softmm::PhysConfig::new(ARENA_BYTES)).expect("arena")
}

fn pattern(len: usize, val: u8) -> Vec<u8> {
    (0..len).map(|i| val.wrapping_add((i as u8).wrapping_mul(31))).collect()
}

fn page_align(x: u64) -> u64 {
    x.wrapping_add(PG - 1) & !(PG - 1)
}

impl World<'_> {
    fn run(&mut self, input: &Input) -> Result<(), String> {
        for (i, &size) in input.files.iter().enumerate() {
            let f = File::create(self.phys, &format!("/tmp/f{i}"), 0).map_err(|e| format!("create: {e:?}"))?;
            let init = pattern(usize::from(size), 0x40 + i as u8);
            f.write_at(0, &init).map_err(|e| format!("write_at: {e:?}"))?;
            let mut o = Obj::new(f.id(), 0);
            o.write_at(0, &init);
            self.model.objs.push(o);
            self.files.push(f);
        }
        let mm = AddressSpace::new(self.phys, cfg().policy(input.policy))
            .map_err(|e| format!("AddressSpace::new: {e:?}"))?;
        self.real.push(Real::new(mm));
        self.model.ases.push(MAs { pages: Default::default(), brk: cfg().start_brk });
        for (step, op) in input.ops.iter().enumerate() {
            self.log.push(format!("{step:2}: {op:?}"));
            let line = self.apply(op).map_err(|e| format!("step {step}: {e}"))?;
            *self.log.last_mut().expect("pushed") = format!("{step:2}: {line}");
            self.check_layout().map_err(|e| format!("after step {step}: {e}"))?;
        }
        self.check_contents()
    }

    fn asi(&self, asi: u8) -> usize {
        usize::from(asi) % self.real.len()
    }

    fn addr(&self, a: usize, x: Addr) -> u64 {
        let pages = &self.model.ases[a].pages;
        match x {
            Addr::Win(p) => (win_pg() + u64::from(p) % WIN_PAGES) * PG,
            Addr::WinOff(p, off) => (win_pg() + u64::from(p) % WIN_PAGES) * PG + u64::from(off) % PG,
            Addr::Mapped(n) if !pages.is_empty() => {
                *pages.keys().nth(usize::from(n) % pages.len()).expect("in range") * PG
            }
            Addr::Mapped(n) => (win_pg() + u64::from(n) % WIN_PAGES) * PG,
            Addr::Brk(d) => page_align(self.model.ases[a].brk).wrapping_add_signed(i64::from(d) * PG as i64),
            Addr::Special(i) => SPECIAL_ADDRS[usize::from(i) % SPECIAL_ADDRS.len()],
            Addr::Raw(v) => v,
        }
    }

    fn check_layout(&self) -> Result<(), String> {
        for (a, r) in self.real.iter().enumerate() {
            let maps = r.mm.maps();
            let got = real_runs(&maps);
            let want = model_runs(&self.model, a);
            if got != want {
                let i = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)).expect("differ");
                return Err(format!(
                    "as{a} mappings differ at run {i}: softmm {:x?}, model {:x?}\n{}",
                    got.get(i),
                    want.get(i),
                    r.mm.maps_text()
                ));
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            ensure!(
                f.len() == self.model.objs[i].size,
                "file {i} size: softmm {}, model {}",
                f.len(),
                self.model.objs[i].size
            );
        }
        Ok(())
    }

    fn check_contents(&mut self) -> Result<(), String> {
        for a in 0..self.real.len() {
            let pages: Vec<u64> = self.model.ases[a].pages.keys().copied().collect();
            for pg in pages {
                let want = self.model.read(a, pg * PG, P);
                let mut buf = vec![0; P];
                let got = self.real[a].cpus[(pg % 2) as usize].read(pg * PG, &mut buf).map(|()| buf);
                if got != want {
                    let what = reference::describe_difference(&got, &want);
                    return Err(format!("final contents of as{a} page {pg:#x}: {what}"));
                }
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            let o = &self.model.objs[i];
            let idxs: std::collections::BTreeSet<u64> =
                o.data.keys().copied().chain(0..o.pages().min(16)).filter(|&k| k < o.pages()).collect();
            for k in idxs {
                // pread refuses an end past i64::MAX: read the last page short.
                let len = PG.min(i64::MAX as u64 - k * PG);
                let want = o.read_at(k * PG, len);
                let mut buf = vec![0; len as usize];
                let n = f.read_at(k * PG, &mut buf).map_err(|e| format!("file {i} page {k:#x}: read_at {e:?}"))?;
                ensure!(n == want.len(), "file {i} page {k:#x}: read {n} bytes, model {}", want.len());
                if let Some(at) = (0..n).find(|&j| buf[j] != want[j]) {
                    return Err(format!(
                        "file {i} page {k:#x} byte {at:#x}: softmm {:#04x}, model {:#04x}",
                        buf[at], want[at]
                    ));
                }
            }
        }
        Ok(())
    }

    /// The stack growth of an access of `len` bytes at `va`, page by page
    /// as the access goes: the first unmapped page it reaches, before any
    /// other fault, grows the growsdown mapping above it if it may
    /// (`expand_downwards`).
    fn grow_for_access(&mut self, a: usize, va: u64, len: u64, write: bool) {
        let (mut x, end) = (va, va.saturating_add(len));
        while x < end {
            if !self.model.ases[a].pages.contains_key(&(x / PG)) && !self.grow_stack(a, x) {
                return;
            }
            if self.model.fault(a, x, write).is_some() {
                return;
            }
            let Some(next) = (x / PG + 1).checked_mul(PG) else { return };
            x = next;
        }
    }

    /// Linux's `expand_downwards` for a fault at `va` (an unmapped page):
    /// the address must be canonical, the mapping above growsdown, the new start at or
    /// above `mmap_min_addr`, clear of the guard gap above an accessible
    /// mapping below, the stack within `stack_limit` and a locked one within
    /// the memlock limit. The new pages are the mapping's, empty.
    fn grow_stack(&mut self, a: usize, va: u64) -> bool {
        let cfg = cfg();
        if !matches!((va as i64) >> 47, 0 | -1) {
            return false;
        }
        let pg = va / PG;
        let pages = &self.model.ases[a].pages;
        let Some((&next, above)) = pages.range(pg..).next() else { return false };
        let above = above.clone();
        if above.flags & vm::GROWSDOWN == 0 || pg * PG < cfg.mmap_min_addr.max(cfg.lsm_mmap_min_addr) {
            return false;
        }
        if let Some((&prev, below)) = pages.range(..pg).next_back() {
            if below.flags & vm::GROWSDOWN == 0 && below.prot.0 != 0 && pg - (prev + 1) < cfg.stack_guard_gap / PG {
                return false;
            }
        }
        let Some(vma) = self.vma_at(a, next * PG) else { return false };
        if vma.end - pg * PG > cfg.stack_limit {
            return false;
        }
        let grow = next - pg;
        if above.flags & vm::LOCKED != 0 && !cfg.cap_ipc_lock {
            let locked = self.model.ases[a].pages.values().filter(|p| p.flags & vm::LOCKED != 0).count() as u64;
            if (locked + grow) * PG > cfg.memlock_limit {
                return false;
            }
        }
        for k in pg..next {
            let mut p = MPage::new(above.prot, Kind::Anon);
            p.flags = above.flags;
            self.model.ases[a].pages.insert(k, p);
        }
        true
    }

    /// softmm's VMA containing `addr` (the oracle for VMA boundaries).
    fn vma_at(&self, a: usize, addr: u64) -> Option<MapEntry> {
        self.real[a].mm.maps().into_iter().find(|e| e.start <= addr && addr < e.end)
    }

    /// Sets every model page's protection from softmm's maps (after a call
    /// whose partial effect the model cannot predict).
    fn resync_prot(&mut self, a: usize) {
        for e in self.real[a].mm.maps() {
            let prot = Prot(
                u8::from(e.perms.as_bytes()[0] == b'r')
                    | u8::from(e.perms.as_bytes()[1] == b'w') << 1
                    | u8::from(e.perms.as_bytes()[2] == b'x') << 2,
            );
            for pg in self.model.mapped_in(a, e.start / PG, (e.end - e.start) / PG) {
                self.model.ases[a].pages.get_mut(&pg).expect("mapped").prot = prot;
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Result<String, String> {
        match *op {
            Op::Mmap { asi, addr, len, prot, flags, file, off } => self.mmap(asi, addr, len, prot, flags, file, off),
            Op::Munmap { asi, addr, len } => {
                let a = self.asi(asi);
                let (addr, len) = (self.addr(a, addr), len_val(len));
                let task = cfg().task_size;
                let alen = page_align(len);
                let want = if addr % PG != 0 || addr > task || len > task - addr || alen == 0 {
                    Err(Errno::Inval)
                } else {
                    Ok(())
                };
                if want.is_ok() && alen > MAX_WALK {
                    return Ok(format!("as{a} munmap({addr:#x}, {len:#x}): valid but huge, skipped (speed)"));
                }
                let r = self.real[a].mm.munmap(addr, len);
                let line = format!("as{a} munmap({addr:#x}, {len:#x}) = {r:?}");
                ensure!(r == want, "{line}: model {want:?}");
                if want.is_ok() {
                    self.model.unmap(a, addr / PG, alen / PG);
                }
                Ok(line)
            }
            Op::Mprotect { asi, addr, len, prot } => self.mprotect(asi, addr, len, prot),
            Op::Mremap { asi, addr, old, new, flags, raw_flags, new_addr } => {
                self.mremap(asi, addr, old, new, raw_flags.unwrap_or(i32::from(flags & 7)), new_addr)
            }
            Op::Madvise { asi, addr, len, advice } => self.madvise(asi, addr, len, advice),
            Op::Mincore { asi, addr, len, short } => self.mincore(asi, addr, len, short),
            Op::Brk { asi, to } => self.brk(asi, to),
            Op::Fork { asi } => {
                let a = self.asi(asi);
                let r = self.real[a].mm.fork();
                let child = match r {
                    Ok(c) => c,
                    // Relaxed: commit accounting may refuse (being added).
                    Err(Errno::NoMem) => return Ok(format!("as{a} fork = ENOMEM (accepted)")),
                    Err(e) => return Err(format!("as{a} fork = {e:?}")),
                };
                let cm = self.model.fork(a);
                let c = if self.real.len() < MAX_AS {
                    self.real.push(Real::new(child));
                    self.model.ases.push(cm);
                    self.real.len() - 1
                } else {
                    self.real[MAX_AS - 1] = Real::new(child);
                    self.model.ases[MAX_AS - 1] = cm;
                    MAX_AS - 1
                };
                Ok(format!("as{a} fork -> as{c}"))
            }
            Op::Exit { asi } => {
                if self.real.len() == 1 {
                    return Ok("exit: last address space, skipped".into());
                }
                let a = self.asi(asi);
                self.real.remove(a);
                self.model.ases.remove(a);
                Ok(format!("as{a} exit"))
            }
            Op::Write { asi, cpu, addr, len, val } => {
                let a = self.asi(asi);
                let va = self.addr(a, addr);
                let len = u64::from(len % (3 * PG as u16));
                let data = pattern(len as usize, val);
                self.grow_for_access(a, va, len, true);
                let want = self.model.write(a, va, &data);
                let r = self.real[a].cpus[usize::from(cpu)].write(va, &data);
                let line = format!("as{a}.{} write({va:#x}, {len}) = {r:?}", u8::from(cpu));
                ensure!(r == want, "{line}: model {want:?}");
                Ok(line)
            }
            Op::Read { asi, cpu, addr, len } => {
                let a = self.asi(asi);
                let va = self.addr(a, addr);
                let len = u64::from(len % (3 * PG as u16));
                self.grow_for_access(a, va, len, false);
                let want = self.model.read(a, va, len as usize);
                let mut buf = vec![0; len as usize];
                let r = self.real[a].cpus[usize::from(cpu)].read(va, &mut buf).map(|()| buf);
                let line = format!("as{a}.{} read({va:#x}, {len}) = {:?}", u8::from(cpu), r.as_ref().map(|_| ()));
                ensure!(r == want, "{line}: {}", reference::describe_difference(&r, &want));
                Ok(line)
            }
            Op::FetchAdd { asi, cpu, addr, v } => {
                let a = self.asi(asi);
                let va = self.addr(a, addr);
                if va % 8 == 0 {
                    self.grow_for_access(a, va, 8, true);
                }
                let want = if va % 8 != 0 {
                    Err(Fault::Unaligned { addr: va })
                } else if let Some(f) = self.model.fault(a, va, true) {
                    Err(f)
                } else {
                    let old = u64::from_le_bytes(self.model.read(a, va, 8).expect("readable").try_into().expect("8"));
                    self.model.write(a, va, &old.wrapping_add(v).to_le_bytes()).expect("writable");
                    Ok(old)
                };
                let r = self.real[a].cpus[usize::from(cpu)].fetch_add_u64(va, v);
                let line = format!("as{a}.{} fetch_add_u64({va:#x}, {v:#x}) = {r:x?}", u8::from(cpu));
                ensure!(r == want, "{line}: model {want:x?}");
                Ok(line)
            }
            Op::FileWrite { file, off, len, val } => {
                let f = usize::from(file) % self.files.len();
                let off = off_val(off);
                let data = pattern(usize::from(len % 9000), val);
                let r = self.files[f].write_at(off, &data);
                let line = format!("file{f} write_at({off:#x}, {}) = {r:?}", data.len());
                // rw_verify_area: an offset or an end negative as a loff_t.
                if off.checked_add(data.len() as u64).is_none_or(|end| end > MAX_FILE) {
                    ensure!(r == Err(Errno::Inval), "{line}: model Err(Inval)");
                    return Ok(line);
                }
                ensure!(r == Ok(data.len()), "{line}: model Ok({})", data.len());
                self.model.objs[f].write_at(off, &data);
                Ok(line)
            }
            Op::FileRead { file, off, len } => {
                let f = usize::from(file) % self.files.len();
                let off = off_val(off);
                let want = self.model.objs[f].read_at(off, u64::from(len % 9000));
                let mut buf = vec![0; usize::from(len % 9000)];
                let r = self.files[f].read_at(off, &mut buf);
                let line = format!("file{f} read_at({off:#x}, {}) = {r:?}", buf.len());
                // pread: EINVAL for an offset or an end negative as a loff_t.
                if off.checked_add(buf.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
                    ensure!(r == Err(softmm::Errno::Inval), "{line}: Linux EINVAL");
                    return Ok(line);
                }
                let n = r.map_err(|e| format!("{line}: {e:?}"))?;
                ensure!(
                    n == want.len() && buf[..n] == want[..],
                    "{line}: model {} bytes, or contents differ",
                    want.len()
                );
                Ok(line)
            }
            Op::FileSetLen { file, size } => {
                let f = usize::from(file) % self.files.len();
                let size = off_val(size);
                let r = self.files[f].set_len(size);
                let line = format!("file{f} set_len({size:#x}) = {r:?}");
                let want = if size > MAX_FILE { Err(Errno::Inval) } else { Ok(()) };
                ensure!(r == want, "{line}: model {want:?}");
                if want.is_ok() {
                    self.model.truncate(f, size);
                }
                Ok(line)
            }
            Op::FilePunch { file, off, len } => {
                let f = usize::from(file) % self.files.len();
                let (off, len) = (off_val(off), len_val(len));
                let r = self.files[f].punch_hole(off, len);
                let line = format!("file{f} punch_hole({off:#x}, {len:#x}) = {r:?}");
                // vfs_fallocate: EINVAL for an offset negative as a loff_t or a
                // length not positive, EFBIG for an end past the largest size.
                let want = if off > MAX_FILE || len == 0 || len > MAX_FILE {
                    Err(Errno::Inval)
                } else if off + len > MAX_FILE {
                    Err(Errno::FBig)
                } else {
                    Ok(())
                };
                ensure!(r == want, "{line}: model {want:?}");
                if want.is_ok() {
                    self.model.objs[f].punch(off, len);
                }
                Ok(line)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn mmap(
        &mut self,
        asi: u8,
        addr: Addr,
        len: Len,
        prot: ProtArg,
        flags: MapFlags,
        file: FileArg,
        off: Off,
    ) -> Result<String, String> {
        let a = self.asi(asi);
        let addr = self.addr(a, addr);
        let len = len_val(len);
        let prot = prot_val(prot);
        let mut fl = match flags.ty % 8 {
            0 | 1 => MAP_PRIVATE,
            2 | 3 => MAP_SHARED,
            4 => MAP_SHARED_VALIDATE,
            5 => 0,
            6 => MAP_DROPPABLE,
            _ => i32::from(flags.ty >> 4),
        };
        for (i, b) in MAP_BITS.iter().enumerate() {
            if flags.bits & (1 << i) != 0 {
                fl |= b;
            }
        }
        if flags.raw_on {
            fl |= flags.raw as i32;
        }
        let alen = page_align(len);
        if alen > MAX_POPULATE || alen == 0 {
            fl &= !(MAP_POPULATE | MAP_LOCKED);
        }
        let offset = off_val(off);
        let anon = fl & MAP_ANONYMOUS != 0;
        let fi = usize::from(file.file) % self.files.len();
        let mode = file.mode % 4;
        let open = (!file.none).then(|| {
            let f = &self.files[fi];
            self.opens.entry((fi, mode)).or_insert_with(|| OpenFile::new(f, mode <= 1, mode % 2 == 0)).clone()
        });
        let what = if anon {
            "anon".to_string()
        } else if file.none {
            "no file".into()
        } else {
            format!("file{fi} mode {}", file.mode % 4)
        };
        let line = format!("as{a} mmap({addr:#x}, {len:#x}, {prot:#x}, {fl:#x}, {what}, {offset:#x})");
        if fl & MAP_HUGETLB != 0 && anon {
            return Ok(line + ": anonymous MAP_HUGETLB, skipped (no pool here: the hugetlb target's)");
        }
        let ty = fl & MAP_TYPE;
        let want = self.predict_mmap(a, addr, len, prot, fl, open.as_ref(), offset);
        if want.is_ok() && alen > MAX_WALK {
            return Ok(line + ": valid but huge, skipped (speed)");
        }
        let r = self.real[a].mm.mmap(addr, len, prot, fl, open.as_ref(), offset);
        let line = format!("{line} = {r:x?}");
        // What Linux charges to the commit total: private writable memory
        // (`accountable_mapping`), and a shared anonymous object whole
        // (`shmem_acct_size`) unless MAP_NORESERVE.
        let shared = matches!(ty, MAP_SHARED | MAP_SHARED_VALIDATE);
        let charged = if shared { anon && fl & MAP_NORESERVE == 0 } else { prot & PROT_WRITE != 0 };
        let at: u64 = match (&want, r) {
            (Ok(_), Err(Errno::NoMem)) if alen >= COMMIT_SLACK && charged => {
                return Ok(line + " (commit limit, accepted)")
            }
            (Ok(_), Err(Errno::Again)) if fl & MAP_LOCKED != 0 => return Ok(line + " (memlock limit, accepted)"),
            (Ok((w, _)), Ok(at)) => {
                ensure!(*w == at, "{line}: model {w:#x}");
                at
            }
            (Err(e), Err(g)) => {
                ensure!(*e == g, "{line}: model {e:?}");
                return Ok(line);
            }
            (w, _) => return Err(format!("{line}: model {:x?}", w.as_ref().map(|x| x.0))),
        };
        // Apply to the model.
        let n = alen / PG;
        let pg = at / PG;
        self.model.unmap(a, pg, n);
        if n > MAX_MODEL_PAGES {
            let u = self.real[a].mm.munmap(at, alen);
            ensure!(u == Ok(()), "{line}; unmapping the large mapping again: {u:?}");
            return Ok(line + " (large: unmapped again)");
        }
        let mut pflags = 0;
        if fl & MAP_LOCKED != 0 {
            pflags |= vm::LOCKED;
        }
        if fl & MAP_GROWSDOWN != 0 {
            pflags |= vm::GROWSDOWN;
        }
        if ty == MAP_DROPPABLE {
            // Wiped in a forked child.
            pflags |= vm::DROPPABLE | vm::WIPEONFORK;
        }
        let kind = |obj: usize, shared: bool, i: u64| Kind::Obj { shared, obj, idx: i };
        let shared = matches!(ty, MAP_SHARED | MAP_SHARED_VALIDATE);
        let mut kinds: Vec<Kind> = Vec::new();
        if anon && shared {
            let inode = self.vma_at(a, at).map(|e| e.inode).ok_or_else(|| format!("{line}: not in maps"))?;
            self.model.objs.push(Obj::new(inode, alen));
            let o = self.model.objs.len() - 1;
            kinds.extend((0..n).map(|i| kind(o, true, i)));
        } else if anon {
            kinds.extend((0..n).map(|_| Kind::Anon));
        } else {
            let o = fi;
            kinds.extend((0..n).map(|i| kind(o, shared, offset / PG + i)));
            if shared && !open.as_ref().expect("file").writable {
                pflags |= vm::NOMAYWRITE;
            }
        }
        for (i, k) in kinds.into_iter().enumerate() {
            let mut p = MPage::new(Prot::from_bits(prot), k);
            p.flags = pflags;
            self.model.ases[a].pages.insert(pg + i as u64, p);
        }
        if fl & MAP_LOCKED != 0 || fl & (MAP_POPULATE | MAP_NONBLOCK) == MAP_POPULATE {
            self.model.populate_write(a, pg..pg + n);
        }
        Ok(line)
    }

    /// Linux's `do_mmap` checks in order; `Ok((address, _))`.
    #[allow(clippy::too_many_arguments)]
    fn predict_mmap(
        &self,
        a: usize,
        mut addr: u64,
        len: u64,
        prot: i32,
        mut fl: i32,
        file: Option<&OpenFile>,
        offset: u64,
    ) -> Result<(u64, ()), Errno> {
        let cfg = cfg();
        if offset % PG != 0 {
            return Err(Errno::Inval);
        }
        let anon = fl & MAP_ANONYMOUS != 0;
        if !anon && file.is_none() {
            return Err(Errno::BadF);
        }
        if !anon && fl & MAP_HUGETLB != 0 {
            // ksys_mmap_pgoff: MAP_HUGETLB with a file not on hugetlbfs.
            return Err(Errno::Inval);
        }
        if len == 0 {
            return Err(Errno::Inval);
        }
        if fl & MAP_FIXED_NOREPLACE != 0 {
            fl |= MAP_FIXED;
        }
        let fixed = fl & MAP_FIXED != 0;
        if !fixed {
            addr &= !(PG - 1);
            if addr != 0 && addr < cfg.mmap_min_addr {
                addr = page_align(cfg.mmap_min_addr);
            }
        }
        let alen = page_align(len);
        if alen == 0 {
            return Err(Errno::NoMem);
        }
        let pgoff = offset / PG;
        if pgoff.checked_add(alen / PG).is_none() {
            return Err(Errno::Overflow);
        }
        // get_unmapped_area
        let task = cfg.task_size;
        if alen > task || alen > task - cfg.mmap_min_addr {
            return Err(Errno::NoMem);
        }
        let at = if fixed {
            if addr > task - alen {
                return Err(Errno::NoMem);
            }
            if addr % PG != 0 {
                return Err(Errno::Inval);
            }
            addr
        } else if fl & MAP_32BIT != 0 {
            // arch_get_unmapped_area with find_start_end's MAP_32BIT window:
            // the hint if it fits below the window's end, else bottom-up.
            let (begin, end) = MAP_32BIT_AREA;
            if alen > end {
                return Err(Errno::NoMem);
            }
            let n = alen / PG;
            if addr != 0 && end - alen >= addr && self.model.fits(a, addr / PG, n) {
                addr
            } else {
                let low = begin.max(cfg.mmap_min_addr) / PG;
                self.model.bottomup_in(a, n, low, end / PG).ok_or(Errno::NoMem)? * PG
            }
        } else {
            self.model.unmapped_area(a, &cfg, addr / PG, alen / PG, false).ok_or(Errno::NoMem)? * PG
        };
        if fixed && at < cfg.mmap_min_addr {
            return Err(Errno::Perm);
        }
        if fl & MAP_FIXED_NOREPLACE != 0 && !self.model.is_free(a, at / PG, alen / PG) {
            return Err(Errno::Exist);
        }
        let ty = fl & MAP_TYPE;
        match file.filter(|_| !anon) {
            Some(f) => {
                // file_mmap_ok: the mapping's end past the largest file offset.
                if alen > MAX_FILE || pgoff > (MAX_FILE - alen) / PG {
                    return Err(Errno::Overflow);
                }
                match ty {
                    MAP_SHARED | MAP_SHARED_VALIDATE => {
                        if ty == MAP_SHARED_VALIDATE && fl & !LEGACY_MAP_MASK != 0 {
                            return Err(Errno::OpNotSupp);
                        }
                        if prot & PROT_WRITE != 0 && !f.writable {
                            return Err(Errno::Acces);
                        }
                    }
                    MAP_PRIVATE => {}
                    _ => return Err(Errno::Inval),
                }
                if !f.readable {
                    return Err(Errno::Acces);
                }
                if fl & MAP_GROWSDOWN != 0 {
                    return Err(Errno::Inval);
                }
            }
            None => match ty {
                MAP_SHARED if fl & MAP_GROWSDOWN != 0 => return Err(Errno::Inval),
                MAP_SHARED | MAP_PRIVATE => {}
                // A locked or stack area makes no sense droppable (hugetlb
                // is skipped).
                MAP_DROPPABLE if fl & (MAP_LOCKED | MAP_GROWSDOWN) != 0 => return Err(Errno::Inval),
                MAP_DROPPABLE => {}
                _ => return Err(Errno::Inval),
            },
        }
        Ok((at, ()))
    }

    fn mprotect(&mut self, asi: u8, addr: Addr, len: Len, prot: ProtArg) -> Result<String, String> {
        let a = self.asi(asi);
        let (addr, len, prot) = (self.addr(a, addr), len_val(len), prot_val(prot));
        let r = self.real[a].mm.mprotect(addr, len, prot);
        let line = format!("as{a} mprotect({addr:#x}, {len:#x}, {prot:#x}) = {r:?}");
        // PROT_GROWSDOWN on a growsdown VMA extends the range down to its
        // start (the first VMA of the range, from softmm's maps).
        let stack_start = (addr % PG == 0)
            .then(|| self.model.mapped_in(a, addr / PG, page_align(len) / PG).first().copied())
            .flatten()
            .filter(|k| self.model.ases[a].pages[k].flags & vm::GROWSDOWN != 0)
            .and_then(|k| self.vma_at(a, k * PG))
            .map(|v| v.start / PG);
        // The model, page by page (see the module doc of reference.rs for why
        // pages suffice: every error is a property of a whole VMA).
        let want = (|| {
            let grows = prot & (PROT_GROWSDOWN | PROT_GROWSUP);
            let prot = prot & !grows;
            if grows == PROT_GROWSDOWN | PROT_GROWSUP {
                return Err(Errno::Inval);
            }
            if addr % PG != 0 {
                return Err(Errno::Inval);
            }
            if len == 0 {
                return Ok(());
            }
            let alen = page_align(len);
            let end = addr.wrapping_add(alen);
            if alen == 0 || end <= addr {
                return Err(Errno::NoMem);
            }
            if prot & !(PROT_READ | PROT_WRITE | PROT_EXEC | PROT_SEM) != 0 {
                return Err(Errno::Inval);
            }
            let (mut pg, mut n) = (addr / PG, alen / PG);
            // The first VMA of the range: with PROT_GROWSDOWN it must be a
            // growsdown one (x86-64 has no VM_GROWSUP, so PROT_GROWSUP is
            // EINVAL once a VMA is found where it must be).
            if grows == PROT_GROWSDOWN && !self.model.is_free(a, pg, n) {
                let start = stack_start.ok_or(Errno::Inval)?;
                n += pg - start;
                pg = start;
            }
            if !self.model.ases[a].pages.contains_key(&pg) {
                return Err(Errno::NoMem);
            }
            if grows == PROT_GROWSUP {
                return Err(Errno::Inval);
            }
            let p = Prot::from_bits(prot);
            let mut next = pg;
            for k in self.model.mapped_in(a, pg, n) {
                if k != next {
                    return Err(Errno::NoMem);
                }
                let mp = self.model.ases[a].pages.get_mut(&k).expect("mapped");
                if p.writable() && mp.flags & vm::NOMAYWRITE != 0 {
                    return Err(Errno::Acces);
                }
                // mprotect_fixup populates a locked private VMA made writable.
                let populate = mp.flags & vm::LOCKED != 0 && mp.private() && !mp.prot.writable() && p.writable();
                mp.prot = p;
                if populate {
                    self.model.populate_write(a, [k]);
                }
                next = k + 1;
            }
            if next < pg + n {
                return Err(Errno::NoMem);
            }
            Ok(())
        })();
        if r == Err(Errno::NoMem) && want.is_ok() && page_align(len) >= COMMIT_SLACK && prot & PROT_WRITE != 0 {
            self.resync_prot(a);
            return Ok(line + " (commit limit, accepted)");
        }
        ensure!(r == want, "{line}: model {want:?}");
        Ok(line)
    }

    fn mremap(
        &mut self,
        asi: u8,
        addr: Addr,
        old: Len,
        new: Len,
        flags: i32,
        new_addr: Addr,
    ) -> Result<String, String> {
        let a = self.asi(asi);
        let (addr, old_len, new_len, new_addr) =
            (self.addr(a, addr), len_val(old), len_val(new), self.addr(a, new_addr));
        let line = format!("as{a} mremap({addr:#x}, {old_len:#x}, {new_len:#x}, {flags:#x}, {new_addr:#x})");
        let (old, new) = (page_align(old_len), page_align(new_len));
        let maps = self.real[a].mm.maps();
        let before = self.model.ases[a].clone();
        let want = self.predict_mremap(a, &maps, addr, old, new, flags, new_addr);
        if want.is_ok() && (new > MAX_WALK || old > MAX_WALK) {
            self.model.ases[a] = before;
            return Ok(line + ": valid but huge, skipped (speed)");
        }
        let r = self.real[a].mm.mremap(addr, old_len, new_len, flags, new_addr);
        let line = format!("{line} = {r:x?}");
        let want = match want {
            Ok((dst, unmap_again)) => {
                if r == Err(Errno::NoMem) && new > old && new - old >= COMMIT_SLACK {
                    self.model.ases[a] = before;
                    return Ok(line + " (commit limit, accepted)");
                }
                ensure!(r == Ok(dst), "{line}: model {:x?}", Ok::<u64, Errno>(dst));
                if let Some((at, n)) = unmap_again {
                    let u = self.real[a].mm.munmap(at * PG, n * PG);
                    ensure!(u == Ok(()), "{line}; unmapping the large result again: {u:?}");
                    return Ok(line + " (large: unmapped again)");
                }
                return Ok(line);
            }
            Err(e) => Err(e),
        };
        // A failed call keeps what it did before failing (a fixed move's
        // unmapped target), as `predict_mremap` left it.
        ensure!(r == want.map(|()| 0), "{line}: model {want:?}");
        Ok(line)
    }

    /// Linux 6.17's `mremap`, applied to the model; returns the new address
    /// and, for a result too large to model, the pages to unmap again on
    /// softmm (already unmapped in the model). A failure leaves the model as
    /// Linux leaves the address space (a fixed move unmaps its target before
    /// the checks that follow). VMA boundaries come from softmm's `maps`
    /// before the call.
    #[allow(clippy::too_many_arguments)]
    fn predict_mremap(
        &mut self,
        a: usize,
        maps: &[MapEntry],
        addr: u64,
        old: u64,
        new: u64,
        flags: i32,
        new_addr: u64,
    ) -> Result<(u64, Option<(u64, u64)>), Errno> {
        let cfg = cfg();
        let task = cfg.task_size;
        if flags & !(MREMAP_FIXED | MREMAP_MAYMOVE | MREMAP_DONTUNMAP) != 0 || addr % PG != 0 {
            return Err(Errno::Inval);
        }
        if new == 0 || new > task {
            return Err(Errno::Inval);
        }
        let fixed = flags & MREMAP_FIXED != 0;
        let dontunmap = flags & MREMAP_DONTUNMAP != 0;
        if fixed || dontunmap {
            if new_addr > task - new || new_addr % PG != 0 || flags & MREMAP_MAYMOVE == 0 {
                return Err(Errno::Inval);
            }
            if dontunmap && old != new {
                return Err(Errno::Inval);
            }
            // vrm_overlaps, for a fixed target and a hint alike, with the
            // old range's unsigned (wrapping) end.
            if addr.wrapping_add(old) > new_addr && new_addr + new > addr {
                return Err(Errno::Inval);
            }
        }
        let vma = |x: u64| maps.iter().find(|e| e.start <= x && x < e.end);
        let (src, o, n, dst_hint) = (addr / PG, old / PG, new / PG, new_addr / PG);
        if fixed && old == new {
            // remap_move: every VMA part of the range, the gaps kept; may not
            // start in a hole, and finds no VMA below a wrapped end.
            if vma(addr).is_none() || addr.checked_add(old).is_none() {
                return Err(Errno::Fault);
            }
            if new_addr < cfg.mmap_min_addr {
                // get_unmapped_area's security_mmap_addr, after the first
                // VMA's target was unmapped.
                let first = vma(addr).map_or(0, |v| (v.end.min(addr + old) - addr) / PG);
                self.model.unmap(a, dst_hint, first);
                return Err(Errno::Perm);
            }
            let pages = self.model.mapped_in(a, src, o);
            for &p in &pages {
                self.model.unmap(a, dst_hint + (p - src), 1);
            }
            for &p in &pages {
                let mp = if dontunmap {
                    let mp = self.model.ases[a].pages[&p].clone();
                    let left = self.model.ases[a].pages.get_mut(&p).expect("mapped");
                    (left.cow, left.guard) = (None, false);
                    mp
                } else {
                    self.model.ases[a].pages.remove(&p).expect("mapped")
                };
                self.model.ases[a].pages.insert(dst_hint + (p - src), mp);
            }
            return Ok((new_addr, None));
        }
        let v = vma(addr).ok_or(Errno::Fault)?;
        let private = v.perms.as_bytes()[3] == b'p';
        if new > old || fixed || dontunmap {
            if old == 0 && private {
                return Err(Errno::Inval);
            }
            if old.min(new) > v.end - addr {
                return Err(Errno::Fault);
            }
        }
        let big = |m: &mut Model, dst: u64| -> Option<(u64, u64)> {
            (n > MAX_MODEL_PAGES).then(|| {
                m.unmap(a, dst, n);
                (dst, n)
            })
        };
        if fixed || dontunmap {
            if fixed {
                self.model.unmap(a, dst_hint, n);
            }
            let mut o = o;
            if n < o {
                shrink_tail(task, addr, new, old)?;
                self.model.unmap(a, src + n, o - n);
                o = n;
            }
            let dst = self.model.unmapped_area(a, &cfg, dst_hint, n, fixed).ok_or(Errno::NoMem)?;
            if dst * PG < cfg.mmap_min_addr {
                // security_mmap_addr (a DONTUNMAP hint is taken as it is).
                return Err(Errno::Perm);
            }
            self.move_or_dup(a, src, o, dst, n, dontunmap);
            return Ok((dst * PG, big(&mut self.model, dst)));
        }
        if n == o {
            return Ok((addr, None));
        }
        if n < o {
            shrink_tail(task, addr, new, old)?;
            self.model.unmap(a, src + n, o - n);
            return Ok((addr, None));
        }
        let delta = n - o;
        let vend = v.end / PG;
        if src + o == vend
            && vend.checked_add(delta).is_some_and(|e| e <= task / PG)
            && self.model.is_free(a, vend, delta)
        {
            if n > MAX_MODEL_PAGES {
                self.model.unmap(a, src, o);
                return Ok((addr, Some((src, n))));
            }
            let last = self.model.ases[a].pages[&(vend - 1)].clone();
            self.model.extend(a, vend - 1, &last, delta);
            if last.flags & vm::LOCKED != 0 {
                self.model.populate_write(a, vend..vend + delta);
            }
            return Ok((addr, None));
        }
        if flags & MREMAP_MAYMOVE == 0 {
            return Err(Errno::NoMem);
        }
        let dst = self.model.unmapped_area(a, &cfg, 0, n, false).ok_or(Errno::NoMem)?;
        self.move_or_dup(a, src, o, dst, n, false);
        Ok((dst * PG, big(&mut self.model, dst)))
    }

    /// `move_vma`: `[src, src+o)` to `dst` grown to `n` pages; `o == 0` (a
    /// shared mapping) maps the same object pages again instead.
    fn move_or_dup(&mut self, a: usize, src: u64, o: u64, dst: u64, n: u64, dontunmap: bool) {
        let m = &mut self.model;
        if o == 0 {
            let first = m.ases[a].pages[&src].clone();
            for j in 0..n.min(MAX_MODEL_PAGES + 1) {
                let mut p = MPage { cow: None, guard: false, ..first.clone() };
                if let Kind::Obj { idx, .. } = &mut p.kind {
                    *idx += j;
                }
                m.ases[a].pages.insert(dst + j, p);
            }
            return;
        }
        let left: Vec<(u64, MPage)> = if dontunmap {
            // The source keeps its VMA, but its entries (markers too) moved.
            (src..src + o).map(|pg| (pg, MPage { cow: None, guard: false, ..m.ases[a].pages[&pg].clone() })).collect()
        } else {
            Vec::new()
        };
        let n = n.min(MAX_MODEL_PAGES + 1);
        let locked = m.ases[a].pages[&src].flags & vm::LOCKED != 0;
        m.move_pages(a, src, o, dst, n.max(o));
        m.ases[a].pages.extend(left);
        if locked && n > o {
            // move_vma of a locked VMA populates what it grew by.
            m.populate_write(a, dst + o..dst + n);
        }
    }

    fn madvise(&mut self, asi: u8, addr: Addr, len: Len, advice: Advice) -> Result<String, String> {
        let a = self.asi(asi);
        let (addr, len) = (self.addr(a, addr), len_val(len));
        let advice = match advice {
            Advice::Known(i) => ADVICES[usize::from(i) % ADVICES.len()],
            Advice::Raw(v) => v,
        };
        let line = format!("as{a} madvise({addr:#x}, {len:#x}, {advice})");
        if matches!(advice, 100 | 101) {
            return Ok(line + ": poison advice, skipped (outside the model)");
        }
        let alen = page_align(len);
        let range_ok = addr % PG == 0 && !(len != 0 && alen == 0) && addr.checked_add(alen).is_some();
        let populate = matches!(advice, MADV_POPULATE_READ | MADV_POPULATE_WRITE | MADV_WILLNEED);
        if range_ok && populate && alen > MAX_POPULATE {
            return Ok(line + ": populating a large range, skipped (speed)");
        }
        if range_ok
            && matches!(advice, MADV_KEEPONFORK | MADV_DODUMP)
            && self
                .model
                .mapped_in(a, addr / PG, alen / PG)
                .iter()
                .any(|k| self.model.ases[a].pages[k].flags & vm::DROPPABLE != 0)
        {
            return Ok(line + ": over a droppable mapping, skipped (softmm defect: Ok, Linux EINVAL)");
        }
        let before = self.model.ases[a].clone();
        let objs_before = self.model.objs.clone();
        let want = self.predict_madvise(a, addr, len, advice);
        let r = self.real[a].mm.madvise(addr, len, advice);
        let line = format!("{line} = {r:?}");
        if advice == MADV_COLLAPSE {
            // Relaxed: which blocks collapse is not modelled.
            self.model.ases[a] = before;
            self.model.objs = objs_before;
            return Ok(line + " (relaxed)");
        }
        ensure!(r == want, "{line}: model {want:?}");
        Ok(line)
    }

    /// Linux's `madvise`, applied to the model.
    fn predict_madvise(&mut self, a: usize, addr: u64, len: u64, advice: i32) -> Result<(), Errno> {
        let known = ADVICES.contains(&advice);
        if !known || addr % PG != 0 {
            return Err(Errno::Inval);
        }
        let alen = page_align(len);
        if len != 0 && alen == 0 {
            return Err(Errno::Inval);
        }
        let end = addr.checked_add(alen).ok_or(Errno::Inval)?;
        if end == addr {
            return Ok(());
        }
        let (pg, n) = (addr / PG, alen / PG);
        if advice == MADV_REMOVE {
            return self.predict_remove(a, addr, end);
        }
        let m = &mut self.model;
        if matches!(advice, MADV_POPULATE_READ | MADV_POPULATE_WRITE) {
            let write = advice == MADV_POPULATE_WRITE;
            for k in pg..pg + n {
                let Some(p) = m.ases[a].pages.get(&k) else { return Err(Errno::NoMem) };
                // Linux 6.18 (seen on the host): a permission failure is EINVAL,
                // SIGBUS and a guard marker's SIGSEGV are EFAULT.
                if (write && !p.prot.writable()) || (!write && !p.prot.has_read()) {
                    return Err(Errno::Inval);
                }
                if p.guard {
                    return Err(Errno::Fault);
                }
                if let Kind::Obj { obj, idx, .. } = p.kind {
                    if p.cow.is_none() && idx >= m.objs[obj].pages() {
                        return Err(Errno::Fault);
                    }
                }
                if write {
                    m.break_cow(a, k);
                }
            }
            return Ok(());
        }
        let mapped = m.mapped_in(a, pg, n);
        if mapped.is_empty() && m.ases[a].pages.range(pg..).next().is_none() {
            return Err(Errno::NoMem);
        }
        for &k in &mapped {
            let p = m.ases[a].pages.get_mut(&k).expect("mapped");
            let locked = p.flags & vm::LOCKED != 0;
            match advice {
                MADV_DONTNEED | MADV_DONTNEED_LOCKED => {
                    if locked && advice == MADV_DONTNEED {
                        return Err(Errno::Inval);
                    }
                    if p.private() {
                        p.cow = None;
                    }
                }
                // MADV_FREE: private anonymous memory only; it is kept (softmm never reclaims).
                MADV_FREE if locked || p.kind != Kind::Anon => return Err(Errno::Inval),
                // can_madv_lru_vma: no locked VMAs.
                MADV_COLD | MADV_PAGEOUT if locked => return Err(Errno::Inval),
                MADV_DONTFORK => p.flags |= vm::DONTCOPY,
                MADV_DOFORK => p.flags &= !vm::DONTCOPY,
                MADV_WIPEONFORK => {
                    if p.kind != Kind::Anon {
                        return Err(Errno::Inval);
                    }
                    p.flags |= vm::WIPEONFORK;
                }
                // A droppable mapping stays wiped on fork and out of dumps.
                MADV_KEEPONFORK | MADV_DODUMP if p.flags & vm::DROPPABLE != 0 => return Err(Errno::Inval),
                MADV_KEEPONFORK => p.flags &= !vm::WIPEONFORK,
                // madvise_guard_install: not on a locked VMA; the page is
                // zapped (a private copy is lost) and its entry marked.
                MADV_GUARD_INSTALL if locked => return Err(Errno::Inval),
                MADV_GUARD_INSTALL => {
                    if p.private() {
                        p.cow = None;
                    }
                    p.guard = true;
                }
                MADV_GUARD_REMOVE => p.guard = false,
                _ => {} // NORMAL, RANDOM, SEQUENTIAL, WILLNEED, (UN)MERGEABLE, (NO)HUGEPAGE, DONTDUMP, DODUMP, COLLAPSE
            }
        }
        if mapped.len() as u64 != n {
            return Err(Errno::NoMem);
        }
        Ok(())
    }

    /// `MADV_REMOVE` of `[start, end)` (not empty), VMA by VMA as
    /// `madvise_walk_vmas` visits them (the boundaries from softmm's maps):
    /// each punches its part of its file, the first that cannot stops the
    /// walk (`EINVAL` locked or without a file, `EACCES` not shared
    /// writable), and a hole anywhere makes the result `ENOMEM`.
    fn predict_remove(&mut self, a: usize, start: u64, end: u64) -> Result<(), Errno> {
        let maps = self.real[a].mm.maps();
        let mut cur = start;
        let mut hole = false;
        for e in maps.iter().filter(|e| e.end > start && e.start < end) {
            if cur < e.start {
                hole = true;
                cur = e.start;
            }
            let stop = e.end.min(end);
            let p = &self.model.ases[a].pages[&(cur / PG)];
            if p.flags & vm::LOCKED != 0 {
                return Err(Errno::Inval);
            }
            match p.kind {
                Kind::Anon => return Err(Errno::Inval),
                Kind::Obj { shared: true, obj, idx } if p.flags & vm::NOMAYWRITE == 0 => {
                    self.model.objs[obj].punch(idx * PG, stop - cur);
                }
                Kind::Obj { .. } => return Err(Errno::Acces),
            }
            cur = stop;
        }
        if hole || cur < end {
            return Err(Errno::NoMem);
        }
        Ok(())
    }

    fn mincore(&mut self, asi: u8, addr: Addr, len: Len, short: u8) -> Result<String, String> {
        let a = self.asi(asi);
        let cfg = cfg();
        let (addr, len) = (self.addr(a, addr), len_val(len));
        let pages = len.div_ceil(PG);
        let buflen = pages.min(1 << 16).saturating_sub(u64::from(short % 4) * u64::from(short / 4 % 64));
        let mut buf = vec![0xaa_u8; buflen as usize];
        let r = self.real[a].mm.mincore(addr, len, &mut buf);
        let line = format!("as{a} mincore({addr:#x}, {len:#x}, [{buflen}]) = {r:?}");
        let (want, written) = if addr % PG != 0 {
            (Err(Errno::Inval), 0)
        } else if addr > cfg.task_size || len > cfg.task_size - addr {
            (Err(Errno::NoMem), 0)
        } else {
            let pg = addr / PG;
            let mut h = 0;
            while h < pages && self.model.ases[a].pages.contains_key(&(pg + h)) {
                h += 1;
            }
            if h < pages {
                if buflen < h {
                    (Err(Errno::Fault), buflen)
                } else {
                    (Err(Errno::NoMem), h)
                }
            } else if buflen < pages {
                (Err(Errno::Fault), buflen)
            } else {
                (Ok(()), pages)
            }
        };
        ensure!(r == want, "{line}: model {want:?}");
        for i in 0..written {
            let b = buf[i as usize];
            let p = &self.model.ases[a].pages[&(addr / PG + i)];
            ensure!(b <= 1, "{line}: byte {i} is {b:#x}");
            ensure!(b == 1 || p.cow.is_none(), "{line}: page {i} has a private copy but is not resident");
        }
        Ok(line)
    }

    fn brk(&mut self, asi: u8, to: Addr) -> Result<String, String> {
        let a = self.asi(asi);
        let cfg = cfg();
        let x = self.addr(a, to);
        let orig = self.model.ases[a].brk;
        let before = self.model.ases[a].clone();
        let mut growth = 0;
        let want = (|| {
            if x < cfg.start_brk || x > cfg.task_size {
                return orig;
            }
            let (newbrk, oldbrk) = (page_align(x), page_align(orig));
            let m = &mut self.model;
            if newbrk == oldbrk {
                m.ases[a].brk = x;
                return x;
            }
            if x <= orig {
                if m.is_free(a, newbrk / PG, (oldbrk - newbrk) / PG) {
                    return orig;
                }
                m.unmap(a, newbrk / PG, (oldbrk - newbrk) / PG);
                m.ases[a].brk = x;
                return x;
            }
            // The first mapping above the old break, up to the new one plus a
            // page and the guard gap, must start (a growsdown one's gap
            // included) above the new break's page.
            let gap = cfg.stack_guard_gap / PG;
            let first = m.ases[a].pages.range(oldbrk / PG..(newbrk + PG) / PG + gap).next();
            if first.is_some_and(|(&pg, _)| m.gap_end(a, pg) < (newbrk + PG) / PG) {
                return orig;
            }
            growth = newbrk - oldbrk;
            if growth / PG <= MAX_MODEL_PAGES {
                for pg in oldbrk / PG..newbrk / PG {
                    m.ases[a].pages.insert(pg, MPage::new(Prot::RW, Kind::Anon));
                }
            }
            m.ases[a].brk = x;
            x
        })();
        if want != orig && (growth > MAX_WALK || x < orig && page_align(orig) - page_align(x) > MAX_WALK) {
            self.model.ases[a] = before;
            return Ok(format!("as{a} brk({x:#x}): valid but huge, skipped (speed)"));
        }
        let r = self.real[a].mm.brk(x);
        let line = format!("as{a} brk({x:#x}) = {r:#x}");
        if r == orig && want != orig && growth >= COMMIT_SLACK {
            self.model.ases[a] = before;
            return Ok(line + " (commit limit, accepted)");
        }
        ensure!(r == want, "{line}: model {want:#x}");
        if growth / PG > MAX_MODEL_PAGES {
            let back = self.real[a].mm.brk(orig);
            ensure!(back == orig, "{line}; brk back to {orig:#x} = {back:#x}");
            self.model.ases[a].brk = orig;
            return Ok(line + " (large: shrunk back)");
        }
        Ok(line)
    }
}

/// Linux's `LEGACY_MAP_MASK` (what `MAP_SHARED_VALIDATE` accepts for a
/// file without `mmap_supported_flags`).
const LEGACY_MAP_MASK: i32 = MAP_SHARED
    | MAP_PRIVATE
    | MAP_FIXED
    | MAP_ANONYMOUS
    | MAP_DENYWRITE
    | MAP_EXECUTABLE
    | MAP_UNINITIALIZED
    | MAP_GROWSDOWN
    | MAP_LOCKED
    | MAP_NORESERVE
    | MAP_POPULATE
    | MAP_NONBLOCK
    | MAP_STACK
    | MAP_HUGETLB;

/// `shrink_vma`'s `do_vmi_munmap(addr + new, old - new)`: `EINVAL` for a
/// tail that starts or ends past `task` (the start wraps as Linux's unsigned
/// sum does), however little of it is mapped.
fn shrink_tail(task: u64, addr: u64, new: u64, old: u64) -> Result<(), Errno> {
    let start = addr.wrapping_add(new);
    if start > task || old - new > task - start {
        return Err(Errno::Inval);
    }
    Ok(())
}

fn len_val(l: Len) -> u64 {
    match l {
        Len::Pages(n) => u64::from(n % 32) * PG,
        Len::Bytes(n) => u64::from(n),
        Len::Special(i) => SPECIAL_LENS[usize::from(i) % SPECIAL_LENS.len()],
        Len::Raw(v) => v,
    }
}

fn off_val(o: Off) -> u64 {
    match o {
        Off::Page(n) => u64::from(n % 24) * PG,
        Off::Byte(n) => u64::from(n),
        Off::Special(i) => SPECIAL_LENS[usize::from(i) % SPECIAL_LENS.len()],
        Off::Raw(v) => v,
    }
}

fn prot_val(p: ProtArg) -> i32 {
    match p {
        ProtArg::Bits(b) => i32::from(b & 7) | if b & 0x80 != 0 { PROT_SEM } else { 0 },
        ProtArg::Raw(v) => v,
    }
}

/// Runs of pages: `(first page, end page, perms, inode, first index)`,
/// adjacent runs merged where they continue each other.
type Run = (u64, u64, String, u64, u64);

fn push_run(out: &mut Vec<Run>, r: Run) {
    if let Some(last) = out.last_mut() {
        if last.1 == r.0 && last.2 == r.2 && last.3 == r.3 && (r.3 == 0 || last.4 + (last.1 - last.0) == r.4) {
            last.1 = r.1;
            return;
        }
    }
    out.push(r);
}

fn real_runs(maps: &[MapEntry]) -> Vec<Run> {
    let mut out = Vec::new();
    for e in maps {
        let idx = if e.inode == 0 { 0 } else { e.offset / PG };
        push_run(&mut out, (e.start / PG, e.end / PG, e.perms.clone(), e.inode, idx));
    }
    out
}

fn model_runs(m: &Model, a: usize) -> Vec<Run> {
    let mut out = Vec::new();
    for (&pg, p) in &m.ases[a].pages {
        let (s, inode, idx) = match p.kind {
            Kind::Anon => ('p', 0, 0),
            Kind::Obj { shared, obj, idx } => (if shared { 's' } else { 'p' }, m.objs[obj].inode, idx),
        };
        push_run(&mut out, (pg, pg + 1, format!("{}{}", p.prot.perms(), s), inode, idx));
    }
    out
}

/// Formats a failure for a panic message (the fuzzer's crash report).
pub fn report(e: &str) -> String {
    let mut s = String::new();
    let _ = write!(s, "softmm disagrees with the reference model: {e}");
    s
}
