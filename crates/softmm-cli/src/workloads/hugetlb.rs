//! `hugetlb-fault`, `hugetlb-fork`, `hugetlb-fork-fault`: seed 000's
//! experiment (Mike Kravetz, "hugetlb: Change huge pmd sharing
//! synchronization again", 2022). Instances are separate processes sharing
//! one hugetlbfs file of `--size` bytes (default 1 GiB: one whole PUD
//! window), each mapping all of it `MAP_SHARED` at a 1 GiB-aligned address,
//! so that their PMD tables can be shared. The two programs of the seed:
//!
//! * fault (`faults`): map the area, write one byte of every 2 MiB page,
//!   unmap, loop; one operation is one page written;
//! * fork (`forks`): map the area, write a few pages ([`FORK_TOUCH`]), fork,
//!   the child writes one page and exits and is reaped, unmap, loop; one
//!   operation is one fork.
//!
//! `hugetlb-fault` runs N fault instances, `hugetlb-fork` N fork instances,
//! `hugetlb-fork-fault` N of each at once (the seed's "combine forking and
//! faulting"), for each N of `--threads` (default 1..=nproc). The file's
//! pages are allocated once before the sweep (`fallocate`), so every fault
//! finds its page in the page cache, as in the seed's loop after its first
//! pass. Each sample's `ops_per_sec` is the instances' summed rate (each
//! instance's operations over its own time); the table also shows it per
//! instance, which is what the seed's tables show.
//!
//! The host row runs on real 2 MiB pages: the sweep reserves `--size` worth
//! through [`softmm_hostsys::HugePages`] (root, at most 2.5 GiB), mounts
//! hugetlbfs, and gives both back at the end; where the host refuses, it
//! prints why and skips the row. Host counters: minor faults (`getrusage`
//! of each instance and its reaped children; per operation in the table)
//! and the `/proc/vmstat` hugetlb counters `htlb_buddy_alloc_success` and
//! `htlb_buddy_alloc_fail` (system-wide, so another tenant's hugetlb
//! activity would show too). PMD shares and unshares cannot be counted on
//! the host; sharing shows there as minor faults per page written below
//! one: an instance whose first write in a window links a PMD table that
//! another instance has filled sees the other 511 pages without faulting.
//!
//! The softmm rows ([`soft`]) run the same programs on softmm, one row per
//! [`HugetlbPolicy`], after the host row (the two areas are never both in
//! memory), with softmm's own counters: faults, `mmap_lock`
//! acquisitions, TLB flush requests, PMD shares and unshares.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use softmm_hostsys::{HugePages, HUGE_PAGE_SIZE, MAX_PAGES, PUD_SIZE};

use softmm::HugetlbPolicy;

use crate::args::BenchArgs;
use crate::args::Limit;
use crate::experiment::{Experiment, Headline};
use crate::machine::{cores, Machine};
use crate::report::{self, Sample};
use crate::summary::{cpus_phrase, figure, SeedRow, SIXTEEN_CPUS};

crate::counters::counters! {
    /// The hugetlb workloads' counters.
    pub struct HugetlbCounters {
        /// Page faults (softmm: handled by its CPUs; host: minor faults of the tasks).
        sum faults,
        /// `mmap_lock` acquisitions: by faults, plus the address spaces' own.
        sum mmap_lock_acquisitions,
        /// TLB flush requests sent to other CPUs.
        sum flush_requests,
        /// hugetlb: PMD tables linked from another address space (`huge_pmd_share`).
        sum pmd_shares,
        /// hugetlb: shared PMD tables detached from an address space (`huge_pmd_unshare`).
        sum pmd_unshares,
        /// hugetlb: the files' `i_mmap` lock taken for read (`HugetlbLockStats`).
        sum i_mmap_read,
        /// hugetlb: the files' `i_mmap` lock taken for write.
        sum i_mmap_write,
        /// hugetlb: the hugetlb VMA lock taken for read.
        sum vma_lock_read,
        /// hugetlb: the hugetlb VMA lock taken for write.
        sum vma_lock_write,
        /// hugetlb: fault mutexes taken.
        sum fault_mutex,
        /// hugetlb: lock-free faults that found their PMD table unshared and retried.
        sum validation_retries,
        /// hugetlb host rows: `/proc/vmstat` `htlb_buddy_alloc_success` during the sample.
        sum htlb_buddy_alloc_success,
        /// hugetlb host rows: `/proc/vmstat` `htlb_buddy_alloc_fail` during the sample.
        sum htlb_buddy_alloc_fail,
        /// hugetlb: CPU time of the program's instance threads over the sample
        /// (`CLOCK_THREAD_CPUTIME_ID`), in ns: its cost per op, which the
        /// other program's share of the CPUs does not inflate.
        sum cpu_ns,
        /// hugetlb: time the program's instance threads waited for hugetlb
        /// locks (`HugetlbLockStats::thread_wait_ns`), in ns.
        sum lock_wait_ns,
        /// hugetlb: waits for the files' `i_mmap` locks, whole arena, in ns.
        sum i_mmap_wait_ns,
        /// hugetlb: waits for hugetlb VMA locks, whole arena, in ns.
        sum vma_lock_wait_ns,
        /// hugetlb: waits for fault mutexes, whole arena, in ns.
        sum fault_mutex_wait_ns,
    }
}

/// The workload names, each run by this module's own sweep.
pub const WORKLOADS: &[&str] = &["hugetlb-fault", "hugetlb-fork", "hugetlb-fork-fault"];

/// The default area: one whole 1 GiB PUD window (the seed used 250 GB on a
/// 320 GB machine; this one is shared by several users).
pub const DEFAULT_SIZE: u64 = PUD_SIZE;

/// Pages the fork program writes before each fork ("a few pages").
pub const FORK_TOUCH: u64 = 4;

/// The most instances of one program in a sample.
const MAX_INSTANCES: usize = 128;

pub mod soft;

/// The seed's two programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// Map, write every page, unmap.
    Fault,
    /// Map, write a few pages, fork, reap, unmap.
    Fork,
}

impl Program {
    /// The sample's mode: `faults` or `forks`.
    pub fn mode(self) -> &'static str {
        match self {
            Program::Fault => "faults",
            Program::Fork => "forks",
        }
    }
}

/// The programs a workload runs together.
fn programs(workload: &str) -> &'static [Program] {
    match workload {
        "hugetlb-fault" => &[Program::Fault],
        "hugetlb-fork" => &[Program::Fork],
        _ => &[Program::Fork, Program::Fault],
    }
}

/// One instance's report, written by the instance process into the shared
/// board before it exits.
#[repr(C)]
struct Slot {
    ops: AtomicU64,
    nanos: AtomicU64,
    minflt: AtomicU64,
    /// 0 while running or done; otherwise the step that failed (1-based)
    /// in the low byte and its errno above.
    error: AtomicU64,
}

/// Shared between the sweep and its instance processes (a `MAP_SHARED`
/// anonymous mapping, so its atomics are the same memory in all of them).
#[repr(C)]
struct Board {
    /// Instances set up and waiting.
    ready: AtomicU32,
    /// Set by the sweep: start.
    go: AtomicU32,
    /// Set by the sweep: finish the current iteration and report.
    stop: AtomicU32,
    slots: [Slot; 2 * MAX_INSTANCES],
}

/// The steps an instance can fail in, for the error message.
const STEPS: &[&str] = &["reserving address space", "mmap of the area", "fork", "waitpid", "munmap of the area"];

/// The board, mapped shared; unmapped on drop.
struct SharedBoard(*mut Board);

impl SharedBoard {
    fn new() -> Result<Self, String> {
        let len = std::mem::size_of::<Board>();
        // SAFETY: a fresh shared anonymous mapping at an address the kernel
        // picks; zero-filled, which is a valid `Board` (atomics of zero).
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap of the shared board: {}", std::io::Error::last_os_error()));
        }
        Ok(SharedBoard(p.cast()))
    }

    fn get(&self) -> &Board {
        // SAFETY: the mapping lives as long as `self` and holds a `Board`
        // that is only ever accessed through atomics.
        unsafe { &*self.0 }
    }
}

impl Drop for SharedBoard {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no reference outlives `self`.
        unsafe { libc::munmap(self.0.cast(), std::mem::size_of::<Board>()) };
    }
}

/// The host's setup for a sweep: the huge pages, the mount, and the area
/// file with all its pages allocated.
pub struct HostArea {
    /// The area file, open read-write.
    fd: libc::c_int,
    /// Its size.
    size: u64,
    // Dropped after `fd` is closed (see `Drop`): the mount and the pool
    // (`None` only for the unit tests' area on a memfd).
    _pages: Option<HugePages>,
}

impl HostArea {
    /// Reserves `size / 2 MiB` huge pages, mounts hugetlbfs, and makes the
    /// area file with every page allocated; the error says why not.
    pub fn new(size: u64) -> Result<HostArea, String> {
        let pages = (size / HUGE_PAGE_SIZE) as usize;
        let hp = HugePages::reserve_with_mount(pages).map_err(|e| e.to_string())?;
        let path = hp.mount_dir().expect("reserve_with_mount mounts").join("area");
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: `c` is NUL-terminated and lives across the call.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(format!("creating {}: {}", path.display(), std::io::Error::last_os_error()));
        }
        let area = HostArea { fd, size, _pages: Some(hp) };
        // SAFETY: `fallocate` on our own descriptor.
        if unsafe { libc::fallocate(fd, 0, 0, size as libc::off_t) } != 0 {
            return Err(format!("fallocate of {} MiB: {}", size >> 20, std::io::Error::last_os_error()));
        }
        Ok(area)
    }
}

#[cfg(test)]
impl HostArea {
    /// An area on a memfd of 4 KiB pages instead of hugetlbfs: the
    /// instances' machinery (fork, board, counts, errors) without root.
    fn on_memfd(size: u64) -> HostArea {
        // SAFETY: the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"hugetlb-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd, size as libc::off_t) }, 0);
        HostArea { fd, size, _pages: None }
    }
}

impl Drop for HostArea {
    fn drop(&mut self) {
        // SAFETY: our descriptor; closing it lets the unmount free the pages.
        unsafe { libc::close(self.fd) };
    }
}

/// What one program's instances measured in one sample.
#[derive(Debug, Clone)]
pub struct ProgramRun {
    /// The program.
    pub program: Program,
    /// Instances.
    pub instances: usize,
    /// Operations of all instances.
    pub ops: u64,
    /// The longest instance's time.
    pub seconds: f64,
    /// The instances' summed rate (each one's operations over its own time).
    pub ops_per_sec: f64,
    /// Minor faults of the instances and their reaped children.
    pub minflt: u64,
}

/// `/proc/vmstat`'s hugetlb counters that count events.
fn vmstat_hugetlb() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("htlb_buddy_alloc_success"), get("htlb_buddy_alloc_fail"))
}

fn minflt(who: libc::c_int) -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(who, &mut ru) };
    ru.ru_minflt as u64
}

/// A forker's stay after its child exits, before it unmaps (`--fork-hold`):
/// spins, as a longer fork would keep the CPU, so that softmm's forkers
/// and the host's can run at one period. Async-signal-safe (the clock is
/// the vDSO's), for the host's instances.
pub fn hold(d: Duration) {
    if d.is_zero() {
        return;
    }
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Writes one byte of each of `pages` huge pages from `base`.
///
/// # Safety
///
/// `base` must map `pages` huge pages, writable.
unsafe fn write_pages(base: *mut u8, pages: u64) {
    for i in 0..pages {
        // SAFETY: inside the mapping, by the caller's contract.
        unsafe { ptr::write_volatile(base.add((i * HUGE_PAGE_SIZE) as usize), 1) };
    }
}

/// The body of one instance process: runs `program` on the area until the
/// board says stop (or for `iterations`), reports into `slot`, and returns
/// the exit status. Only async-signal-safe calls: the sweep's process may
/// have other threads when it forks this one.
fn instance(
    program: Program,
    area: &HostArea,
    board: &Board,
    slot: &Slot,
    iterations: Option<u64>,
    fork_hold: Duration,
) -> i32 {
    let fail = |step: u64| {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as u64;
        slot.error.store(step | (errno << 8), Ordering::Release);
        1
    };
    let size = area.size as usize;
    // An address 1 GiB-aligned, kept free for the area: the whole window
    // lies in the VMA and every instance maps the file at the same offset
    // within its PUD, which PMD sharing needs.
    // SAFETY: a fresh inaccessible reservation at an address the kernel
    // picks; the area replaces part of it below.
    let room = unsafe {
        libc::mmap(
            ptr::null_mut(),
            size + PUD_SIZE as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if room == libc::MAP_FAILED {
        return fail(1);
    }
    let addr = (room as u64).next_multiple_of(PUD_SIZE) as *mut libc::c_void;
    board.ready.fetch_add(1, Ordering::AcqRel);
    while board.go.load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_micros(100));
    }
    let (f0, c0, t0) = (minflt(libc::RUSAGE_SELF), minflt(libc::RUSAGE_CHILDREN), Instant::now());
    let mut ops = 0;
    let mut n = 0;
    loop {
        match iterations {
            Some(max) if n >= max => break,
            // At least one pass: an instance the scheduler started late
            // still measures something.
            None if n > 0 && board.stop.load(Ordering::Acquire) != 0 => break,
            _ => {}
        }
        n += 1;
        // SAFETY: `addr..addr+size` lies in the reservation above, which
        // nothing else in this single-threaded process uses, so MAP_FIXED
        // replaces only the reservation (or the hole the last munmap left).
        let p = unsafe {
            libc::mmap(addr, size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_FIXED, area.fd, 0)
        };
        if p == libc::MAP_FAILED {
            return fail(2);
        }
        match program {
            Program::Fault => {
                // SAFETY: `p` maps `size` bytes of huge pages, writable.
                unsafe { write_pages(p.cast(), area.size / HUGE_PAGE_SIZE) };
                ops += area.size / HUGE_PAGE_SIZE;
            }
            Program::Fork => {
                // SAFETY: as above; FORK_TOUCH pages at most.
                unsafe { write_pages(p.cast(), FORK_TOUCH.min(area.size / HUGE_PAGE_SIZE)) };
                // SAFETY: the child only calls `_exit`.
                let pid = unsafe { libc::fork() };
                if pid < 0 {
                    return fail(3);
                }
                if pid == 0 {
                    // SAFETY: the child writes one page of the mapping it
                    // inherited (as the softmm child does) and ends,
                    // running nothing else.
                    unsafe {
                        write_pages(p.cast(), 1);
                        libc::_exit(0)
                    };
                }
                let mut status = 0;
                // SAFETY: reaps our own child, writing only `status`.
                if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
                    return fail(4);
                }
                hold(fork_hold);
                ops += 1;
            }
        }
        // SAFETY: the mapping made above, used by nothing after this.
        if unsafe { libc::munmap(p, size) } != 0 {
            return fail(5);
        }
    }
    let nanos = t0.elapsed().as_nanos() as u64;
    let faults = (minflt(libc::RUSAGE_SELF) - f0) + (minflt(libc::RUSAGE_CHILDREN) - c0);
    slot.ops.store(ops, Ordering::Relaxed);
    slot.nanos.store(nanos, Ordering::Relaxed);
    slot.minflt.store(faults, Ordering::Relaxed);
    0
}

/// Runs `instances` processes of each of `programs` at once on the host for
/// `limit`, and returns each program's totals and the vmstat deltas
/// `(htlb_buddy_alloc_success, htlb_buddy_alloc_fail)`.
pub fn host(
    area: &HostArea,
    programs: &[Program],
    instances: usize,
    limit: Limit,
    fork_hold: Duration,
) -> Result<(Vec<ProgramRun>, (u64, u64)), String> {
    if instances == 0 || instances > MAX_INSTANCES {
        return Err(format!("instances must be 1..={MAX_INSTANCES}"));
    }
    let board = SharedBoard::new()?;
    let b = board.get();
    let iterations = match limit {
        Limit::Iterations(n) => Some(n),
        Limit::Duration(_) => None,
    };
    // SAFETY: `getpid` cannot fail.
    let parent = unsafe { libc::getpid() };
    let mut pids = Vec::new();
    let mut spawn_err = None;
    'spawn: for (pi, &program) in programs.iter().enumerate() {
        for i in 0..instances {
            let slot = &b.slots[pi * MAX_INSTANCES + i];
            // SAFETY: the child runs `instance` (async-signal-safe calls
            // only) and leaves with `_exit`, running no destructor of this
            // process's state.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                spawn_err = Some(format!("fork of an instance: {}", std::io::Error::last_os_error()));
                break 'spawn;
            }
            if pid == 0 {
                // An instance must not outlive the sweep (a panic or a kill
                // there would leave it looping on the area): it dies with
                // its parent, also if the parent died before this line.
                // SAFETY: `prctl` and `getppid` take no pointers.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                }
                let code = instance(program, area, b, slot, iterations, fork_hold);
                // SAFETY: ends the instance without unwinding into the sweep.
                unsafe { libc::_exit(code) };
            }
            pids.push(pid);
        }
    }
    let want = (programs.len() * instances) as u32;
    let deadline = Instant::now() + Duration::from_secs(30);
    while spawn_err.is_none() && b.ready.load(Ordering::Acquire) < want {
        if b.slots.iter().any(|s| s.error.load(Ordering::Acquire) != 0) {
            break; // an instance failed before it was ready: reported below
        }
        if Instant::now() > deadline {
            spawn_err = Some("the instances did not start within 30 s".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let vm0 = vmstat_hugetlb();
    b.go.store(1, Ordering::Release);
    if let (None, Limit::Duration(d)) = (&spawn_err, limit) {
        std::thread::sleep(d);
    }
    b.stop.store(1, Ordering::Release);
    let mut exit_err = None;
    for pid in pids {
        let mut status = 0;
        // SAFETY: reaps our own child, writing only `status`.
        let w = unsafe { libc::waitpid(pid, &mut status, 0) };
        if w != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            exit_err.get_or_insert(format!("an instance failed (status {status:#x})"));
        }
    }
    let vm1 = vmstat_hugetlb();
    if let Some(e) = spawn_err {
        return Err(e);
    }
    let mut out = Vec::new();
    for (pi, &program) in programs.iter().enumerate() {
        let slots = &b.slots[pi * MAX_INSTANCES..pi * MAX_INSTANCES + instances];
        if let Some(e) = slots.iter().map(|s| s.error.load(Ordering::Acquire)).find(|&e| e != 0) {
            let step = STEPS.get((e & 0xff) as usize - 1).copied().unwrap_or("?");
            return Err(format!(
                "a {} instance failed at {step}: {}",
                program.mode(),
                std::io::Error::from_raw_os_error((e >> 8) as i32)
            ));
        }
        let ops: u64 = slots.iter().map(|s| s.ops.load(Ordering::Relaxed)).sum();
        let secs = |s: &Slot| s.nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let seconds = slots.iter().map(secs).fold(0.0, f64::max);
        let ops_per_sec = slots
            .iter()
            .map(|s| if secs(s) > 0.0 { s.ops.load(Ordering::Relaxed) as f64 / secs(s) } else { 0.0 })
            .sum();
        let minflt = slots.iter().map(|s| s.minflt.load(Ordering::Relaxed)).sum();
        out.push(ProgramRun { program, instances, ops, seconds, ops_per_sec, minflt });
    }
    if let Some(e) = exit_err {
        return Err(e);
    }
    Ok((out, (vm1.0.saturating_sub(vm0.0), vm1.1.saturating_sub(vm0.1))))
}

/// The sample of one program of a run: `policy` names the row (`host`
/// or a [`HugetlbPolicy`]).
fn sample(
    workload: &str,
    policy: &str,
    run: &ProgramRun,
    counters: HugetlbCounters,
    repeat: usize,
) -> Sample<HugetlbCounters> {
    Sample {
        workload: workload.into(),
        mode: run.program.mode().into(),
        policy: policy.into(),
        threads: run.instances,
        repeat,
        ops: run.ops,
        seconds: run.seconds,
        ops_per_sec: run.ops_per_sec,
        counters,
        cpu_seconds: 0.0,
        cpu: None,
    }
}

/// The host counters of one program of a host run.
fn host_counters(run: &ProgramRun, vmstat: (u64, u64)) -> HugetlbCounters {
    HugetlbCounters {
        faults: Some(run.minflt),
        htlb_buddy_alloc_success: Some(vmstat.0),
        htlb_buddy_alloc_fail: Some(vmstat.1),
        ..HugetlbCounters::default()
    }
}

/// The rows `--policy` asks for: softmm's hugetlb policies (in
/// [`HugetlbPolicy::ALL`]'s order) and whether the host row runs. Names:
/// `all` (every policy and the host), `default` (the library's default
/// policy), `host`, and the policies' names; an unknown name is an error.
/// `--no-host` leaves the host out.
fn parse_policies(policy: &str, no_host: bool) -> Result<(Vec<HugetlbPolicy>, bool), String> {
    let (mut soft, mut host) = (Vec::new(), false);
    for name in policy.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match name {
            "all" => {
                soft.extend_from_slice(HugetlbPolicy::ALL);
                host = true;
            }
            "default" => soft.push(HugetlbPolicy::default()),
            "host" => host = true,
            _ => soft.push(HugetlbPolicy::from_name(name).ok_or_else(|| {
                let known: Vec<&str> = HugetlbPolicy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown hugetlb policy `{name}` (known: all, default, host, {})", known.join(", "))
            })?),
        }
    }
    let soft = HugetlbPolicy::ALL.iter().copied().filter(|p| soft.contains(p)).collect();
    Ok((soft, host && !no_host))
}

/// Checks `--size`: a multiple of 2 MiB, within what may be reserved.
fn check_size(size: u64) -> Result<(), String> {
    if size == 0 || size % HUGE_PAGE_SIZE != 0 {
        return Err("--size must be a multiple of 2M for hugetlb".into());
    }
    if size / HUGE_PAGE_SIZE > MAX_PAGES as u64 {
        return Err(format!(
            "--size of {} MiB is more than the {} MiB of huge pages the lab reserves",
            size >> 20,
            MAX_PAGES * 2
        ));
    }
    Ok(())
}

/// What [`soft::SoftArea::sharing`] means, for the sweep's output.
fn sharing_line(area: &soft::SoftArea) -> &'static str {
    if area.sharing {
        "softmm PMD sharing: on (probe: a second address space's first fault in the window linked the first \
         one's PMD table)"
    } else {
        "softmm PMD sharing: off (probe: a second address space's first fault in the window linked no PMD table: \
         this softmm build does not share PMD tables of hugetlbfs files, and has no switch for it), so the softmm rows \
         show every instance with PMD tables of its own"
    }
}

/// What one sample of the sweep gave: each program's run and counters.
type SampleRuns = Result<Vec<(ProgramRun, HugetlbCounters)>, String>;

/// `softmm bench hugetlb-fault|hugetlb-fork|hugetlb-fork-fault`: the sweep,
/// its table, `--json`.
pub fn bench(args: &BenchArgs) -> Result<i32, String> {
    let mut workloads: Vec<&'static str> = Vec::new();
    for w in &args.workloads {
        let w = WORKLOADS
            .iter()
            .copied()
            .find(|x| x == w)
            .ok_or_else(|| format!("`{w}` cannot run with the hugetlb workloads: give only hugetlb-* workloads"))?;
        if !workloads.contains(&w) {
            workloads.push(w);
        }
    }
    let size = args.size.unwrap_or(DEFAULT_SIZE);
    check_size(size)?;
    let (policies, with_host) = parse_policies(&args.policy, args.no_host)?;
    let threads = args.thread_counts(|| (1..=cores()).collect())?;
    if let Some(&t) = threads.iter().find(|&&t| t > MAX_INSTANCES) {
        return Err(format!("{t} instances: at most {MAX_INSTANCES}"));
    }
    args.repeats()?;
    if !args.mode.is_empty() {
        return Err("the hugetlb workloads have no --mode (each runs its programs)".into());
    }
    let limit = match args.iterations {
        Some(0) => return Err("--iterations must be at least 1".into()),
        Some(n) => Limit::Iterations(n),
        None if args.duration > 0.0 && args.duration.is_finite() => {
            Limit::Duration(Duration::from_secs_f64(args.duration))
        }
        None => return Err("--duration must be positive".into()),
    };
    let fork_hold = Duration::from_micros(args.fork_hold);
    if !fork_hold.is_zero() && !workloads.iter().any(|w| programs(w).contains(&Program::Fork)) {
        return Err("--fork-hold applies to hugetlb-fork and hugetlb-fork-fault only".into());
    }
    crate::table::set_wide(args.wide);
    let mut machine = Machine::detect();
    let windows = size / PUD_SIZE;
    print!("{}", machine.header(&format!("bench {}", workloads.join(","))));
    print!(
        "{}",
        crate::table::wrap(
            &format!(
                "One shared hugetlbfs file of {} MiB ({} huge pages of 2 MiB, {} whole 1 GiB PUD window{} that \
                 can share PMD tables), mapped at a 1 GiB-aligned address by every instance; {} repeats.",
                size >> 20,
                size / HUGE_PAGE_SIZE,
                windows,
                if windows == 1 { "" } else { "s" },
                args.repeat
            ),
            "  "
        )
    );
    if !fork_hold.is_zero() {
        println!("  Each forker holds its mapping {} us after its child exits (--fork-hold).", args.fork_hold);
    }
    let mut samples = Vec::new();
    let mut failures = 0;
    let mut record =
        |w: &str, policy: &str, t: usize, r: usize, (got, cpu): (SampleRuns, Option<crate::machine::CpuShare>)| {
            match got {
                Ok(runs) => {
                    for (run, counters) in runs {
                        let s = Sample { cpu, ..sample(w, policy, &run, counters, r) };
                        eprintln!(
                            "{w} {} {policy} instances={t}: {} ops/s{}",
                            s.mode,
                            crate::stats::si(s.ops_per_sec),
                            report::cpu_note(cpu)
                        );
                        samples.push(s);
                    }
                }
                Err(e) => {
                    failures += 1;
                    eprintln!("softmm: {w} {policy} instances={t}: {e}");
                }
            }
        };
    // The host row first: its instances are forks of this process, whose
    // fork and COW faults grow with what the softmm rows leave mapped here
    // (allocator arenas, thread stacks): after them the host fork loop ran
    // at a third of its rate, with 35 minor faults per fork instead of 15.
    if with_host {
        match HostArea::new(size) {
            Err(e) => println!("host row skipped: the host cannot give {} MiB of huge pages: {e}", size >> 20),
            Ok(area) => {
                for &w in &workloads {
                    for &t in &threads {
                        for r in 0..args.repeat {
                            let got = crate::machine::measured(t * programs(w).len(), || {
                                host(&area, programs(w), t, limit, fork_hold).map(|(runs, vm)| {
                                    runs.into_iter()
                                        .map(|run| {
                                            let c = host_counters(&run, vm);
                                            (run, c)
                                        })
                                        .collect()
                                })
                            });
                            record(w, "host", t, r, got);
                        }
                    }
                }
            }
        }
    }
    if !policies.is_empty() {
        let area = soft::SoftArea::new(size)?;
        print!("{}", crate::table::wrap(sharing_line(&area), "  "));
        for &w in &workloads {
            for &p in &policies {
                for &t in &threads {
                    for r in 0..args.repeat {
                        let got = crate::machine::measured(t * programs(w).len(), || {
                            soft::run(&area, p, programs(w), t, limit, fork_hold)
                                .map(|runs| runs.into_iter().map(|s| (s.run, s.counters)).collect())
                        });
                        record(w, p.name(), t, r, got);
                    }
                }
            }
        }
    }
    println!();
    print!("{}", table(&samples, size));
    print!("{}", report::cpu_warnings(&samples));
    machine.finish();
    print!("{}", machine.footer());
    report::save_json(args.json.as_deref(), &super::results(machine, samples))?;
    Ok(if failures > 0 { 1 } else { 0 })
}

/// A counter of the row's samples per operation, `-` where they have none.
fn per_op(
    row: &report::Row<'_, HugetlbCounters>,
    ops: u64,
    counter: impl Fn(&HugetlbCounters) -> Option<u64>,
) -> String {
    let total: Option<u64> = row.samples.iter().map(|x| counter(&x.counters)).sum();
    total.map_or("-".into(), |c| format!("{:.3}", c as f64 / ops.max(1) as f64))
}

/// A time counter of the row's samples in microseconds per operation, `-`
/// where they have none.
fn micros_per_op(
    row: &report::Row<'_, HugetlbCounters>,
    ops: u64,
    counter: impl Fn(&HugetlbCounters) -> Option<u64>,
) -> String {
    let total: Option<u64> = row.samples.iter().map(|x| counter(&x.counters)).sum();
    total.map_or("-".into(), |ns| format!("{:.2}", ns as f64 / 1e3 / ops.max(1) as f64))
}

/// Operations per second of the instance threads' CPU time (over every
/// repeat), `-` where the samples have no CPU time: what the program's
/// rate would be with a CPU of its own per instance and no waiting.
fn per_cpu_second(row: &report::Row<'_, HugetlbCounters>, ops: u64) -> String {
    let cpu: Option<u64> = row.samples.iter().map(|x| x.counters.cpu_ns).sum();
    match cpu {
        Some(ns) if ns > 0 => crate::stats::si(ops as f64 * 1e9 / ns as f64),
        _ => "-".into(),
    }
}

/// Read and write acquisitions of one lock per operation, `r+w`.
fn rw_per_op(
    row: &report::Row<'_, HugetlbCounters>,
    ops: u64,
    read: impl Fn(&HugetlbCounters) -> Option<u64>,
    write: impl Fn(&HugetlbCounters) -> Option<u64>,
) -> String {
    match (per_op(row, ops, read), per_op(row, ops, write)) {
        (r, w) if r == "-" || w == "-" => "-".into(),
        (r, w) => format!("{r}+{w}"),
    }
}

/// The hugetlb table: a heading per workload and mode, a row per policy
/// and instance count with the summed and per-instance rate (medians over
/// repeats) and the counters per operation.
pub fn table(samples: &[Sample<HugetlbCounters>], size: u64) -> String {
    let mut t = crate::table::Table::new();
    t.column("policy", true, 0, None)
        .column(
            "inst",
            false,
            0,
            Some("instances per program (processes; on softmm, address spaces with a thread each)"),
        )
        .column("ops/s", false, 0, Some("summed over the instances, median of the repeats"))
        .column("min-max", false, 0, Some("the lowest and highest of the repeats"))
        .column("cpus", false, 0, Some(report::CPUS_GLOSS))
        .column("ops/s/inst", false, 4, Some("ops/s per instance"))
        .column(
            "ops/cpu-s",
            false,
            0,
            Some(
                "softmm: ops per second of the program's instance threads' own CPU time \
                 (CLOCK_THREAD_CPUTIME_ID; children's work runs on the instance's thread)",
            ),
        )
        .column("cpu us/op", false, 5, Some("that CPU time per op"))
        .column(
            "wait us/op",
            false,
            0,
            Some("time those threads waited for hugetlb locks (i_mmap, VMA lock, fault mutex), per op"),
        )
        .column(
            "faults/op",
            false,
            0,
            Some(
                "host: minor faults (children included); softmm: faults of the instances' and children's \
                 CPUs; below 1 where a write found its page mapped through a PMD table shared with another \
                 instance",
            ),
        )
        .column("mmap_lock/op", false, 6, Some("mmap_lock acquisitions (faults and the instances' own calls)"))
        .column("flush/op", false, 7, Some("TLB flush requests to other CPUs"))
        .column("share/op", false, 3, Some("huge_pmd_share calls"))
        .column("unshare/op", false, 3, Some("huge_pmd_unshare calls"))
        .column("i_mmap r+w/op", false, 0, Some("the files' i_mmap lock taken for read + for write"))
        .column("vma lock r+w/op", false, 2, Some("the hugetlb VMA lock taken for read + for write"))
        .column("mutex/op", false, 1, Some("fault mutexes taken"))
        .column("retry/op", false, 8, Some("lock-free faults that found their PMD table unshared and retried"));
    let host_allocs: Vec<u64> = samples.iter().filter_map(|x| x.counters.htlb_buddy_alloc_success).collect();
    let allocs = (!host_allocs.is_empty()).then(|| host_allocs.iter().sum::<u64>());
    t.legend(&format!(
        "{} MiB shared hugetlbfs file. faults: one op = one 2 MiB page written (map, write all, unmap); \
         forks: one op = one fork (map, write {FORK_TOUCH} pages, fork, the child writes 1 page and exits, \
         unmap); fork-fault runs both programs at once. The share, unshare and lock counters are of the \
         whole arena during the sample (in fork-fault both programs' rows show the same totals); wait \
         and CPU time are per program{}.",
        size >> 20,
        allocs.map_or(String::new(), |a| format!(
            "; host /proc/vmstat htlb_buddy_alloc_success during the samples: {a} (pages are preallocated, so 0)"
        )),
    ));
    let mut last = String::new();
    let mut policies: Vec<&str> = Vec::new();
    for row in report::rows(samples) {
        let s = row.samples[0];
        let group = format!("{} {}", s.workload, s.mode);
        if group != last {
            t.heading(&group);
            last = group;
        }
        if !policies.contains(&s.policy.as_str()) {
            policies.push(&s.policy);
        }
        let rate = row.median();
        let ops: u64 = row.samples.iter().map(|x| x.ops).sum();
        t.row(vec![
            s.policy.clone(),
            s.threads.to_string(),
            crate::stats::si(rate),
            row.min_max(),
            report::cpus_cell(&row.samples),
            crate::stats::si(rate / s.threads.max(1) as f64),
            per_cpu_second(&row, ops),
            micros_per_op(&row, ops, |c| c.cpu_ns),
            micros_per_op(&row, ops, |c| c.lock_wait_ns),
            per_op(&row, ops, |c| c.faults),
            per_op(&row, ops, |c| c.mmap_lock_acquisitions),
            per_op(&row, ops, |c| c.flush_requests),
            per_op(&row, ops, |c| c.pmd_shares),
            per_op(&row, ops, |c| c.pmd_unshares),
            rw_per_op(&row, ops, |c| c.i_mmap_read, |c| c.i_mmap_write),
            rw_per_op(&row, ops, |c| c.vma_lock_read, |c| c.vma_lock_write),
            per_op(&row, ops, |c| c.fault_mutex),
            per_op(&row, ops, |c| c.validation_retries),
        ]);
    }
    let mut out = t.render();
    out.push_str("Policies:\n");
    out.push_str(&crate::seeds::legend("hugetlb", &policies));
    out
}

/// Seed 000's short run for the headline summary: one instance of the
/// fault program (`hugetlb-fault`, 1 GiB) for `duration` per sample under
/// each of `policies` in turns, `repeats` times; the samples, with their
/// CPU shares (an empty list, the reason printed, if the area cannot be
/// made).
pub fn short_run(duration: Duration, policies: &[HugetlbPolicy], repeats: usize) -> Vec<Sample<HugetlbCounters>> {
    let limit = Limit::Duration(duration);
    let mut out = Vec::new();
    let area = match soft::SoftArea::new(DEFAULT_SIZE) {
        Ok(area) => area,
        Err(e) => {
            eprintln!("softmm: seed 000: {e}");
            return out;
        }
    };
    for r in 0..repeats {
        for &p in policies {
            let (got, cpu) = crate::machine::measured(1, || {
                soft::run(&area, p, programs("hugetlb-fault"), 1, limit, Duration::ZERO)
            });
            match got {
                Ok(runs) => out.extend(
                    runs.into_iter()
                        .map(|s| Sample { cpu, ..sample("hugetlb-fault", p.name(), &s.run, s.counters, r) }),
                ),
                Err(e) => eprintln!("softmm: seed 000 {}: {e}", p.name()),
            }
        }
    }
    out
}

/// Seed 000's experiment: the hugetlb workloads over the hugetlb policies.
pub struct Hugetlb;

impl Experiment for Hugetlb {
    fn names(&self) -> &'static [&'static str] {
        WORKLOADS
    }

    fn alone(&self) -> bool {
        true
    }

    fn bench(&self, args: &BenchArgs) -> Result<i32, String> {
        bench(args)
    }

    fn seed_row(&self, h: &mut Headline<'_>) -> Option<SeedRow> {
        Some(seed_000(h.limit, h.repeats))
    }
}

/// Seed 000 from a short run of its own experiment (`softmm bench
/// hugetlb-fault`): the files' `i_mmap` lock acquisitions (read and write)
/// per 2 MiB page faulted by one address space writing a shared 1 GiB
/// hugetlbfs file, for `limit` (a duration; 0.5 s for iterations) per
/// sample, `repeats` times in turns; `i-mmap-rwsem` (before the seed,
/// Linux 5.7-6.0) against softmm's default hugetlb policy.
pub fn seed_000(limit: Limit, repeats: usize) -> SeedRow {
    let d = limit.duration_or_default();
    let (old, new) = (HugetlbPolicy::IMmapRwsem, HugetlbPolicy::default());
    let samples = short_run(d, &[old, new], repeats);
    let per_fault = |s: &Sample<HugetlbCounters>| {
        let c = &s.counters;
        Some((c.i_mmap_read? + c.i_mmap_write?) as f64 / s.ops.max(1) as f64)
    };
    SeedRow {
        seed: "000",
        metric: "acquisitions of the file-wide i_mmap lock per 2 MiB page faulted, one address space writing \
                 a shared 1 GiB hugetlbfs file, lower is better"
            .into(),
        lower_is_better: true,
        old: figure(&samples, old.name(), per_fault),
        new: figure(&samples, new.name(), per_fault),
        host: None,
        notes: vec![format!(
            "its faults/s gain comes from many processes faulting the file at once, more than {} can \
             show: see the 16-CPU results, {SIXTEEN_CPUS}",
            cpus_phrase()
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_huge_pages_within_the_reservation_limit() {
        assert!(check_size(DEFAULT_SIZE).is_ok());
        assert!(check_size(2 << 20).is_ok());
        assert!(check_size(MAX_PAGES as u64 * HUGE_PAGE_SIZE).is_ok());
        assert!(check_size(0).is_err());
        assert!(check_size(3 << 20).unwrap_err().contains("multiple of 2M"));
        assert!(check_size((MAX_PAGES as u64 + 1) * HUGE_PAGE_SIZE).unwrap_err().contains("more than"));
    }

    #[test]
    fn policies_are_every_softmm_policy_the_default_or_named_ones_and_the_host() {
        assert_eq!(parse_policies("all", false), Ok((HugetlbPolicy::ALL.to_vec(), true)));
        assert_eq!(parse_policies("all", true), Ok((HugetlbPolicy::ALL.to_vec(), false)));
        assert_eq!(parse_policies("default,host", false), Ok((vec![HugetlbPolicy::default()], true)));
        assert_eq!(parse_policies("host", false), Ok((vec![], true)));
        // In ALL's order, once each.
        assert_eq!(
            parse_policies("lock-free,i-mmap-rwsem,lock-free", false),
            Ok((vec![HugetlbPolicy::IMmapRwsem, HugetlbPolicy::LockFree], false))
        );
        let e = parse_policies("mmap-lock", false).unwrap_err();
        assert!(e.contains("unknown hugetlb policy `mmap-lock`") && e.contains("vma-lock"), "{e}");
    }

    #[test]
    fn the_combined_run_runs_both_programs_and_names_their_modes() {
        assert_eq!(programs("hugetlb-fault"), &[Program::Fault]);
        assert_eq!(programs("hugetlb-fork"), &[Program::Fork]);
        let both: Vec<&str> = programs("hugetlb-fork-fault").iter().map(|p| p.mode()).collect();
        assert_eq!(both, ["forks", "faults"]);
    }

    #[test]
    fn instances_run_their_iterations_and_report_them() {
        let area = HostArea::on_memfd(8 << 20);
        let (runs, _) = host(&area, programs("hugetlb-fork-fault"), 2, Limit::Iterations(3), Duration::ZERO).unwrap();
        let forks = runs.iter().find(|r| r.program == Program::Fork).unwrap();
        let faults = runs.iter().find(|r| r.program == Program::Fault).unwrap();
        assert_eq!((forks.instances, forks.ops), (2, 2 * 3));
        assert_eq!((faults.instances, faults.ops), (2, 2 * 3 * 4), "4 pages of 2 MiB, 3 passes, 2 instances");
        assert!(faults.ops_per_sec > 0.0 && forks.ops_per_sec > 0.0);
        assert!(faults.minflt > 0 && forks.minflt > 0, "{runs:?}");
    }

    #[test]
    fn an_instance_that_fails_is_reported_with_its_step_and_errno() {
        let mut area = HostArea::on_memfd(4 << 20);
        // SAFETY: closes the memfd; the area's drop closes -1, which fails harmlessly.
        unsafe { libc::close(area.fd) };
        area.fd = -1;
        let e = host(&area, programs("hugetlb-fault"), 1, Limit::Duration(Duration::from_millis(10)), Duration::ZERO)
            .unwrap_err();
        assert!(e.contains("failed at mmap of the area") && e.contains("Bad file descriptor"), "{e}");
    }

    #[test]
    fn the_table_shows_rates_per_instance_and_faults_per_op() {
        let run = ProgramRun {
            program: Program::Fault,
            instances: 2,
            ops: 1024,
            seconds: 1.0,
            ops_per_sec: 2000.0,
            minflt: 512,
        };
        let host = sample("hugetlb-fault", "host", &run, host_counters(&run, (0, 0)), 0);
        let counters = HugetlbCounters {
            faults: Some(1024),
            mmap_lock_acquisitions: Some(2048),
            flush_requests: Some(0),
            pmd_shares: Some(256),
            pmd_unshares: Some(128),
            i_mmap_read: Some(1024),
            i_mmap_write: Some(512),
            fault_mutex: Some(2048),
            cpu_ns: Some(500_000_000),
            lock_wait_ns: Some(2_048_000),
            ..HugetlbCounters::default()
        };
        let soft = sample("hugetlb-fault", "vma-lock", &run, counters, 0);
        let t = crate::table::with_wide(true, || table(&[host.clone(), soft.clone()], DEFAULT_SIZE));
        assert_eq!(t.lines().nth(1), Some("hugetlb-fault faults"), "{t}");
        // softmm's policies first, the host last.
        let cells: Vec<&str> = t.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(cells[..4], ["vma-lock", "2", "2.00k", "2.00k-2.00k"], "{t}");
        // 0.5 s of CPU and 2.048 ms of lock wait over 1024 ops: 2.05k ops
        // per CPU-second, 488.28 and 2.00 us per op.
        assert_eq!(cells[5..9], ["1.00k", "2.05k", "488.28", "2.00"], "{t}");
        assert_eq!(cells[9..], ["1.000", "2.000", "0.000", "0.250", "0.125", "1.000+0.500", "-", "2.000", "-"], "{t}");
        let row = t.lines().nth(3).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[..6], ["host", "2", "2.00k", "2.00k-2.00k", "-", "1.00k"], "{t}");
        assert_eq!(cells[6..9], ["-", "-", "-"], "host: no CPU time or lock wait per program: {t}");
        assert_eq!(cells[9..], ["0.500", "-", "-", "-", "-", "-", "-", "-", "-"], "host: minor faults only: {t}");
        // Narrow, the table fits 100 columns and names what it leaves out.
        let narrow = crate::table::with_wide(false, || table(&[host, soft], DEFAULT_SIZE));
        assert!(narrow.lines().all(|l| l.chars().count() <= 100) && narrow.contains("--wide adds"), "{narrow}");
        assert!(t.contains("1024 MiB") && t.contains("htlb_buddy_alloc_success during the samples: 0"), "{t}");
    }
}
