"""host_test: a doctest cc_test of the host path (no CUDA)."""

load("//bazel:copts.bzl", "FSDP_COPTS", "FSDP_LINKOPTS")

# The libraries with sources, and their separate-compilation counterparts.
_SEPARATE = {
    "//:checkpoint": "//:checkpoint_separate",
}

def host_test(name, srcs, deps = [], size = "small", copts = [], header_only = False, **kwargs):
    """A host test, compiled in separate-compilation mode unless `header_only`.

    Separate mode (//:fsdp_separate, docs/build.md): the library's non-template definitions and the host model core
    on comm::local (its executor and optimizers) are compiled once, in fsdp/src.hpp's one file, for every test; a
    test file parses their declarations only and compiles what it instantiates itself (its policies' Model shells,
    other backends and communicators). Each test file compiles in about two thirds of its header-only time. The
    code is the same in both modes (example_test and port_modes_test compare programs built both ways byte for byte;
    CMake's tests, the examples and the consumer are header-only). `header_only`: the library's default mode, as a
    user's first file is built (readme_test), with the host core compiled once by //tests/support:instances.
    """
    if header_only:
        library = ["//:fsdp", "//tests/support:instances"]
    else:
        library = ["//:fsdp_separate"]
        deps = [_SEPARATE.get(d, d) for d in deps]
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = FSDP_COPTS + copts,
        linkopts = FSDP_LINKOPTS,
        deps = deps + library + [
            "//tests/support",
            "@doctest",
        ],
        size = size,
        **kwargs
    )
