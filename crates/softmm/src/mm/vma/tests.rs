use std::sync::Arc;

use crate::mempolicy::MPOL_BIND;
use crate::uapi::*;
use crate::{AddressSpace, Cpu, MmConfig, PhysConfig, PhysMem, PAGE_SIZE};

fn two_nodes() -> Arc<PhysMem> {
    PhysMem::new(PhysConfig::new(2 * 64 * PAGE_SIZE).nodes(2)).unwrap()
}

fn spans(mm: &AddressSpace) -> Vec<(u64, u64, String)> {
    mm.maps().into_iter().map(|m| (m.start, m.end, m.perms)).collect()
}

/// Linux's `is_mergeable_vma` compares policies (`mpol_equal`) for
/// every merge, `mprotect`'s too: a range whose protection comes back
/// to its neighbour's does not merge with a neighbour of another
/// policy, and the neighbour keeps its policy.
#[test]
fn mprotect_does_not_merge_across_policies() {
    let phys = two_nodes();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, 4 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.mbind(a, 2 * PAGE_SIZE, MPOL_BIND, Some(&[0b10]), 3, 0).unwrap();
    mm.mprotect(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, PROT_READ).unwrap();
    mm.mprotect(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, PROT_READ | PROT_WRITE).unwrap();
    let want = [(a, a + 2 * PAGE_SIZE, "rw-p".to_string()), (a + 2 * PAGE_SIZE, a + 4 * PAGE_SIZE, "rw-p".into())];
    assert_eq!(spans(&mm), want);
    let mut cpu = Cpu::attached(&mm);
    cpu.write_u64(a, 1).unwrap();
    cpu.write_u64(a + 3 * PAGE_SIZE, 1).unwrap();
    let mut status = [i32::MIN; 2];
    mm.pages_stat(&[a, a + 3 * PAGE_SIZE], &mut status).unwrap();
    assert_eq!(status, [1, 0], "the bound half keeps its policy, the other has none");
}

/// A change in the middle of a VMA splits it in three, and the same
/// change over all of it merges the three back (`vma_modify`).
#[test]
fn a_change_in_the_middle_splits_in_three_and_merges_back() {
    let phys = two_nodes();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm.mmap(0, 6 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    mm.mprotect(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, PROT_READ).unwrap();
    let rw = "rw-p".to_string();
    let ro = "r--p".to_string();
    assert_eq!(
        spans(&mm),
        [
            (a, a + 2 * PAGE_SIZE, rw.clone()),
            (a + 2 * PAGE_SIZE, a + 4 * PAGE_SIZE, ro.clone()),
            (a + 4 * PAGE_SIZE, a + 6 * PAGE_SIZE, rw.clone())
        ]
    );
    mm.mprotect(a, 6 * PAGE_SIZE, PROT_READ).unwrap();
    assert_eq!(spans(&mm), [(a, a + 6 * PAGE_SIZE, ro)]);
    mm.munmap(a + PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
    assert_eq!(spans(&mm).len(), 2);
    drop(mm);
    assert_eq!(phys.quiesce().vmas, 0);
}

/// `max_map_count` is checked at each split, as `split_vma` does: the
/// head split goes (1 VMA, under the limit of 2), the tail split is
/// refused with `ENOMEM`, and the head stays split off with the flags
/// unchanged; a change needing one split at the limit changes nothing; a
/// change needing none goes ahead. (Host comparisons:
/// `tests/host/map_count_limit.rs`.)
#[test]
fn a_split_past_max_map_count_leaves_what_linux_leaves() {
    let phys = two_nodes();
    let mm = AddressSpace::new(&phys, MmConfig::default().max_map_count(2)).unwrap();
    let a = mm.mmap(0, 6 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, None, 0).unwrap();
    assert_eq!(mm.mprotect(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, PROT_READ), Err(crate::Errno::NoMem));
    let head_split = spans(&mm);
    assert_eq!(
        head_split.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
        [(a, a + 2 * PAGE_SIZE), (a + 2 * PAGE_SIZE, a + 6 * PAGE_SIZE)]
    );
    assert!(head_split.iter().all(|s| s.2.starts_with("rw")), "{head_split:?}");
    assert_eq!(mm.mbind(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, MPOL_BIND, Some(&[0b10]), 3, 0), Err(crate::Errno::NoMem));
    assert_eq!(spans(&mm), head_split);
    mm.mprotect(a, 2 * PAGE_SIZE, PROT_READ).unwrap();
    assert_eq!(spans(&mm).len(), 2);
}
thread_local! {
    /// What [`RecordingOps`] was asked on this thread.
    static CALLS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Hooks that refuse a split at [`REFUSED`] and record every call.
struct RecordingOps;
static RECORDING_OPS: RecordingOps = RecordingOps;
const REFUSED: u64 = 0x4000_3000;

impl crate::vma::VmaOps for RecordingOps {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn may_split(&self, _vma: &crate::vma::Vma, addr: u64) -> crate::Result<()> {
        CALLS.with(|c| c.borrow_mut().push(format!("may_split {addr:#x}")));
        if addr == REFUSED {
            return Err(crate::Errno::Perm);
        }
        Ok(())
    }
    fn split(&self, vma: &crate::vma::Vma, addr: u64) -> Option<std::ops::Range<u64>> {
        assert!(vma.lock.is_detached(), "split before the VMA left the tree");
        CALLS.with(|c| c.borrow_mut().push(format!("split {addr:#x}")));
        None
    }
    fn close(&self, _vma: &crate::vma::Vma, start: u64, end: u64) {
        CALLS.with(|c| c.borrow_mut().push(format!("close {start:#x}-{end:#x}")));
    }
}

fn calls() -> Vec<String> {
    CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

/// The core asks a VMA's own hooks, whatever its backing: each edge may
/// refuse (a refused tail leaving the head split off, as `vma_modify`'s
/// `split_vma` calls do), each split is told once the VMA is detached,
/// the pieces keep the hooks, and an unmap, which asks every edge before
/// anything changes, closes the part that goes (here with no
/// reservation, so the core asks nothing).
#[test]
fn splits_go_through_the_vmas_hooks() {
    let phys = two_nodes();
    let mm = AddressSpace::new(&phys, MmConfig::default()).unwrap();
    let a = mm
        .mmap(0x4000_0000, 6 * PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, None, 0)
        .unwrap();
    {
        let mut st = mm.write_lock();
        let v = st.vmas.find(a).cloned().unwrap();
        let mut hooked = v.rebound(v.start, v.end, v.pgoff);
        hooked.ops = &RECORDING_OPS;
        st.vmas.replace(v.start, hooked);
    }
    assert_eq!(mm.mprotect(a + PAGE_SIZE, 2 * PAGE_SIZE, PROT_READ), Err(crate::Errno::Perm));
    let rw = |s: u64, e: u64| (a + s * PAGE_SIZE, a + e * PAGE_SIZE, "rw-p".to_string());
    assert_eq!(spans(&mm), [rw(0, 1), rw(1, 6)], "a refused tail split leaves the head split off");
    assert_eq!(calls(), ["may_split 0x40001000", "may_split 0x40003000", "split 0x40001000"]);
    mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, PROT_READ).unwrap();
    assert_eq!(calls(), ["may_split 0x40002000", "split 0x40002000"]);
    assert_eq!(spans(&mm).len(), 3);
    let st = mm.read_lock();
    assert!(st.vmas.iter().all(|v| v.ops.name() == "recording"), "every piece keeps the hooks");
    drop(st);
    assert_eq!(mm.munmap(a + 4 * PAGE_SIZE, PAGE_SIZE), Ok(()));
    assert_eq!(calls(), ["may_split 0x40004000", "may_split 0x40005000", "split 0x40004000", "split 0x40005000"]);
}
