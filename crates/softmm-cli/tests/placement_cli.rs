//! `softmm bench --placement`: both placements of issue 32's item 4 in one
//! run, each softmm row once per placement, the host once.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

#[test]
fn bench_runs_each_placement_as_its_own_rows() {
    let dir = std::env::temp_dir().join(format!("softmm-cli-test-{}-placement", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let args = [
        "bench",
        "mmap1",
        "--policy",
        "default,host",
        "--placement",
        "linux,arenas",
        "--threads",
        "1,2",
        "--iterations",
        "2",
        "--size",
        "128M",
        "--json",
        "out.json",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_softmm")).args(args).current_dir(&dir).output().expect("run softmm");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    // The legend glosses the placement of the `+arenas` rows.
    assert!(stdout.contains("per-vma-seq+arenas") && stdout.contains("arenas: "), "{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("out.json")).unwrap()).unwrap();
    let got: BTreeSet<(String, u64)> = v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["policy"].as_str().unwrap().to_string(), s["threads"].as_u64().unwrap()))
        .collect();
    let want: BTreeSet<(String, u64)> =
        ["per-vma-seq", "per-vma-seq+arenas", "host"].iter().flat_map(|p| [1, 2].map(|t| (p.to_string(), t))).collect();
    assert_eq!(got, want);

    let bad = Command::new(env!("CARGO_BIN_EXE_softmm"))
        .args(["bench", "mmap1", "--placement", "nope"])
        .current_dir(&dir)
        .output()
        .expect("run softmm");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown placement"));
    let _ = std::fs::remove_dir_all(&dir);
}
