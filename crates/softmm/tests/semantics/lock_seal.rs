//! What the host comparison (`lock_seal_host`) cannot run in a child of
//! this process: `fork`'s inheritance of seals, locks, `MCL_FUTURE` and
//! MDWE, the heap under `mlockall`, and `VmLck`.

use softmm::uapi::*;
use softmm::*;
use softmm_testkit::common::*;

fn mm(config: MmConfig) -> std::sync::Arc<AddressSpace> {
    AddressSpace::new(&phys(16), config).unwrap()
}

#[test]
fn a_child_keeps_seals_and_mdwe_but_not_locks() {
    let parent = mm(MmConfig::default());
    let a = parent.mmap(0, 4 * PAGE, PROT_READ, ANON, None, 0).unwrap();
    parent.mlock(a, 2 * PAGE).unwrap();
    parent.mseal(a + 2 * PAGE, PAGE, 0).unwrap();
    parent.mlockall(MCL_FUTURE).unwrap();
    parent.prctl_set_mdwe(PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0).unwrap();
    assert_eq!(parent.stats().locked_pages, 2);
    let child = parent.fork().unwrap();
    assert_eq!(child.stats().locked_pages, 0);
    assert!(child.maps().iter().all(|m| !m.vm_flags.contains("lo")));
    assert_eq!(child.munmap(a + 2 * PAGE, PAGE), Err(Errno::Perm));
    assert_eq!(child.prctl_get_mdwe(0, 0, 0, 0), Ok(PR_MDWE_REFUSE_EXEC_GAIN));
    assert_eq!(child.mprotect(a, PAGE, PROT_READ | PROT_EXEC), Err(Errno::Acces));
    // MCL_FUTURE is not inherited: the child's new mapping is not locked.
    let b = child.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
    assert!(child.maps().iter().any(|m| m.start == b && !m.vm_flags.contains("lo")));
    // The parent's is.
    let c = parent.mmap(0, PAGE, PROT_READ, ANON, None, 0).unwrap();
    assert!(parent.maps().iter().any(|m| m.start == c && m.vm_flags.contains("lo")));
}

#[test]
fn no_inherit_drops_mdwe_in_the_child() {
    let parent = mm(MmConfig::default());
    parent.prctl_set_mdwe(PR_MDWE_REFUSE_EXEC_GAIN | PR_MDWE_NO_INHERIT, 0, 0, 0).unwrap();
    let child = parent.fork().unwrap();
    assert_eq!(child.prctl_get_mdwe(0, 0, 0, 0), Ok(0));
    child.mmap(0, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC, ANON, None, 0).unwrap();
}

#[test]
fn the_heap_grows_locked_under_mcl_future_within_the_limit() {
    let mm = mm(MmConfig::default().memlock_limit(4 * PAGE));
    let start = mm.brk(0);
    mm.mlockall(MCL_FUTURE).unwrap();
    assert_eq!(mm.brk(start + 2 * PAGE), start + 2 * PAGE);
    let st = mm.stats();
    assert_eq!((st.locked_pages, st.rss_pages), (2, 2), "locked and faulted in");
    // Past the limit: refused, the break unchanged.
    assert_eq!(mm.brk(start + 8 * PAGE), start + 2 * PAGE);
    // A mapping past it: EAGAIN.
    assert_eq!(mm.mmap(0, 4 * PAGE, PROT_READ, ANON, None, 0), Err(Errno::Again));
    mm.munlockall().unwrap();
    assert_eq!(mm.stats().locked_pages, 0);
    assert_eq!(mm.brk(start + 8 * PAGE), start + 8 * PAGE);
}

#[test]
fn mlock_faults_the_range_in_and_onfault_does_not() {
    let mm = mm(MmConfig::default());
    let a = mm.mmap(0, 8 * PAGE, PROT_READ | PROT_WRITE, ANON, None, 0).unwrap();
    mm.mlock2(a, 4 * PAGE, MLOCK_ONFAULT).unwrap();
    assert_eq!(mm.stats().rss_pages, 0);
    mm.mlock(a + 4 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(mm.stats().rss_pages, 4);
    assert_eq!(mm.stats().locked_pages, 8);
    let flags: Vec<String> = mm.maps().into_iter().map(|m| m.vm_flags).collect();
    assert_eq!(flags, ["rd wr mr mw me lo lf ac", "rd wr mr mw me lo ac"]);
}

/// An unfaulted anonymous `MREMAP_DONTUNMAP` move into the locked VMA
/// beside its own source: Linux 6.12's `copy_vma` does not merge the
/// destination with the source it keeps (`keep_source`), so the
/// destination joins the locked VMA before it, and the source, whose lock
/// a `DONTUNMAP` move always clears, stays a VMA of its own. Linux 6.18
/// merges all three and clears the lock of the whole VMA, the part never
/// moved included (seen on the host); softmm follows 6.12, and the host
/// differential does not generate the case.
#[test]
fn a_dontunmap_move_keeps_its_locked_source_apart_as_linux_6_12() {
    let mm = mm(MmConfig::default());
    let a = mm.mmap(0, 12 * PAGE, RW, ANON, None, 0).unwrap();
    mm.mlock2(a, 12 * PAGE, MLOCK_ONFAULT).unwrap();
    let flags = MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP;
    assert_eq!(mm.mremap(a + 9 * PAGE, 3 * PAGE, 3 * PAGE, flags, a + 6 * PAGE), Ok(a + 6 * PAGE));
    let maps: Vec<_> = mm
        .maps()
        .into_iter()
        .map(|m| (m.start - a, m.end - a, m.vm_flags.contains("lf"), m.vm_flags.contains("lo")))
        .collect();
    assert_eq!(maps, [(0, 9 * PAGE, true, true), (9 * PAGE, 12 * PAGE, false, false)]);
}
