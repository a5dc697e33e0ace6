#!/usr/bin/env python3
"""Medians [min-max] per binary, mode and policy of a CSV written by
big-munmap-cause.sh. Usage: big-munmap-cause-medians.py FILE.csv [col,col,...]"""
import csv, statistics, sys
rows=list(csv.DictReader(open(sys.argv[1])))
keys=sys.argv[2].split(",") if len(sys.argv)>2 else ["munmap_ms","p99_ms","cpu_ms","runq_ms","oth_cpu_ms","zap_ms","free_ms","pgtable_ms","load1"]
print("bin            mode  policy     n | "+" ".join(f"{k:>16}" for k in keys))
seen=[]
for x in rows:
    k=(x["bin"],x["mode"],x["policy"])
    if k not in seen: seen.append(k)
for k in sorted(seen, key=lambda k:(k[1],k[2],k[0])):
    r=[x for x in rows if (x["bin"],x["mode"],x["policy"])==k]
    col=lambda c:[float(x[c]) for x in r if x[c]!='']
    cell=lambda c: (f"{statistics.median(col(c)):.2f}[{min(col(c)):.1f}-{max(col(c)):.1f}]" if col(c) else "-").rjust(16)
    print(f"{k[0]:14} {k[1]:5} {k[2]:10} {len(r)} | "+" ".join(cell(c) for c in keys))
