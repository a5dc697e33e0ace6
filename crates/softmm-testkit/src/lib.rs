//! softmm's test harness, shared by the integration tests of
//! `crates/softmm/tests` and the `cargo fuzz` targets of `crates/softmm/fuzz`.
//!
//! It uses softmm's public API only, as any other user of the library: what
//! a test checks through it is what a user can observe.
//!
//! - [`caps`]: dropping the process's capabilities, to compare with the
//!   host as an ordinary process;
//! - [`common`]: the integration tests' small helpers (arenas, leak checks,
//!   watchdogs, the stress tests' seeds and threads);
//! - [`differential`]: scenarios of mapping calls ([`differential::ops`])
//!   and the runner that plays them on the host kernel
//!   ([`differential::host`]);
//! - [`reference`](mod@reference): the sequential reference model of Linux's mapping
//!   semantics;
//! - [`fuzz_ops`]: the fuzz targets' decoding and checking, softmm against
//!   the reference model (and [`fuzz_ops::huge`] for hugetlb);
//! - [`sources`]: a crate's sources as the layering tests read them.

pub mod caps;
pub mod common;
pub mod fuzz_ops;
pub mod reference;
pub mod sources;

/// The differential test's harness: scenarios and the host runner.
#[cfg(feature = "differential")]
pub mod differential {
    pub mod host;
    pub mod ops;
}
