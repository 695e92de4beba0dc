"""host_test: a doctest cc_test against the header-only library (host path, no CUDA)."""

load("//bazel:copts.bzl", "FSDP_COPTS", "FSDP_LINKOPTS")

def host_test(name, srcs, deps = [], size = "small", copts = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = FSDP_COPTS + copts,
        linkopts = FSDP_LINKOPTS,
        deps = deps + [
            "//:fsdp",
            "//tests/support",
            "@doctest",
        ],
        size = size,
        **kwargs
    )
