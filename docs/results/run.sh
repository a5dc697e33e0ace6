#!/bin/sh
# Regenerates every table, JSON file and figure in this directory (12 to 15
# minutes on 2 CPUs); README.md is written from them. Each file's first
# lines name the softmm commit, the CPUs and the load average it ran at.
# Usage: docs/results/run.sh [path/to/softmm] [output directory]
#   (defaults: target/release/softmm, this directory)
# On a larger machine, THREADS (e.g. 1,2,4,8,16) sets the thread counts of the
# thread sweeps, CORTENMM_THREADS those of cortenmm's 300-sample sweep,
# INSTANCES the hugetlb instances (each one a faulting and a forking process)
# and ACCESSORS migrate's accessor threads; unset, each keeps the 2-CPU run's.
# The hugetlb host rows need root (they grow the host's huge-page pool for
# the run); big-munmap needs about 17 GB free.
set -e
cd "$(dirname "$0")"
softmm=$(realpath "${1:-../../target/release/softmm}")
mkdir -p "${2:-.}" && cd "${2:-.}"
threads=${THREADS:+--threads $THREADS}
run() { "$softmm" bench "$@" --repeat 3 | tee "$out.txt"; }
out=headline; run $threads --json headline.json --plot headline.svg
"$softmm" plot headline.json headline.png || echo "headline.png not drawn: the SVG stands"
out=hugetlb; run hugetlb-fault,hugetlb-fork,hugetlb-fork-fault ${INSTANCES:+--threads $INSTANCES} --json hugetlb.json
out=big-munmap; run big-munmap --size 8G --threads 1 --json big-munmap.json
out=migrate; run migrate --threads "${ACCESSORS:-1,2}" --json migrate.json
out=pin; run pin --size 1G $threads --json pin.json
for w in page-fault1 page-fault2 page-fault3 mmap1 mmap2 tlb-flush; do
    out=$w; run "$w" $threads --mode threads,processes --json "$w.json" --plot "$w.svg"
done
# Old against new designs of issues 26 and 32, each axis in one run: the
# shootdown targets (broadcast, fill-owners) and their posting (locked,
# adaptive); the writers' serialized path (reserve, short).
out=shootdowns; run tlb-flush $threads --mode threads --policy default,broadcast --posting locked,adaptive \
    --duration 0.5 --json shootdowns.json
out=writers; run mmap1,mmap2 $threads --mode threads,processes --policy reserve,short,host --duration 0.5 \
    --json writers.json
out=cortenmm; run cortenmm ${CORTENMM_THREADS:+--threads $CORTENMM_THREADS} --json cortenmm.json --plot cortenmm.svg
