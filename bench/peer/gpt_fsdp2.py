#!/usr/bin/env python3
"""The PyTorch peer of examples/04_gpt_host: the same GPT-2-style model trained with PyTorch FSDP2.

`fully_shard` per block and on the root, a bf16 MixedPrecisionPolicy (fp32 reduction) or none, the initial
weights read from the safetensors file the example wrote (--export-init), and the same token batches: the data
generator, the learning-rate schedule and the AdamW settings below are copies of gpt_model.hpp's, kept
bit-identical. Runs on CPU with gloo (world size --world, one process per rank) or on CUDA with NCCL under torchrun.

  python3 bench/peer/gpt_fsdp2.py --init init.safetensors --ours ours.txt [--world 2] [--precision bf16]

With --ours (the example's --losses output) it prints both loss curves and gradient norms side by side and the
largest differences, and exits 1 when a step's loss differs by more than --tolerance or its gradient norm by more
than --norm-tolerance (relative: AdamW's update does not change with a gradient's scale, the norm does). --compile
runs each block under torch.compile.

--experts N --top-k K: each block's MLP a mixture of experts as the example's (gpt_model.hpp's shape::experts: a
router, a token's K most probable experts with their probabilities renormalised as gates, dropless, Switch's
load-balancing loss over the rank's tokens, 0.01 x N x sum_i f_i P_i). With --ep 1 every rank computes every expert
for its tokens (plain FSDP2 over the world). --ep E > 1 is expert parallelism as the example's: expert groups of E
consecutive ranks, the rank at place q of its group holding experts [q N/E, (q+1) N/E) of every block; a token's
choices go to their experts' ranks and come back by all_to_all over the group (all_to_all_single_autograd, as
torchtitan's expert parallelism); each block's experts are a `fully_shard` of their own over the ranks that hold
the same experts (a (world/E, E) mesh's first dimension: FSDP2 with a mesh per parameter). A rank's expert gradient
sums the tokens of its whole expert group, and FSDP2 averages it over the expert shard group (world / E ranks): the
backward multiplies it by 1 / E, so that it is the world's average as the dense gradients are (exact for E a power of
two; set_gradient_divide_factor(world) would do it in the reduction, but its PREMUL_SUM does not run on gloo).
Clipping is one norm over both meshes' shards, all-reduced over the world (clip_grad_norm_ does not take DTensors of
two meshes: pytorch#180346).
"""
import argparse
import math
import os
import struct
import sys
import time

MASK = (1 << 64) - 1


def f32(x):
    """x rounded to float, as the C++ side holds it."""
    return struct.unpack("f", struct.pack("f", x))[0]


# ---- gpt_model.hpp's data generator, bit for bit ------------------------------------------------------------
def mix(x):
    """splitmix64's finaliser (fsdp::init::detail::mix)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def unit(bits):
    return (bits >> 11) * 2.0**-53


def uniform(seed, sample, i):
    return unit(mix(mix(mix(seed) ^ sample) ^ i))


def draw(u, vocab):
    return min(vocab - 1, int(u * vocab))


def permutation(seed, vocab):
    p = list(range(vocab))
    for k in range(vocab - 1, 0, -1):
        j = mix(seed ^ (0x5045524D + k)) % (k + 1)
        p[k], p[j] = p[j], p[k]
    return p


def sequence(seed, follow, perm, context, sample):
    vocab = len(perm)
    out = [draw(uniform(seed, sample, 0), vocab)]
    for i in range(1, context + 1):
        if uniform(seed, sample, 2 * i - 1) < follow:
            out.append(perm[out[-1]])
        else:
            out.append(draw(uniform(seed, sample, 2 * i), vocab))
    return out


def lr_at(a, step):
    lr, lo = a.lr, a.lr * a.min_lr_ratio
    if step < a.warmup:
        return lr * (step + 1) / a.warmup
    span = a.steps - a.warmup - 1
    ratio = 1.0 if span <= 0 else min(1.0, (step - a.warmup) / span)
    return lo + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - lo)


# ---- the model -----------------------------------------------------------------------------------------------
class ExpertGroup:
    """--ep E > 1: this rank's expert group (E consecutive ranks, its all_to_all) and its place q in it."""

    def __init__(self, group, degree, place):
        self.group, self.degree, self.place = group, degree, place


def build(torch, a, ep=None):
    """The model; with `ep` (an ExpertGroup) each block holds its place's experts only."""
    nn = torch.nn
    F = torch.nn.functional
    held = a.experts // ep.degree if ep else a.experts  # experts a rank holds, each block

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(a.width, 3 * a.width)
            self.proj = nn.Linear(a.width, a.width)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(x).split(C, dim=2)
            shape = (B, T, a.heads, C // a.heads)
            q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(a.width, 4 * a.width)
            self.proj = nn.Linear(4 * a.width, a.width)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(a.width, a.experts, bias=False)

    class Stacked(nn.Module):  # X experts' Linear(I, O): weight [X, O, I], bias [X, O]
        def __init__(self, inputs, outputs):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(held, outputs, inputs))
            self.bias = nn.Parameter(torch.zeros(held, outputs))

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = Stacked(a.width, 4 * a.width)
            self.proj = Stacked(4 * a.width, a.width)

        def forward(self, rows, e):
            """Each row [n, C] through its expert e [n] (an index among the experts held here)."""
            h = torch.einsum("nc,nhc->nh", rows, self.fc.weight[e]) + self.fc.bias[e]
            return torch.einsum("nh,nch->nc", F.gelu(h, approximate="tanh"), self.proj.weight[e]) + self.proj.bias[e]

    def exchange(rows, sent, received):
        """rows [sum(sent), ...] to the expert group's ranks (sent[q] to rank q), received[q] rows from each back."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd  # torchtitan's choice
        return all_to_all_single_autograd(rows.contiguous(), received, sent, ep.group)

    def dispatched(experts, flat, idx):
        """Each token choice's expert output [n K, C], token-major (choice j of token t at t K + j): the choices sent
        to their experts' ranks by destination (token-major within one), computed there, sent back."""
        import torch.distributed as dist
        choice = idx.reshape(-1)
        owner = torch.div(choice, held, rounding_mode="floor")
        order = torch.argsort(owner, stable=True)
        sent = torch.bincount(owner, minlength=ep.degree)
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=ep.group)
        sent, received = sent.tolist(), received.tolist()
        local = torch.empty(sum(received), dtype=choice.dtype, device=choice.device)
        dist.all_to_all_single(local, (choice[order] % held).contiguous(), received, sent, group=ep.group)
        rows = exchange(flat[torch.div(order, a.top_k, rounding_mode="floor")], sent, received)
        y = exchange(experts(rows, local), received, sent)
        return y[torch.argsort(order)]  # back in the choices' order

    def moe(router, experts, x):
        """The example's mixture of experts on x [B, T, C]: its output, and its load-balancing loss."""
        B, T, C = x.shape
        flat = x.reshape(-1, C)
        probs = F.softmax(router.router(flat).float(), dim=-1)
        top, idx = torch.sort(probs, dim=-1, descending=True, stable=True)  # the lower index first on a tie
        top, idx = top[:, : a.top_k], idx[:, : a.top_k]
        gates = top / top.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        if ep:
            ys = dispatched(experts, flat, idx).view(-1, a.top_k, C)
        for j in range(a.top_k):  # each token's j-th choice, in the example's order
            y = ys[:, j] if ep else experts(flat, idx[:, j])
            out = out + gates[:, j : j + 1].to(y.dtype) * y
        n = flat.shape[0]
        f = torch.bincount(idx.flatten(), minlength=a.experts).to(probs.dtype) / (n * a.top_k)
        aux = a.aux_weight * a.experts * (f * probs.mean(dim=0)).sum()
        return out.view(B, T, C), aux

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(a.width, eps=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(a.width, eps=1e-5)
            if a.experts:
                self.mlp = Router()
                self.moe = Experts()
            else:
                self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            if not a.experts:
                return x + self.mlp(self.ln_2(x)), 0.0
            y, aux = moe(self.mlp, self.moe, self.ln_2(x))
            return x + y, aux

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.width)
            self.wpe = nn.Embedding(a.context, a.width)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.width, eps=1e-5)
            self.lm_head = nn.Linear(a.width, a.vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            aux = 0.0
            for block in self.h:
                x, a_ = block(x)
                aux = aux + a_
            logits = self.lm_head(self.ln_f(x)).float()
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) + aux

    return Gpt()


def torch_name(ours):
    """h.0.attn.qkv.w -> h.0.attn.qkv.weight; wte -> wte.weight."""
    if ours in ("wte", "wpe"):
        return ours + ".weight"
    stem, leaf = ours.rsplit(".", 1)
    return stem + {"w": ".weight", "b": ".bias"}[leaf]


def train(rank, a, losses_out):
    """Trains on this rank; rank 0 appends (loss, gradient norm) per step to losses_out."""
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))  # spawned here: one GPU per rank
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=a.world)
    world = dist.get_world_size()
    ep = None
    if a.ep > 1:
        if not a.experts or a.experts % a.ep or world % a.ep:
            sys.exit(f"error: --ep {a.ep} must divide --experts ({a.experts}) and the world ({world})")
        # (world/E, E): dimension 1 an expert group (consecutive ranks), dimension 0 the ranks holding the same experts
        device_type = "cuda" if cuda else "cpu"
        expert_mesh = init_device_mesh(device_type, (world // a.ep, a.ep), mesh_dim_names=("expert_shard", "expert"))
        ep = ExpertGroup(expert_mesh.get_group("expert"), a.ep, rank % a.ep)
    torch.manual_seed(0)
    model = build(torch, a, ep)
    if not a.init:  # GPT-2's initialisation, as gpt_model.hpp's (other values: this run is for timing)
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif ".ln_" in n or n.startswith("ln_f"):
                torch.nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * a.layers) if n.endswith("proj.weight") else 0.02
                torch.nn.init.normal_(p, std=0.01 if n.startswith("wpe") else std)
    else:
        state = {torch_name(k): v for k, v in load_file(a.init).items()}
        state["lm_head.weight"] = state["wte.weight"]
        if ep:  # the global expert stacks: this rank's place's share
            held = a.experts // ep.degree
            for k in state:
                if ".moe." in k:
                    state[k] = state[k][ep.place * held : (ep.place + 1) * held].clone()
        model.load_state_dict(state, strict=True)  # every tensor present, none left over
    device = torch.device("cuda") if cuda else torch.device("cpu")
    model.to(device)
    mesh = init_device_mesh(device.type, (world,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if a.precision == "bf16"
          else MixedPrecisionPolicy())
    for block in model.h:
        if a.compile:  # each block compiled in place before it is wrapped, as torchtitan does
            block.compile()
        if ep:  # the experts first, over the ranks holding the same experts
            fully_shard(block.moe, mesh=expert_mesh["expert_shard"], mp_policy=mp)
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    # the blocks' matrices (and stacks of them): gpt_model.hpp's decay rule (no_decay on biases, norms, embeddings)
    def decays(n, p):
        return p.ndim >= 2 and n.startswith("h.") and n.endswith("weight")
    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    rest = [p for n, p in model.named_parameters() if not decays(n, p)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": f32(a.weight_decay)}, {"params": rest, "weight_decay": 0.0}],
                            lr=f32(lr_at(a, 0)), betas=(f32(0.9), f32(0.95)), eps=f32(1e-8),
                            foreach=a.foreach)
    perm = permutation(a.data_seed, a.vocab)
    if a.batch % world:
        sys.exit(f"error: global batch {a.batch} does not split over {world} ranks")
    B = a.batch // world
    times = []
    for step in range(a.steps):
        # The batch is made before the step's clock starts: the generator is a Python loop (tens of ms a batch of
        # 8 x 1024 tokens), which a PyTorch trainer's data loader would run ahead of the step.
        seqs = [sequence(a.data_seed, a.follow, perm, a.context, step * a.batch + rank * B + b) for b in range(B)]
        data = torch.tensor(seqs, dtype=torch.long, device=device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        lr = f32(lr_at(a, step))  # gpt_model.hpp's lr_at rounds to float
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        if ep:  # averaged over the expert shard group (world / E ranks), each summing its expert group's tokens
            for block in model.h:
                for p in block.moe.parameters():
                    p.grad.mul_(1.0 / ep.degree)  # so over the world, as the dense gradients
        # gpt_model.hpp: max_norm 0 means no clipping (the norm is still computed and printed)
        max_norm = a.max_norm if a.max_norm > 0 else float("inf")
        if ep:  # one norm over both meshes' shards: each element is on one rank once, its square summed over the world
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            squares = torch.stack([g.to_local().float().pow(2).sum() for g in grads]).sum()
            dist.all_reduce(squares, op=dist.ReduceOp.SUM)
            norm = squares.sqrt()
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0).item()  # clip_grad_norm_'s rule
            for g in grads:
                g.mul_(coef)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total = total.item() / world
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        if rank == 0:
            losses_out.append((total, float(norm)))
            print(f"step {step:3d}  loss {total:.6f}  lr {lr:.3e}  norm {float(norm):.4f}  {dt:.3f} s", flush=True)
    if rank == 0 and len(times) > 2:
        mean = sum(times[2:]) / len(times[2:])  # after two warm-up steps
        peak = f"; peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB" if cuda else ""
        tokens = a.batch * a.context / mean
        flops = 6.0 * (a.layers * 12.0 * a.width**2 + a.vocab * a.width) + 12.0 * a.layers * a.context * a.width
        mfu = 100.0 * flops * tokens / (a.peak_tflops * 1e12)
        print(f"mean step {mean:.4f} s over steps 2..{len(times) - 1}, {tokens:.0f} tokens/s, "
              f"MFU {mfu:.2f}% of {a.peak_tflops:.0f} TFLOP/s{peak}", flush=True)
    if rank == 0 and a.compile:
        # Whether the blocks ran compiled: the identical blocks share one graph (more means recompiles), no graph
        # break, every frame dynamo saw compiled (on CPU with PyTorch 2.11 and 2.15: 1 graph, 0 breaks, 3 of 3).
        from torch._dynamo.utils import counters
        frames = counters["frames"]
        print(f"torch.compile: {counters['stats']['unique_graphs']} graph(s), "
              f"{sum(counters['graph_break'].values())} graph break(s), {frames['ok']} of {frames['total']} frame(s) "
              f"compiled", flush=True)
    dist.destroy_process_group()


def worker(rank, a, queue):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    losses = []
    train(rank, a, losses)
    if rank == 0:
        queue.put(losses)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", help="initial weights: the example's --export-init file (without it: PyTorch's own "
                                  "initialisation, for timing only)")
    p.add_argument("--ours", help="the example's --losses file, to compare with")
    p.add_argument("--tolerance", type=float,
                   help="largest relative loss difference accepted (default 1e-5 for fp32, 5e-3 for bf16)")
    p.add_argument("--norm-tolerance", type=float,
                   help="largest relative difference of the gradient norm accepted (default 1e-5 for fp32, 5e-2 for "
                        "bf16); AdamW hides a gradient's scale from the losses, the norm does not")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-norm", type=float, default=1.0)
    p.add_argument("--data-seed", type=int, default=1234)
    p.add_argument("--follow", type=float, default=0.75)
    p.add_argument("--experts", type=int, default=0, help="a mixture of experts in each block (0: the plain MLP)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--aux-weight", type=float, default=0.01)
    p.add_argument("--ep", type=int, default=1,
                   help="expert parallelism: expert groups of this many ranks, each holding its share of the experts")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--foreach", action="store_true",
                   help="PyTorch's multi-tensor AdamW (its default on CUDA); without it one parameter at a time, as "
                        "the loss comparison with the example was validated")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (the first steps then include the compilation: the mean skips two)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the device's peak, for MFU (gpt_model.hpp's FLOPs)")
    a = p.parse_args()
    if a.tolerance is None:
        a.tolerance = 1e-5 if a.precision == "fp32" else 5e-3
    if a.norm_tolerance is None:
        a.norm_tolerance = 1e-5 if a.precision == "fp32" else 5e-2
    a.lr, a.min_lr_ratio, a.aux_weight = f32(a.lr), f32(a.min_lr_ratio), f32(a.aux_weight)  # floats in gpt_model.hpp

    if "RANK" in os.environ:  # under torchrun
        a.world = int(os.environ["WORLD_SIZE"])
        losses = []
        train(int(os.environ["RANK"]), a, losses)
        if int(os.environ["RANK"]) != 0:
            return 0
    else:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        procs = [ctx.Process(target=worker, args=(r, a, queue)) for r in range(a.world)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        if any(proc.exitcode != 0 for proc in procs):
            print("error: a rank failed", file=sys.stderr)
            return 1
        losses = queue.get()
    if not a.ours:
        return 0
    # the example's --losses lines: step, loss, learning rate, gradient norm
    ours = [tuple(float(x) for x in line.split()[1::2]) for line in open(a.ours) if line.strip()]
    n = min(len(ours), len(losses))

    def diff(i, k):  # relative difference of step i's loss (k 0) or norm (k 1)
        return abs(ours[i][k] - losses[i][k]) / losses[i][k]

    worst = [max(range(n), key=lambda i: diff(i, k)) for k in (0, 1)]
    rel = [diff(worst[k], k) for k in (0, 1)]
    print(f"\n{'step':>4} {'loss ours':>10} {'pytorch':>10} {'rel. diff':>10} {'norm ours':>10} {'pytorch':>10} "
          f"{'rel. diff':>10}")
    for i in range(n):
        print(f"{i:4d} {ours[i][0]:10.6f} {losses[i][0]:10.6f} {diff(i, 0):10.2e} {ours[i][1]:10.6f} "
              f"{losses[i][1]:10.6f} {diff(i, 1):10.2e}")
    print(f"\n{n} steps: largest relative difference {rel[0]:.3e} at step {worst[0]} (tolerance {a.tolerance:.1e}), "
          f"of the gradient norm {rel[1]:.3e} at step {worst[1]} (tolerance {a.norm_tolerance:.1e}); final loss ours "
          f"{ours[n - 1][0]:.6f}, pytorch {losses[n - 1][0]:.6f}")
    return 0 if rel[0] <= a.tolerance and rel[1] <= a.norm_tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
