//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use softmm::uapi::*;
use softmm::{AddressSpace, FaultPolicy, MmConfig, PhysConfig, PhysMem};

pub const PAGE: u64 = 4096;
pub const ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;
pub const RW: i32 = PROT_READ | PROT_WRITE;

/// A small machine: `mib` MiB of frames; memory on demand
/// (`PhysConfig::on_demand`) when `SOFTMM_ON_DEMAND` is set, so that a
/// test binary can be run both ways.
pub fn phys(mib: u64) -> Arc<PhysMem> {
    let on_demand = std::env::var_os("SOFTMM_ON_DEMAND").is_some();
    PhysMem::new(PhysConfig::new(mib << 20).on_demand(on_demand)).expect("arena")
}

/// An address space with the default layout and `policy` (speculation
/// forced on, so that single-threaded tests exercise it too).
pub fn mm_with(phys: &Arc<PhysMem>, policy: FaultPolicy) -> Arc<AddressSpace> {
    AddressSpace::new(phys, MmConfig::default().policy(policy).force_speculative(true)).expect("valid config")
}

/// Asserts that everything allocated on `phys` has been freed.
#[track_caller]
pub fn assert_no_leaks(phys: &PhysMem) {
    let s = phys.quiesce();
    assert_eq!((s.frames_used, s.page_tables, s.vmas, s.rmap_entries), (0, 0, 0, 0), "leak: {s:?}");
    // Every huge page back in the pool, no reservation left.
    let h = phys.huge_page_stats();
    assert_eq!((h.free, h.rsvd, h.surp), (h.total, 0, 0), "hugetlb leak: {h:?}");
}

/// Runs `f` on its own thread named `name`; fails if it panics or does not
/// finish within `secs` seconds (a deadlock detector, not a timing check).
pub fn watchdog<R: Send + 'static>(name: &str, secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let h = thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .expect("spawn");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{name}: deadlock: not done after {secs} s"),
    }
}

/// A host file in the temporary directory, removed when dropped.
pub struct TempFile(PathBuf);

impl TempFile {
    /// A file named after this process and `tag`, holding `content`.
    pub fn new(tag: &str, content: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(format!("softmm-host-file-{}-{tag}", std::process::id()));
        std::fs::write(&path, content).unwrap();
        TempFile(path)
    }

    /// The file opened for reading, and for writing too when `write`.
    pub fn open(&self, write: bool) -> std::fs::File {
        std::fs::OpenOptions::new().read(true).write(write).open(&self.0).unwrap()
    }

    /// The file's bytes now.
    pub fn read(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
