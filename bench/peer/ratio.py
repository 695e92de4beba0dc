#!/usr/bin/env python3
"""Ours against PyTorch FSDP2 from their logs, as ratios: reads the "mean step" line that examples/05_gpt_cuda and
bench/peer/gpt_fsdp2.py each print at the end of a run on the same GPU, model and batch.

  python3 bench/peer/ratio.py OURS.log PYTORCH.log

Goals (issue: the GPT trainer): our step time at most 0.8 of PyTorch's, our peak memory no higher. Exits 1 when a
log has no "mean step" line; the goals are reported, not enforced."""
import re
import sys

LINE = re.compile(r"^mean step ([0-9.]+) s over steps [0-9.]+, ([0-9.]+) tokens/s, MFU ([0-9.]+)% of [0-9.]+ TFLOP/s"
                  r"(?:; peak memory ([0-9.]+) MiB)?")


def figures(path):
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if m:
            return [float(g) if g is not None else None for g in m.groups()]
    sys.exit(f"error: {path} has no 'mean step' line (did the run finish?)")


ours, theirs = figures(sys.argv[1]), figures(sys.argv[2])
print(f"{'':14} {'ours':>12} {'PyTorch':>12} {'ratio':>8}  goal")
for i, (name, unit, goal) in enumerate([("step time", "s", "<= 0.8"), ("tokens/s", "", ""), ("MFU", "%", ""),
                                        ("peak memory", "MiB", "<= 1.0")]):
    a, b = ours[i], theirs[i]
    ratio = f"{a / b:8.3f}" if a is not None and b else "       -"
    fmt = lambda v: "-" if v is None else f"{v:.4g} {unit}".strip()
    print(f"{name:14} {fmt(a):>12} {fmt(b):>12} {ratio}  {goal}")
