//! Every switch that breaks one step of a protocol, for the loom models
//! only: a model is trusted once it is seen to fail with the step removed
//! (each model's file names the switch it was seen to fail with). They are
//! kept in this one place, as crossbeam-epoch keeps its loom/std choice in
//! `mod primitive`, so that a reader finds every fault injection of the
//! crate at once; each module is named for the protocol it breaks, and the
//! protocol's own module imports it as `broken`, so a use site reads
//! `broken::no_list_fence()` beside the step it skips. Outside loom builds
//! the switches are constants `false` or absent.
//!
//! They depend on nothing of the crate (`std`'s atomics and thread-locals:
//! a switch is set by the model's test thread, outside any model
//! execution).

/// Declares a model's switch: a thread-local flag under loom (per OS
/// thread: loom runs every thread of a model on its test's thread, so a
/// model that sets it breaks itself only) and `$reader`, its value, which
/// is `false` outside loom builds.
macro_rules! switch {
    ($(#[$doc:meta])* $name:ident, $reader:ident) => {
        #[cfg(loom)]
        std::thread_local! {
            $(#[$doc])*
            pub(crate) static $name: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }

        #[doc = concat!("[`", stringify!($name), "`]'s value (false outside loom).")]
        #[inline(always)]
        pub(crate) fn $reader() -> bool {
            #[cfg(loom)]
            return $name.with(std::cell::Cell::get);
            #[cfg(not(loom))]
            false
        }
    };
}

/// The switches of the fill-owner protocol (`tlb/targets.rs`), its ranged
/// catch-up and a CPU's switch between address spaces (`Cpu::attach`);
/// models `tlb/loom_tests.rs`. Per OS thread: loom runs every thread of a
/// model on its test's thread, so a switch breaks the model of the test
/// that sets it and no other test running beside it.
#[cfg(loom)]
pub(crate) mod tlb {
    use std::cell::Cell;

    std::thread_local! {
        /// A locked change of a present entry does not add the owners it
        /// swapped out to its guard's (`PteGuard::replace`): the clear does
        /// not collect the CPUs its shootdown must ask.
        pub(crate) static CLEAR_SKIPS_OWNERS: Cell<bool> = const { Cell::new(false) };
        /// The TLB fill records itself with a plain store instead of a
        /// compare-exchange against the value it read (`Leaf::set_filled`).
        pub(crate) static FILL_STORES: Cell<bool> = const { Cell::new(false) };
        /// A catch-up takes a request's range from its slot without
        /// checking the slot's tag (`CpuTlbState::drop_requested`): a slot
        /// read before its initiator stored it yields an older request's
        /// range.
        pub(crate) static RANGE_WITHOUT_TAG: Cell<bool> = const { Cell::new(false) };
        /// A `Cpu` that leaves an address space or attaches to one keeps
        /// its TLB (`Cpu::empty_tlb` does nothing): a CPU out of the
        /// attached list, which no initiator asks, still holds entries.
        pub(crate) static SWITCH_KEEPS_TLB: Cell<bool> = const { Cell::new(false) };
        /// A section entered while its CPU is quiescent (by a callback that
        /// softmm runs inside a call of its thread) does not lift the
        /// quiescence (`CpuTlbState::lift_quiescence`): no shootdown waits
        /// for it.
        pub(crate) static SECTION_KEEPS_QUIESCENCE: Cell<bool> = const { Cell::new(false) };
    }
}

/// The switch of host memory's release protocol (`crate::host_mem`);
/// model `host_mem/loom_tests.rs`.
#[cfg(loom)]
pub(crate) mod host_mem {
    std::thread_local! {
        /// A write section that removes a host-memory VMA publishes the new
        /// tree without shooting every CPU down (step 2 of the protocol,
        /// `AddressSpace::end_write_section`).
        pub(crate) static NO_SHOOTDOWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}

/// The switch of page migration's freeze (`phys/frozen.rs`, the
/// migrators `migrate.rs` and `migrate/hugetlb.rs`); model
/// `migrate/loom_tests.rs`. Per OS thread, as `tlb`'s.
pub(crate) mod migrate {
    switch!(
        /// The migrator begins the flushes of its unmap but does not wait
        /// for them before it copies (they are waited for at the end of
        /// its batch), and still holds the proof that its freeze takes
        /// (`AddressSpace::flush_tlbs` of no address space): a CPU may
        /// write the old page through a translation it cached before the
        /// unmap. (Skipping the flush outright would break the copy as
        /// well, but loom, which sees no guest memory, would find no
        /// interleaving that differs: the migrator would never touch the
        /// CPU's state.)
        SKIP_FLUSH_WAIT,
        skip_flush_wait
    );
}

/// The switch of the per-CPU numbers (`sync/percpu.rs`, `PercpuIds`);
/// its model is beside them. Per OS thread, as `tlb`'s.
pub(crate) mod percpu_ids {
    switch!(
        /// A slot's next number is stored, not compare-exchanged against
        /// the number loaded: two threads of the slot take the same one.
        STORE_WITHOUT_COMPARE,
        store_without_compare
    );
}

/// The switches of the shootdown initiator (`tlb/shootdown.rs`); models
/// `tlb/loom_tests.rs`. Per OS thread, as `tlb`'s: every model's
/// shootdowns read it, and only the model that sets it may see it set.
pub(crate) mod shootdown {
    switch!(
        /// A lock-free initiator loads the published CPU list without the
        /// fence that orders its PTE changes before the load.
        NO_LIST_FENCE,
        no_list_fence
    );
}

/// The switches of the shared barrier (`tlb/shared_barrier.rs`); models
/// `tlb/loom_tests.rs`. Per OS thread, as `tlb`'s.
pub(crate) mod shared_barrier {
    switch!(
        /// An initiator is content with a barrier that had already started
        /// when it loaded `started` (waits for `done >= s`, not `s + 1`).
        JOIN_RUNNING,
        join_running
    );
}

/// The switches of the per-CPU fence mode (`tlb/fence_mode.rs`); models
/// `tlb/loom_tests.rs`. Per OS thread, as `tlb`'s.
pub(crate) mod fence_mode {
    switch!(
        /// An initiator whose every target fences skips the barrier and its
        /// own fence too.
        SKIP_WITHOUT_FENCE,
        skip_without_fence
    );
}

/// The switches of the commit charge (`phys/commit.rs`); model
/// `phys/commit/loom_tests.rs`. Per OS thread, as `tlb`'s.
pub(crate) mod commit {
    switch!(
        /// `OVERCOMMIT_NEVER` charges check their sum without the `never` lock.
        UNLOCKED_NEVER_CHECK,
        unlocked_never_check
    );
}

/// The switches of seed 000's schemes (`phys/hugetlb/lock.rs`,
/// `fault/hugetlb.rs`, `file/hugetlbfs.rs`, the page tables' free); models
/// `hugetlb/loom_tests.rs`, `migrate/loom_tests.rs`.
///
/// Switches for the loom models only (`hugetlb/loom_tests.rs`), each
/// breaking one mechanism so a model can show that it catches the race
/// the mechanism closes.
#[cfg(loom)]
pub(crate) mod hugetlb {
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Faults skip their policy's lock (`IMmapRwsem`, `VmaLock`) or
    /// validation (`LockFree`).
    pub(crate) static SKIP_POLICY: AtomicBool = AtomicBool::new(false);
    /// Truncate and hole punch do not zap again a page that a fault mapped
    /// between their first zap and the page's removal.
    pub(crate) static SKIP_REZAP: AtomicBool = AtomicBool::new(false);
    /// A zap of a shareable hugetlb VMA under `mmap_lock` for read
    /// (`MADV_DONTNEED`, truncate, hole punch) takes neither the VMA lock
    /// nor `i_mmap` for write around its walk (no `__hugetlb_zap_begin`).
    pub(crate) static SKIP_ZAP_LOCK: AtomicBool = AtomicBool::new(false);

    /// `huge_pmd_share` links nothing (set by the models once their
    /// tables are shared). Not a broken variant: loom treats a thread
    /// parked at a `try_read` as waiting for the lock, so a writer that
    /// takes that `mmap_lock` and then waits for `i_mmap`, which the
    /// sharing fault holds, is reported as a deadlock that cannot happen
    /// (the `try_read` fails). In loom 0.7.2, `try_acquire_read_lock`
    /// registers the thread's next operation as a read of the lock
    /// (`branch_action`), and `post_acquire_write_lock` marks every other
    /// thread whose next operation is on that lock blocked, a try
    /// included; no retry loop is involved, so a `yield_now` would not
    /// help. With it set, a fault whose table was unshared allocates a
    /// table of its own instead of linking one again; the model with no
    /// `mmap_lock` writer (`dontneed_vs_resharing_fault`) leaves it clear
    /// and re-shares.
    pub(crate) static NO_SHARE: AtomicBool = AtomicBool::new(false);

    /// Held by every model whose faults read these switches (they are
    /// process-wide, and loom requires each model to replay the same
    /// execution): one such model at a time.
    #[cfg(test)]
    pub(crate) static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A dying tree that shared a PMD table frees the PMD tables whose last
    /// link it held at once, not after a grace period (`PageTables`'
    /// drop); under loom such a table is marked freed instead
    /// (`pgtable::table::Table::freed`) and a lock of it sets
    /// [`USED_FREED_TABLE`].
    pub(crate) static FREE_AT_ONCE: AtomicBool = AtomicBool::new(false);
    /// `hugetlb_wp` and the pin's unshare take no page lock, and take their
    /// reference on the page they copy from only after the PMD lock is gone,
    /// from the frame number read under it: a migration (or a zap) may free
    /// the page in between, and the copy's reference then lands on a free
    /// page (the order before the reference came from the locked entry).
    pub(crate) static UNLOCKED_PAGE_REF: AtomicBool = AtomicBool::new(false);
    /// `huge_pmd_share` links the table of another address space's VMA
    /// without taking that VMA's read reference (and so without seeing it
    /// detached): a writer there (`munmap`) may zap and free the table
    /// while the link is made.
    pub(crate) static SHARE_WITHOUT_VMA_REF: AtomicBool = AtomicBool::new(false);
    /// Set when a walker locked a PMD table that a dying tree had freed
    /// (under [`FREE_AT_ONCE`]): a use after free.
    pub(crate) static USED_FREED_TABLE: AtomicBool = AtomicBool::new(false);

    pub(crate) fn free_at_once() -> bool {
        FREE_AT_ONCE.load(Ordering::Relaxed)
    }

    pub(crate) fn share_without_vma_ref() -> bool {
        SHARE_WITHOUT_VMA_REF.load(Ordering::Relaxed)
    }

    pub(crate) fn no_share() -> bool {
        NO_SHARE.load(Ordering::Relaxed)
    }

    pub(crate) fn skip_policy() -> bool {
        SKIP_POLICY.load(Ordering::Relaxed)
    }

    pub(crate) fn skip_zap_lock() -> bool {
        SKIP_ZAP_LOCK.load(Ordering::Relaxed)
    }

    pub(crate) fn skip_rezap() -> bool {
        SKIP_REZAP.load(Ordering::Relaxed)
    }

    pub(crate) fn unlocked_page_ref() -> bool {
        UNLOCKED_PAGE_REF.load(Ordering::Relaxed)
    }
}

/// The switches of writeback (`Inode::writeback`, `page_mkclean`); model
/// `host_file/loom_tests.rs`. Per OS thread: a loom model's threads all run
/// on the thread of its test, and other tests are left alone.
pub(crate) mod writeback {
    #[cfg(all(test, loom))]
    std::thread_local! {
        /// The dirty flag is cleared after the copy instead of before the
        /// write-protect.
        pub(crate) static CLEAR_AFTER_COPY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// No `page_mkclean`: mappings stay writable across writeback.
        pub(crate) static SKIP_MKCLEAN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// `page_mkclean` write-protects but does not wait for the TLB
        /// shootdown before the copy.
        pub(crate) static SKIP_MKCLEAN_FLUSH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[inline(always)]
    pub(crate) fn clear_after_copy() -> bool {
        #[cfg(all(test, loom))]
        return CLEAR_AFTER_COPY.with(|c| c.get());
        #[cfg(not(all(test, loom)))]
        false
    }

    #[inline(always)]
    pub(crate) fn skip_mkclean() -> bool {
        #[cfg(all(test, loom))]
        return SKIP_MKCLEAN.with(|c| c.get());
        #[cfg(not(all(test, loom)))]
        false
    }

    #[inline(always)]
    pub(crate) fn skip_mkclean_flush() -> bool {
        #[cfg(all(test, loom))]
        return SKIP_MKCLEAN_FLUSH.with(|c| c.get());
        #[cfg(not(all(test, loom)))]
        false
    }
}

/// The switch of the PTE lock's role in a zap (`AddressSpace::zap_walk`);
/// model `sys/loom_tests.rs`. Per OS thread: loom runs every thread of a
/// model on its test's thread.
#[cfg(loom)]
pub(crate) mod pgtable {
    use std::cell::Cell;

    std::thread_local! {
        /// The zap decides on each entry from a read taken before it locks
        /// the table, not under the PTE lock: a fault's locked commit may
        /// land between the read and the clear, which then drops the
        /// committed page without its reference.
        pub(crate) static ZAP_READS_UNLOCKED: Cell<bool> = const { Cell::new(false) };
    }
}

/// The switches of the per-VMA `madvise` (`sys/madvise.rs`); models
/// `sys/loom_tests.rs`. Per OS thread, as `tlb`'s: every model's
/// `MADV_DONTNEED` reads it. Outside loom builds every switch is off.
pub(crate) mod madvise {
    switch!(
        /// The per-VMA path takes no read reference on the VMA it found: it
        /// zaps under that VMA's flags whether or not a writer has replaced it.
        NO_VMA_REF,
        no_vma_ref
    );
}

/// The switches of the range writers' shared mode (`sync/range_writers.rs`);
/// model `sync/loom_tests.rs`'s `range_writer_vs_blocker`. Per OS thread,
/// as the tlb switches.
pub(crate) mod range_writers {
    #[cfg(loom)]
    use std::cell::Cell;

    #[cfg(loom)]
    std::thread_local! {
        /// A range writer looks at `blockers` without the SeqCst fence
        /// after its announcement.
        pub(crate) static NO_ENTER_FENCE: Cell<bool> = const { Cell::new(false) };
        /// A range writer enters without looking at `blockers`.
        pub(crate) static NO_RECHECK: Cell<bool> = const { Cell::new(false) };
        /// A range writer removes VMAs from its window's view without
        /// detaching them (`VmaTree::remove`): a lock-free fault that found
        /// one goes on and commits after the zap (`mm/loom_tests.rs`,
        /// `a_range_munmap_against_a_fault_in_its_range`).
        pub(crate) static NO_DETACH: Cell<bool> = const { Cell::new(false) };
        /// A range writer does not take its window's lock: two writers of
        /// one window both change the version they loaded, and the second
        /// publication loses the first's change
        /// (`a_range_mmap_against_a_merging_neighbour`).
        pub(crate) static NO_WINDOW_LOCK: Cell<bool> = const { Cell::new(false) };
        /// An `mmap_lock` holder under the range policy, writer or reader,
        /// neither blocks nor drains the range writers
        /// (`AddressSpace::write_lock`, `read_lock`,
        /// `read_lock_recursive`): fork copies a VMA a range writer is
        /// removing (`a_range_munmap_against_fork`); a fault gives its
        /// `anon_vma` to a VMA a range `madvise` has replaced
        /// (`a_range_madvise_against_a_fault_in_its_range`); a truncate's
        /// reverse-map walk zaps a file page's old place while a range
        /// `mremap` moves it to a new one
        /// (`a_range_mremap_of_a_file_against_truncate`).
        pub(crate) static NO_BLOCK: Cell<bool> = const { Cell::new(false) };
        /// A range writer's check of its slot's share of the room below
        /// `max_map_count` (`RangeState::map_count_share`) does not count
        /// the other writers inside in its slot: two writers of one slot
        /// that both read its change before either adds to it both go
        /// ahead, and together pass the limit
        /// (`a_range_writer_pair_against_the_map_count_limit`).
        pub(crate) static NO_COUNT_OTHERS: Cell<bool> = const { Cell::new(false) };
        /// A range writer's `munmap` zaps after it has published its
        /// window and left the shared mode, as a lock-free unmap would: a
        /// truncate that walks the address space's VMAs of the file after
        /// the publication misses the entries still there and returns with
        /// a dropped page mapped (`a_range_munmap_of_a_file_against_truncate`).
        pub(crate) static ZAP_AFTER_LEAVE: Cell<bool> = const { Cell::new(false) };
        /// An `mmap` of a file links the address space to the file
        /// (`AddressSpace::link_file`) after it has published the new VMA
        /// and left the shared mode or `mmap_lock`: a fault in the new
        /// mapping installs a page, and a truncate whose reverse-map walk
        /// finds no link returns with its dropped page mapped
        /// (`a_range_mmap_of_a_file_against_truncate`).
        pub(crate) static LINK_AFTER_LEAVE: Cell<bool> = const { Cell::new(false) };
        /// A range `munmap` that emptied its window looks at the rest of
        /// its 512 GiB region (`AddressSpace::range_free_emptied_region`)
        /// without the SeqCst fence after its publication: two writers
        /// that empty the region's last two windows each see the other's
        /// window as it was, and neither frees the region's PUD table
        /// (`two_range_munmaps_that_empty_a_region_free_its_pud_table`).
        pub(crate) static NO_REGION_FENCE: Cell<bool> = const { Cell::new(false) };
    }

    /// [`NO_REGION_FENCE`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn no_region_fence() -> bool {
        #[cfg(loom)]
        return NO_REGION_FENCE.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    /// [`LINK_AFTER_LEAVE`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn link_after_leave() -> bool {
        #[cfg(loom)]
        return LINK_AFTER_LEAVE.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    /// [`ZAP_AFTER_LEAVE`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn zap_after_leave() -> bool {
        #[cfg(loom)]
        return ZAP_AFTER_LEAVE.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    /// [`NO_DETACH`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn no_detach() -> bool {
        #[cfg(loom)]
        return NO_DETACH.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    /// [`NO_WINDOW_LOCK`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn no_window_lock() -> bool {
        #[cfg(loom)]
        return NO_WINDOW_LOCK.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    /// [`NO_COUNT_OTHERS`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn no_count_others() -> bool {
        #[cfg(loom)]
        return NO_COUNT_OTHERS.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    /// [`NO_BLOCK`]'s value (false outside loom).
    #[inline(always)]
    pub(crate) fn no_block() -> bool {
        #[cfg(loom)]
        return NO_BLOCK.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    #[inline(always)]
    pub(crate) fn no_enter_fence() -> bool {
        #[cfg(loom)]
        return NO_ENTER_FENCE.with(Cell::get);
        #[cfg(not(loom))]
        false
    }

    #[inline(always)]
    pub(crate) fn no_recheck() -> bool {
        #[cfg(loom)]
        return NO_RECHECK.with(Cell::get);
        #[cfg(not(loom))]
        false
    }
}

/// Runs a loom model of the real code as it is, where no execution may go
/// wrong (a panic fails the test), then with the thread-local `switch` set,
/// where some execution must: how a model shows that it catches what its
/// switch breaks. The model reports what went wrong rather than panicking
/// (a panic inside a loom execution aborts the process while loom objects
/// unwind). Preemption bound 2 (the broken variant: 1, then 2 if that
/// showed nothing wrong), and room for the real calls' many steps (locks,
/// epoch, frame counts).
#[cfg(all(test, loom))]
pub(crate) fn check_model(
    model: fn() -> Result<(), String>,
    switch: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
) {
    let builder = || {
        let mut b = crate::sync::model::Builder::new();
        b.preemption_bound = Some(2);
        b.max_branches = 100_000;
        b
    };
    // Per OS thread, which runs every thread of the model.
    switch.with(|s| s.set(false));
    builder().check(move || {
        if let Err(e) = model() {
            panic!("{e}");
        }
    });
    switch.with(|s| s.set(true));
    let caught = caught(2, builder, move || model().is_err());
    switch.with(|s| s.set(false));
    assert!(caught, "the model did not catch the broken variant");
}

/// Whether some execution of a broken variant's model goes wrong (`wrong`
/// returns `true`) under loom, with the builder `builder` makes, searched
/// under preemption bound 1, then each larger bound up to `max` until one
/// shows it. A missing step usually shows under one preemption, whose
/// search is a fraction of a larger bound's (loom cannot stop a search at
/// its first wrong execution: a panic inside one aborts the process), and
/// the variant is shown wrong as well by any bound. Halved the address
/// space's models (`mm::loom_tests`, 134 s to 67 s on the 2-CPU VM).
#[cfg(all(test, loom))]
pub(crate) fn caught<F>(max: usize, builder: impl Fn() -> crate::sync::model::Builder, wrong: F) -> bool
where
    F: Fn() -> bool + Sync + Send + Clone + 'static,
{
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let seen = std::sync::Arc::new(AtomicBool::new(false));
    for bound in 1..=max {
        let mut b = builder();
        b.preemption_bound = Some(bound);
        let (seen_here, wrong) = (seen.clone(), wrong.clone());
        b.check(move || {
            if wrong() {
                seen_here.store(true, Relaxed);
            }
        });
        if seen.load(Relaxed) {
            return true;
        }
    }
    false
}

/// The switches of the publication of the VMA set's windows
/// (`vma/windows.rs`, `VmaTree::publish_changed`): the lookup's recheck,
/// model `mm/loom_tests.rs`; the order, test
/// `sys::publish_tests::the_order_matters` (a test build's switch, not a
/// loom one: what it breaks is seen between two publications of one
/// thread). Per OS thread, as `tlb`'s.
pub(crate) mod windows {
    #[cfg(any(test, loom))]
    std::thread_local! {
        /// The changed windows are published in the reverse of the order
        /// that never shows a hole: a split's left window before its right
        /// one, a merge's losing window before its gaining one.
        pub(crate) static PUBLISH_REVERSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[cfg(loom)]
    std::thread_local! {
        /// A lock-free lookup that falls through to the windows below and
        /// finds nothing returns that without confirming it against the
        /// sequence count of sections publishing several windows.
        pub(crate) static NO_FALL_THROUGH_RECHECK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[inline(always)]
    pub(crate) fn no_fall_through_recheck() -> bool {
        #[cfg(loom)]
        return NO_FALL_THROUGH_RECHECK.with(|c| c.get());
        #[cfg(not(loom))]
        false
    }

    #[inline(always)]
    pub(crate) fn publish_reversed() -> bool {
        #[cfg(any(test, loom))]
        return PUBLISH_REVERSED.with(|c| c.get());
        #[cfg(not(any(test, loom)))]
        false
    }
}

/// The switch of a thread's own RCU callbacks (`sync/rcu.rs`,
/// `reclaim_own`); model `mm/loom_tests.rs`.
pub(crate) mod rcu {
    #[cfg(loom)]
    std::thread_local! {
        /// `reclaim_own` frees every queued free without waiting for its
        /// batch's marker: no grace period.
        pub(crate) static FREE_WITHOUT_GRACE_PERIOD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[inline(always)]
    pub(crate) fn free_without_grace_period() -> bool {
        #[cfg(loom)]
        return FREE_WITHOUT_GRACE_PERIOD.with(|c| c.get());
        #[cfg(not(loom))]
        false
    }
}
