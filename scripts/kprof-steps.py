#!/usr/bin/env python3
"""kprof-steps.py FILE LABEL: one decode step per kernel on each GPU, from kernel records "device
start_ns end_ns name" a line (scripts/kprof.c's, or an nsys export's: gpu-check tpcheck).  A step runs from one hist_store launch (the forward
pass's last launch before the LM head) to the next; the mean of the last 8 steps of the run (an
`inferd bench --batch 1` run's steps are its timed batch-1 decode steps).  Per GPU: the step's wall
time, its time in kernels (a sum's wait for its peer is kernel time), launches, and the kernels
that take the most time, with their launches a step and mean time."""
import collections
import sys


def main():
    path, label = sys.argv[1], sys.argv[2]
    by_dev = collections.defaultdict(list)
    for line in open(path):
        if line.startswith("#"):
            print(f"{label}: {line.strip()}")
            continue
        parts = line.split(maxsplit=3)
        if len(parts) == 4:
            by_dev[int(parts[0])].append((int(parts[1]), int(parts[2]), parts[3].strip()))
    if not by_dev:
        print(f"{label}: no kernel records in {path}")
    for dev in sorted(by_dev):
        ks = sorted(by_dev[dev])
        marks = [i for i, k in enumerate(ks) if k[2] == "hist_store"]
        if len(marks) < 10:
            print(f"{label} GPU {dev}: {len(marks)} hist_store launches among {len(ks)} kernels")
            continue
        steps = [(marks[j], marks[j + 1]) for j in range(len(marks) - 9, len(marks) - 1)]
        tot = collections.defaultdict(lambda: [0, 0.0])
        wall = busy = 0.0
        for a, b in steps:
            wall += ks[b][0] - ks[a][0]
            for s, e, nm in ks[a:b]:
                tot[nm][0] += 1
                tot[nm][1] += e - s
                busy += e - s
        ns = len(steps)
        print(f"{label} GPU {dev}: a B=1 step {wall / ns / 1e3:.1f} us wall, {busy / ns / 1e3:.1f} us in kernels, "
              f"{sum(t[0] for t in tot.values()) / ns:.0f} launches (mean of {ns} steps)")
        for nm, (c, t) in sorted(tot.items(), key=lambda x: -x[1][1])[:12]:
            print(f"  {nm[:40]:40s} {c / ns:5.0f} {t / ns / 1e3:8.1f} us {t / c / 1e3:7.2f} us each")


if __name__ == "__main__":
    main()
