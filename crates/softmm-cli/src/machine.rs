//! The machine description written with every result, its load, and what
//! share of its CPUs each sample had: a sample taken while other processes
//! used the CPUs measures the machine's load, not the design.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Where the samples were taken.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPUs this process may run on.
    pub cores: usize,
    /// CPU model name.
    pub model: String,
    /// Host kernel release.
    pub kernel: String,
    /// The softmm commit the command was built from (`-dirty` with local changes).
    pub softmm_commit: String,
    /// The load average (1, 5 and 15 minutes) when the run began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_start: Option<[f64; 3]>,
    /// The load average when the run ended (its own threads included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_end: Option<[f64; 3]>,
}

impl Machine {
    /// This machine, with its load average now.
    pub fn detect() -> Machine {
        Machine {
            cores: cores(),
            model: model(),
            kernel: kernel(),
            softmm_commit: env!("SOFTMM_COMMIT").to_string(),
            load_start: load_average(),
            load_end: None,
        }
    }

    /// Records the load average at the end of the run.
    pub fn finish(&mut self) {
        self.load_end = load_average();
    }

    /// The first lines of every run's output: the machine, the commit, the
    /// load average and the CPU count, and a warning where the load leaves
    /// the run less than the CPUs it counts on.
    pub fn header(&self, what: &str) -> String {
        let mut out = crate::table::wrap(
            &format!(
                "softmm {what}: softmm {} on {} CPUs ({}, {})",
                self.softmm_commit, self.cores, self.model, self.kernel
            ),
            "  ",
        );
        match self.load_start {
            Some([l1, l5, l15]) => {
                out.push_str(&format!("load average at the start: {l1:.2} {l5:.2} {l15:.2} (1, 5, 15 min)\n"));
                if l1 > busy_load(self.cores) {
                    out.push_str(&crate::table::wrap(
                        &format!(
                            "warning: a load average of {l1:.2} on {} CPUs: other processes are using CPUs that \
                             the samples need, so rates measure the machine's load as much as the design; the \
                             cpus column and the warnings after each table say which samples were short",
                            self.cores
                        ),
                        "  ",
                    ));
                }
            }
            None => out.push_str("load average: unknown (no /proc/loadavg)\n"),
        }
        out
    }

    /// The last line: the load average at the end.
    pub fn footer(&self) -> String {
        match self.load_end {
            Some([l1, l5, l15]) => format!("load average at the end: {l1:.2} {l5:.2} {l15:.2} (1, 5, 15 min)\n"),
            None => String::new(),
        }
    }
}

/// The 1-minute load above which the header warns: three quarters of the CPUs.
pub fn busy_load(cores: usize) -> f64 {
    cores as f64 * 0.75
}

/// CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `/proc/loadavg`'s three load averages.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut f = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([f.next()??, f.next()??, f.next()??])
}

fn model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn kernel() -> String {
    // SAFETY: an all-zero utsname is valid, and uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".to_string();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!("{} {}", field(&u.sysname), field(&u.release))
}

/// The CPUs one sample had: how much of the CPUs this process may run on
/// other processes (and the hypervisor, as steal time) used meanwhile, and
/// how many of its threads wanted a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CpuShare {
    /// CPUs this process may run on.
    pub cores: usize,
    /// CPUs' worth of time other processes used on them during the sample
    /// (busy time of those CPUs in `/proc/stat`, steal included, less this
    /// process's own CPU time and its children's, over the wall time).
    pub others: f64,
    /// CPUs' worth of time this process and its reaped children used.
    pub used: f64,
    /// Threads (or processes) of the sample that run without waiting for
    /// each other: the workers, plus a mapper, munmapper or migrator.
    pub tasks: usize,
}

impl CpuShare {
    /// The CPUs left to the sample: its CPUs less what others used.
    pub fn free(&self) -> f64 {
        (self.cores as f64 - self.others).max(0.0)
    }

    /// The CPUs its tasks could use at most.
    pub fn wanted(&self) -> f64 {
        self.tasks.min(self.cores).max(1) as f64
    }

    /// Whether the CPUs left fall well short (below 80%) of what its tasks
    /// could use: the sample measured the machine's other work.
    pub fn short(&self) -> bool {
        self.free() < 0.8 * self.wanted()
    }
}

/// Measures one sample's [`CpuShare`]: [`CpuMeter::start`] before it,
/// [`CpuMeter::finish`] after.
pub struct CpuMeter {
    t0: Instant,
    busy0: Option<f64>,
    ours0: f64,
}

impl CpuMeter {
    /// Starts measuring.
    pub fn start() -> CpuMeter {
        CpuMeter { t0: Instant::now(), busy0: busy_seconds(), ours0: own_cpu_seconds() }
    }

    /// The share since [`CpuMeter::start`] of a sample of `tasks` tasks;
    /// `None` without `/proc/stat` or for too short a sample to tell.
    pub fn finish(&self, tasks: usize) -> Option<CpuShare> {
        let wall = self.t0.elapsed().as_secs_f64();
        let busy = busy_seconds()? - self.busy0?;
        let ours = own_cpu_seconds() - self.ours0;
        // /proc/stat counts in clock ticks (10 ms): a shorter sample says nothing.
        (wall >= 0.05).then(|| CpuShare {
            cores: cores(),
            others: ((busy - ours) / wall).max(0.0),
            used: ours / wall,
            tasks,
        })
    }
}

/// Runs `f` as one sample of `tasks` tasks and measures its CPU share.
pub fn measured<T>(tasks: usize, f: impl FnOnce() -> T) -> (T, Option<CpuShare>) {
    let m = CpuMeter::start();
    let r = f();
    (r, m.finish(tasks))
}

/// CPU seconds of this process (every thread, exited ones too) and its
/// reaped children.
fn own_cpu_seconds() -> f64 {
    let of = |who| {
        // SAFETY: an all-zero rusage is valid, and getrusage fills it.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid out-pointer.
        unsafe { libc::getrusage(who, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    };
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

/// Busy seconds so far of the CPUs this process may run on (`/proc/stat`:
/// user, nice, system, irq, softirq and steal time).
fn busy_seconds() -> Option<f64> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid out-pointer of the size given.
    let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } == 0;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let mut ticks = 0u64;
    let mut any = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else { continue };
        let mut f = rest.split_whitespace();
        let Some(Ok(cpu)) = f.next().map(str::parse::<usize>) else { continue }; // the "cpu" total line
                                                                                 // SAFETY: CPU_ISSET reads the set; `cpu` is checked against its size.
        if ok && (cpu >= libc::CPU_SETSIZE as usize || !unsafe { libc::CPU_ISSET(cpu, &set) }) {
            continue;
        }
        let v: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
        // user nice system idle iowait irq softirq steal (guest is in user)
        if v.len() >= 8 {
            ticks += v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
            any = true;
        }
    }
    any.then(|| ticks as f64 / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_short_where_others_leave_less_than_most_of_what_the_tasks_want() {
        let s = |others: f64, tasks: usize| CpuShare { cores: 2, others, used: 1.0, tasks };
        assert!(!s(0.1, 2).short());
        assert!(s(0.84, 2).short(), "1.16 CPUs left for 2 threads");
        assert!(!s(0.84, 1).short(), "1.16 CPUs left for 1 thread");
        assert!(s(1.5, 1).short());
        assert!(s(0.5, 3).short(), "3 tasks on 2 CPUs want both");
        assert_eq!(s(3.0, 1).free(), 0.0);
    }

    #[test]
    fn the_meter_sees_this_process_work() {
        // 100 ms of this process's CPU time, however long a loaded machine
        // takes to give it.
        let (x, share) = measured(1, || {
            let c0 = own_cpu_seconds();
            let mut x = 0u64;
            while own_cpu_seconds() - c0 < 0.1 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
            x
        });
        std::hint::black_box(x);
        let share = share.expect("/proc/stat on Linux");
        assert!(share.used > 0.0 && share.used <= share.cores as f64 + 0.5, "{share:?}");
        assert!(share.others >= 0.0 && share.tasks == 1 && share.cores == cores(), "{share:?}");
        assert!(load_average().is_some());
    }
}
