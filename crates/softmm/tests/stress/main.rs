//! Stress tests: threads racing faults, mapping changes, shootdowns,
//! forks, pins and migrations on small and huge pages, under every policy,
//! each scenario under a watchdog (a hang detector, not a timing check),
//! and the races they found. `STRESS_SEED` and `STRESS_SCALE` (see
//! `softmm_testkit::common`) change their choices and lengths.

mod blocked_cpu;
mod dirty_cow;
mod hugetlb_dontneed_race;
mod hugetlb_stress;
mod hugetlb_stress_regressions;
mod posting_stress;
mod range_writers;
mod shootdown_targets;
mod stress;
mod stress_regressions;
