use super::*;

#[test]
fn each_setter_sets_its_own_field() {
    // Every field differs from its default, and the literal names every
    // field: a new field fails to compile here until it gets a setter.
    let built = MmConfig::default()
        .policy(FaultPolicy::Speculative)
        .task_size(1 << 40)
        .mmap_base(1 << 39)
        .mmap_min_addr(0x2000)
        .lsm_mmap_min_addr(0x10000)
        .start_brk(1 << 30)
        .max_map_count(77)
        .stack_guard_gap(3 * PAGE_SIZE)
        .stack_limit(5 << 20)
        .thp_align(false)
        .fault_around_pages(4)
        .force_speculative(true)
        .memlock_limit(9 << 20)
        .cap_ipc_lock(true)
        .cap_sys_rawio(true)
        .pin_policy(PinPolicy::Batched)
        .unmap_policy(UnmapPolicy::Sectioned)
        .cap_sys_nice(true)
        .migrate_policy(MigratePolicy::OneByOne)
        .shootdown_policy(crate::tlb::ShootdownPolicy::NextAccess)
        .shootdown_targets(crate::tlb::ShootdownTargets::Broadcast)
        .posting_policy(crate::tlb::PostingPolicy::SharedBarrier)
        .hugetlb_policy(HugetlbPolicy::LockFree)
        .placement(PlacementPolicy::Arenas)
        .madvise_policy(MadvisePolicy::MmapLock)
        .writer_policy(WriterPolicy::Reserve)
        .host_file_coherence(HostFileCoherence::Cache)
        .atomic_alignment(crate::AtomicAlignment::Split)
        .time_unmaps(true);
    let want = MmConfig {
        policy: FaultPolicy::Speculative,
        task_size: 1 << 40,
        mmap_base: 1 << 39,
        mmap_min_addr: 0x2000,
        lsm_mmap_min_addr: 0x10000,
        start_brk: 1 << 30,
        max_map_count: 77,
        stack_guard_gap: 3 * PAGE_SIZE,
        stack_limit: 5 << 20,
        thp_align: false,
        fault_around_pages: 4,
        force_speculative: true,
        memlock_limit: 9 << 20,
        cap_ipc_lock: true,
        cap_sys_rawio: true,
        pin_policy: PinPolicy::Batched,
        unmap_policy: UnmapPolicy::Sectioned,
        cap_sys_nice: true,
        migrate_policy: MigratePolicy::OneByOne,
        shootdown_policy: crate::tlb::ShootdownPolicy::NextAccess,
        shootdown_targets: crate::tlb::ShootdownTargets::Broadcast,
        posting_policy: crate::tlb::PostingPolicy::SharedBarrier,
        hugetlb_policy: HugetlbPolicy::LockFree,
        placement: PlacementPolicy::Arenas,
        madvise_policy: MadvisePolicy::MmapLock,
        writer_policy: WriterPolicy::Reserve,
        host_file_coherence: HostFileCoherence::Cache,
        atomic_alignment: crate::AtomicAlignment::Split,
        time_unmaps: true,
    };
    assert_eq!(format!("{built:?}"), format!("{want:?}"));
    assert_ne!(format!("{:?}", MmConfig::default()), format!("{want:?}"));
}
