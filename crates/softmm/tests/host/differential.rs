//! Differential test against the host kernel: the same scenario of mmap,
//! munmap, mprotect, mremap, madvise, ftruncate, mincore, `mlock2`
//! (`MLOCK_ONFAULT`), munlock, mseal and `PR_SET_MDWE` calls and probing
//! accesses runs on Linux (in a child process of its own per scenario, so
//! that seals and MDWE end with it, inside a reserved address window) and
//! on softmm, under every fault policy; every return value,
//! errno, probe outcome and the `/proc/self/maps` lines of the window after
//! every step must agree.

use softmm_testkit::differential::{host, ops};

use ops::{MapLine, Op, Outcome, Scenario, Trace};
use proptest::prelude::*;
use softmm::uapi::*;
use softmm::{AddressSpace, Cpu, Fault, FaultPolicy, File, MmConfig, OpenFile, PhysConfig, PhysMem};

/// Runs `s` on softmm with `policy`, in an address space laid out like the
/// host child: `mmap_base` at the window's top, with a never-merging
/// `PROT_NONE` placeholder right above it as the host has.
fn run_on_softmm(s: &Scenario, policy: FaultPolicy) -> Trace {
    let phys = PhysMem::new(PhysConfig::new(64 << 20)).expect("arena");
    let trace = {
        let config = MmConfig::default()
            .policy(policy)
            .mmap_base(s.window.1)
            .force_speculative(true)
            // The runner runs as the test does (root on CI): no memlock
            // limit for its locks.
            .cap_ipc_lock(host_has_ipc_lock())
            .madvise_policy(softmm_testkit::common::madvise_policy())
            .writer_policy(softmm_testkit::common::writer_policy());
        let mm = AddressSpace::new(&phys, config).expect("valid config");
        mm.mmap(s.window.1, ops::PAGE, PROT_NONE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, None, 0)
            .expect("placeholder above the window");
        // One open per file, as the host child opens each memfd once.
        let files: Vec<OpenFile> = s
            .files
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let f = File::create(&phys, &format!("/memfd:f{i} (deleted)"), size).expect("file");
                let data: Vec<u8> = (0..size).map(|k| ops::file_byte(i, k)).collect();
                f.write_at(0, &data).expect("fill");
                OpenFile::read_write(&f)
            })
            .collect();
        let mut cpu = Cpu::attached(&mm);
        let steps = s
            .ops
            .iter()
            .map(|op| {
                let out = apply(&mm, &mut cpu, &files, host::mincore_cap(s), op);
                (out, maps_in_window(&mm, s.window))
            })
            .collect();
        Trace { steps }
    };
    let left = phys.quiesce();
    assert_eq!((left.frames_used, left.page_tables, left.vmas), (0, 0, 0), "leak after {s:?}");
    trace
}

/// Whether this process (whose runner children inherit its privileges)
/// has `CAP_IPC_LOCK` (bit 14 of `CapEff`).
fn host_has_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_string())))
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

fn errno(r: softmm::Result<u64>) -> Outcome {
    match r {
        Ok(v) => Outcome::Ok(v),
        Err(e) => Outcome::Err(e.code()),
    }
}

fn apply(mm: &AddressSpace, cpu: &mut Cpu, files: &[OpenFile], mincore_cap: usize, op: &Op) -> Outcome {
    match *op {
        Op::Mmap { addr, len, prot, flags, file, offset } => {
            errno(mm.mmap(addr, len, prot, flags, file.map(|i| &files[i]), offset))
        }
        Op::Munmap { addr, len } => errno(mm.munmap(addr, len).map(|()| 0)),
        Op::Mprotect { addr, len, prot } => errno(mm.mprotect(addr, len, prot).map(|()| 0)),
        Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
            errno(mm.mremap(old_addr, old_len, new_len, flags, new_addr))
        }
        Op::Madvise { addr, len, advice } => errno(mm.madvise(addr, len, advice).map(|()| 0)),
        Op::Ftruncate { file, len } => errno(files[file].file.set_len(len).map(|()| 0)),
        Op::Mincore { addr, len } => {
            // The host's buffer is as long, followed by a guard page.
            let mut v = vec![0u8; mincore_cap];
            match mm.mincore(addr, len, &mut v) {
                Ok(()) => {
                    v.truncate(len.div_ceil(softmm::PAGE_SIZE) as usize);
                    Outcome::Mincore(v)
                }
                Err(e) => Outcome::Err(e.code()),
            }
        }
        Op::MlockOnfault { addr, len } => errno(mm.mlock2(addr, len, MLOCK_ONFAULT).map(|()| 0)),
        Op::Munlock { addr, len } => errno(mm.munlock(addr, len).map(|()| 0)),
        Op::Mseal { addr, len } => errno(mm.mseal(addr, len, 0).map(|()| 0)),
        Op::SetMdwe => errno(mm.prctl_set_mdwe(PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0).map(|()| 0)),
        Op::Probe { addr, write } => {
            let r = match write {
                None => cpu.read_u8(addr),
                Some(b) => cpu.write_u8(addr, b).map(|()| b),
            };
            match r {
                Ok(b) => Outcome::Read(b),
                Err(Fault::Segv { code, .. }) => Outcome::Segv(code.code()),
                Err(Fault::Bus { .. }) => Outcome::Bus(ops::BUS_ADRERR),
                Err(f) => panic!("unexpected fault {f:?} probing {addr:#x}"),
            }
        }
    }
}

fn maps_in_window(mm: &AddressSpace, (lo, hi): (u64, u64)) -> Vec<MapLine> {
    mm.maps()
        .into_iter()
        .filter(|e| e.start < hi && e.end > lo)
        .map(|e| MapLine { start: e.start, end: e.end, perms: e.perms, offset: e.offset, anon: e.inode == 0 })
        .collect()
}

/// Compares softmm's trace with the host's step by step; on the first
/// difference, fails with the scenario up to that step and both sides.
fn compare(s: &Scenario, host: &Trace, policy: FaultPolicy) -> Result<(), String> {
    let mine = run_on_softmm(s, policy);
    for (i, (h, m)) in host.steps.iter().zip(&mine.steps).enumerate() {
        if h != m {
            let mut msg = format!("policy {}: step {i} differs\nscenario (files {:?}):\n", policy.name(), s.files);
            for (j, op) in s.ops.iter().enumerate().take(i + 1) {
                msg += &format!("  {j:2}: {op:?}\n      host -> {:?}\n", host.steps[j].0);
                if j < i && (j == 0 || host.steps[j].1 != host.steps[j - 1].1) {
                    msg += &fmt_maps(&host.steps[j].1);
                }
            }
            msg += &format!("host:   {:?}\nsoftmm: {:?}\n", h.0, m.0);
            if h.1 != m.1 {
                msg += &format!("host maps:\n{}softmm maps:\n{}", fmt_maps(&h.1), fmt_maps(&m.1));
            }
            return Err(msg);
        }
    }
    assert_eq!(host.steps.len(), mine.steps.len());
    Ok(())
}

fn fmt_maps(lines: &[MapLine]) -> String {
    lines
        .iter()
        .map(|l| {
            format!("    {:x}-{:x} {} {:x}{}\n", l.start, l.end, l.perms, l.offset, if l.anon { "" } else { " file" })
        })
        .collect()
}

#[test]
fn kselftest_cases_match_the_host() {
    for (name, s) in ops::kselftest_scenarios_named(ops::DEFAULT_WINDOW) {
        let host = host::run_on_host(&s);
        for &policy in FaultPolicy::ALL {
            if let Err(e) = compare(&s, &host, policy) {
                panic!("kselftest case {name}: {e}");
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_scenarios_match_the_host(s in ops::scenario_strategy(ops::DEFAULT_WINDOW)) {
        let host = host::run_on_host(&s);
        for &policy in FaultPolicy::ALL {
            compare(&s, &host, policy).map_err(TestCaseError::fail)?;
        }
    }
}

/// Scenarios the random test once found differing, kept as fixed cases.
fn past_failures() -> Vec<(&'static str, Vec<Op>)> {
    use Op::*;
    let w = ops::DEFAULT_WINDOW.1;
    let p = ops::PAGE;
    vec![
        (
            "MAP_POPULATE of a private writable mapping write-faults (anon_vma decides the later merge)",
            vec![
                Mmap { addr: 0, len: 8 * p, prot: 3, flags: ANON_PRIVATE | MAP_POPULATE, file: None, offset: 0 },
                Mmap { addr: w - 62 * p, len: 5 * p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Mremap { old_addr: w - p, old_len: p, new_len: p, flags: 0, new_addr: 0 },
                Mremap { old_addr: w - 4 * p, old_len: p, new_len: 2 * p, flags: MREMAP_MAYMOVE, new_addr: 0 },
            ],
        ),
        (
            "pieces of one shared anonymous mapping merge back",
            vec![
                Mmap {
                    addr: w - 30 * p,
                    len: 13 * p,
                    prot: 3,
                    flags: MAP_SHARED | MAP_ANONYMOUS,
                    file: None,
                    offset: 0,
                },
                Mprotect { addr: w - 18 * p, len: p, prot: PROT_READ },
                Mprotect { addr: w - 19 * p, len: 2 * p, prot: 3 },
            ],
        ),
        (
            "mremap of a shared mapping with old_len 0 leaves the source whole",
            vec![
                Mmap { addr: 0, len: 2 * p, prot: 3, flags: MAP_SHARED, file: Some(0), offset: 0 },
                Mremap { old_addr: w - p, old_len: 0, new_len: p, flags: MREMAP_MAYMOVE, new_addr: 0 },
            ],
        ),
        (
            "a PROT_NONE page keeps its frame for mincore",
            vec![
                Mmap { addr: 0, len: p, prot: 3, flags: ANON_PRIVATE, file: None, offset: 0 },
                Probe { addr: w - p, write: None },
                Mprotect { addr: w - p, len: p, prot: PROT_NONE },
                Mincore { addr: w - p, len: p },
            ],
        ),
        (
            "mprotect merging with a faulted neighbour",
            vec![
                Mmap { addr: w - 5 * p, len: 5 * p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Mmap {
                    addr: w - p,
                    len: p,
                    prot: 3,
                    flags: MAP_SHARED_VALIDATE | MAP_ANONYMOUS,
                    file: None,
                    offset: 0,
                },
                Mmap { addr: 0, len: p, prot: PROT_WRITE, flags: ANON_PRIVATE, file: None, offset: 0 },
                Probe { addr: w - 6 * p, write: Some(0) },
                Mmap {
                    addr: w - 7 * p,
                    len: p,
                    prot: 3,
                    flags: ANON_PRIVATE | MAP_FIXED_NOREPLACE,
                    file: None,
                    offset: 0,
                },
                Probe { addr: w - p, write: Some(0) },
                Mprotect { addr: w - 7 * p, len: 3 * p, prot: 3 },
            ],
        ),
        (
            "mprotect merging after DONTUNMAP moves and populate",
            vec![
                Mmap {
                    addr: w - 17 * p,
                    len: p,
                    prot: 3,
                    flags: MAP_SHARED_VALIDATE | MAP_ANONYMOUS,
                    file: None,
                    offset: 0,
                },
                Mmap { addr: w - 15 * p, len: 13 * p, prot: PROT_WRITE, flags: ANON_PRIVATE, file: None, offset: 0 },
                Mremap { old_addr: w - p, old_len: p, new_len: p, flags: 3, new_addr: w - 16 * p },
                Mmap { addr: 0, len: p, prot: 3, flags: MAP_SHARED, file: Some(0), offset: 0 },
                Mmap { addr: 0, len: 3 * p, prot: 3, flags: ANON_PRIVATE, file: None, offset: 0 },
                Probe { addr: w - 15 * p, write: Some(0) },
                Mmap { addr: w - p, len: p, prot: 3, flags: ANON_PRIVATE, file: None, offset: 0 },
                Mmap { addr: 0, len: 4 * p, prot: 3, flags: ANON_PRIVATE | MAP_POPULATE, file: None, offset: 0 },
                Probe { addr: w - p + 1368, write: Some(194) },
                Mprotect { addr: w - 17 * p, len: 3 * p, prot: 3 },
            ],
        ),
        (
            "a DONTUNMAP move that merges back into its source VMA ends the multi-VMA walk",
            vec![
                Mmap { addr: w - 33 * p, len: 3 * p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Mremap {
                    old_addr: w - 32 * p,
                    old_len: p,
                    new_len: p,
                    flags: MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
                    new_addr: w - 30 * p,
                },
                Probe { addr: w - 30 * p, write: None },
            ],
        ),
    ]
}

const ANON_PRIVATE: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

#[test]
fn past_failures_match_the_host() {
    for (name, ops) in past_failures() {
        let s = Scenario { window: ops::DEFAULT_WINDOW, files: vec![65536, 122880], ops };
        let host = host::run_on_host(&s);
        for &policy in FaultPolicy::ALL {
            if let Err(e) = compare(&s, &host, policy) {
                panic!("{name}: {e}");
            }
        }
    }
}

/// madvise advice Linux 6.18 knows and softmm once refused or got wrong
/// (`MADV_GUARD_*`, `MERGEABLE`/`UNMERGEABLE`, `COLLAPSE`, `REMOVE`), run on
/// the host and on softmm step by step: results, probes, mincore and maps.
fn madvise_scenarios() -> Vec<(&'static str, Vec<Op>)> {
    use Op::*;
    let w = ops::DEFAULT_WINDOW.1;
    let p = ops::PAGE;
    vec![
        (
            "guard markers: SIGSEGV, zap on install, kept by DONTNEED/mprotect, moved by mremap, cleared by munmap, hole gives ENOMEM",
            vec![
                Mmap { addr: 0, len: 8 * p, prot: 3, flags: ANON_PRIVATE, file: None, offset: 0 },
                Probe { addr: w - 8 * p, write: Some(3) },
                Probe { addr: w - 7 * p, write: Some(3) },
                Madvise { addr: w - 7 * p, len: 2 * p, advice: MADV_GUARD_INSTALL },
                Probe { addr: w - 7 * p, write: None },
                Probe { addr: w - 6 * p, write: Some(1) },
                Mincore { addr: w - 8 * p, len: 8 * p },
                Madvise { addr: w - 8 * p, len: 8 * p, advice: MADV_DONTNEED },
                Probe { addr: w - 7 * p, write: None },
                Madvise { addr: w - 8 * p, len: 8 * p, advice: MADV_POPULATE_READ },
                Mprotect { addr: w - 8 * p, len: 8 * p, prot: 0 },
                Probe { addr: w - 7 * p, write: None },
                Mprotect { addr: w - 8 * p, len: 8 * p, prot: 3 },
                Mremap { old_addr: w - 8 * p, old_len: 4 * p, new_len: 4 * p, flags: 3, new_addr: w - 20 * p },
                Probe { addr: w - 19 * p, write: None },
                Madvise { addr: w - 19 * p, len: p, advice: MADV_GUARD_REMOVE },
                Probe { addr: w - 19 * p, write: None },
                Munmap { addr: w - 18 * p, len: p },
                Mmap { addr: w - 18 * p, len: p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Probe { addr: w - 18 * p, write: None },
                Madvise { addr: w - 20 * p, len: 20 * p, advice: MADV_GUARD_INSTALL },
                Probe { addr: w - 20 * p, write: None },
                Mincore { addr: w - 4 * p, len: 4 * p },
            ],
        ),
        (
            "guard markers in shared and private file mappings: kept by truncate, file shows through after removal",
            vec![
                Mmap { addr: 0, len: 4 * p, prot: 3, flags: MAP_SHARED, file: Some(0), offset: 0 },
                Mmap { addr: 0, len: 4 * p, prot: 3, flags: MAP_PRIVATE, file: Some(1), offset: 0 },
                Probe { addr: w - 8 * p, write: Some(9) },
                Madvise { addr: w - 8 * p, len: 8 * p, advice: MADV_GUARD_INSTALL },
                Probe { addr: w - 8 * p, write: None },
                Probe { addr: w - 2 * p, write: None },
                Mincore { addr: w - 8 * p, len: 8 * p },
                Ftruncate { file: 0, len: p },
                Ftruncate { file: 0, len: 8 * p },
                Probe { addr: w - 3 * p, write: None },
                Madvise { addr: w - 8 * p, len: 8 * p, advice: MADV_GUARD_REMOVE },
                Probe { addr: w - 8 * p, write: None },
                Probe { addr: w - 3 * p, write: None },
                Mincore { addr: w - 8 * p, len: 8 * p },
            ],
        ),
        (
            "MADV_MERGEABLE splits private VMAs, is ignored on shared ones, UNMERGEABLE merges back",
            vec![
                Mmap { addr: 0, len: 4 * p, prot: 3, flags: ANON_PRIVATE, file: None, offset: 0 },
                Madvise { addr: w - 3 * p, len: p, advice: MADV_MERGEABLE },
                Mmap { addr: 0, len: 4 * p, prot: 3, flags: MAP_PRIVATE, file: Some(1), offset: 0 },
                Madvise { addr: w - 7 * p, len: p, advice: MADV_MERGEABLE },
                Mmap { addr: 0, len: 4 * p, prot: 3, flags: MAP_SHARED, file: Some(1), offset: 0 },
                Madvise { addr: w - 11 * p, len: p, advice: MADV_MERGEABLE },
                Madvise { addr: w - 12 * p, len: 12 * p, advice: MADV_UNMERGEABLE },
                Munmap { addr: w - 2 * p, len: p },
                Madvise { addr: w - 4 * p, len: 4 * p, advice: MADV_MERGEABLE },
                Mmap { addr: w - 2 * p, len: p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
            ],
        ),
        (
            "MADV_REMOVE across VMAs and holes, on private, anonymous and shared anonymous mappings",
            vec![
                Mmap { addr: w - 8 * p, len: 4 * p, prot: 3, flags: MAP_SHARED | MAP_FIXED, file: Some(0), offset: 0 },
                Mprotect { addr: w - 6 * p, len: p, prot: 1 },
                Mincore { addr: w - 8 * p, len: 4 * p },
                Madvise { addr: w - 10 * p, len: 6 * p, advice: MADV_REMOVE },
                Mincore { addr: w - 8 * p, len: 4 * p },
                Probe { addr: w - 8 * p, write: None },
                Mmap { addr: w - 3 * p, len: 2 * p, prot: 3, flags: MAP_PRIVATE | MAP_FIXED, file: Some(0), offset: 0 },
                Madvise { addr: w - 8 * p, len: 6 * p, advice: MADV_REMOVE },
                Mmap { addr: w - 3 * p, len: 2 * p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Madvise { addr: w - 3 * p, len: 2 * p, advice: MADV_REMOVE },
                Mmap { addr: w - 3 * p, len: 2 * p, prot: 3, flags: MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, file: None, offset: 0 },
                Probe { addr: w - 3 * p, write: Some(4) },
                Madvise { addr: w - 3 * p, len: 2 * p, advice: MADV_REMOVE },
                Probe { addr: w - 3 * p, write: None },
            ],
        ),
        (
            "MADV_COLLAPSE of an anonymous block makes it resident; an empty block or a small VMA is EINVAL",
            vec![
                Mmap { addr: w - 8 * ops::PMD, len: 4 * ops::PMD, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Madvise { addr: w - 8 * ops::PMD, len: ops::PMD, advice: MADV_COLLAPSE },
                Probe { addr: w - 8 * ops::PMD + 5 * p, write: Some(1) },
                Madvise { addr: w - 8 * ops::PMD, len: ops::PMD, advice: MADV_COLLAPSE },
                Madvise { addr: w - 8 * ops::PMD, len: 2 * ops::PMD, advice: MADV_COLLAPSE },
                Madvise { addr: w - 8 * ops::PMD, len: ops::PMD / 2, advice: MADV_COLLAPSE },
                Mincore { addr: w - 8 * ops::PMD, len: 8 * p },
                Mmap { addr: w - 4 * p, len: 4 * p, prot: 3, flags: ANON_PRIVATE | MAP_FIXED, file: None, offset: 0 },
                Madvise { addr: w - 4 * p, len: 4 * p, advice: MADV_COLLAPSE },
            ],
        ),
    ]
}

#[test]
fn madvise_scenarios_match_the_host() {
    for (name, ops) in madvise_scenarios() {
        let s = Scenario { window: ops::DEFAULT_WINDOW, files: vec![65536, 122880], ops };
        let host = host::run_on_host(&s);
        for &policy in FaultPolicy::ALL {
            if let Err(e) = compare(&s, &host, policy) {
                panic!("{name}: {e}");
            }
        }
    }
}
