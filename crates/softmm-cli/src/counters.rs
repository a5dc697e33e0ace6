//! Counters of samples: the [`Counters`] trait every experiment's own
//! counters type implements, the [`counters!`] macro that declares one, and
//! the thread sweep's type, [`FaultCounters`], which the headline hands on
//! to the seed rows (the other experiments declare theirs beside their
//! sweeps).
//!
//! A leaf: it imports nothing else of the lab.

/// A sample's counters, totals for the sample: each experiment has its own
/// type (declared with [`counters!`]), whose fields are the JSON
/// `counters` keys its samples write, each absent where it does not apply.
pub trait Counters: Clone + Default + std::fmt::Debug {
    /// Adds `other`'s counters into these (a table row's total over its
    /// repeats): totals add up; durations and rates keep the worst.
    fn add(&mut self, other: &Self);
}

/// Declares an experiment's [`Counters`] type: each field an `Option<u64>`
/// and a JSON key (left out where `None`), marked `sum` (a total, which a
/// row adds up over its repeats) or `max` (a duration or rate, of which a
/// row keeps the worst).
macro_rules! counters {
    ($(#[$m:meta])* $vis:vis struct $name:ident { $($(#[$fm:meta])* $how:ident $field:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        $vis struct $name {
            $(
                $(#[$fm])*
                #[serde(skip_serializing_if = "Option::is_none", default)]
                pub $field: Option<u64>,
            )*
        }

        impl $crate::counters::Counters for $name {
            fn add(&mut self, o: &Self) {
                $($crate::counters::counters!(@add $how, self.$field, o.$field);)*
            }
        }
    };
    (@add sum, $a:expr, $b:expr) => {
        if let Some(b) = $b {
            $a = Some($a.unwrap_or(0) + b);
        }
    };
    (@add max, $a:expr, $b:expr) => {
        if let Some(b) = $b {
            $a = Some($a.map_or(b, |a: u64| a.max(b)));
        }
    };
}
pub(crate) use counters;

counters! {
    /// The thread sweep's counters (pft, will-it-scale, tlb-flush,
    /// interference, cortenmm, big-munmap): the faults', `mmap_lock`'s and the
    /// shootdowns' of every sample, and big-munmap's own.
    pub struct FaultCounters {
        /// Page faults (softmm: handled by its CPUs; host: minor faults of the tasks).
        sum faults,
        /// `mmap_lock` acquisitions: by faults, plus the address spaces' own.
        sum mmap_lock_acquisitions,
        /// The part of `mmap_lock_acquisitions` taken for write (softmm's
        /// address spaces' own: its faults never write-lock).
        sum mmap_lock_writes,
        /// Calls softmm's range-parallel writers completed without
        /// `mmap_lock` (`--policy range`; `MmStats::range`).
        sum range_writes,
        /// Range-writer conflicts: the shared mode refused (an `mmap_lock`
        /// holder blocked it) or a window's lock found held.
        sum range_conflicts,
        /// TLB flush requests sent to other CPUs.
        sum flush_requests,
        /// Nanoseconds the flushes spent waiting for CPUs inside an access
        /// (softmm's `TlbStats::flush_wait_ns`).
        sum flush_wait_ns,
        /// TLB shootdowns begun (softmm's `TlbStats::flushes`).
        sum shootdowns,
        /// Shootdowns that asked no CPU of another thread: no request, no
        /// barrier, no wait (softmm's `TlbStats::local_flushes`).
        sum local_shootdowns,
        /// Process-wide barriers the shootdowns issued, `membarrier` (softmm's
        /// `TlbStats::barriers`).
        sum barriers,
        /// Flushes covered by another initiator's barrier
        /// (`TlbStats::barriers_joined`).
        sum barriers_joined,
        /// Writes the flushes made to shared cache lines
        /// (`TlbStats::shared_writes`, `shared-write-stats` builds).
        sum flush_shared_writes,
        /// Lock-free fault attempts.
        sum spec_attempts,
        /// Lock-free attempts aborted (every cause).
        sum spec_aborts,
        /// Lock-free attempts that fell back to `mmap_lock`.
        sum fallbacks,
        /// Writes to shared cache lines by faults, or in big-munmap by the
        /// munmapping thread during the munmap (`shared-write-stats` builds).
        sum shared_writes,
        /// big-munmap: how long the large `munmap` took, in ns.
        max munmap_ns,
        /// big-munmap: median latency of the other threads' operations that
        /// overlapped the munmap, in ns.
        max p50_ns,
        /// big-munmap: their 99th percentile, in ns.
        max p99_ns,
        /// big-munmap: their maximum, in ns.
        max max_ns,
        /// big-munmap: the other threads' operations per second during the munmap.
        max ops_per_sec,
        /// big-munmap: the same threads' operations per second before it.
        max alone_ops_per_sec,
        /// big-munmap: time the munmap held `mmap_lock` for write (softmm's `UnmapStats`).
        max munmap_write_hold_ns,
        /// big-munmap: time it held `mmap_lock` for read (`downgrade`).
        max munmap_read_hold_ns,
        /// big-munmap: time it waited to take `mmap_lock` for write again.
        max munmap_lock_wait_ns,
        /// big-munmap: time in its zap loop, flushes and frees of full gathers included.
        max munmap_zap_ns,
        /// big-munmap: its TLB shootdowns.
        max munmap_flushes,
        /// big-munmap: time in them, request to last acknowledgement.
        max munmap_flush_ns,
        /// big-munmap: the part of that spent waiting for other CPUs' acknowledgements.
        max munmap_flush_wait_ns,
        /// big-munmap: time putting frames and scheduling tables after the flushes.
        max munmap_free_ns,
        /// big-munmap: time detaching the range's page tables (`free_pgtables`).
        max munmap_pgtable_ns,
        /// big-munmap: time the munmapping thread waited for a grace period and
        /// freed the range's page tables itself, after dropping every lock.
        max munmap_table_free_ns,
        /// big-munmap: page tables it left to the epoch collector instead (the
        /// grace period outlasted its wait).
        max munmap_tables_deferred,
        /// big-munmap: the munmap's flushes that forced a barrier (an IPI per
        /// CPU running another thread of the process, with `membarrier`).
        max munmap_barriers,
        /// big-munmap: the munmap's frees of gathered frames and tables (one
        /// per full gather and one at the end), with a shootdown before each
        /// except under `lock-free`, which shoots its range down once.
        max munmap_batches,
        /// big-munmap: CPU time of the munmapping thread during the munmap (`/proc/.../schedstat`).
        max munmap_cpu_ns,
        /// big-munmap: its run-queue delay meanwhile: runnable but not running.
        max munmap_runq_ns,
        /// big-munmap: CPU time of the other threads during the munmap, summed.
        max other_cpu_ns,
        /// big-munmap: their run-queue delay meanwhile, summed.
        max other_runq_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_adds_totals_keeps_the_worst_duration_and_writes_only_what_was_counted() {
        let a = FaultCounters { faults: Some(2), p99_ns: Some(10), ..FaultCounters::default() };
        let b = FaultCounters { faults: Some(3), p99_ns: Some(7), ..FaultCounters::default() };
        let mut row = FaultCounters::default();
        row.add(&a);
        row.add(&b);
        assert_eq!((row.faults, row.p99_ns, row.spec_attempts), (Some(5), Some(10), None));
        let json = serde_json::to_value(&row).expect("serializes");
        assert_eq!(json, serde_json::json!({"faults": 5, "p99_ns": 10}));
        let back: FaultCounters = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, row);
    }
}
