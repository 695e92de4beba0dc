#!/usr/bin/env python3
"""Reads the SASS of tools/sass/kernels.cu (see tools/sass-check) and checks the library's bandwidth kernels.

Usage: check.py DTYPE_HPP SASS RES_USAGE   (the outputs of cuobjdump -sass and cuobjdump -res-usage, demangled)

Rules, for each kernel named below (every one must be present):
  convert_kernel<D, S>          a vector load of four S (LDG.E.128 for fp32, LDG.E.64 for 16-bit, LDG.E for
                                8-bit: SASS writes a 32-bit access without a width) and a vector store of four D
  accumulate_kernel<S>          a vector load of four S, LDG.E.128 (the fp32 gradient shard) and STG.E.128 (for an
                                8-bit S the shard's accesses only: see main())
  for_each_arrays_kernel<F>     LDG.E.128 and STG.E.128, for the optimizers' updates F = adamw, sgd and lion
  for_each_block_kernel<block_quantize<S, Q>>
                                SHFL.BFLY: a warp's lanes share a block (neighbouring lanes, neighbouring elements)
                                and merge its extent across lanes (f32 -> f8e4m3 for a gather, bf16 -> i8 for a
                                reduction's input); before, one thread took a whole block, B elements apart from its
                                neighbour's, so that every warp load touched 32 sectors
  for_each_quads_kernel<block_dequantize<D, f8e4m3>>
                                a vector store of four D (STG.E.128 for fp32, STG.E.64 for bf16)
  for_each_quads_kernel<block_dequantize_sum<i8>>
                                LDG.E.128 and STG.E.128 (the fp32 gradient shard, four elements a thread)
  reduce_ranks_kernel<D>        a vector load and store of four D (comm::local's reduction on one GPU; f32, bf16)
and, for all of them, no local memory (no spills) and an occupancy of at least 75% at 256 threads per block on
sm_90 (65536 registers and 2048 threads per SM, registers allocated in multiples of 8 per thread).

The GPT example's kernels (tools/sass/gpt.cu, its SASS appended to the same files). The attention, head width 64,
bf16:
  forward, backward_query, backward_key <..., product::tensor>
                                HMMA (mma.sync on tensor cores) and no local memory; no occupancy rule (a block of
                                128 threads keeps its rows' fragments and sums in registers, FlashAttention's way)
  forward<..., product::twin>   the control: the same algorithm by the warp's lanes must have no HMMA
and the kernels that take four elements a thread, element-wise (bias_gelu, gelu_backward, bias_residual, add_bias),
by rows (layernorm_forward, bias_residual_layernorm, layernorm_backward_input: a warp a row; cross_entropy: a block
a row, the row's 16-byte-aligned middle) and by columns (column_partials, layernorm_param_partials): LDG.E.128 and
STG.E.128, no spills, 75% occupancy; bias_gelu, layernorm_forward and bias_residual_layernorm also with a bf16
output (what the matrix products read): LDG.E.128 and STG.E.64 (four bf16 a store); bias_residual and
bias_residual_layernorm on a bf16 projection (as the trainer writes it): LDG.E.64 besides; gelu_backward in bf16 (its
input, output gradient and input gradient): LDG.E.64 and STG.E.64; column_partials on a bf16 gradient (the MLP's):
LDG.E.64 and STG.E.128; layernorm_backward_input and layernorm_param_partials on a bf16 output gradient (the
trainer's): LDG.E.64 as well; add_bias on a bf16 product (QKV): LDG.E.64 and STG.E.64.

Negative controls: the scalar for_each_kernel<F> of the same optimizers must break the for_each_arrays rule, and
the scalar for_each_kernel of the block quantization and the dequantizations must break theirs (if one passes,
the check cannot tell the kernels apart and fails itself).

Prints one line per kernel and closes with "sass: P passed, F failed, 0 skipped"; exit status 1 on any failure.
"""
import re
import sys

THREADS = 256
REGS_PER_SM = 65536
THREADS_PER_SM = 2048
MIN_OCCUPANCY = 0.75


def dtype_bytes(dtype_hpp):
    """The width of each dtype enumerator, in order, from core/dtype.hpp's dtype_rows (its one description)."""
    rows = re.findall(r'\{dtype::(\w+), "\w+", (\d+),', open(dtype_hpp).read())
    if not rows:
        sys.exit(f"sass-check: no dtype_rows found in {dtype_hpp}")
    return {str(i): int(width) for i, (_, width) in enumerate(rows)}, {str(i): n for i, (n, _) in enumerate(rows)}


def functions(sass):
    """Kernel name -> its SASS lines."""
    out, name = {}, None
    for line in open(sass):
        m = re.search(r"Function : (.*)", line)
        if m:
            name = m.group(1).strip()
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def resources(res):
    out, name = {}, None
    for line in open(res):
        m = re.search(r"Function (.*):$", line.strip())
        if m:
            name = m.group(1).strip()
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and name:
            out[name] = tuple(int(x) for x in m.groups())
    return out


def accesses(lines):
    """The kernel's global accesses by width (LDG.E, LDG.E.128, ...) and its cross-lane shuffles (SHFL.BFLY)."""
    found = set()
    for line in lines:
        m = re.search(r"\b((?:LDG|STG)\.E(?:\.\w+)?)\b", line)
        if m:
            found.add(m.group(1))
        m = re.search(r"\b(SHFL\.BFLY)\b", line)
        if m:
            found.add(m.group(1))
        if re.search(r"\bHMMA\.", line):
            found.add("HMMA")
    return found


def occupancy(regs, threads=THREADS):
    per_thread = (regs + 7) // 8 * 8
    blocks = REGS_PER_SM // (per_thread * threads) if per_thread else THREADS_PER_SM // threads
    return min(blocks * threads, THREADS_PER_SM) / THREADS_PER_SM


def main():
    dtype_hpp, sass, res = sys.argv[1:4]
    width, dname = dtype_bytes(dtype_hpp)

    def vec(prefix, d):  # four elements of dtype d in one access (32 bits: SASS names no width, the scalar 8-bit
        bits = 32 * width[d]  # path's accesses are .U8)
        return f"{prefix}.E" if bits == 32 else f"{prefix}.E.{bits}"

    wanted = {}  # short name -> (pattern, required accesses)
    for d in width:
        for s in width:
            wanted[f"convert {dname[s]} -> {dname[d]}"] = (
                rf"convert_kernel<\(fsdp::dtype\){d}, \(fsdp::dtype\){s}>", {vec("LDG", s), vec("STG", d)})
    for s in width:
        # An 8-bit source's vector load is a plain LDG.E, which the fp32 tail's scalar load of the gradient shard
        # also is: by name the rule could not fail there, so it asks only for the shard's vector accesses. The same
        # vec<storage, 4> load of 8-bit elements is checked in convert_kernel<*, 8-bit>, where nothing else is LDG.E.
        need = {"LDG.E.128", "STG.E.128"} | (set() if width[s] == 1 else {vec("LDG", s)})
        wanted[f"accumulate<{dname[s]}>"] = (rf"accumulate_kernel<\(fsdp::dtype\){s}>", need)
    # the optimizers' element functions: optim::elementwise's rule_elements<R> over each library rule
    rules = {"adamw": "adamw_rule", "sgd": "sgd_momentum_rule", "lion": "lion_rule"}
    elements = {f: rf"fsdp::optim::detail::rule_elements<fsdp::optim::detail::{r}>" for f, r in rules.items()}
    for f in rules:
        wanted[f"for_each_arrays<{f}>"] = (rf"for_each_arrays_kernel<{elements[f]}", {"LDG.E.128", "STG.E.128"})
    controls = {f"for_each<{f}> (scalar, control)": (rf"for_each_kernel<{elements[f]}", {"LDG.E.128", "STG.E.128"})
                for f in rules}
    # block-scaled 8-bit gathers and reductions (kernels/quantize.hpp, kernels/cooperative.hpp)
    idx = {n: i for i, n in dname.items()}
    dt = lambda n: rf"\(fsdp::dtype\){idx[n]}"
    quantize = {"f32 -> f8e4m3": dt("f32") + ", " + dt("f8e4m3"), "bf16 -> i8": dt("bf16") + ", " + dt("i8")}
    for short, args in quantize.items():
        pattern = rf"fsdp::kernels::block_quantize<{args}>"
        wanted[f"block_quantize {short}"] = (rf"for_each_block_kernel<{pattern}", {"SHFL.BFLY"})
        controls[f"block_quantize {short} (one thread a block, control)"] = (rf"for_each_kernel<{pattern}", {"SHFL.BFLY"})
    for d in ("f32", "bf16"):
        pattern = rf"fsdp::kernels::block_dequantize<{dt(d)}, {dt('f8e4m3')}>"
        wanted[f"block_dequantize f8e4m3 -> {d}"] = (rf"for_each_quads_kernel<{pattern}", {vec("STG", idx[d])})
        controls[f"block_dequantize f8e4m3 -> {d} (scalar, control)"] = (rf"for_each_kernel<{pattern}", {vec("STG", idx[d])})
    pattern = rf"fsdp::kernels::block_dequantize_sum<{dt('i8')}>"
    wanted["block_dequantize_sum i8"] = (rf"for_each_quads_kernel<{pattern}", {"LDG.E.128", "STG.E.128"})
    controls["block_dequantize_sum i8 (scalar, control)"] = (rf"for_each_kernel<{pattern}", {"LDG.E.128", "STG.E.128"})
    for d in ("f32", "bf16"):
        wanted[f"reduce_ranks<{d}>"] = (rf"reduce_ranks_kernel<{dt(d)}>", {vec("LDG", idx[d]), vec("STG", idx[d])})

    # the GPT example's attention (no occupancy rule: see above)
    # (forward has a fourth argument, its output's type: the trainer's, bf16)
    attention = r"gpt_cuda::attention::{}<fsdp::basic_float<\(fsdp::dtype\)" + idx["bf16"] + r">, 64, \(gpt_cuda::attention::product\){}[,>]"
    heavy = set()
    for kernel in ("forward", "backward_query", "backward_key"):
        wanted[f"attention {kernel} (tensor cores)"] = (attention.format(kernel, 0), {"HMMA"})
        heavy.add(f"attention {kernel} (tensor cores)")
    controls["attention forward (twin, control)"] = (attention.format("forward", 1), {"HMMA"})
    wanted["gpt cross_entropy"] = (r"gpt_cuda::kernels::cross_entropy<0>", {"LDG.E.128", "STG.E.128"})
    # the kernels whose output a matrix product reads: fp32, or four bf16 in one 64-bit store
    wanted["gpt add_bias<f32>"] = (r"gpt_cuda::kernels::add_bias<float>", {"LDG.E.128", "STG.E.128"})
    wanted["gpt add_bias<bf16>"] = (rf"gpt_cuda::kernels::add_bias<fsdp::basic_float<{dt('bf16')}>", {"LDG.E.64", "LDG.E.128", "STG.E.64"})
    for kernel in ("bias_gelu", "layernorm_forward"):
        wanted[f"gpt {kernel}<f32>"] = (rf"gpt_cuda::kernels::{kernel}<float>", {"LDG.E.128", "STG.E.128"})
        wanted[f"gpt {kernel}<bf16>"] = (rf"gpt_cuda::kernels::{kernel}<fsdp::basic_float<{dt('bf16')}>", {"LDG.E.128", "STG.E.64"})
    # the kernels after the projections: the product in fp32, or in bf16 as the trainer writes it (a 64-bit load of
    # four), the residual fp32 in and out; bias_residual_layernorm also writes the next norm's output (bf16: 64-bit)
    bf16 = rf"fsdp::basic_float<{dt('bf16')}>"
    wanted["gpt bias_residual<f32>"] = (r"gpt_cuda::kernels::bias_residual<float>", {"LDG.E.128", "STG.E.128"})
    wanted["gpt bias_residual<bf16>"] = (rf"gpt_cuda::kernels::bias_residual<{bf16} ?>", {"LDG.E.64", "LDG.E.128", "STG.E.128"})
    wanted["gpt bias_residual_layernorm<f32>"] = (r"gpt_cuda::kernels::bias_residual_layernorm<float, float>", {"LDG.E.128", "STG.E.128"})
    wanted["gpt bias_residual_layernorm<bf16>"] = (rf"gpt_cuda::kernels::bias_residual_layernorm<{bf16}, {bf16} ?>", {"LDG.E.64", "LDG.E.128", "STG.E.128", "STG.E.64"})
    # GELU's backward reads the MLP's pre-activation and its output gradient and writes its input gradient in the
    # compute type (four bf16 in one 64-bit access); the column sums read fp32 gradients, or the MLP's in bf16
    wanted["gpt gelu_backward<f32>"] = (r"gpt_cuda::kernels::gelu_backward<float>", {"LDG.E.128", "STG.E.128"})
    wanted["gpt gelu_backward<bf16>"] = (rf"gpt_cuda::kernels::gelu_backward<fsdp::basic_float<{dt('bf16')}>", {"LDG.E.64", "STG.E.64"})
    wanted["gpt column_partials<f32>"] = (r"gpt_cuda::kernels::column_partials<float>", {"LDG.E.128", "STG.E.128"})
    wanted["gpt column_partials<bf16>"] = (rf"gpt_cuda::kernels::column_partials<fsdp::basic_float<{dt('bf16')}>", {"LDG.E.64", "STG.E.128"})
    # the norms' backward, on an fp32 output gradient or the trainer's bf16 one (four bf16 in one 64-bit load)
    for kernel in ("layernorm_backward_input", "layernorm_param_partials"):
        wanted[f"gpt {kernel}<f32>"] = (rf"gpt_cuda::kernels::{kernel}<float>", {"LDG.E.128", "STG.E.128"})
        wanted[f"gpt {kernel}<bf16>"] = (rf"gpt_cuda::kernels::{kernel}<fsdp::basic_float<{dt('bf16')}>", {"LDG.E.64", "LDG.E.128", "STG.E.128"})
    heavy.add("attention forward (twin, control)")

    fns, usage = functions(sass), resources(res)
    passed = failed = 0
    for short, (pattern, need) in list(wanted.items()) + list(controls.items()):
        names = [n for n in fns if re.search(pattern, n)]
        control = short in controls
        if len(names) != 1:
            print(f"FAILED {short}: {len(names)} kernels match /{pattern}/ in the cubin (expected 1)")
            failed += 1
            continue
        have = accesses(fns[names[0]])
        missing = sorted(need - have)
        regs, stack, _, local = usage.get(names[0], (None, None, None, None))
        problems = []
        if missing:
            problems.append("no " + ", ".join(missing) + " (has " + (", ".join(sorted(have)) or "no global access") + ")")
        if regs is None:
            problems.append("no resource usage")
        else:
            if local or stack:
                problems.append(f"{local} bytes of local memory, {stack} of stack (spills)")
            if short not in heavy and occupancy(regs) < MIN_OCCUPANCY:
                problems.append(f"occupancy {occupancy(regs):.0%} at {regs} registers (under {MIN_OCCUPANCY:.0%})")
        threads = 128 if short in heavy else THREADS  # the attention kernels' blocks are 128 threads
        figures = f"{regs} registers, occupancy {occupancy(regs, threads):.0%} at {threads} threads" if regs is not None else "no figures"
        if control:
            if missing:
                print(f"passed {short}: rejected as it should be ({figures}; no {', '.join(missing)})")
                passed += 1
            else:
                print(f"FAILED {short}: a scalar kernel passes the vector rule; the check cannot tell them apart")
                failed += 1
        elif problems:
            print(f"FAILED {short}: " + "; ".join(problems) + f" ({figures})")
            failed += 1
        else:
            print(f"passed {short}: {', '.join(sorted(need))} ({figures})")
            passed += 1
    print(f"sass: {passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
