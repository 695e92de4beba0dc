#!/usr/bin/env python3
"""PyTorch FSDP2's host overhead per module per step, on the CPU, for comparison with bench/overhead_bench.cc.

The same shape of problem as the C++ bench: N modules of one 256-element parameter each, world size 1 (gloo, a
CPU device mesh), a step = forward, backward, SGD (momentum 0.9) step, zero_grad; no compute worth the name
(each module adds its parameter to a 256-element activation). FSDP2 (torch.distributed.fsdp.fully_shard) wraps
every module and the root. The baseline, measured in the same run, is the same model without FSDP. The overhead
per module per step is (FSDP2 step - baseline step) / N.

Not part of CI (it needs PyTorch): python3 -m venv v && v/bin/pip install torch && v/bin/python bench/fsdp2_overhead.py
"""
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

NUMEL = 256
REPEATS = 5


class Unit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((NUMEL,), 0.5))

    def forward(self, x):
        return x + self.w


class Chain(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.units = torch.nn.ModuleList(Unit() for _ in range(n))

    def forward(self, x):
        for u in self.units:
            x = u(x)
        return x


def us_per_step(model, steps, warmup):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.zeros(NUMEL)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    best = float("inf")
    for _ in range(REPEATS):
        for _ in range(warmup):
            step()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, (time.perf_counter() - t0) / steps * 1e6)
    return best


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    torch.set_num_threads(1)
    rows = []
    for n in (64, 512):
        steps = max(4, 6400 // n)
        warmup = max(2, steps // 10)
        base = us_per_step(Chain(n), steps, warmup)
        sharded = Chain(n)
        for u in sharded.units:
            fully_shard(u, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        fsdp = us_per_step(sharded, steps, warmup)
        rows.append({"units": n, "fsdp2_us_per_step": fsdp, "baseline_us_per_step": base,
                     "overhead_us_per_unit": (fsdp - base) / n})
    print(f"PyTorch {torch.__version__} FSDP2 host overhead: modules of {NUMEL} elements, world 1 (gloo, CPU), "
          f"best of {REPEATS} repeats")
    print(f"{'units':>6} {'us/step':>12} {'baseline':>12} {'overhead us/unit':>18}")
    for r in rows:
        print(f"{r['units']:>6} {r['fsdp2_us_per_step']:>12.1f} {r['baseline_us_per_step']:>12.1f} "
              f"{r['overhead_us_per_unit']:>18.2f}")
    print(json.dumps({"bench": "fsdp2_overhead", "torch": torch.__version__, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
