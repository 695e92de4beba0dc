"""The Python half of the interoperability check (safetensors_interop_test.sh), with the `safetensors` package.

usage: safetensors_interop.py OURS OURS_F16 REFDIR THEIRS THEIRS_REFDIR

Reads OURS (F32) and OURS_F16 (F16), written by the library, with safetensors.numpy.load_file and checks every
tensor against REFDIR/<name>.f32 bit for bit (F16: against numpy's own round-to-nearest-even of the fp32 values).
Then writes THEIRS with safetensors.numpy.save_file (weights F32, biases F16, new values) and the fp32 values the
library must import into THEIRS_REFDIR/<name>.f32.
"""
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def main(ours, ours_f16, refdir, theirs, theirs_refdir):
    names = sorted(f[: -len(".f32")] for f in os.listdir(refdir) if f.endswith(".f32"))
    loaded, loaded_f16 = load_file(ours), load_file(ours_f16)
    problems = []
    if sorted(loaded) != names:
        problems.append(f"{ours} holds {sorted(loaded)}, expected {names}")
    if sorted(loaded_f16) != names:
        problems.append(f"{ours_f16} holds {sorted(loaded_f16)}, expected {names}")
    for name in names:
        ref = np.fromfile(os.path.join(refdir, name + ".f32"), dtype="<f4")
        got = loaded.get(name)
        if got is None or got.dtype != np.float32 or got.size != ref.size:
            problems.append(f"{name}: F32 file gives {None if got is None else (got.dtype, got.shape)}")
            continue
        if not np.array_equal(got.reshape(-1).view(np.uint32), ref.view(np.uint32)):
            problems.append(f"{name}: F32 values differ")
        half = loaded_f16.get(name)
        if half is None or half.dtype != np.float16 or half.shape != got.shape:
            problems.append(f"{name}: F16 file gives {None if half is None else (half.dtype, half.shape)}")
        elif not np.array_equal(half.reshape(-1).view(np.uint16), ref.astype(np.float16).view(np.uint16)):
            problems.append(f"{name}: F16 values differ from numpy's rounding of the fp32 values")

    os.makedirs(theirs_refdir, exist_ok=True)
    written = {}
    for name in names:
        values = (loaded[name] * np.float32(0.5) + np.float32(0.25)).astype(np.float32)
        if name.endswith(".b"):
            values = values.astype(np.float16)
        written[name] = values
        values.astype(np.float32).reshape(-1).astype("<f4").tofile(os.path.join(theirs_refdir, name + ".f32"))
    save_file(written, theirs, metadata={"format": "np"})

    for p in problems:
        print("python:", p)
    print(f"python: {len(names)} tensors read with safetensors.numpy ({len(problems)} problems); wrote {theirs}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
