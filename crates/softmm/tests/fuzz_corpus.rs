//! Replays every input of the committed fuzz corpus
//! (`fuzz/corpus/ops/`) through the same decoding and checking code as the
//! `cargo fuzz` target `ops` (`tests/fuzz_ops/mod.rs`), so that every test
//! run checks what the fuzzer found interesting: no panic, no disagreement
//! with the reference model, no leak.

mod fuzz_ops;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

/// An input taking longer than this has deadlocked.
const HANG_SECS: u64 = 30;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/ops")
}

#[test]
fn corpus_replays_without_findings() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the committed corpus")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus is empty");
    let n = files.len();
    // One thread runs every input on one arena (a `Cpu` is not `Send`, and
    // the arena's prefault is the costly part); this thread watches for hangs.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let phys = fuzz_ops::arena();
        for f in files {
            let data = std::fs::read(&f).expect("corpus file");
            let name = f.file_name().expect("name").to_string_lossy().into_owned();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fuzz_ops::run_bytes(&data, &phys)));
            let r = r.unwrap_or_else(|e| {
                let msg =
                    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                Err(format!("panic: {}", msg.unwrap_or_default()))
            });
            let failed = r.is_err();
            if tx.send((name, r)).is_err() || failed {
                // A panic may leave the arena in use: stop at the first failure.
                return;
            }
        }
    });
    for done in 0..n {
        match rx.recv_timeout(Duration::from_secs(HANG_SECS)) {
            Ok((_, Ok(()))) => {}
            Ok((name, Err(e))) => panic!("corpus input {name}: {e}"),
            Err(_) => panic!("corpus input {done} of {n} did not finish in {HANG_SECS} s: deadlock"),
        }
    }
}
