#!/usr/bin/env python3
"""Medians (with min and max) per build and policy of a CSV written by
big-munmap-ab.sh. Usage: big-munmap-medians.py FILE.csv"""
import csv
import statistics
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
keys = ["munmap_ms", "p99_ms", "max_ms", "cpu_ms", "runq_ms", "oth_runq_ms", "fwait_ms", "free_ms"]
print("build policy    n load | " + " ".join(f"{k:>13}" for k in keys) + "   (median [min-max], ms)")
for b in ["old", "new"]:
    for p in ["locked", "sectioned", "downgrade", "lock-free"]:
        r = [x for x in rows if x["bin"] == b and x["policy"] == p]
        if not r:
            continue
        col = lambda k: [float(x[k]) for x in r]
        cell = lambda k: f"{statistics.median(col(k)):.1f}[{min(col(k)):.0f}-{max(col(k)):.0f}]".rjust(13)
        load = statistics.median(float(x["load1"]) for x in r)
        print(f"{b:5} {p:9} {len(r):2} {load:4.1f} | " + " ".join(cell(k) for k in keys))
