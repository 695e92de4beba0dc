#!/usr/bin/env python3
"""Ours against PyTorch FSDP2 from their logs, as ratios: reads the "mean step" line that examples/05_gpt_cuda and
bench/peer/gpt_fsdp2.py each print at the end of a run on the same GPU, model and batch.

  python3 bench/peer/ratio.py OURS.log EAGER.log [COMPILED.log]

EAGER.log is the peer run eagerly, COMPILED.log (optional) the peer with --compile. Prints the figures side by side
and the three ratios of issue 52's goals: our step time against the eager peer's (goal at most 0.8), against the
compiled peer's (goal at most 1.0), and our peak memory against the eager peer's (goal at most 1.0; compiling left
PyTorch's peak unchanged when measured). Exits 1 when a log has no "mean step" line; the goals are reported, not
enforced."""
import re
import sys

LINE = re.compile(r"^mean step ([0-9.]+) s over steps [0-9.]+, ([0-9.]+) tokens/s, MFU ([0-9.]+)% of [0-9.]+ TFLOP/s"
                  r"(?:; peak memory ([0-9.]+) MiB)?")
NAMES = [("step time", "s"), ("tokens/s", ""), ("MFU", "%"), ("peak memory", "MiB")]


def figures(path):
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if m:
            return [float(g) if g is not None else None for g in m.groups()]
    sys.exit(f"error: {path} has no 'mean step' line (did the run finish?)")


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit("usage: ratio.py OURS.log EAGER.log [COMPILED.log]")
    runs = [("ours", figures(argv[1])), ("eager", figures(argv[2]))]
    if len(argv) == 4:
        runs.append(("compiled", figures(argv[3])))
    fmt = lambda v, unit: "-" if v is None else (f"{v:,.0f} {unit}" if v >= 1000 else f"{v:.4g} {unit}").strip()
    print(f"{'':14}" + "".join(f" {name:>12}" for name, _ in runs))
    for i, (name, unit) in enumerate(NAMES):
        print(f"{name:14}" + "".join(f" {fmt(r[i], unit):>12}" for _, r in runs))
    ours = runs[0][1]

    def ratio(label, a, b, goal):
        value = f"{a / b:.3f}" if a is not None and b else "-"
        verdict = "" if value == "-" else ("met" if a / b <= goal else "missed")
        print(f"ratio {label:34} {value:>7}  goal <= {goal} {verdict}".rstrip())

    ratio("step, ours / eager", ours[0], runs[1][1][0], 0.8)
    if len(runs) == 3:
        ratio("step, ours / compiled", ours[0], runs[2][1][0], 1.0)
    ratio("peak memory, ours / eager", ours[3], runs[1][1][3], 1.0)


if __name__ == "__main__":
    main(sys.argv)
