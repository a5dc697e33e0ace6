//! The host's PMD sharing, as the number softmm's hugetlb must match: a
//! `fork`ed child reading all 512 pages of a 1 GiB hugetlbfs window that its
//! parent already faulted in takes one minor fault when the window is
//! shared and PUD-aligned (it links the parent's PMD table), and 512 when
//! it is not aligned or the mapping is private. Skipped, with the host's
//! reason printed, where no 512 huge pages can be reserved.

use softmm_hostsys::{probe_pmd_share, HugePages, Placement, ShareProbe, PAGES_PER_PUD};

/// The probe of each placement under one reservation, or `None` (the reason
/// printed) where the host refuses.
fn probes() -> Option<Vec<(Placement, ShareProbe)>> {
    let guard = match HugePages::reserve_with_mount(PAGES_PER_PUD as usize) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return None;
        }
    };
    let dir = guard.mount_dir().expect("mounted");
    let all = [Placement::SharedPudAligned, Placement::SharedMisaligned, Placement::Private];
    Some(all.into_iter().map(|p| (p, probe_pmd_share(dir, p).unwrap_or_else(|e| panic!("{p:?}: {e}")))).collect())
}

#[test]
fn a_forked_child_shares_the_pmd_table_of_an_aligned_shared_window_and_of_no_other() {
    let Some(probes) = probes() else { return };
    for (placement, p) in &probes {
        eprintln!("{placement:?}: {p:?}");
        assert_eq!(p.pages, 512);
        assert_eq!(p.parent_minflt, 512, "{placement:?}: the parent faults every page in itself");
        let want = if *placement == Placement::SharedPudAligned { 1 } else { 512 };
        assert_eq!(p.child_minflt, want, "{placement:?}");
    }
}
