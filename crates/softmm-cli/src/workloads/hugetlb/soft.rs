//! The softmm rows of seed 000's experiment: the host's programs
//! ([`super::Program`]) on softmm, one row per [`HugetlbPolicy`].
//!
//! Processes mode, as the lab's other softmm process rows: an instance is an
//! [`AddressSpace`] of its own, driven by a thread of its own through a
//! [`Cpu`] of its own, all in one [`PhysMem`] whose hugetlb pool holds the
//! area. The area is one hugetlbfs [`File`] with every page allocated
//! (`fallocate`) before the sweep, as the host's, and every instance maps
//! all of it `MAP_SHARED` at the same 1 GiB-aligned address ([`BASE`]), so
//! each whole 1 GiB window can share its PMD table (`want_pmd_share`).
//!
//! * fault: map, write one byte of every 2 MiB page, unmap, loop; one
//!   operation is one page written;
//! * fork: map, write [`super::FORK_TOUCH`] pages, [`AddressSpace::fork`],
//!   the child writes one page on a CPU of the instance's thread and exits
//!   (its last reference dropped), unmap, loop; one operation is one fork.
//!
//! HugetlbCounters per sample: the instances' and their children's faults and the
//! `mmap_lock` acquisitions of their faults (the CPUs' [`softmm::FaultStats`]),
//! the `mmap_lock` acquisitions of the instances' own address spaces and
//! their TLB flush requests ([`softmm::MmStats`]; a child's address space
//! is not read before it goes), and from the pool ([`PoolReading`], the
//! lab's one reading of the pool's event counters) the PMD shares and
//! unshares of the whole arena during the sample; per program, its
//! instance threads' CPU time (`CLOCK_THREAD_CPUTIME_ID`: a child's fault
//! and exit run on its parent's thread) and their waits for hugetlb locks
//! ([`HugetlbLockStats::thread_wait_ns`]), the per-op costs that do not
//! depend on how the two programs share the CPUs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use softmm::uapi::{MAP_FIXED, MAP_SHARED, PROT_READ, PROT_WRITE};
use softmm::{
    AddressSpace, Cpu, File, HugePageStats, HugetlbLockStats, HugetlbPolicy, MmConfig, OpenFile, PhysConfig, PhysMem,
};
use softmm_hostsys::{HUGE_PAGE_SIZE, PUD_SIZE};

use super::{HugetlbCounters, Program, ProgramRun, FORK_TOUCH, MAX_INSTANCES};
use crate::args::Limit;

/// Where every instance maps the area: 1 GiB-aligned (64 GiB), so that
/// each whole window of the file sits at the same offset within its PUD in
/// every address space.
pub const BASE: u64 = 64 * PUD_SIZE;

/// Small frames beside the pool: page tables, the zero page, per-CPU
/// caches. An instance needs three table pages (PGD, PUD, PMD per window);
/// this is generous.
const SMALL_BYTES: u64 = 64 << 20;

/// The softmm setup of a sweep: the arena with the area's pages in its
/// pool, and the area file with every page allocated.
pub struct SoftArea {
    phys: Arc<PhysMem>,
    file: Arc<File>,
    size: u64,
    /// Whether a second address space's first fault in a window links the
    /// first one's PMD table (see [`SoftArea::new`]).
    pub sharing: bool,
}

impl SoftArea {
    /// An arena whose pool holds exactly `size / 2 MiB` huge pages, a
    /// hugetlbfs file of `size` bytes with all of them allocated, and PMD
    /// sharing as the library has it for a new file ([`pmd_sharing`] says
    /// which). The error says what failed.
    pub fn new(size: u64) -> Result<SoftArea, String> {
        let pages = size / HUGE_PAGE_SIZE;
        let phys = PhysMem::new(PhysConfig::new(SMALL_BYTES + size + HUGE_PAGE_SIZE).hugepages(pages))
            .map_err(|e| format!("softmm arena with {pages} huge pages: {e}"))?;
        let file = File::create_hugetlbfs(&phys, "/area", size).map_err(|e| format!("hugetlbfs file: {e}"))?;
        file.fallocate(0, 0, size).map_err(|e| format!("fallocate of {} MiB: {e}", size >> 20))?;
        let mut area = SoftArea { phys, file, size, sharing: false };
        area.sharing = pmd_sharing(&area)?;
        Ok(area)
    }

    /// The arena's leftovers once every instance is gone: page tables,
    /// VMAs and reverse-map entries, small frames in use, and pool pages
    /// not free. With no address space left that is `(0, 0, 0, 0, pages)`:
    /// the area's pages come from the pool and the file keeps them all.
    pub fn leftovers(&self) -> (u64, u64, u64, u64, u64) {
        let s = self.phys.quiesce();
        let h = self.phys.huge_page_stats();
        (s.page_tables, s.vmas, s.rmap_entries, s.frames_used, h.total - h.free)
    }

    /// `Err` naming what leaked where [`SoftArea::leftovers`] is not
    /// `(0, 0, 0, 0, pages)`.
    fn check_leftovers(&self) -> Result<(), String> {
        let left = self.leftovers();
        let want = (0, 0, 0, 0, self.size / HUGE_PAGE_SIZE);
        if left == want {
            return Ok(());
        }
        Err(format!(
            "leaked once every address space was gone: (page tables, VMAs, rmap entries, small frames, huge pages in use) = {left:?}, want {want:?}"
        ))
    }
}

/// Whether PMD tables are shared on the lab's file, found by trying: one
/// address space writes the first page of the area, a second one writes the
/// same page, and the pool's `pmd_shares` says whether the second linked
/// the first one's table. softmm shares as Linux does, with no switch, so
/// this checks the library rather than choosing; the sweep prints it.
fn pmd_sharing(area: &SoftArea) -> Result<bool, String> {
    if area.size < PUD_SIZE {
        return Ok(false); // no whole window: want_pmd_share never holds
    }
    let before = PoolReading::take(&area.phys);
    let open = OpenFile::read_write(&area.file);
    let mut spaces = Vec::new();
    for _ in 0..2 {
        let mm = AddressSpace::new(&area.phys, MmConfig::default()).map_err(|e| format!("address space: {e}"))?;
        map(&mm, &open, area.size)?;
        Cpu::attached(&mm).write_u8(BASE, 1).map_err(|f| format!("probe write: {f:?}"))?;
        spaces.push(mm);
    }
    drop(spaces);
    Ok(PoolReading::take(&area.phys).counters_since(&before).pmd_shares.unwrap_or(0) > 0)
}

/// The arena's hugetlb event counters at one moment: the lab's one reading
/// of them, so that new ones (hugetlb lock acquisitions by kind) are read
/// here and turned into [`HugetlbCounters`] in [`PoolReading::counters_since`].
#[derive(Debug, Clone, Copy)]
pub struct PoolReading {
    stats: HugePageStats,
    locks: HugetlbLockStats,
}

impl PoolReading {
    /// Reads `phys`'s counters.
    pub fn take(phys: &PhysMem) -> PoolReading {
        PoolReading { stats: phys.huge_page_stats(), locks: phys.hugetlb_lock_stats() }
    }

    /// What happened between `before` and this reading: PMD shares and
    /// unshares, and hugetlb lock acquisitions by kind, of the whole arena.
    pub fn counters_since(&self, before: &PoolReading) -> HugetlbCounters {
        let (a, b) = (&self.stats, &before.stats);
        let (l, m) = (&self.locks, &before.locks);
        let d = |x: u64, y: u64| Some(x.saturating_sub(y));
        HugetlbCounters {
            pmd_shares: d(a.pmd_shares, b.pmd_shares),
            pmd_unshares: d(a.pmd_unshares, b.pmd_unshares),
            i_mmap_read: d(l.i_mmap_read, m.i_mmap_read),
            i_mmap_write: d(l.i_mmap_write, m.i_mmap_write),
            vma_lock_read: d(l.vma_lock_read, m.vma_lock_read),
            vma_lock_write: d(l.vma_lock_write, m.vma_lock_write),
            fault_mutex: d(l.fault_mutex, m.fault_mutex),
            validation_retries: d(l.validation_retries, m.validation_retries),
            i_mmap_wait_ns: d(l.i_mmap_wait_ns, m.i_mmap_wait_ns),
            vma_lock_wait_ns: d(l.vma_lock_wait_ns, m.vma_lock_wait_ns),
            fault_mutex_wait_ns: d(l.fault_mutex_wait_ns, m.fault_mutex_wait_ns),
            ..HugetlbCounters::default()
        }
    }
}

fn map(mm: &AddressSpace, open: &OpenFile, size: u64) -> Result<(), String> {
    mm.mmap(BASE, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, Some(open), 0)
        .map(|_| ())
        .map_err(|e| format!("mmap of the area: {e}"))
}

/// What one instance reports.
#[derive(Debug, Default)]
struct InstanceOut {
    ops: u64,
    nanos: u64,
    faults: u64,
    mmap_lock: u64,
    flush_requests: u64,
    /// The instance thread's CPU time over its loop.
    cpu_ns: u64,
    /// Its waits for hugetlb locks over the loop.
    lock_wait_ns: u64,
}

/// One instance: runs `program` in an address space of its own until
/// `stop` (or for `iterations`), after the common start.
fn instance(
    area: &SoftArea,
    policy: HugetlbPolicy,
    program: Program,
    start: &Barrier,
    stop: &AtomicBool,
    iterations: Option<u64>,
    fork_hold: Duration,
) -> Result<InstanceOut, String> {
    let setup = || -> Result<_, String> {
        let mm = AddressSpace::new(&area.phys, MmConfig::default().hugetlb_policy(policy))
            .map_err(|e| format!("address space: {e}"))?;
        Ok((mm, OpenFile::read_write(&area.file)))
    };
    let made = setup();
    // Every instance reaches the barrier, also one whose setup failed, so
    // that the others are not left waiting.
    start.wait();
    let (mm, open) = made?;
    let mut cpu = Cpu::attached(&mm);
    // The children's CPU: one per instance, attached to each child in turn.
    let mut child_cpu = Cpu::new();
    let pages = area.size / HUGE_PAGE_SIZE;
    let write = |cpu: &mut Cpu, i: u64| {
        cpu.write_u8(BASE + i * HUGE_PAGE_SIZE, 1).map_err(|f| format!("write to huge page {i}: {f:?}"))
    };
    let t0 = Instant::now();
    let (cpu0, wait0) = (crate::workloads::space::thread_cpu_ns(), HugetlbLockStats::thread_wait_ns());
    let (mut ops, mut n) = (0, 0);
    loop {
        match iterations {
            Some(max) if n >= max => break,
            // At least one pass: an instance the scheduler started late
            // still measures something.
            None if n > 0 && stop.load(Ordering::Relaxed) => break,
            _ => {}
        }
        n += 1;
        map(&mm, &open, area.size)?;
        match program {
            Program::Fault => {
                for i in 0..pages {
                    write(&mut cpu, i)?;
                }
                ops += pages;
            }
            Program::Fork => {
                for i in 0..FORK_TOUCH.min(pages) {
                    write(&mut cpu, i)?;
                }
                let child = mm.fork().map_err(|e| format!("fork: {e}"))?;
                child_cpu.attach(&child);
                write(&mut child_cpu, 0)?;
                child_cpu.detach();
                drop(child); // the child's exit
                super::hold(fork_hold);
                ops += 1;
            }
        }
        mm.munmap(BASE, area.size).map_err(|e| format!("munmap of the area: {e}"))?;
    }
    let nanos = t0.elapsed().as_nanos() as u64;
    let cpu_ns = crate::workloads::space::thread_cpu_ns().saturating_sub(cpu0);
    let lock_wait_ns = HugetlbLockStats::thread_wait_ns().saturating_sub(wait0);
    let (f, cf, st) = (cpu.stats().fault, child_cpu.stats().fault, mm.stats());
    Ok(InstanceOut {
        ops,
        nanos,
        faults: f.faults + cf.faults,
        mmap_lock: f.mmap_lock_acquisitions + cf.mmap_lock_acquisitions + st.mmap_lock_read + st.mmap_lock_write,
        flush_requests: st.tlb.flush_requests,
        cpu_ns,
        lock_wait_ns,
    })
}

/// One program's totals of a softmm run, with its counters.
#[derive(Debug, Clone)]
pub struct SoftRun {
    /// Operations, rates and faults, as the host's.
    pub run: ProgramRun,
    /// Faults, `mmap_lock` acquisitions, flush requests, PMD shares and
    /// unshares (the last two of the whole arena during the run).
    pub counters: HugetlbCounters,
}

/// Runs `instances` instances of each of `programs` at once under `policy`
/// for `limit`, each program's instances on threads of their own, and
/// returns each program's totals. Every address space is gone when it
/// returns.
pub fn run(
    area: &SoftArea,
    policy: HugetlbPolicy,
    programs: &[Program],
    instances: usize,
    limit: Limit,
    fork_hold: Duration,
) -> Result<Vec<SoftRun>, String> {
    if instances == 0 || instances > MAX_INSTANCES {
        return Err(format!("instances must be 1..={MAX_INSTANCES}"));
    }
    let iterations = match limit {
        Limit::Iterations(n) => Some(n),
        Limit::Duration(_) => None,
    };
    let stop = AtomicBool::new(false);
    let start = Barrier::new(programs.len() * instances + 1);
    let before = PoolReading::take(&area.phys);
    let outs: Vec<(Program, Result<InstanceOut, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = programs
            .iter()
            .flat_map(|&p| std::iter::repeat_n(p, instances))
            .map(|p| {
                let (stop, start) = (&stop, &start);
                (p, scope.spawn(move || instance(area, policy, p, start, stop, iterations, fork_hold)))
            })
            .collect();
        start.wait();
        if let Limit::Duration(d) = limit {
            let t0 = Instant::now();
            // Sleep in slices so that instances failing early end the wait.
            while t0.elapsed() < d && !handles.iter().all(|(_, h)| h.is_finished()) {
                std::thread::sleep((d - t0.elapsed().min(d)).min(Duration::from_millis(20)));
            }
        }
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|(p, h)| (p, h.join().unwrap_or_else(|_| Err("an instance panicked".into())))).collect()
    });
    let pool = PoolReading::take(&area.phys).counters_since(&before);
    area.check_leftovers()?;
    let mut out = Vec::new();
    for &program in programs {
        let mut of = Vec::new();
        for (p, r) in outs.iter().filter(|(p, _)| *p == program) {
            match r {
                Ok(o) => of.push(o),
                Err(e) => return Err(format!("a {} instance under {}: {e}", p.mode(), policy.name())),
            }
        }
        let secs = |o: &InstanceOut| o.nanos as f64 / 1e9;
        let ops = of.iter().map(|o| o.ops).sum();
        let faults = of.iter().map(|o| o.faults).sum();
        out.push(SoftRun {
            run: ProgramRun {
                program,
                instances,
                ops,
                seconds: of.iter().map(|o| secs(o)).fold(0.0, f64::max),
                ops_per_sec: of.iter().map(|o| if secs(o) > 0.0 { o.ops as f64 / secs(o) } else { 0.0 }).sum(),
                minflt: faults,
            },
            counters: HugetlbCounters {
                faults: Some(faults),
                mmap_lock_acquisitions: Some(of.iter().map(|o| o.mmap_lock).sum()),
                flush_requests: Some(of.iter().map(|o| o.flush_requests).sum()),
                cpu_ns: Some(of.iter().map(|o| o.cpu_ns).sum()),
                lock_wait_ns: Some(of.iter().map(|o| o.lock_wait_ns).sum()),
                ..pool.clone()
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small area: 8 huge pages, no whole window (so no sharing).
    const SMALL: u64 = 8 * HUGE_PAGE_SIZE;

    #[test]
    fn every_policy_runs_both_programs_counts_every_page_and_leaks_nothing() {
        let area = SoftArea::new(SMALL).unwrap();
        assert!(!area.sharing, "no whole 1 GiB window, no sharing");
        for &policy in HugetlbPolicy::ALL {
            let runs =
                run(&area, policy, &[Program::Fork, Program::Fault], 2, Limit::Iterations(3), Duration::ZERO).unwrap();
            let fork = &runs[0];
            let fault = &runs[1];
            assert_eq!((fork.run.program, fork.run.ops), (Program::Fork, 2 * 3));
            assert_eq!((fault.run.program, fault.run.ops), (Program::Fault, 2 * 3 * 8), "8 pages, 3 passes, 2");
            // Without sharing every page written after a map is a fault:
            // the fault program's 48 pages; per fork, 4 pages and the
            // child's one.
            assert_eq!(fault.counters.faults, Some(2 * 3 * 8), "{policy:?}");
            assert_eq!(fork.counters.faults, Some(2 * 3 * (FORK_TOUCH + 1)), "{policy:?}");
            assert!(fault.counters.mmap_lock_acquisitions.unwrap() > 0);
            assert_eq!(fault.counters.pmd_shares, Some(0));
            assert!(fault.run.ops_per_sec > 0.0 && fork.run.ops_per_sec > 0.0);
            // Each program's threads' own CPU time; waits may be 0.
            assert!(fault.counters.cpu_ns.unwrap() > 0 && fork.counters.cpu_ns.unwrap() > 0, "{policy:?}");
            assert!(fault.counters.lock_wait_ns.is_some() && fork.counters.lock_wait_ns.is_some());
            assert_eq!(area.leftovers(), (0, 0, 0, 0, 8), "only the file's pages stay ({policy:?})");
            assert_eq!(area.check_leftovers(), Ok(()));
        }
    }

    #[test]
    fn a_timed_run_stops_and_a_bad_instance_count_is_refused() {
        let area = SoftArea::new(SMALL).unwrap();
        let runs = run(
            &area,
            HugetlbPolicy::default(),
            &[Program::Fault],
            1,
            Limit::Duration(Duration::from_millis(20)),
            Duration::ZERO,
        )
        .unwrap();
        // At least one pass, and it stopped (the time is not asserted: the
        // machine may be busy).
        assert!(runs[0].run.ops >= 8 && runs[0].run.ops % 8 == 0 && runs[0].run.seconds > 0.0, "{runs:?}");
        assert!(
            run(&area, HugetlbPolicy::default(), &[Program::Fault], 0, Limit::Iterations(1), Duration::ZERO).is_err()
        );
        assert!(run(
            &area,
            HugetlbPolicy::default(),
            &[Program::Fault],
            MAX_INSTANCES + 1,
            Limit::Iterations(1),
            Duration::ZERO
        )
        .is_err());
    }

    /// `--fork-hold`: each fork's hold is spent, so a run of n forks lasts
    /// at least n holds (a bound that holds however busy the machine).
    #[test]
    fn a_forker_holds_its_mapping_for_the_fork_hold_after_each_fork() {
        let area = SoftArea::new(4 * HUGE_PAGE_SIZE).unwrap();
        let hold = Duration::from_millis(5);
        let runs = run(&area, HugetlbPolicy::default(), &[Program::Fork], 1, Limit::Iterations(3), hold).unwrap();
        assert_eq!(runs[0].run.ops, 3);
        assert!(runs[0].run.seconds >= 3.0 * hold.as_secs_f64(), "{runs:?}");
        area.check_leftovers().unwrap();
    }

    #[test]
    fn the_default_area_is_one_whole_window_and_the_probe_reports_sharing() {
        // 1 GiB of pool pages, zeroed by the fallocate: the probe's answer
        // is whatever the library does for a new hugetlbfs file.
        let area = SoftArea::new(PUD_SIZE).unwrap();
        let runs =
            run(&area, HugetlbPolicy::default(), &[Program::Fork], 1, Limit::Iterations(2), Duration::ZERO).unwrap();
        let shares = runs[0].counters.pmd_shares.unwrap();
        // Every child links its parent's table where sharing is on: its
        // one fault is a share.
        assert_eq!(shares, if area.sharing { 2 } else { 0 }, "{runs:?}");
        assert_eq!(runs[0].counters.faults, Some(2 * (FORK_TOUCH + 1)), "{runs:?}");
        assert_eq!(area.leftovers(), (0, 0, 0, 0, 512));
    }
}
