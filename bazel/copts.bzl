"""Common compiler and linker flags for the project's host (g++) targets."""

FSDP_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror=return-type",
    "-pthread",
    # The library's arithmetic rounds once per operation (core/rounding.hpp); the tests' references are plain
    # float expressions, so they must not be fused into FMAs either (clang's default contracts on FMA targets).
    "-ffp-contract=off",
]

FSDP_LINKOPTS = [
    "-pthread",
]
