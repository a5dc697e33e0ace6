#!/bin/sh
# Records three multi-threaded programs (a JVM thread pool, 16 goroutines,
# Node worker threads: their sources are in
# crates/softmm-cli/tests/logs/programs) with strace and perf, replays each
# with its page faults, and runs it as a workload under every fault, unmap,
# shootdown-target, madvise and writer policy (`softmm replay --run --bench
# --policy all`), with the host row (each program run untraced). Needs
# javac, go, node, strace and perf, as root (perf's tracepoints); about a
# minute on 2 CPUs. Writes NAME.txt, NAME.json and NAME.svg here per program.
# Usage: docs/results/replay/run.sh [path/to/softmm]
set -e
cd "$(dirname "$0")"
softmm=$(realpath "${1:-../../../target/release/softmm}")
programs=$(realpath ../../../crates/softmm-cli/tests/logs/programs)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
javac -d "$work" "$programs/ThreadPool.java"
cp "$programs/goroutines.go" "$work/" && (cd "$work" && go mod init goroutines >/dev/null 2>&1 && go build -o goroutines goroutines.go)
bench() {
    name=$1; shift
    "$softmm" replay --run --save "$work/$name.log" --bench --policy all --repeat 3 \
        --json "$name.json" --plot "$name.svg" -- "$@" | tee "$name.txt"
}
bench jvm java -cp "$work" ThreadPool
bench go "$work/goroutines"
bench node node "$programs/alloc-workers.js"
