//! Replays every input of the committed fuzz corpora (`fuzz/corpus/ops/`,
//! `fuzz/corpus/hugetlb/`) through the same decoding and checking code as
//! the `cargo fuzz` targets `ops` (`softmm_testkit::fuzz_ops`) and `hugetlb`
//! (`softmm_testkit::fuzz_ops::huge`), so that every test run checks what the
//! fuzzer found interesting: no panic, no disagreement with the models, no
//! leak.

use softmm_testkit::fuzz_ops;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

/// An input taking longer than this has deadlocked.
const HANG_SECS: u64 = 30;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

/// Runs every input of `target`'s corpus with `run` on one arena made by
/// `arena`.
fn replay<P: 'static>(target: &str, arena: fn() -> P, run: fn(&[u8], &P) -> Result<(), String>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
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
        let phys = arena();
        for f in files {
            let data = std::fs::read(&f).expect("corpus file");
            let name = f.file_name().expect("name").to_string_lossy().into_owned();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&data, &phys)));
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
            Ok((name, Err(e))) => panic!("{target} corpus input {name}: {e}"),
            Err(_) => panic!("{target} corpus input {done} of {n} did not finish in {HANG_SECS} s: deadlock"),
        }
    }
}

#[test]
fn corpus_replays_without_findings() {
    replay("ops", fuzz_ops::arena, fuzz_ops::run_bytes);
}

#[test]
fn hugetlb_corpus_replays_without_findings() {
    replay("hugetlb", fuzz_ops::huge::arena, fuzz_ops::huge::run_bytes);
}
