#!/bin/sh
# The second sweep of 2026-11-28 (about two minutes): mmap1 and mmap2 after
# the writer's own RCU batches wait for 32 frees (`sync::rcu::BATCH_FREES`),
# beside the spinning handoff (`short-spin`) and range writers; pft under the
# two free-list layouts; interference. Usage as sweep.sh: BIN_DIR OUT_DIR.
bin=$(realpath "$1"); out=$(realpath "$2"); mkdir -p "$out"; cd "$out" || exit 1
{ uname -a; nproc; lscpu; } > machine.txt 2>&1
T=${THREADS:-1,4,16}
bench() { echo "== softmm bench $*"; timeout 150 "$bin/softmm" bench "$@" --repeat 3 --duration 0.3 2>&1; echo "== exit $?"; }
{
  bench mmap1,mmap2 --mode threads,processes --threads "$T" --policy short-own-rcu,short-spin,range,host \
      --wide --json writers.json
  bench pft --threads "$T" --policy default,host --free-lists node --wide --json pft-node.json
  bench pft --threads "$T" --policy default --free-lists striped --wide --json pft-striped.json
  bench interference --threads "$T" --policy default,host --wide --json interference.json
} > log.txt
