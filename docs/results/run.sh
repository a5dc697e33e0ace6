#!/bin/sh
# Regenerates the results in this directory (about 10 minutes on 2 CPUs).
# Usage: docs/results/run.sh [path/to/softmm]   (default: target/release/softmm)
set -e
cd "$(dirname "$0")"
softmm=${1:-../../target/release/softmm}
run() { "$softmm" bench "$@" --repeat 3 | tee "$out.txt"; }
out=headline; run --json headline.json --plot headline.svg
"$softmm" plot headline.json headline.png
for w in page-fault1 page-fault2 page-fault3 mmap1 mmap2 tlb-flush; do
    out=$w; run "$w" --mode threads,processes --json "$w.json" --plot "$w.svg"
done
out=cortenmm; run cortenmm --json cortenmm.json --plot cortenmm.svg
out=pin; "$softmm" bench pin --size 1G --repeat 3 --json pin.json | tee pin.txt
out=big-munmap; "$softmm" bench big-munmap --size 8G --threads 1 --repeat 3 --json big-munmap.json | tee big-munmap.txt
out=hugetlb; "$softmm" bench hugetlb-fault,hugetlb-fork,hugetlb-fork-fault --repeat 3 --json hugetlb.json | tee hugetlb.txt
out=migrate; "$softmm" bench migrate --threads 1,2 --repeat 3 --json migrate.json | tee migrate.txt
