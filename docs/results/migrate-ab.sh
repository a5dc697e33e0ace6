#!/bin/bash
# Alternates softmm binaries for seed 003's experiment: N rounds, each
# running every binary once with `bench migrate --threads 1,2 --repeat 1`,
# and prints per run the load average and, per policy and accessor count,
# pages migrated/s and the migrator's CPU µs per page.
# usage: migrate-ab.sh N BINARY...   (e.g. two builds copied aside)
N=$1; shift
for r in $(seq 1 "$N"); do
  for b in "$@"; do
    l=$(cut -d' ' -f1 /proc/loadavg)
    out=$("$b" bench migrate --threads 1,2 --repeat 1 2>&1)
    rows=$(echo "$out" | grep -E "^(batched|one-by-one) +[0-9]" | awk '{printf "%s/%s=%s,%sus ", $1, $2, $3, $6}')
    echo "round=$r bin=$b load=$l $rows"
  done
done
