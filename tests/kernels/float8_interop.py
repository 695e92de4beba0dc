"""What the ml_dtypes package (PyPI) makes of fp8, for tests/kernels/float8_interop.cc.

Writes, for each format (E4M3 as ml_dtypes.float8_e4m3fn, E5M2 as ml_dtypes.float8_e5m2):
  decode FORMAT B BITS      the fp32 bits of fp8 pattern B (all 256)
  step FORMAT SIGN P Q      fp32 inputs of sign SIGN (0 or 1) whose magnitude bits are P or more (up to the next
                            step, and at most 0x7f800000, infinity) convert to fp8 bits Q
  sample FORMAT X Q         fp32 input bits X convert to fp8 bits Q (random inputs, NaNs included)
Each step is found by bisection over the magnitude bits, where ml_dtypes' conversion is monotonic (rounding to
nearest is); the samples check ml_dtypes directly, without that assumption.
"""
import sys

import ml_dtypes
import numpy as np

FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
INF = 0x7F800000


def convert(fmt, bits):
    x = np.asarray(bits, dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflow inputs are part of the table
        return x.astype(FORMATS[fmt]).view(np.uint8)


def steps(fmt, sign):
    q = lambda p: int(convert(fmt, [(sign << 31) | p])[0])
    out = [(0, q(0))]
    while True:
        p, cur = out[-1]
        if q(INF) == cur:
            return out
        lo, hi = p, INF  # q(lo) == cur != q(hi): the first change lies in (lo, hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if q(mid) == cur:
                lo = mid
            else:
                hi = mid
        out.append((hi, q(hi)))


def main(path):
    rng = np.random.default_rng(11)
    with open(path, "w") as f:
        for fmt, t in FORMATS.items():
            values = np.arange(256, dtype=np.uint8).view(t).astype(np.float32).view(np.uint32)
            for b, v in enumerate(values):
                f.write(f"decode {fmt} {b} {int(v):#010x}\n")
            for sign in (0, 1):
                for p, q in steps(fmt, sign):
                    f.write(f"step {fmt} {sign} {p:#010x} {q:#04x}\n")
            xs = rng.integers(0, 1 << 32, size=200000, dtype=np.uint64).astype(np.uint32)
            for x, q in zip(xs, convert(fmt, xs)):
                f.write(f"sample {fmt} {int(x):#010x} {int(q):#04x}\n")


if __name__ == "__main__":
    main(sys.argv[1])
