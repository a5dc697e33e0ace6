#!/bin/bash
# One process per sample of `softmm bench big-munmap --size 2G --threads 1
# --duration 0.2 --no-host`, binaries, modes, policies and chrt alternating,
# one CSV line each (ms; the load average at its start; clear_ms = zap - free
# - flush; guard_ms only from builds that had the separate guard-marker walk,
# 5830681). Section 6 of big-munmap-cause.txt. Usage:
#   big-munmap-cause.sh OUT.csv ROUNDS "BIN..." "MODE..." "POLICY..." "no yes"
# ("yes": under `chrt -f 1`). Environment (SOFTMM_SYMMETRIC_FENCES) passes through.
out=$1; rounds=$2; bins=$3; modes=$4; pols=$5; rts=$6
tmp=$(mktemp)
[ -f "$out" ] || echo "round,bin,mode,policy,rt,load1,munmap_ms,p99_ms,cpu_ms,runq_ms,oth_cpu_ms,zap_ms,flush_ms,fwait_ms,free_ms,clear_ms,whold_ms,lockwait_ms,guard_ms,pgtable_ms,barriers,shared_writes" >"$out"
for i in $(seq 1 $rounds); do for b in $bins; do for m in $modes; do for p in $pols; do for rt in $rts; do
  load=$(cut -d' ' -f1 /proc/loadavg)
  pre=""; [ "$rt" = yes ] && pre="chrt -f 1"
  $pre $b bench big-munmap --size 2G --policy $p --mode $m --threads 1 --duration 0.2 --no-host --json $tmp >/dev/null
  python3 - $i $(basename $b) $m $p $rt $load $tmp >>"$out" <<'PY'
import json, sys
c = json.load(open(sys.argv[7]))["samples"][0]["counters"]
g=lambda k: c.get(k,0)/1e6
vals=[g("munmap_ns"),g("p99_ns"),g("munmap_cpu_ns"),g("munmap_runq_ns"),g("other_cpu_ns"),g("munmap_zap_ns"),g("munmap_flush_ns"),g("munmap_flush_wait_ns"),g("munmap_free_ns"),g("munmap_zap_ns")-g("munmap_free_ns")-g("munmap_flush_ns"),g("munmap_write_hold_ns"),g("munmap_lock_wait_ns"),g("munmap_guard_ns"),g("munmap_pgtable_ns")]
print(",".join(sys.argv[1:7]+[f"{v:.2f}" for v in vals]+[str(c.get("munmap_barriers","")),str(c.get("shared_writes",""))]))
PY
done; done; done; done; done
rm -f $tmp
