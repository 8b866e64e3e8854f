#!/usr/bin/env python3
"""kprof-steps.py FILE:LABEL...: decode steps per kernel on each GPU, from kernel records "device
start_ns end_ns [gx.gy.gz/threads] name" a line (scripts/kprof.c's, or an nsys export's: gpu-check
tpcheck), several runs side by side (TP=1 against each GPU of TP=2).

A step runs from one hist_store launch (the forward pass's first) to the next.  Steps are grouped
by their batch (the embedding's grid is the step's tokens, where the records carry grids) and by
the kernels they launch, so a run of `inferd bench --batch 1,64` gives its B=1 and B=64 decode
steps apart (the prompt steps and the first, captured, steps fall into groups of their own and
are left out: a group needs 8 steps, 3 of 256 tokens or more); the last 8 steps of each group are
taken.

A kernel's time is its part of the step's critical path, end - max(start, the previous kernel's
end): kernels that overlap (programmatic dependent launch: a kernel starts while the one before
it finishes) are not counted twice, and the step's wall time is the kernels' time plus its idle
gaps (launch latency, the host).  A sum's wait for its peer is tp_add's time."""
import collections
import re
import sys

GRID = re.compile(r"^(\d+)\.(\d+)\.(\d+)/(\d+)$")


def load(path):
    by_dev = collections.defaultdict(list)
    notes = []
    for line in open(path):
        if line.startswith("#"):
            notes.append(line.strip())
            continue
        parts = line.split(maxsplit=4)
        if len(parts) < 4:
            continue
        grid = None
        if len(parts) == 5 and GRID.match(parts[3]):
            grid, name = parts[3], parts[4].strip()
        else:
            name = " ".join(parts[3:]).strip()
        by_dev[int(parts[0])].append((int(parts[1]), int(parts[2]), name, grid))
    for d in by_dev:
        by_dev[d].sort()
    return by_dev, notes


def steps_of(ks):
    """{(B, signature): [step...]}, a step a list of kernel records, in order of the run, and last
    the next step's start"""
    marks = [i for i, k in enumerate(ks) if k[2] == "hist_store"]
    groups = collections.OrderedDict()
    for a, b in zip(marks, marks[1:]):
        step = ks[a:b] + [(ks[b][0], ks[b][0], None, None)]  # (the next step's start: where this one's wall ends)
        emb = next((k for k in step[:-1] if k[2].startswith("embed")), None)
        B = int(GRID.match(emb[3]).group(1)) if emb and emb[3] else 0
        sig = (B, len(step), tuple(sorted({k[2] for k in step[:-1]})))
        groups.setdefault(sig, []).append(step)
    return groups


def summarise(steps):
    """the mean step: wall us, kernel us, gap us, launches; {name: [launches, us, grid]}"""
    per = collections.defaultdict(lambda: [0, 0.0, None])
    wall = busy = 0.0
    n = 0
    for step in steps:
        wall += step[-1][0] - step[0][0]
        prev_end = step[0][0]
        for s, e, nm, g in step[:-1]:
            t = max(0, e - max(s, prev_end))
            prev_end = max(prev_end, e)
            per[nm][0] += 1
            per[nm][1] += t
            per[nm][2] = g
            busy += t
            n += 1
    ns = len(steps)
    return wall / ns / 1e3, busy / ns / 1e3, n / ns, {k: [v[0] / ns, v[1] / ns / 1e3, v[2]] for k, v in per.items()}


def main():
    runs = []  # (label, {B: summary})
    for arg in sys.argv[1:]:
        path, _, label = arg.partition(":")
        by_dev, notes = load(path)
        for n in notes:
            print(f"{label}: {n}")
        if not by_dev:
            print(f"{label}: no kernel records in {path}")
        for dev in sorted(by_dev):
            res = {}
            for (B, _, _), steps in steps_of(by_dev[dev]).items():
                need = 3 if B >= 256 else 8  # (a 2,048-token prompt is 4 steps of 512, the last with the LM head)
                if len(steps) >= need and (B not in res or len(steps) > res[B][0]):
                    res[B] = (len(steps), summarise(steps[-8:]))
            if not res:
                print(f"{label} GPU {dev}: no group of 8 like steps among {len(by_dev[dev])} kernels")
            runs.append((f"{label} GPU{dev}", {B: v[1] for B, v in res.items()}))
    for B in sorted({B for _, r in runs for B in r}):
        cols = [(lab, r[B]) for lab, r in runs if B in r]
        print(f"\n== steps of {B} tokens (the mean of the last 8 like steps or fewer): us a step, launches a step ==")
        print("| | " + " | ".join(lab for lab, _ in cols) + " |")
        print("| --- |" + " --- |" * len(cols))
        print("| step wall | " + " | ".join(f"{s[0]:.1f}" for _, s in cols) + " |")
        print("| in kernels | " + " | ".join(f"{s[1]:.1f}" for _, s in cols) + " |")
        print("| idle gaps | " + " | ".join(f"{s[0] - s[1]:.1f}" for _, s in cols) + " |")
        print("| launches | " + " | ".join(f"{s[2]:.0f}" for _, s in cols) + " |")
        names = collections.defaultdict(float)
        for _, s in cols:
            for nm, v in s[3].items():
                names[nm] = max(names[nm], v[1])
        for nm in sorted(names, key=lambda x: -names[x]):
            cells = []
            for _, s in cols:
                v = s[3].get(nm)
                cells.append(f"{v[1]:.1f} ({v[0]:.0f} x {v[1] / v[0]:.2f}, {v[2] or ''})" if v else "")
            print(f"| {nm[:44]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
