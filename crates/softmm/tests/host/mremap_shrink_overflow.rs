//! A shrinking `mremap` whose `old_len` runs past the end of the address
//! space (issue 16, item 5), compared with the host kernel call by call and
//! map by map, in the style of `differential.rs`.
//!
//! Linux's `mremap` shrinks with `do_vmi_munmap(addr + new_len, old_len -
//! new_len)`, whose range check (`start > TASK_SIZE || len > TASK_SIZE -
//! start`) refuses a tail that passes `TASK_SIZE` or wraps 2^64 with
//! `EINVAL`, and unmaps nothing. A tail inside the address space is unmapped
//! whatever it covers: holes and other VMAs after the one at `addr`.

use softmm_testkit::differential::{host, ops};

use std::sync::Arc;

use ops::{MapLine, Op, Outcome, Scenario, Trace};
use softmm::uapi::*;
use softmm::{AddressSpace, File, MmConfig, OpenFile, PhysConfig, PhysMem};

const P: u64 = ops::PAGE;
const TASK_SIZE: u64 = 0x7fff_ffff_f000;
const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

/// Runs `s` on softmm laid out like the host child (see `differential.rs`).
fn run_on_softmm(s: &Scenario) -> Trace {
    let phys = PhysMem::new(PhysConfig::new(16 << 20)).expect("arena");
    let trace = {
        let mm = AddressSpace::new(&phys, MmConfig::default().mmap_base(s.window.1)).expect("valid config");
        mm.mmap(s.window.1, P, PROT_NONE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, None, 0)
            .expect("placeholder above the window");
        let files: Vec<Arc<File>> = s
            .files
            .iter()
            .enumerate()
            .map(|(i, &size)| File::create(&phys, &format!("/memfd:f{i} (deleted)"), size).expect("file"))
            .collect();
        let steps = s
            .ops
            .iter()
            .map(|op| {
                let r = match *op {
                    Op::Mmap { addr, len, prot, flags, file, offset } => {
                        let of = file.map(|i| OpenFile::read_write(&files[i]));
                        mm.mmap(addr, len, prot, flags, of.as_ref(), offset)
                    }
                    Op::Mremap { old_addr, old_len, new_len, flags, new_addr } => {
                        mm.mremap(old_addr, old_len, new_len, flags, new_addr)
                    }
                    Op::Munmap { addr, len } => mm.munmap(addr, len).map(|()| 0),
                    ref other => panic!("not used here: {other:?}"),
                };
                let out = match r {
                    Ok(v) => Outcome::Ok(v),
                    Err(e) => Outcome::Err(e.code()),
                };
                let maps = mm
                    .maps()
                    .into_iter()
                    .filter(|e| e.start < s.window.1 && e.end > s.window.0)
                    .map(|e| MapLine {
                        start: e.start,
                        end: e.end,
                        perms: e.perms,
                        offset: e.offset,
                        anon: e.inode == 0,
                    })
                    .collect();
                (out, maps)
            })
            .collect();
        Trace { steps }
    };
    let left = phys.quiesce();
    assert_eq!((left.frames_used, left.page_tables, left.vmas), (0, 0, 0), "leak after {s:?}");
    trace
}

/// A 4-page VMA at `w - 16P`, a hole of 2 pages, a 2-page file VMA at
/// `w - 10P`, then `op`, then a probe of the result by a `munmap` of the
/// whole setup (which must succeed on both).
fn scenario(op: Op) -> Scenario {
    let w = ops::DEFAULT_WINDOW.1;
    Scenario {
        window: ops::DEFAULT_WINDOW,
        files: vec![16 * P],
        ops: vec![
            Op::Mmap { addr: w - 16 * P, len: 4 * P, prot: 3, flags: ANON | MAP_FIXED, file: None, offset: 0 },
            Op::Mmap { addr: w - 10 * P, len: 2 * P, prot: 3, flags: MAP_SHARED | MAP_FIXED, file: Some(0), offset: 0 },
            op,
            Op::Munmap { addr: w - 16 * P, len: 16 * P },
        ],
    }
}

/// Every shrinking `mremap` of the VMA at `w - 16P` whose old length ends
/// past `TASK_SIZE`, wraps 2^64, or lies within the window across the hole
/// and the next VMA; with and without `MREMAP_MAYMOVE`.
fn cases() -> Vec<Op> {
    let w = ops::DEFAULT_WINDOW.1;
    let a = w - 16 * P;
    let old_lens = [
        // The issue's case: addr + old_len passes 2^64.
        u64::MAX - P + 1,
        u64::MAX - a + 1,
        u64::MAX - a + 1 + P,
        u64::MAX - a + 1 + 5 * P,
        // Rounded up, it wraps to 0 (then old_len < new_len: a grow).
        u64::MAX,
        // Past TASK_SIZE without wrapping.
        TASK_SIZE - a + P,
        TASK_SIZE,
        1 << 47,
        1 << 63,
        // Within the window, over the hole and the file VMA.
        8 * P,
        7 * P + 1,
        16 * P,
    ];
    let mut out = Vec::new();
    for old_len in old_lens {
        for new_len in [1, P, 2 * P, 4 * P] {
            for flags in [0, MREMAP_MAYMOVE] {
                out.push(Op::Mremap { old_addr: a, old_len, new_len, flags, new_addr: 0 });
            }
        }
    }
    out
}

#[test]
fn shrinking_mremap_with_overflowing_old_len_matches_the_host() {
    let mut checked = 0;
    for op in cases() {
        let s = scenario(op.clone());
        if let Err(e) = host::check_scenario(&s) {
            panic!("case not safe on the host ({e}): {op:?}");
        }
        let host = host::run_on_host(&s);
        let mine = run_on_softmm(&s);
        assert_eq!(host.steps.len(), mine.steps.len());
        for (i, (h, m)) in host.steps.iter().zip(&mine.steps).enumerate() {
            assert_eq!(h, m, "step {i} of {:?} differs (host left, softmm right)", s.ops);
        }
        checked += 1;
    }
    assert_eq!(checked, 96);
}

#[test]
fn the_issue_case_is_einval_and_changes_nothing() {
    // The exact case: 4 pages at `a`, old_len from `a` past 2^64, shrink to
    // one page. Linux refuses the unmap of the tail (EINVAL).
    let w = ops::DEFAULT_WINDOW.1;
    let a = w - 16 * P;
    let s = scenario(Op::Mremap { old_addr: a, old_len: u64::MAX - a + 1 + P, new_len: P, flags: 0, new_addr: 0 });
    let host = host::run_on_host(&s);
    assert_eq!(host.steps[2].0, Outcome::Err(libc::EINVAL), "the host's answer changed");
    assert_eq!(host.steps[2].1, host.steps[1].1, "the host changed the maps");
    assert_eq!(host.steps, run_on_softmm(&s).steps, "host left, softmm right");
}
