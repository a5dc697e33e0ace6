//! `pin`: seed 004's experiment. A region mapped but never touched (default
//! 8 GiB, `--size`) is pinned for write and long term, as VFIO pins a guest's
//! memory, so every page is faulted in and pinned; by 1..=nproc worker
//! threads (`--threads`; softmm's `pin_user_pages_parallel`, the range cut
//! into 2 MiB-aligned chunks), under every `PinPolicy` (`per-page`: the
//! seed's before, `batched`: the seed, `per-vma`: softmm's default). Modes:
//! `alone`, and `interfered`, where one more thread of the address space
//! loops mmap/munmap of an unrelated 16-page region meanwhile.
//!
//! The host row pins the same size through io_uring's fixed-buffer
//! registration (`IORING_REGISTER_BUFFERS` pins with `FOLL_WRITE |
//! FOLL_LONGTERM`), one ring per thread, each registering its slice in
//! iovecs of at most 1 GiB (io_uring's limit), with `RLIMIT_MEMLOCK` raised
//! to infinity (as root); if the host refuses, the reason is printed and
//! only that row is skipped.
//!
//! One operation is one page pinned: `ops_per_sec` is pages pinned per
//! second; counters `pages` and `mmap_lock_acquisitions` (the pin's own and
//! its faults' fallbacks; the table shows them per 512 pages, VFIO's batch).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softmm::{AddressSpace, Foll, PhysConfig, PhysMem, PinPolicy, PAGE_SIZE};

use super::Measured;
use crate::args::BenchArgs;
use crate::experiment::{Experiment, Headline};
use crate::machine::{cores, Machine};
use crate::report::{self, Sample};
use crate::summary::{beside_one, cpus_phrase, figure, SeedRow, SIXTEEN_CPUS};

crate::counters::counters! {
    /// `pin`'s counters.
    pub struct PinCounters {
        /// Page faults (softmm: handled by its CPUs; host: minor faults of the tasks).
        sum faults,
        /// `mmap_lock` acquisitions: by faults, plus the address spaces' own.
        sum mmap_lock_acquisitions,
        /// Pages pinned (`pin`).
        sum pages,
    }
}

/// The modes.
pub const MODES: &[&str] = &["alone", "interfered"];

/// The default region: seed 004 pinned 320 GiB; 8 GiB keeps a sweep short.
pub const DEFAULT_SIZE: u64 = 8 << 30;

/// Pages of the interfering thread's mapping.
const MAPPER_PAGES: u64 = 16;

/// The softmm arena for a `size`-byte region: the region, its page tables
/// (1/512), and frames cached by threads that exited.
pub fn arena_bytes(size: u64) -> u64 {
    size + size / 256 + (64 << 20) + cores() as u64 * (2 << 20)
}

/// CPU seconds this process has used (user and system, every thread).
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One softmm sample: an address space with `policy` maps `size` bytes, and
/// `threads` workers pin all of it (timed); the pins are dropped and the
/// address space with them (untimed).
pub fn soft(
    phys: &Arc<PhysMem>,
    policy: PinPolicy,
    threads: usize,
    size: u64,
    interfered: bool,
) -> Result<Measured<PinCounters>, String> {
    let config = super::mm_config().pin_policy(policy).cap_ipc_lock(true);
    let mm = AddressSpace::new(phys, config).map_err(|e| format!("address space: {e}"))?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let a = mm.mmap(0, size, rw, anon, None, 0).map_err(|e| format!("mmap of {} MiB: {e}", size >> 20))?;
    let npages = (size / PAGE_SIZE) as usize;
    let stop = AtomicBool::new(false);
    let (pinned, seconds, mapper) = std::thread::scope(|s| {
        let mapper = interfered.then(|| {
            s.spawn(|| -> Result<u64, String> {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let len = MAPPER_PAGES * PAGE_SIZE;
                    let b = mm.mmap(0, len, libc::PROT_READ, anon, None, 0).map_err(|e| format!("mapper: {e}"))?;
                    mm.munmap(b, len).map_err(|e| format!("mapper: {e}"))?;
                    n += 1;
                }
                Ok(n)
            })
        });
        if interfered {
            // Let the mapper get going first.
            std::thread::sleep(Duration::from_millis(2));
        }
        let (c0, t0) = (process_cpu_seconds(), Instant::now());
        let pinned = mm.pin_user_pages_parallel(a, npages, Foll::WRITE | Foll::LONGTERM, threads);
        let (seconds, cpu) = (t0.elapsed().as_secs_f64(), process_cpu_seconds() - c0);
        stop.store(true, Ordering::Relaxed);
        let mapper = mapper.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        (pinned, (seconds, cpu), mapper)
    });
    let (seconds, cpu_seconds) = seconds;
    if let Some(m) = mapper {
        m?;
    }
    let pinned = pinned.map_err(|e| format!("pin_user_pages of {} MiB: {e}", size >> 20))?;
    let st = pinned.stats();
    drop(pinned);
    drop(mm);
    Ok(Measured {
        ops: st.pages,
        seconds,
        cpu_seconds,
        counters: PinCounters {
            pages: Some(st.pages),
            faults: Some(st.faults),
            mmap_lock_acquisitions: Some(st.mmap_lock_acquisitions),
        },
    })
}

/// The host's `IORING_REGISTER_BUFFERS`.
const IORING_REGISTER_BUFFERS: libc::c_uint = 0;
/// io_uring's largest registered buffer.
const IORING_MAX_BUF: u64 = 1 << 30;

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// A ring whose registered buffers are released when it is closed.
struct Ring(libc::c_int);

impl Ring {
    fn new() -> Result<Ring, String> {
        // struct io_uring_params: 120 bytes, zeroed; the kernel fills it in.
        let mut params = [0u64; 15];
        // SAFETY: io_uring_setup(entries, params) writes at most the 120
        // bytes of `params`, which lives across the call.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
        if fd < 0 {
            return Err(format!("io_uring_setup: {}", errno_text()));
        }
        Ok(Ring(fd as libc::c_int))
    }

    /// Registers `[addr, addr + len)` as fixed buffers of at most 1 GiB each.
    fn register(&self, addr: u64, len: u64) -> Result<(), String> {
        let iov: Vec<libc::iovec> = (0..len.div_ceil(IORING_MAX_BUF))
            .map(|i| {
                let off = i * IORING_MAX_BUF;
                libc::iovec {
                    iov_base: (addr + off) as *mut libc::c_void,
                    iov_len: (len - off).min(IORING_MAX_BUF) as usize,
                }
            })
            .collect();
        // SAFETY: the iovecs describe memory this process mapped and keeps
        // mapped until the ring is closed; the kernel only reads `iov`.
        let rc = unsafe {
            libc::syscall(libc::SYS_io_uring_register, self.0, IORING_REGISTER_BUFFERS, iov.as_ptr(), iov.len() as u32)
        };
        if rc < 0 {
            return Err(format!("IORING_REGISTER_BUFFERS: {}", errno_text()));
        }
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: our own descriptor; closing the ring unpins its buffers.
        unsafe { libc::close(self.0) };
    }
}

/// Raises `RLIMIT_MEMLOCK` to infinity where allowed (root); io_uring
/// charges registered buffers against it otherwise.
fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit reads `lim`; failure (not root) leaves the limit as it was.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// One host sample: `size` bytes mapped but never touched, registered by
/// `threads` rings at once (each its slice, 2 MiB aligned), timed; then the
/// rings are closed and the region unmapped.
pub fn host(threads: usize, size: u64) -> Result<Measured<PinCounters>, String> {
    raise_memlock();
    // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mmap of {} MiB: {}", size >> 20, errno_text()));
    }
    let addr = base as u64;
    let slice = (size / threads as u64).div_ceil(2 << 20) * (2 << 20);
    let result = (|| {
        let rings: Vec<Ring> = (0..threads).map(|_| Ring::new()).collect::<Result<_, _>>()?;
        let (c0, t0) = (process_cpu_seconds(), Instant::now());
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = rings
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let lo = (i as u64 * slice).min(size);
                    let hi = ((i as u64 + 1) * slice).min(size);
                    (lo < hi).then(|| s.spawn(move || r.register(addr + lo, hi - lo)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        let (seconds, cpu_seconds) = (t0.elapsed().as_secs_f64(), process_cpu_seconds() - c0);
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        drop(rings);
        let pages = size / PAGE_SIZE;
        Ok(Measured {
            ops: pages,
            seconds,
            cpu_seconds,
            counters: PinCounters { pages: Some(pages), ..PinCounters::default() },
        })
    })();
    // SAFETY: the mapping made above; the rings that pinned it are closed.
    unsafe { libc::munmap(base, size as usize) };
    result
}

/// A sample record.
fn sample(mode: &str, policy: &str, threads: usize, repeat: usize, m: &Measured<PinCounters>) -> Sample<PinCounters> {
    Sample {
        workload: "pin".into(),
        mode: mode.into(),
        policy: policy.into(),
        threads,
        repeat,
        ops: m.ops,
        seconds: m.seconds,
        ops_per_sec: if m.seconds > 0.0 { m.ops as f64 / m.seconds } else { 0.0 },
        counters: m.counters.clone(),
        cpu_seconds: m.cpu_seconds,
        cpu: None,
    }
}

/// The policies `--policy` names: `all`, `default`, pin policy names, `host`.
fn parse_policies(s: &str, no_host: bool) -> Result<(Vec<PinPolicy>, bool), String> {
    let mut out = Vec::new();
    let mut host = !no_host;
    let mut only_host = true;
    for name in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let add: Vec<PinPolicy> = match name {
            "all" => PinPolicy::ALL.to_vec(),
            "default" => vec![PinPolicy::default()],
            "host" => {
                host = true;
                continue;
            }
            _ => vec![PinPolicy::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = PinPolicy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown pin policy `{name}` (known: {}, all, default, host)", names.join(", "))
            })?],
        };
        only_host = false;
        for p in add {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if only_host && !no_host {
        return Ok((Vec::new(), true));
    }
    Ok((out, host))
}

/// `softmm bench pin`: the sweep, its table, `--json`.
pub fn bench(args: &BenchArgs) -> Result<i32, String> {
    if args.workloads.iter().any(|w| w != "pin") {
        return Err("`pin` runs alone: give it as the only workload".into());
    }
    let size = args.size.unwrap_or(DEFAULT_SIZE);
    if size % PAGE_SIZE != 0 {
        return Err("--size must be a multiple of 4K for pin".into());
    }
    let (policies, with_host) = parse_policies(&args.policy, args.no_host)?;
    let threads = args.thread_counts(|| (1..=cores()).collect())?;
    args.repeats()?;
    let modes: Vec<&str> = if args.mode.is_empty() {
        MODES.to_vec()
    } else {
        let mut m = Vec::new();
        for a in &args.mode {
            m.push(
                *MODES.iter().find(|x| **x == a).ok_or_else(|| format!("pin has no mode `{a}` (alone, interfered)"))?,
            );
        }
        m
    };
    crate::table::set_wide(args.wide);
    let mut machine = Machine::detect();
    print!("{}", machine.header("bench pin"));
    println!("{} MiB pinned (FOLL_WRITE | FOLL_LONGTERM), {} repeats\n", size >> 20, args.repeat);
    let mut samples = Vec::new();
    let mut failures = 0;
    if !policies.is_empty() {
        let phys = PhysMem::new(PhysConfig::new(arena_bytes(size))).map_err(|e| {
            format!("cannot make a {} MiB softmm arena: {e}: use a smaller --size", arena_bytes(size) >> 20)
        })?;
        for &mode in &modes {
            for &t in &threads {
                for r in 0..args.repeat {
                    for &p in &policies {
                        let interfered = mode == "interfered";
                        let tasks = t + usize::from(interfered);
                        let (got, cpu) = crate::machine::measured(tasks, || soft(&phys, p, t, size, interfered));
                        match got {
                            Ok(m) => {
                                let s = Sample { cpu, ..sample(mode, p.name(), t, r, &m) };
                                eprintln!(
                                    "pin {mode} {} threads={t}: {} pages/s{}",
                                    p.name(),
                                    crate::stats::si(s.ops_per_sec),
                                    report::cpu_note(cpu)
                                );
                                samples.push(s);
                            }
                            Err(e) => {
                                failures += 1;
                                eprintln!("softmm: pin {mode} {} threads={t}: {e}", p.name());
                            }
                        }
                    }
                }
            }
        }
    }
    if with_host {
        // Alone only: the host's own mmap_lock traffic is not this row's subject.
        'host: for &t in &threads {
            for r in 0..args.repeat {
                let (got, cpu) = crate::machine::measured(t, || host(t, size));
                match got {
                    Ok(m) => samples.push(Sample { cpu, ..sample("alone", "host", t, r, &m) }),
                    Err(e) => {
                        println!("host row skipped: the host cannot pin {} MiB through io_uring: {e}", size >> 20);
                        break 'host;
                    }
                }
            }
        }
    }
    print!("{}", table(&samples));
    print!("{}", report::cpu_warnings(&samples));
    machine.finish();
    print!("{}", machine.footer());
    report::save_json(args.json.as_deref(), &super::results(machine, samples))?;
    Ok(if failures > 0 { 1 } else { 0 })
}

/// The median pages/s of `mode`/`policy` at `threads`.
fn median(samples: &[Sample<PinCounters>], mode: &str, policy: &str, threads: usize) -> Option<f64> {
    crate::report::median(samples, "pin", mode, policy, threads)
}

/// The pin table, a heading per mode: seconds, pages/s (median and
/// min-max), the CPUs free, pages per CPU second, speedup over one thread
/// of the same policy and mode, and `mmap_lock` acquisitions per 512 pages.
pub fn table(samples: &[Sample<PinCounters>]) -> String {
    let mut t = crate::table::Table::new();
    t.column("policy", true, 0, None)
        .column("thr", false, 0, Some("pinning threads"))
        .column("seconds", false, 0, Some("the pin's duration at the median rate"))
        .column("pages/s", false, 0, Some("pages pinned per second, median of the repeats"))
        .column("min-max", false, 0, Some("the lowest and highest of the repeats"))
        .column("cpus", false, 0, Some(report::CPUS_GLOSS))
        .column("pages/cpu-s", false, 1, Some("pages per CPU second of the whole process (the mapper's included)"))
        .column("speedup", false, 0, Some("over 1 thread of the same policy and mode"))
        .column("lock/512", false, 0, Some("mmap_lock acquisitions per 512 pages (VFIO's batch)"));
    t.legend(
        "One op = one page pinned (FOLL_WRITE | FOLL_LONGTERM, faulted in by the pin); interfered: beside \
         a thread looping mmap/munmap of 16 pages; host: io_uring's IORING_REGISTER_BUFFERS, one ring per \
         thread (alone only).",
    );
    let mut last = String::new();
    let mut policies: Vec<&str> = Vec::new();
    for row in report::rows(samples) {
        let s = row.samples[0];
        if s.mode != last {
            t.heading(&format!("pin {}", s.mode));
            last = s.mode.clone();
        }
        if !policies.contains(&s.policy.as_str()) {
            policies.push(&s.policy);
        }
        let rate = row.median();
        let one = median(samples, &s.mode, &s.policy, 1);
        let speedup = one.filter(|o| *o > 0.0).map_or("-".into(), |o| format!("{:.2}x", rate / o));
        let pages: u64 = row.samples.iter().map(|x| x.counters.pages.unwrap_or(x.ops)).sum();
        let locks: Option<u64> = row.samples.iter().map(|x| x.counters.mmap_lock_acquisitions).sum();
        let per512 = locks.map_or("-".into(), |l| format!("{:.2}", l as f64 * 512.0 / pages.max(1) as f64));
        let secs = s.ops as f64 / rate.max(f64::MIN_POSITIVE);
        let cpu: f64 = row.samples.iter().map(|x| x.cpu_seconds).sum();
        let ops: u64 = row.samples.iter().map(|x| x.ops).sum();
        let per_cpu = if cpu > 0.0 { crate::stats::si(ops as f64 / cpu) } else { "-".into() };
        t.row(vec![
            s.policy.clone(),
            s.threads.to_string(),
            format!("{secs:.3}"),
            crate::stats::si(rate),
            row.min_max(),
            report::cpus_cell(&row.samples),
            per_cpu,
            speedup,
            per512,
        ]);
    }
    let mut out = t.render();
    out.push_str("Policies:\n");
    out.push_str(&crate::seeds::legend("pin", &policies));
    out
}

/// Seed 004's short run for the headline summary: `size` bytes pinned by
/// `threads` workers beside a thread looping mmap/munmap, under `per-page`
/// and the default policy in turns, `repeats` times; the samples, with
/// their CPU shares.
pub fn short_run(size: u64, threads: usize, repeats: usize) -> Result<Vec<Sample<PinCounters>>, String> {
    let phys = PhysMem::new(PhysConfig::new(arena_bytes(size))).map_err(|e| format!("arena: {e}"))?;
    let mut out = Vec::new();
    for r in 0..repeats {
        for policy in [PinPolicy::PerPage, PinPolicy::default()] {
            let (m, cpu) = crate::machine::measured(threads + 1, || soft(&phys, policy, threads, size, true));
            match m {
                Ok(m) => out.push(Sample { cpu, ..sample("interfered", policy.name(), threads, r, &m) }),
                Err(e) => eprintln!("softmm: seed 004 {}: {e}", policy.name()),
            }
        }
    }
    Ok(out)
}

/// Seed 004's experiment: `pin` over the pin policies.
pub struct Pin;

impl Experiment for Pin {
    fn names(&self) -> &'static [&'static str] {
        &["pin"]
    }

    fn alone(&self) -> bool {
        true
    }

    fn bench(&self, args: &BenchArgs) -> Result<i32, String> {
        bench(args)
    }

    fn seed_row(&self, h: &mut Headline<'_>) -> Option<SeedRow> {
        seed_004(h.repeats)
    }
}

/// Seed 004 from a short run of its own experiment (`softmm bench pin`):
/// `mmap_lock` acquisitions per 512 pages pinned (`FOLL_WRITE |
/// FOLL_LONGTERM`, 256 MiB faulted in by the pin) by [`beside_one`] workers
/// beside a thread looping mmap/munmap, `repeats` times in turns;
/// `per-page` (before the seed) against the default pin policy. `None` if
/// the arena cannot be made.
pub fn seed_004(repeats: usize) -> Option<SeedRow> {
    let workers = beside_one();
    let samples = short_run(256 << 20, workers, repeats).ok()?;
    let per512 =
        |s: &Sample<PinCounters>| Some(s.counters.mmap_lock_acquisitions? as f64 * 512.0 / s.counters.pages? as f64);
    Some(SeedRow {
        seed: "004",
        metric: format!(
            "mmap_lock acquisitions per 512 pages pinned by {workers} worker{} beside a thread looping \
             mmap/munmap (256 MiB), lower is better",
            if workers == 1 { "" } else { "s" }
        ),
        lower_is_better: true,
        old: figure(&samples, "per-page", per512),
        new: figure(&samples, softmm::PinPolicy::default().name(), per512),
        host: None,
        notes: vec![format!(
            "its pages/s gain comes from many CPUs pinning at once, more than {} can show: see the 16-CPU \
             results, {SIXTEEN_CPUS}",
            cpus_phrase()
        )],
    })
}
