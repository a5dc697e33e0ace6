#!/bin/bash
# Alternates two softmm builds and the four unmap policies on one big-munmap
# configuration, one process per sample, and writes one CSV line per sample
# with the load average at its start and its counters in ms (see
# big-munmap-cause.txt). Usage:
#   docs/results/big-munmap-ab.sh OLD_SOFTMM NEW_SOFTMM SIZE MODE ROUNDS OUT.csv
set -e
old=$1; new=$2; size=$3; mode=$4; rounds=$5; out=$6
tmp=$(mktemp)
echo "round,bin,policy,load1,munmap_ms,p99_ms,max_ms,cpu_ms,runq_ms,oth_runq_ms,oth_cpu_ms,fwait_ms,free_ms,whold_ms" >"$out"
for i in $(seq 1 "$rounds"); do
  for b in old new; do
    bin=$old; [ "$b" = new ] && bin=$new
    for p in locked sectioned downgrade lock-free; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      "$bin" bench big-munmap --size "$size" --policy "$p" --mode "$mode" --threads 1 \
        --duration 0.2 --no-host --json "$tmp" >/dev/null
      python3 - "$i" "$b" "$p" "$load" "$tmp" >>"$out" <<'PY'
import json, sys
c = json.load(open(sys.argv[5]))["samples"][0]["counters"]
keys = ["munmap_ns", "p99_ns", "max_ns", "munmap_cpu_ns", "munmap_runq_ns", "other_runq_ns",
        "other_cpu_ns", "munmap_flush_wait_ns", "munmap_free_ns", "munmap_write_hold_ns"]
print(",".join(sys.argv[1:5] + [f"{c.get(k, 0) / 1e6:.2f}" for k in keys]))
PY
    done
  done
done
rm -f "$tmp"
