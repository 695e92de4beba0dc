"""nvcc inside Bazel 4.2.3 without a CUDA toolchain: one genrule per .cu file, then a cc rule.

Each .cu is compiled by a genrule that calls /usr/local/cuda/bin/nvcc by its absolute path (an nvcc
reached through an external-repository symlink cannot find its own headers in the sandbox). The
resulting .o goes into the srcs of a cc_test / cc_binary whose deps bring cudart and NCCL.

The genrule sees only the files it lists, so `hdrs` must name every header (filegroups) the .cu
includes from this workspace. Headers under the workspace's include/ are found with
`#include <fsdp/...>` (-Iinclude); the CUDA toolkit's own headers (cuda_runtime, CCCL, NCCL) come
from nvcc; system headers such as <doctest/doctest.h> and <mpi.h> come from /usr/include through the
host compiler (add "-I/usr/lib/x86_64-linux-gnu/openmpi/include" and "-DOMPI_SKIP_MPICXX" to copts
when a .cu includes <mpi.h>).

Every generated target is tagged "cuda", so `--config=asan` / `--config=tsan` (which filter out
that tag) never build them. Where no GPU is visible they are not built at all unless FSDP_BAZEL_CUDA=on (see
local_gpu.bzl): they are incompatible with the host platform, and `bazel test //...` passes over them. A target
with build_without_gpu = True is built everywhere (the smoke test: the proof that this rule still compiles and
links).

Usage:
    load("//bazel:cuda.bzl", "cuda_binary", "cuda_test")

    cuda_test(
        name = "gpu_test",
        srcs = ["gpu_test.cu"],
        hdrs = ["//:fsdp_headers"],
    )
"""

load("@local_gpu//:defs.bzl", "BUILD_CUDA")

NVCC = "/usr/local/cuda/bin/nvcc"

# A constraint no platform has: the nvcc targets require it where they are not to be built (local_gpu.bzl).
NOT_BUILT_HERE = ["//bazel:gpu_or_FSDP_BAZEL_CUDA_on"]

def _compatible(build_without_gpu):
    return [] if (BUILD_CUDA or build_without_gpu) else NOT_BUILT_HERE

# H100 / H200: SASS for sm_90 plus compute_90 PTX for forward compatibility.
CUDA_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

# No --expt-relaxed-constexpr and no --extended-lambda: the library's headers compile correctly under plain
# `nvcc -std=c++20`, as a user's own build compiles them. Calling a host function (constexpr or not) from device
# code is only a warning under plain nvcc (#20011-D to #20015-D), and the kernel is then wrong (std::bit_cast in a
# cast kernel stored zeros): here it is an error, so none can come back unseen.
NVCC_DIAG_ERRORS = "--diag-error=20011,20012,20013,20014,20015"

NVCC_COPTS = [
    "-std=c++20",
    "-O2",
    NVCC_DIAG_ERRORS,
    "-Xcompiler=-fPIC,-pthread",
    "-Iinclude",
]

def _stem(src):
    base = src.split(":")[-1].split("/")[-1]
    if base.endswith(".cu"):
        base = base[:-len(".cu")]
    return base

def _nvcc_objects(name, srcs, hdrs, copts, tags, compatible, visibility = None):
    """Declares one nvcc genrule per .cu in srcs; returns the labels of the .o files."""
    objs = []
    for src in srcs:
        out = "%s_%s.o" % (name, _stem(src))
        native.genrule(
            name = "%s_%s_nvcc" % (name, _stem(src)),
            srcs = [src] + hdrs,
            outs = [out],
            cmd = " ".join(
                [NVCC] + NVCC_COPTS + CUDA_GENCODE + copts +
                ["-x", "cu", "-c", "$(location %s)" % src, "-o", "$@"],
            ),
            message = "nvcc %s" % src,
            tags = tags,
            target_compatible_with = compatible,
            visibility = visibility,
        )
        objs.append(":" + out)
    return objs

def cuda_test(name, srcs, hdrs = [], deps = [], size = "small", tags = [], copts = [], cc_srcs = [], build_without_gpu = False, **kwargs):
    """A cc_test built from .cu files with nvcc, linked with cudart, NCCL and doctest.

    Args:
      name: test name.
      srcs: .cu files (one nvcc genrule each; outputs <name>_<stem>.o).
      hdrs: labels (filegroups) of every workspace header the .cu files include.
      deps: extra cc deps for the link (for example @mpi//:mpi).
      size: test size.
      tags: extra tags; "cuda" is always added.
      copts: extra nvcc flags (for example "-DFOO=1").
      cc_srcs: plain C++ sources compiled by the host compiler into the same binary (with //:fsdp).
      build_without_gpu: build it where no GPU is visible too (see local_gpu.bzl).
      **kwargs: passed to cc_test (args, data, env, timeout, shard_count, visibility, ...).
    """
    all_tags = tags + ([] if "cuda" in tags else ["cuda"])
    compatible = _compatible(build_without_gpu)
    objs = _nvcc_objects(name, srcs, hdrs, copts, all_tags, compatible)
    native.cc_test(
        name = name,
        srcs = objs + cc_srcs,
        deps = deps + ([] if not cc_srcs else ["//:fsdp"]) + [
            "@cuda//:cudart",
            "@cuda//:nccl",
            "@doctest//:doctest",
        ],
        linkopts = ["-pthread"],
        size = size,
        tags = all_tags,
        target_compatible_with = compatible,
        **kwargs
    )

def cuda_binary(name, srcs, hdrs = [], deps = [], static_cudart = False, copts = [], tags = [], nccl = True, **kwargs):
    """A cc_binary built from .cu files with nvcc.

    Args:
      name: binary name.
      srcs: .cu files (one nvcc genrule each; outputs <name>_<stem>.o).
      hdrs: labels (filegroups) of every workspace header the .cu files include.
      deps: extra cc deps for the link.
      static_cudart: link libcudart_static.a (for binaries carried to another machine).
      copts: extra nvcc flags.
      tags: extra tags; "cuda" is always added.
      nccl: link libnccl.so (set False for binaries that must not need libnccl.so.2 at run time).
      **kwargs: passed to cc_binary (data, visibility, ...).
    """
    all_tags = tags + ([] if "cuda" in tags else ["cuda"])
    compatible = _compatible(False)
    objs = _nvcc_objects(name, srcs, hdrs, copts, all_tags, compatible)
    cuda_deps = ["@cuda//:cudart_static" if static_cudart else "@cuda//:cudart"]
    if nccl:
        cuda_deps.append("@cuda//:nccl")
    native.cc_binary(
        name = name,
        srcs = objs,
        deps = deps + cuda_deps,
        linkopts = ["-pthread"],
        tags = all_tags,
        target_compatible_with = compatible,
        **kwargs
    )
