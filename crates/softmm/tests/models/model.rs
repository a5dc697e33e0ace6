//! Model-based property test: random sequences of mapping calls, forks, file
//! writes, truncates and hole punches, and guest accesses, applied both to
//! softmm and to a small sequential reference model of Linux's semantics (one
//! entry per page: protection, backing, private copy; plus file contents).
//!
//! The model predicts, for every call, its result (the addresses chosen by the
//! top-down allocator included) and, for every access, the bytes read or the
//! signal raised (SIGSEGV MAPERR/ACCERR, SIGBUS past EOF). After every
//! operation the mapped pages of every address space (protection,
//! shared/private, inode and file page index, from `maps()`; VMA boundaries
//! are ignored) and the file sizes are compared; at the end every mapped page
//! is read and compared, as are the files, and everything is dropped and
//! checked for leaks.
//!
//! Each address space has two CPUs: one on the test thread and one on a
//! worker thread (parked while idle), so that TLB shootdowns between CPUs and
//! the lock-free fault policies (used only with more than one CPU attached)
//! are exercised. A case that deadlocks aborts the process after
//! `HANG_SECS`, printing its operations.
//!
//! Run more cases with `PROPTEST_CASES=10000 cargo test --release --test models model::`.

use softmm_testkit::common;
use softmm_testkit::reference;

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use reference::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Errno, Fault, FaultPolicy, File, MmConfig, OpenFile};

/// Pages of the window that fixed mappings, unmaps and accesses aim at; it
/// ends at `mmap_base`, so that top-down placement fills its holes.
const WIN_PAGES: u64 = 256;
/// Most address spaces alive at once (a fork beyond replaces the last).
const MAX_AS: usize = 3;
/// Largest file offset the generated file operations reach, in pages.
const FILE_PAGES: u64 = 14;
/// A case taking longer than this has deadlocked.
const HANG_SECS: u64 = 20;

fn mmap_base_pg() -> u64 {
    MmConfig::default().mmap_base / PAGE
}

fn win_pg() -> u64 {
    mmap_base_pg() - WIN_PAGES
}

// ---------------------------------------------------------------------------
// Generated operations. Addresses are selectors resolved when the operation
// runs, against the state reached so far, so that shrinking keeps them valid.

#[derive(Clone, Copy, Debug)]
enum Backing {
    Anon,
    SharedAnon,
    File { shared: bool, file: u8, pgoff: u8 },
}

/// A page: a window page, or (if `window` is false and something is mapped)
/// the `sel`-th mapped page of the address space.
#[derive(Clone, Copy, Debug)]
struct Target {
    window: bool,
    page: u16,
    sel: u32,
}

#[derive(Clone, Copy, Debug)]
enum RemapMode {
    /// No flags, `new < old` (the old range may run past its VMA).
    Shrink,
    /// No flags, `new > old`: in place or `ENOMEM`.
    Grow,
    /// `MREMAP_MAYMOVE`, `new > old`.
    MayMove,
    /// `MREMAP_MAYMOVE | MREMAP_FIXED` to a window page.
    Fixed(u16),
    /// `MREMAP_MAYMOVE | MREMAP_DONTUNMAP`, `new == old`, no address hint.
    DontUnmap,
}

#[derive(Clone, Debug)]
enum Op {
    Mmap {
        asi: u8,
        fixed: Option<u16>,
        pages: u8,
        prot: Prot,
        backing: Backing,
    },
    Munmap {
        asi: u8,
        at: Target,
        pages: u8,
    },
    Mprotect {
        asi: u8,
        at: Target,
        pages: u8,
        prot: Prot,
    },
    /// Source: page `off` of the `sel`-th VMA, `old` pages (within the VMA
    /// except for `Shrink`).
    Mremap {
        asi: u8,
        sel: u32,
        off: u16,
        old: u8,
        new: u8,
        mode: RemapMode,
    },
    Dontneed {
        asi: u8,
        at: Target,
        pages: u8,
    },
    Fork {
        asi: u8,
    },
    /// An access through CPU `cpu` (each address space has two).
    Write {
        asi: u8,
        cpu: u8,
        at: Target,
        off: u16,
        len: u8,
        val: u8,
    },
    Read {
        asi: u8,
        cpu: u8,
        at: Target,
        off: u16,
        len: u8,
    },
    FileWrite {
        file: u8,
        off: u32,
        len: u16,
        val: u8,
    },
    FileSetLen {
        file: u8,
        size: u32,
    },
    FilePunch {
        file: u8,
        off: u32,
        len: u16,
    },
}

#[derive(Clone, Debug)]
struct Scenario {
    policy: FaultPolicy,
    /// Initial sizes of the files (1 or 2).
    files: Vec<u32>,
    ops: Vec<Op>,
}

fn prot() -> impl Strategy<Value = Prot> {
    prop_oneof![1 => Just(Prot::NONE), 2 => Just(Prot::R), 5 => Just(Prot::RW)]
}

fn target() -> impl Strategy<Value = Target> {
    (prop::bool::weighted(0.3), 0..WIN_PAGES as u16, any::<u32>()).prop_map(|(window, page, sel)| Target {
        window,
        page,
        sel,
    })
}

fn npages() -> impl Strategy<Value = u8> {
    prop_oneof![3 => 1u8..=4, 1 => 1u8..=16]
}

fn page_offset() -> impl Strategy<Value = u16> {
    prop_oneof![3 => 0u16..PAGE as u16, 1 => (PAGE as u16 - 16)..PAGE as u16]
}

fn access_len() -> impl Strategy<Value = u8> {
    prop_oneof![3 => Just(1u8), 1 => 1u8..=16]
}

fn file_size() -> impl Strategy<Value = u32> {
    (0..FILE_PAGES as u32 - 2, 0..PAGE as u32, any::<bool>())
        .prop_map(|(pages, sub, aligned)| pages * PAGE as u32 + if aligned { 0 } else { sub })
}

fn backing() -> impl Strategy<Value = Backing> {
    prop_oneof![
        3 => Just(Backing::Anon),
        1 => Just(Backing::SharedAnon),
        3 => (any::<bool>(), 0u8..2, 0u8..12).prop_map(|(shared, file, pgoff)| Backing::File { shared, file, pgoff }),
    ]
}

fn remap_mode() -> impl Strategy<Value = RemapMode> {
    prop_oneof![
        Just(RemapMode::Shrink),
        Just(RemapMode::Grow),
        Just(RemapMode::MayMove),
        (0..WIN_PAGES as u16).prop_map(RemapMode::Fixed),
        Just(RemapMode::DontUnmap),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let asi = 0u8..MAX_AS as u8;
    prop_oneof![
        5 => (asi.clone(), prop_oneof![4 => (0..WIN_PAGES as u16).prop_map(Some), 1 => Just(None)], npages(), prot(), backing())
            .prop_map(|(asi, fixed, pages, prot, backing)| Op::Mmap { asi, fixed, pages, prot, backing }),
        2 => (asi.clone(), target(), npages()).prop_map(|(asi, at, pages)| Op::Munmap { asi, at, pages }),
        2 => (asi.clone(), target(), npages(), prot())
            .prop_map(|(asi, at, pages, prot)| Op::Mprotect { asi, at, pages, prot }),
        3 => (asi.clone(), any::<u32>(), any::<u16>(), 1u8..=8, 1u8..=16, remap_mode())
            .prop_map(|(asi, sel, off, old, new, mode)| Op::Mremap { asi, sel, off, old, new, mode }),
        2 => (asi.clone(), target(), npages()).prop_map(|(asi, at, pages)| Op::Dontneed { asi, at, pages }),
        1 => asi.clone().prop_map(|asi| Op::Fork { asi }),
        8 => (asi.clone(), 0u8..2, target(), page_offset(), access_len(), any::<u8>())
            .prop_map(|(asi, cpu, at, off, len, val)| Op::Write { asi, cpu, at, off, len, val }),
        5 => (asi, 0u8..2, target(), page_offset(), access_len())
            .prop_map(|(asi, cpu, at, off, len)| Op::Read { asi, cpu, at, off, len }),
        2 => (0u8..2, 0..(FILE_PAGES as u32 - 2) * PAGE as u32, 1u16..6000, any::<u8>())
            .prop_map(|(file, off, len, val)| Op::FileWrite { file, off, len, val }),
        2 => (0u8..2, file_size()).prop_map(|(file, size)| Op::FileSetLen { file, size }),
        1 => (0u8..2, 0..FILE_PAGES as u32 * PAGE as u32, 1u16..12000)
            .prop_map(|(file, off, len)| Op::FilePunch { file, off, len }),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::sample::select(FaultPolicy::ALL.to_vec()),
        prop::collection::vec(file_size(), 1..=2),
        prop::collection::vec(op(), 20..=60),
    )
        .prop_map(|(policy, files, ops)| Scenario { policy, files, ops })
}

// ---------------------------------------------------------------------------
// The reference model: softmm_testkit::reference (shared with the fuzz target).

// ---------------------------------------------------------------------------
// Running a scenario against both.

/// A guest access, for a worker thread's CPU.
enum Req {
    Read(u64, usize),
    Write(u64, Vec<u8>),
}

/// A thread with its own CPU on an address space, doing the accesses sent to
/// it. Its CPU is parked while it waits for work, as a thread that blocks
/// outside softmm must (else shootdowns would wait for it).
struct Worker {
    tx: Option<mpsc::Sender<Req>>,
    rx: mpsc::Receiver<Result<Vec<u8>, Fault>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn new(mm: &Arc<AddressSpace>) -> Worker {
        let (tx, wrx) = mpsc::channel::<Req>();
        let (wtx, rx) = mpsc::channel();
        let mm = mm.clone();
        let thread = std::thread::spawn(move || {
            let mut cpu = Cpu::attached(&mm);
            drop(mm);
            cpu.park();
            for req in wrx {
                cpu.resume();
                let r = match req {
                    Req::Read(va, len) => {
                        let mut buf = vec![0; len];
                        cpu.read(va, &mut buf).map(|()| buf)
                    }
                    Req::Write(va, data) => cpu.write(va, &data).map(|()| Vec::new()),
                };
                cpu.park();
                if wtx.send(r).is_err() {
                    break;
                }
            }
        });
        Worker { tx: Some(tx), rx, thread: Some(thread) }
    }

    fn call(&self, req: Req) -> Result<Vec<u8>, Fault> {
        self.tx.as_ref().expect("running").send(req).expect("worker alive");
        self.rx.recv().expect("worker alive")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One address space of softmm with its two CPUs: one on this thread and
/// one on a worker thread (both go before the address space).
struct Real {
    cpu: Cpu,
    worker: Worker,
    mm: Arc<AddressSpace>,
}

impl Real {
    fn new(mm: Arc<AddressSpace>) -> Real {
        Real { cpu: Cpu::attached(&mm), worker: Worker::new(&mm), mm }
    }
}

/// Accesses through CPU `cpu` (0: this thread's, 1: the worker's) of `real[a]`.
/// While a worker runs, this thread's CPUs are parked: this thread is blocked
/// outside softmm, and the worker's faults may shoot them down.
fn access(real: &mut [Real], a: usize, cpu: u8, req: Req) -> Result<Vec<u8>, Fault> {
    if cpu % 2 == 0 {
        let c = &mut real[a].cpu;
        return match req {
            Req::Read(va, len) => {
                let mut buf = vec![0; len];
                c.read(va, &mut buf).map(|()| buf)
            }
            Req::Write(va, data) => c.write(va, &data).map(|()| Vec::new()),
        };
    }
    real.iter_mut().for_each(|r| r.cpu.park());
    let r = real[a].worker.call(req);
    real.iter_mut().for_each(|r| r.cpu.resume());
    r
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

/// Window-relative page number, for readable logs.
fn wp(pg: u64) -> i64 {
    pg as i64 - win_pg() as i64
}

fn resolve(model: &Model, a: usize, t: Target) -> u64 {
    let pages = &model.ases[a].pages;
    if !t.window && !pages.is_empty() {
        return *pages.keys().nth(t.sel as usize % pages.len()).expect("in range");
    }
    win_pg() + u64::from(t.page) % WIN_PAGES
}

fn pattern(len: usize, val: u8) -> Vec<u8> {
    (0..len).map(|i| val.wrapping_add((i as u8).wrapping_mul(31))).collect()
}

/// Runs `sc` on its own thread (CPUs are not `Send`, so everything is made
/// there). A case that does not finish in time is a deadlock in softmm: its
/// log, up to the operation that hung, is printed and the process aborted
/// (a spinning thread cannot be stopped, so there is no shrinking then).
fn run_watched(sc: &Scenario) -> Result<(), String> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let (sc2, log2) = (sc.clone(), log.clone());
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&sc2, &log2)));
        let _ = tx.send(r.unwrap_or_else(|e| {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panic: {}", msg.unwrap_or_default()))
        }));
    });
    let r = match rx.recv_timeout(Duration::from_secs(HANG_SECS)) {
        Ok(r) => r,
        Err(_) => {
            // Straight to stderr: the test harness's capture would be lost.
            let _ = writeln!(
                std::io::stderr(),
                "softmm hung for {HANG_SECS} s on the last operation below\n{sc:?}\n--- ops:\n{}",
                log.lock().unwrap().join("\n")
            );
            std::process::abort();
        }
    };
    r.map_err(|e| format!("{e}\n--- ops:\n{}", log.lock().unwrap().join("\n")))
}

fn run(sc: &Scenario, log: &Mutex<Vec<String>>) -> Result<(), String> {
    let phys = phys(32);
    {
        let mut model = Model::default();
        let mut files = Vec::new();
        let mut opens = Vec::new();
        for (i, &size) in sc.files.iter().enumerate() {
            let f = File::create(&phys, &format!("/tmp/f{i}"), 0).expect("file");
            let init = pattern(size as usize, 0x40 + i as u8);
            f.write_at(0, &init).expect("write_at");
            let mut o = Obj::new(f.id(), 0);
            o.write_at(0, &init);
            model.objs.push(o);
            opens.push(OpenFile::read_write(&f));
            files.push(f);
        }
        let mut real = vec![Real::new(mm_with(&phys, sc.policy))];
        model.ases.push(MAs::default());

        for (step, op) in sc.ops.iter().enumerate() {
            let n_as = real.len();
            log.lock().unwrap().push(format!("{step:2}: {op:?}"));
            let line =
                apply(op, &mut model, &mut real, &files, &opens, n_as).map_err(|e| format!("step {step}: {e}"))?;
            *log.lock().unwrap().last_mut().expect("pushed") = format!("{step:2}: {line}");
            check_layout(&model, &real, &files).map_err(|e| format!("after step {step}: {e}"))?;
        }

        // Final contents: every mapped page, and the files.
        for a in 0..real.len() {
            for &pg in model.ases[a].pages.keys() {
                let want = model.read(a, pg * PAGE, P);
                let got = access(&mut real, a, (pg % 2) as u8, Req::Read(pg * PAGE, P));
                if got != want {
                    let what = reference::describe_difference(&got, &want);
                    return Err(format!(
                        "final contents of as{a} page {} ({:?}): {what}",
                        wp(pg),
                        model.ases[a].pages[&pg]
                    ));
                }
            }
        }
        for (i, f) in files.iter().enumerate() {
            let o = &model.objs[i];
            let mut buf = vec![0; o.size as usize];
            ensure!(f.read_at(0, &mut buf) == Ok(o.size as usize), "file {i}: short read");
            let want = o.read_at(0, o.size);
            if let Some(at) = (0..buf.len()).find(|&j| buf[j] != want[j]) {
                return Err(format!("file {i} byte {at:#x}: softmm {:#04x}, model {:#04x}", buf[at], want[at]));
            }
        }
        drop(real);
        drop(opens);
        drop(files);
    }
    assert_no_leaks(&phys);
    Ok(())
}

fn check_layout(model: &Model, real: &[Real], files: &[Arc<File>]) -> Result<(), String> {
    for (a, r) in real.iter().enumerate() {
        let want = model.layout(a);
        let got = real_layout(&r.mm.maps());
        if got != want {
            let pg = want
                .keys()
                .chain(got.keys())
                .copied()
                .filter(|k| want.get(k) != got.get(k))
                .min()
                .expect("a difference");
            return Err(format!(
                "as{a} page {}: softmm {:?}, model {:?}\n{}",
                wp(pg),
                got.get(&pg),
                want.get(&pg),
                r.mm.maps_text()
            ));
        }
    }
    for (i, f) in files.iter().enumerate() {
        ensure!(f.len() == model.objs[i].size, "file {i} size: softmm {}, model {}", f.len(), model.objs[i].size);
    }
    Ok(())
}

/// Applies `op` to both sides; returns a description of what ran.
fn apply(
    op: &Op,
    model: &mut Model,
    real: &mut Vec<Real>,
    files: &[Arc<File>],
    opens: &[OpenFile],
    n_as: usize,
) -> Result<String, String> {
    let mut line = String::new();
    match *op {
        Op::Mmap { asi, fixed, pages, prot, backing } => {
            let a = asi as usize % n_as;
            let n = u64::from(pages);
            let (flags, file, off, what) = match backing {
                Backing::Anon => (MAP_PRIVATE | MAP_ANONYMOUS, None, 0, "anon".to_string()),
                Backing::SharedAnon => (MAP_SHARED | MAP_ANONYMOUS, None, 0, "shared-anon".to_string()),
                Backing::File { shared, file, pgoff } => {
                    let f = file as usize % files.len();
                    let flags = if shared { MAP_SHARED } else { MAP_PRIVATE };
                    (
                        flags,
                        Some(&opens[f]),
                        u64::from(pgoff),
                        format!("file{f}@{pgoff} {}", if shared { 's' } else { 'p' }),
                    )
                }
            };
            let (addr, flags, at) = match fixed {
                Some(p) => {
                    let pg = win_pg() + u64::from(p) % (WIN_PAGES - n + 1);
                    (pg * PAGE, flags | MAP_FIXED, pg)
                }
                None => (0, flags, model.topdown(a, n)),
            };
            let r = real[a].mm.mmap(addr, n * PAGE, prot.bits(), flags, file, off * PAGE);
            write!(
                line,
                "as{a} mmap({}, {n}p, {prot:?}, {what}) = {:?}",
                if addr == 0 { "0".into() } else { format!("{}", wp(at)) },
                r.map(|x| wp(x / PAGE))
            )
            .unwrap();
            ensure!(r == Ok(at * PAGE), "{line}: want {}", wp(at));
            model.unmap(a, at, n);
            let kind = |i: u64| match backing {
                Backing::Anon => Kind::Anon,
                Backing::SharedAnon => Kind::Obj { shared: true, obj: model.objs.len(), idx: i },
                Backing::File { shared, file, pgoff } => {
                    Kind::Obj { shared, obj: file as usize % files.len(), idx: u64::from(pgoff) + i }
                }
            };
            let kinds: Vec<Kind> = (0..n).map(kind).collect();
            if let Backing::SharedAnon = backing {
                let inode = real[a]
                    .mm
                    .maps()
                    .iter()
                    .find(|e| e.start <= at * PAGE && at * PAGE < e.end)
                    .map(|e| e.inode)
                    .ok_or_else(|| format!("{line}: new mapping not in maps"))?;
                model.objs.push(Obj::new(inode, n * PAGE));
            }
            for (i, kind) in kinds.into_iter().enumerate() {
                model.ases[a].pages.insert(at + i as u64, MPage::new(prot, kind));
            }
        }
        Op::Munmap { asi, at, pages } => {
            let a = asi as usize % n_as;
            let pg = resolve(model, a, at);
            let n = u64::from(pages);
            let r = real[a].mm.munmap(pg * PAGE, n * PAGE);
            write!(line, "as{a} munmap({}, {n}p) = {r:?}", wp(pg)).unwrap();
            ensure!(r == Ok(()), "{line}");
            model.unmap(a, pg, n);
        }
        Op::Mprotect { asi, at, pages, prot } => {
            let a = asi as usize % n_as;
            let pg = resolve(model, a, at);
            let n = u64::from(pages);
            let mut want = Ok(());
            for p in pg..pg + n {
                match model.ases[a].pages.get_mut(&p) {
                    Some(mp) => mp.prot = prot,
                    None => {
                        want = Err(Errno::NoMem);
                        break;
                    }
                }
            }
            let r = real[a].mm.mprotect(pg * PAGE, n * PAGE, prot.bits());
            write!(line, "as{a} mprotect({}, {n}p, {prot:?}) = {r:?}", wp(pg)).unwrap();
            ensure!(r == want, "{line}: want {want:?}");
        }
        Op::Mremap { asi, sel, off, old, new, mode } => {
            let a = asi as usize % n_as;
            let maps = real[a].mm.maps();
            if maps.is_empty() {
                return Ok(format!("as{a} mremap: nothing mapped"));
            }
            let v = &maps[sel as usize % maps.len()];
            let (vstart, vend) = (v.start / PAGE, v.end / PAGE);
            let src = vstart + u64::from(off) % (vend - vstart);
            let in_vma = u64::from(old).min(vend - src);
            let (old, new, flags, new_addr) = match mode {
                RemapMode::Shrink => {
                    let old = u64::from(old);
                    (old, 1 + (u64::from(new) - 1) % old, 0, 0)
                }
                RemapMode::Grow => (in_vma, in_vma + 1 + u64::from(new) % 8, 0, 0),
                RemapMode::MayMove => (in_vma, in_vma + 1 + u64::from(new) % 8, MREMAP_MAYMOVE, 0),
                RemapMode::DontUnmap => (in_vma, in_vma, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0),
                RemapMode::Fixed(d) => {
                    let new = u64::from(new);
                    let dst = win_pg() + u64::from(d) % (WIN_PAGES - new + 1);
                    if dst < src + in_vma && src < dst + new {
                        return Ok(format!("as{a} mremap fixed: overlap, skipped"));
                    }
                    (in_vma, new, MREMAP_MAYMOVE | MREMAP_FIXED, dst)
                }
            };
            // The prediction, from the model (plus softmm's VMA end for in-place growth).
            let want = match mode {
                RemapMode::Shrink => Ok(src),
                RemapMode::Fixed(_) => Ok(new_addr),
                RemapMode::DontUnmap => Ok(model.topdown(a, new)),
                RemapMode::Grow | RemapMode::MayMove => {
                    if src + old == vend && model.is_free(a, vend, new - old) {
                        Ok(src)
                    } else if matches!(mode, RemapMode::MayMove) {
                        Ok(model.topdown(a, new))
                    } else {
                        Err(Errno::NoMem)
                    }
                }
            };
            let r = real[a].mm.mremap(src * PAGE, old * PAGE, new * PAGE, flags, new_addr * PAGE);
            write!(
                line,
                "as{a} mremap({}, {old}p, {new}p, {mode:?}{}) [vma {}..{}] = {:?}",
                wp(src),
                if flags & MREMAP_FIXED != 0 { format!(" -> {}", wp(new_addr)) } else { String::new() },
                wp(vstart),
                wp(vend),
                r.map(|x| wp(x / PAGE))
            )
            .unwrap();
            ensure!(r == want.map(|p| p * PAGE), "{line}: want {:?}", want.map(wp));
            match (mode, want) {
                (_, Err(_)) => {}
                (RemapMode::Shrink, _) => model.unmap(a, src + new, old - new),
                (RemapMode::DontUnmap, Ok(dst)) => {
                    // The source stays mapped, emptied: private pages lose their copies.
                    let left: Vec<(u64, MPage)> = (src..src + old)
                        .map(|pg| (pg, MPage { cow: None, ..model.ases[a].pages[&pg].clone() }))
                        .collect();
                    model.move_pages(a, src, old, dst, new);
                    model.ases[a].pages.extend(left);
                }
                (RemapMode::Fixed(_), Ok(dst)) => {
                    model.unmap(a, dst, new);
                    let old = if new < old {
                        model.unmap(a, src + new, old - new);
                        new
                    } else {
                        old
                    };
                    model.move_pages(a, src, old, dst, new);
                }
                (_, Ok(dst)) if dst == src => {
                    let last = model.ases[a].pages[&(src + old - 1)].clone();
                    model.extend(a, src + old - 1, &last, new - old);
                }
                (_, Ok(dst)) => model.move_pages(a, src, old, dst, new),
            }
        }
        Op::Dontneed { asi, at, pages } => {
            let a = asi as usize % n_as;
            let pg = resolve(model, a, at);
            let n = u64::from(pages);
            let mut want = Ok(());
            for p in pg..pg + n {
                match model.ases[a].pages.get_mut(&p) {
                    Some(mp) => mp.cow = None,
                    None => want = Err(Errno::NoMem),
                }
            }
            let r = real[a].mm.madvise(pg * PAGE, n * PAGE, MADV_DONTNEED);
            write!(line, "as{a} madvise({}, {n}p, DONTNEED) = {r:?}", wp(pg)).unwrap();
            ensure!(r == want, "{line}: want {want:?}");
        }
        Op::Fork { asi } => {
            let a = asi as usize % n_as;
            let child = real[a].mm.fork().map_err(|e| format!("as{a} fork: {e:?}"))?;
            let child = Real::new(child);
            let cm = model.ases[a].clone();
            let c = if real.len() < MAX_AS {
                real.push(child);
                model.ases.push(cm);
                real.len() - 1
            } else {
                real[MAX_AS - 1] = child;
                model.ases[MAX_AS - 1] = cm;
                MAX_AS - 1
            };
            write!(line, "as{a} fork -> as{c}").unwrap();
        }
        Op::Write { asi, cpu, at, off, len, val } => {
            let a = asi as usize % n_as;
            let va = resolve(model, a, at) * PAGE + u64::from(off);
            let data = pattern(len as usize, val);
            let want = model.write(a, va, &data);
            let r = access(real, a, cpu, Req::Write(va, data)).map(|_| ());
            write!(line, "as{a}.{} write({}+{:#x}, {len}) = {r:?}", cpu % 2, wp(va / PAGE), va % PAGE).unwrap();
            ensure!(r == want, "{line}: want {want:?}");
        }
        Op::Read { asi, cpu, at, off, len } => {
            let a = asi as usize % n_as;
            let va = resolve(model, a, at) * PAGE + u64::from(off);
            let want = model.read(a, va, len as usize);
            let r = access(real, a, cpu, Req::Read(va, len as usize));
            write!(line, "as{a}.{} read({}+{:#x}, {len}) = {r:?}", cpu % 2, wp(va / PAGE), va % PAGE).unwrap();
            ensure!(r == want, "{line}: want {want:?}");
        }
        Op::FileWrite { file, off, len, val } => {
            let f = file as usize % files.len();
            let data = pattern(len as usize, val);
            let r = files[f].write_at(u64::from(off), &data);
            write!(line, "file{f} write_at({off:#x}, {len}) = {r:?}").unwrap();
            ensure!(r == Ok(data.len()), "{line}");
            model.objs[f].write_at(u64::from(off), &data);
        }
        Op::FileSetLen { file, size } => {
            let f = file as usize % files.len();
            let r = files[f].set_len(u64::from(size));
            write!(line, "file{f} set_len({size:#x}) = {r:?}").unwrap();
            ensure!(r == Ok(()), "{line}");
            model.truncate(f, u64::from(size));
        }
        Op::FilePunch { file, off, len } => {
            let f = file as usize % files.len();
            let r = files[f].punch_hole(u64::from(off), u64::from(len));
            write!(line, "file{f} punch_hole({off:#x}, {len:#x}) = {r:?}").unwrap();
            ensure!(r == Ok(()), "{line}");
            model.objs[f].punch(u64::from(off), u64::from(len));
        }
    }
    Ok(line)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn softmm_matches_the_model(sc in scenario()) {
        let r = run_watched(&sc);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}
