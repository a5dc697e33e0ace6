//! Why the host refused.

use std::fmt;
use std::io;

/// Why the host could not give what was asked. The `Display` text is a
/// whole sentence meant to be printed as the reason a test or row was
/// skipped.
#[derive(Debug)]
pub enum HostError {
    /// Changing the huge page pool and mounting need root.
    NotRoot,
    /// The kernel has no 2 MiB hugetlb pool (no `CONFIG_HUGETLBFS`, or
    /// another architecture).
    NoHugetlb,
    /// More pages were asked for than [`crate::MAX_PAGES`] allows.
    TooMany {
        /// Pages asked for.
        asked: usize,
    },
    /// The kernel grew the pool by fewer pages than asked (memory is short
    /// or too fragmented for 2 MiB pages); the pool was put back.
    Fewer {
        /// Pages asked for.
        asked: usize,
        /// Pages the kernel added.
        got: usize,
    },
    /// Another user of this crate kept the reservation lock for the whole
    /// wait.
    Busy {
        /// Who holds it, as far as known.
        holder: &'static str,
    },
    /// A host call failed.
    Io {
        /// What was being done.
        what: String,
        /// The host's error.
        err: io::Error,
    },
}

impl HostError {
    pub(crate) fn io(what: impl Into<String>, err: io::Error) -> Self {
        HostError::Io { what: what.into(), err }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::NotRoot => write!(f, "not root: reserving huge pages and mounting hugetlbfs need root"),
            HostError::NoHugetlb => write!(
                f,
                "the host kernel has no 2 MiB hugetlb pool (/sys/kernel/mm/hugepages/hugepages-2048kB is missing)"
            ),
            HostError::TooMany { asked } => write!(
                f,
                "{asked} huge pages asked, more than the {} (2.5 GiB) this crate reserves at a time on a shared machine",
                crate::MAX_PAGES
            ),
            HostError::Fewer { asked, got } => write!(
                f,
                "the host gave {got} of the {asked} huge pages asked (memory short or fragmented); pool restored"
            ),
            HostError::Busy { holder } => {
                write!(f, "huge page reservation busy: {holder} kept the lock for the whole wait")
            }
            HostError::Io { what, err } => write!(f, "{what}: {err}"),
        }
    }
}

impl std::error::Error for HostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostError::Io { err, .. } => Some(err),
            _ => None,
        }
    }
}
