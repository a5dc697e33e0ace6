//! Running a workload's task body on N threads (one or several address
//! spaces) or N forked host processes, with a common start, a stop after the
//! duration or a fixed number of iterations, and per-task results.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use softmm::FaultStats;

use crate::args::Limit;

use super::space::{minor_faults, process_cpu_ns, thread_cpu_ns, HostSpace, Space};

/// What a task sees of the run.
pub struct TaskCtx<'a> {
    /// The task's index.
    pub tid: usize,
    /// Number of tasks.
    pub ntasks: usize,
    stop: &'a AtomicBool,
    iterations: Option<u64>,
}

impl TaskCtx<'_> {
    /// Whether to run another iteration after `done` of them.
    #[inline]
    pub fn more(&self, done: u64) -> bool {
        match self.iterations {
            Some(n) => done < n,
            None => !self.stop.load(Ordering::Relaxed),
        }
    }
}

/// One task's result. Plain data: forked children write it to shared memory.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct TaskOut {
    /// Operations done.
    pub ops: u64,
    /// Seconds of the measured part, where the task times only part of its
    /// loop (`timed`); otherwise the run's wall time is used.
    pub timed_ns: u64,
    /// Whether `timed_ns` is set.
    pub timed: bool,
    /// CPU time of the task.
    pub cpu_ns: u64,
    /// Host minor faults of the task.
    pub minflt: u64,
    /// softmm fault counters of the task's CPU.
    pub fault: FaultStats,
    /// Whether `fault` is set.
    pub has_fault: bool,
    /// Writes to shared cache lines the task's thread made in softmm (its
    /// faults and its calls; `shared-write-stats` builds, 0 otherwise).
    pub shared_writes: u64,
}

/// The results of all tasks of one run.
pub struct RunOut {
    /// Per task.
    pub tasks: Vec<TaskOut>,
    /// Wall seconds from the common start until every task finished.
    pub wall: f64,
}

impl RunOut {
    /// Total operations.
    pub fn ops(&self) -> u64 {
        self.tasks.iter().map(|t| t.ops).sum()
    }

    /// The measured seconds: the mean of the tasks' timed parts where they
    /// time themselves, else the wall time.
    pub fn seconds(&self) -> f64 {
        let timed: Vec<f64> = self.tasks.iter().filter(|t| t.timed).map(|t| t.timed_ns as f64 / 1e9).collect();
        if timed.is_empty() {
            self.wall
        } else {
            timed.iter().sum::<f64>() / timed.len() as f64
        }
    }

    /// Total CPU seconds of the tasks.
    pub fn cpu_seconds(&self) -> f64 {
        self.tasks.iter().map(|t| t.cpu_ns as f64 / 1e9).sum()
    }

    /// Summed softmm fault counters, if the tasks had them.
    pub fn fault(&self) -> Option<FaultStats> {
        let mut any = false;
        let mut f = FaultStats::default();
        for t in self.tasks.iter().filter(|t| t.has_fault) {
            any = true;
            f.add(&t.fault);
        }
        any.then_some(f)
    }

    /// Summed shared-line writes of the tasks' threads.
    pub fn shared_writes(&self) -> u64 {
        self.tasks.iter().map(|t| t.shared_writes).sum()
    }

    /// Summed host minor faults.
    pub fn minflt(&self) -> u64 {
        self.tasks.iter().map(|t| t.minflt).sum()
    }
}

/// A body run beside the tasks until they finish, polling its stop flag.
pub type Background<'a, S> = &'a (dyn Fn(&S, &AtomicBool) -> Result<u64, i32> + Sync);

/// Runs `body` on `n` threads, task `i` in `spaces[i % spaces.len()]` (one
/// space: threads of one process; one per task: separate processes). Each
/// thread makes its own accessor. `background`, if any, runs on one more
/// thread (in `spaces[0]`, with a parked accessor) from the start until every
/// task finished, polling the flag it is given.
pub fn run_threads<S, B>(
    spaces: &[&S],
    n: usize,
    limit: Limit,
    body: B,
    background: Option<Background<S>>,
) -> Result<RunOut, String>
where
    S: Space,
    B: Fn(&S, &mut S::Cpu, &TaskCtx) -> Result<TaskOut, i32> + Sync,
{
    let stop = AtomicBool::new(false);
    let bg_stop = AtomicBool::new(false);
    let barrier = Barrier::new(n + 1 + usize::from(background.is_some()));
    let iterations = match limit {
        Limit::Iterations(k) => Some(k),
        Limit::Duration(_) => None,
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|tid| {
                let space = spaces[tid % spaces.len()];
                let (stop, barrier, body) = (&stop, &barrier, &body);
                scope.spawn(move || -> Result<TaskOut, i32> {
                    let mut cpu = space.cpu();
                    S::park(&mut cpu);
                    barrier.wait();
                    S::resume(&mut cpu);
                    let (cpu0, flt0) = (thread_cpu_ns(), minor_faults(true));
                    let shw0 = softmm::shared_writes_this_thread();
                    let ctx = TaskCtx { tid, ntasks: n, stop, iterations };
                    let r = body(space, &mut cpu, &ctx);
                    S::park(&mut cpu);
                    let mut out = r?;
                    out.shared_writes = softmm::shared_writes_this_thread() - shw0;
                    out.cpu_ns = thread_cpu_ns() - cpu0;
                    out.minflt = minor_faults(true) - flt0;
                    if let Some(f) = S::fault_stats(&cpu) {
                        out.fault = f;
                        out.has_fault = true;
                    }
                    Ok(out)
                })
            })
            .collect();
        let bg = background.map(|f| {
            let (space, bg_stop, barrier) = (spaces[0], &bg_stop, &barrier);
            scope.spawn(move || {
                // Attached before the start, so that the address space counts
                // as multithreaded from the first fault; parked, since it
                // makes no access that would acknowledge a shootdown.
                let mut cpu = space.cpu();
                S::park(&mut cpu);
                barrier.wait();
                f(space, bg_stop)
            })
        });
        barrier.wait();
        let t0 = Instant::now();
        if let Limit::Duration(d) = limit {
            // Sleep in slices so that tasks failing early end the wait.
            while t0.elapsed() < d && !handles.iter().all(|h| h.is_finished()) {
                std::thread::sleep((d - t0.elapsed().min(d)).min(Duration::from_millis(20)));
            }
            stop.store(true, Ordering::Relaxed);
        }
        let mut tasks = Vec::with_capacity(n);
        let mut err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(out)) => tasks.push(out),
                Ok(Err(e)) => err = Some(format!("a task failed: {}", std::io::Error::from_raw_os_error(e))),
                Err(_) => err = Some("a task panicked".to_string()),
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        bg_stop.store(true, Ordering::Relaxed);
        match bg.map(|h| h.join()) {
            None | Some(Ok(Ok(_))) => {}
            Some(Ok(Err(e))) => {
                return Err(format!("the background task failed: {}", std::io::Error::from_raw_os_error(e)))
            }
            Some(Err(_)) => return Err("the background task panicked".to_string()),
        }
        match err {
            Some(e) => Err(e),
            None => Ok(RunOut { tasks, wall }),
        }
    })
}

/// The memory forked children and the parent share.
#[repr(C)]
struct Shared {
    ready: AtomicU64,
    start: AtomicBool,
    stop: AtomicBool,
}

#[repr(C)]
struct Slot {
    out: TaskOut,
    /// 0: not done, 1: ok, 2: failed with `errno`.
    status: AtomicU64,
    errno: AtomicU64,
}

/// Runs `body` in `n` forked processes on the host (will-it-scale's process
/// mode). `body` runs in a child of a multithreaded process: it must not
/// allocate or take locks (the host [`Space`] calls do neither).
pub fn run_processes<B>(n: usize, limit: Limit, body: B) -> Result<RunOut, String>
where
    B: Fn(&HostSpace, &mut (), &TaskCtx) -> Result<TaskOut, i32>,
{
    let bytes = std::mem::size_of::<Shared>() + n * std::mem::size_of::<Slot>();
    // SAFETY: a fresh shared anonymous mapping (zeroed: valid atomics and
    // plain data), unmapped at the end of this function.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!("mmap of shared memory: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `base` is aligned to a page and zeroed, a valid `Shared`.
    let shared = unsafe { &*(base as *const Shared) };
    // SAFETY: the slots follow `Shared` (whose size keeps them aligned).
    let slots = unsafe { (base as *mut u8).add(std::mem::size_of::<Shared>()) as *mut Slot };
    let iterations = match limit {
        Limit::Iterations(k) => Some(k),
        Limit::Duration(_) => None,
    };
    let mut pids = Vec::with_capacity(n);
    let mut result = Ok(());
    for tid in 0..n {
        // SAFETY: the child only runs `body` (allocation- and lock-free) and
        // `_exit`s; the parent continues normally.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: slot `tid` is inside the mapping and written only by this child.
            let slot = unsafe { &mut *slots.add(tid) };
            let (cpu0, flt0) = (process_cpu_ns(), minor_faults(false));
            shared.ready.fetch_add(1, Ordering::AcqRel);
            while !shared.start.load(Ordering::Acquire) {
                std::hint::spin_loop();
                // SAFETY: plain syscall.
                unsafe { libc::sched_yield() };
            }
            let ctx = TaskCtx { tid, ntasks: n, stop: &shared.stop, iterations };
            match body(&HostSpace, &mut (), &ctx) {
                Ok(mut out) => {
                    out.cpu_ns = process_cpu_ns() - cpu0;
                    out.minflt = minor_faults(false) - flt0;
                    slot.out = out;
                    slot.status.store(1, Ordering::Release);
                }
                Err(e) => {
                    slot.errno.store(e as u64, Ordering::Relaxed);
                    slot.status.store(2, Ordering::Release);
                }
            }
            // SAFETY: ends the child without running the parent's atexit
            // handlers or flushing its copies of stdio buffers.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            result = Err(format!("fork: {}", std::io::Error::last_os_error()));
            break;
        }
        pids.push(pid);
    }
    let mut wall = 0.0;
    if result.is_ok() {
        while shared.ready.load(Ordering::Acquire) < n as u64 {
            std::thread::sleep(Duration::from_micros(200));
        }
        let t0 = Instant::now();
        shared.start.store(true, Ordering::Release);
        if let Limit::Duration(d) = limit {
            std::thread::sleep(d);
        }
        shared.stop.store(true, Ordering::Release);
        for &pid in &pids {
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
        wall = t0.elapsed().as_secs_f64();
    } else {
        shared.start.store(true, Ordering::Release);
        shared.stop.store(true, Ordering::Release);
        for &pid in &pids {
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
    let mut tasks = Vec::with_capacity(n);
    for tid in 0..pids.len() {
        // SAFETY: every child has exited; the slot is plain data.
        let slot = unsafe { &*slots.add(tid) };
        match slot.status.load(Ordering::Acquire) {
            1 => tasks.push(slot.out),
            2 => {
                let e = slot.errno.load(Ordering::Relaxed) as i32;
                result = Err(format!("process {tid} failed: {}", std::io::Error::from_raw_os_error(e)));
            }
            _ => result = Err(format!("process {tid} died")),
        }
    }
    // SAFETY: unmapping the mapping made above; nothing refers to it now.
    unsafe { libc::munmap(base, bytes) };
    result.map(|()| RunOut { tasks, wall })
}
