"""Common compiler and linker flags for the project's host (g++) targets."""

FSDP_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror=return-type",
    "-pthread",
]

FSDP_LINKOPTS = [
    "-pthread",
]
