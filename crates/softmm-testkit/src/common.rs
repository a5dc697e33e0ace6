//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use softmm::uapi::*;
use softmm::{
    Access, AddressSpace, Cpu, FaultPolicy, MadvisePolicy, MmConfig, PhysConfig, PhysMem, PostingPolicy,
    ShootdownPolicy, ShootdownTargets, WriterPolicy,
};

pub const PAGE: u64 = 4096;
pub const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
pub const RW: i32 = PROT_READ | PROT_WRITE;

/// A small machine: `mib` MiB of frames; memory on demand
/// (`PhysConfig::on_demand`) when `SOFTMM_ON_DEMAND` is set, so that a
/// test binary can be run both ways.
pub fn phys(mib: u64) -> Arc<PhysMem> {
    let on_demand = std::env::var_os("SOFTMM_ON_DEMAND").is_some();
    PhysMem::new(PhysConfig::new(mib << 20).on_demand(on_demand)).expect("arena")
}

/// An address space with the default layout and `policy` (speculation
/// forced on, so that single-threaded tests exercise it too), and the
/// `madvise` policy of [`madvise_policy`].
pub fn mm_with(phys: &Arc<PhysMem>, policy: FaultPolicy) -> Arc<AddressSpace> {
    AddressSpace::new(phys, config_with(policy)).expect("valid config")
}

/// The configuration of [`mm_with`].
fn config_with(policy: FaultPolicy) -> MmConfig {
    MmConfig::default()
        .policy(policy)
        .force_speculative(true)
        .madvise_policy(madvise_policy())
        .writer_policy(writer_policy())
}

/// The writer policy named by `SOFTMM_WRITER_POLICY` (the default if
/// unset), so that a test binary can be run under each (scripts/test.sh
/// runs the semantic, differential and model tests under `range`).
pub fn writer_policy() -> WriterPolicy {
    match std::env::var("SOFTMM_WRITER_POLICY") {
        Ok(name) => {
            WriterPolicy::from_name(&name).unwrap_or_else(|| panic!("SOFTMM_WRITER_POLICY={name:?}: no such policy"))
        }
        Err(_) => WriterPolicy::default(),
    }
}

/// One way to make TLB shootdowns: the three axes `MmConfig` chooses them
/// by (when a CPU drops its entries, which CPUs are asked, how requests are
/// posted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shootdown {
    pub policy: ShootdownPolicy,
    pub targets: ShootdownTargets,
    pub posting: PostingPolicy,
}

impl Shootdown {
    /// Configurations that together take every value of each axis: the
    /// default first, the design before the scaling work (every CPU asked,
    /// under the list's lock) second. Tests that race a change against
    /// CPUs holding translations cycle through them, so each mechanism
    /// meets each race without multiplying the runs.
    pub const COVERING: &'static [Shootdown] = &[
        Shootdown {
            policy: ShootdownPolicy::AccessSections,
            targets: ShootdownTargets::FillOwners,
            posting: PostingPolicy::Adaptive,
        },
        Shootdown {
            policy: ShootdownPolicy::AccessSections,
            targets: ShootdownTargets::Broadcast,
            posting: PostingPolicy::Locked,
        },
        Shootdown {
            policy: ShootdownPolicy::NextAccess,
            targets: ShootdownTargets::FillOwnersRanges,
            posting: PostingPolicy::LockFree,
        },
        Shootdown {
            policy: ShootdownPolicy::NextAccess,
            targets: ShootdownTargets::Broadcast,
            posting: PostingPolicy::SharedBarrier,
        },
    ];

    /// `config` with this shootdown configuration.
    pub fn apply(self, config: MmConfig) -> MmConfig {
        config.shootdown_policy(self.policy).shootdown_targets(self.targets).posting_policy(self.posting)
    }

    /// A short name for test logs.
    pub fn name(self) -> String {
        format!("{}+{}+{}", self.policy.name(), self.targets.name(), self.posting.name())
    }
}

/// [`mm_with`] under the shootdown configuration `shootdown`.
pub fn mm_with_shootdown(phys: &Arc<PhysMem>, policy: FaultPolicy, shootdown: Shootdown) -> Arc<AddressSpace> {
    AddressSpace::new(phys, shootdown.apply(config_with(policy))).expect("valid config")
}

/// The fault policies, each paired with a shootdown configuration of
/// [`Shootdown::COVERING`] in turn (cycling through the longer list), so
/// that a test run once per pair meets every value of every axis.
pub fn fault_and_shootdown_policies() -> impl Iterator<Item = (FaultPolicy, Shootdown)> {
    let n = FaultPolicy::ALL.len().max(Shootdown::COVERING.len());
    (0..n).map(|i| (FaultPolicy::ALL[i % FaultPolicy::ALL.len()], Shootdown::COVERING[i % Shootdown::COVERING.len()]))
}

/// The `madvise` policy named by `SOFTMM_MADVISE_POLICY` (the default if
/// unset), so that a test binary can be run under each (scripts/test.sh).
pub fn madvise_policy() -> MadvisePolicy {
    match std::env::var("SOFTMM_MADVISE_POLICY") {
        Ok(name) => {
            MadvisePolicy::from_name(&name).unwrap_or_else(|| panic!("SOFTMM_MADVISE_POLICY={name:?}: no such policy"))
        }
        Err(_) => MadvisePolicy::default(),
    }
}

/// Asserts that everything allocated on `phys` has been freed.
#[track_caller]
pub fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "leak: {s:?}");
    // Every huge page back in the pool, no reservation left.
    let h = phys.huge_page_stats();
    assert_eq!((h.free, h.rsvd, h.surp), (h.total, 0, 0), "hugetlb leak: {h:?}");
}

/// The kind, first byte and size of the access whose fault `cpu` recorded
/// last ([`Cpu::last_fault`]); fails if none was.
#[track_caller]
pub fn last_fault(cpu: &Cpu) -> (Access, u64, usize) {
    let i = cpu.last_fault().expect("a fault was recorded");
    (i.access, i.addr, i.size)
}

/// Runs `f` on its own thread named `name`; fails if it panics or does not
/// finish within `secs` seconds (a deadlock detector, not a timing check).
pub fn watchdog<R: Send + 'static>(name: &str, secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let h = thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .expect("spawn");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{name}: deadlock: not done after {secs} s"),
    }
}

/// The stress tests' knobs: `STRESS_SEED=<n>` changes their random
/// choices, `STRESS_SCALE=<n>` multiplies their iteration counts.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The seed of a stress test: `STRESS_SEED`, else `default`.
pub fn stress_seed(default: u64) -> u64 {
    env_u64("STRESS_SEED", default)
}

/// `n` iterations multiplied by `STRESS_SCALE` (at least 1).
pub fn scaled(n: u64) -> u64 {
    n * env_u64("STRESS_SCALE", 1).max(1)
}

/// splitmix64: a small seeded generator for the stress tests' schedules.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next number of the sequence.
    // Not an `Iterator`: the sequence never ends, and the callers draw one
    // number at a time.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, n)`; `n > 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// A named thread (the name shows in panic messages).
pub fn spawn<R: Send + 'static>(name: String, f: impl FnOnce() -> R + Send + 'static) -> thread::JoinHandle<R> {
    thread::Builder::new().name(name).spawn(f).expect("spawn")
}

/// Joins every thread, then re-raises the first panic: no thread is left
/// running when a scenario fails.
pub fn join_all<R>(hs: Vec<thread::JoinHandle<R>>) -> Vec<R> {
    let rs: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
    rs.into_iter().map(|r| r.unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
}

/// A host file in the temporary directory, removed when dropped.
pub struct TempFile(PathBuf);

impl TempFile {
    /// A file named after this process and `tag`, holding `content`.
    pub fn new(tag: &str, content: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("softmm-host-file-{}-{tag}", std::process::id()));
        std::fs::write(&path, content).unwrap();
        TempFile(path)
    }

    /// The file opened for reading, and for writing too when `write`.
    pub fn open(&self, write: bool) -> std::fs::File {
        std::fs::OpenOptions::new().read(true).write(write).open(&self.0).unwrap()
    }

    /// The file's bytes now.
    pub fn read(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads the file at `path` (a `/proc` file of the calling process) into
/// `buf[..cap - 1]` and ends it with a NUL; returns the bytes read (0 if
/// it cannot be opened). Only `open`, `read` and `close`: callable in a
/// child forked from a threaded test process, where the allocator may be
/// held by a thread that did not come along.
///
/// # Safety
///
/// `buf` is valid for writes of `cap` bytes, and `cap` is at least 1.
pub unsafe fn read_raw_nul(path: &std::ffi::CStr, buf: *mut u8, cap: usize) -> usize {
    // SAFETY: system calls on a descriptor of our own; `buf` as the caller
    // promises, written below `cap` only.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        let mut got = 0;
        while fd >= 0 && got < cap - 1 {
            let n = libc::read(fd, buf.add(got).cast(), cap - 1 - got);
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        if fd >= 0 {
            libc::close(fd);
        }
        buf.add(got).write(0);
        got
    }
}
