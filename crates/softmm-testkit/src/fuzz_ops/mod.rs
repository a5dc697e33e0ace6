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
    MmConfig::default().thp_align(false).force_speculative(true).writer_policy(crate::common::writer_policy())
}

fn win_pg() -> u64 {
    cfg().mmap_base / PG - WIN_PAGES
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

mod input;
mod madvise;
mod mmap;
mod mremap;

pub use input::*;

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
