#!/bin/sh
# The sweeps of issues 32 (writers in parallel), 27 (seed 000 as the host
# runs it) and 31 (the inline TLB hit) on a lent many-CPU machine, in one
# run of about four minutes, each softmm row beside the host's in the same
# run. Usage: docs/results/16cpu/sweep.sh BIN_DIR OUT_DIR, where BIN_DIR holds
# `softmm` (the lab), `c-tlb-bench` and `tlb_hit` (scripts/bench-c-tlb.sh's
# two programs), built here, since the lent machine has no Rust toolchain.
# Writes at most eight files: machine.txt, log.txt (every table) and one
# JSON file per sweep.
bin=$(realpath "$1"); out=$(realpath "$2"); mkdir -p "$out"; cd "$out" || exit 1
{ uname -a; nproc; lscpu; free -g; grep -i huge /proc/meminfo; } > machine.txt 2>&1
T=${THREADS:-1,4,16}; I=${INSTANCES:-1,2,4,8}
bench() { echo "== softmm bench $*"; timeout 150 "$bin/softmm" bench "$@" --repeat 3 --duration 0.3 2>&1; echo "== exit $?"; }
{
  # Issue 32: the serialized short path against range-parallel writers,
  # under Linux placement and arenas, threads and processes.
  bench mmap1,mmap2 --mode threads,processes --threads "$T" --policy short-own-rcu,range,host \
      --placement linux,arenas --json writers.json
  bench cortenmm --mode mmap-low,mmap-pf-low --threads "$T" --policy short-own-rcu,range,host \
      --placement linux,arenas --json cortenmm.json
  bench pft,interference --threads "$T" --policy default,host --wide --json faults.json
  bench tlb-flush --mode threads --threads "$T" --policy default,host --json tlb-flush.json
  # Issue 27: seed 000's combined experiment and the forks alone.
  bench hugetlb-fork-fault,hugetlb-fork --threads "$I" --policy lock-free,host --wide \
      --json hugetlb-fork-fault.json
  # Issue 31: the inline hit from C, a native load and the Rust accessor.
  echo "== c-tlb-bench"; timeout 60 "$bin/c-tlb-bench" 2>&1
  echo "== tlb_hit"; timeout 60 "$bin/tlb_hit" 2>&1
} > log.txt
