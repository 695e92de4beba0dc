"""@local_gpu: whether this machine's Bazel builds the nvcc targets (cuda_test, cuda_binary in cuda.bzl).

Without a GPU those targets can only print "skipped" (a test) or refuse to start (an example), and nvcc spends
most of `bazel test //...` on them (911 s of 2 cores' 2,660 s on 2026-11-27). So by default they are built only
where `nvidia-smi -L` lists a GPU; elsewhere they are incompatible with the host platform: `bazel test //...` and
`bazel build //...` pass over them, and naming one fails with "didn't satisfy constraint
//bazel:gpu_or_FSDP_BAZEL_CUDA_on". Without a GPU, CI compiles the same sources with CMake and runs them on the
simulated GPU (tools/sim-check), and still builds //tests/cuda:cuda_smoke_test here, so the nvcc rule itself stays
built and linked.

FSDP_BAZEL_CUDA (in the environment of the bazel command) overrides the detection:
    auto   (default) build them where nvidia-smi lists a GPU
    on     always build them (compile-check on a machine without a GPU: FSDP_BAZEL_CUDA=on bazel build //...)
    off    never build them (except the smoke test)

Bazel reruns the detection when FSDP_BAZEL_CUDA or PATH changes, and after `bazel sync --configure`; a GPU
installed under a running Bazel server is seen after `bazel shutdown`.
"""

def _local_gpu_impl(rctx):
    mode = rctx.os.environ.get("FSDP_BAZEL_CUDA", "auto")
    if mode not in ["auto", "on", "off"]:
        fail("FSDP_BAZEL_CUDA is '%s': it must be one of auto, on, off" % mode)
    gpus = []
    smi = rctx.which("nvidia-smi")
    if smi != None:
        r = rctx.execute([smi, "-L"], timeout = 30)
        if r.return_code == 0:
            gpus = [line for line in r.stdout.splitlines() if line.startswith("GPU ")]
    build = mode == "on" or (mode == "auto" and len(gpus) > 0)
    rctx.file("BUILD", "exports_files([\"defs.bzl\"])\n")
    rctx.file("defs.bzl", "# Written by //bazel:local_gpu.bzl (FSDP_BAZEL_CUDA=%s, %d GPU(s) listed).\nBUILD_CUDA = %s\n" %
                          (mode, len(gpus), build))

local_gpu = repository_rule(
    implementation = _local_gpu_impl,
    environ = ["FSDP_BAZEL_CUDA", "PATH"],
    local = True,
    configure = True,
)
