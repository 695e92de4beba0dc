"""The PyTorch peer's copies of the data generator and the schedule (bench/peer/gpt_fsdp2.py), printed as
peer_data.cc prints gpt_model.hpp's. Needs no PyTorch."""
import importlib.util
import struct
import sys
import types

spec = importlib.util.spec_from_file_location("gpt_fsdp2", sys.argv[1])
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]

for vocab in (2, 7, 64, 50257):
    seed = 1234 + vocab
    perm = peer.permutation(seed, vocab)
    print(f"perm {vocab}: " + " ".join(str(v) for v in perm[:40]))
    for sample in (0, 1, 77, 123456789):
        print(f"sample {sample}: " + " ".join(str(t) for t in peer.sequence(seed, 0.75, perm, 32, sample)))
a = types.SimpleNamespace(lr=f32(3e-3), min_lr_ratio=f32(0.1), warmup=5, steps=50)
for step in range(50):
    print(f"lr {step}: {f32(peer.lr_at(a, step)):.9e}")
