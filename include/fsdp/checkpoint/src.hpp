#pragma once
// The checkpoint library's non-template definitions, for separate-compilation mode (fsdp/core/config.hpp,
// docs/build.md): compile this file once in a program built in that mode that uses fsdp/checkpoint/, beside
// fsdp/src.hpp (Bazel: depend on //:checkpoint_separate; CMake: link fsdp::checkpoint_separate; both do it). It
// needs nlohmann-json and xxHash's header, which in this mode no checkpoint header includes.
#if !defined(FSDP_SEPARATE_COMPILATION)
#error "fsdp/checkpoint/src.hpp is for separate-compilation mode: define FSDP_SEPARATE_COMPILATION for this \
file and for every file that includes a library header (docs/build.md)"
#endif

#include "fsdp/checkpoint/checksum.ipp"
#include "fsdp/checkpoint/detail/load.ipp"
#include "fsdp/checkpoint/detail/shared.ipp"
#include "fsdp/checkpoint/directory.ipp"
#include "fsdp/checkpoint/io.ipp"
#include "fsdp/checkpoint/manifest.ipp"
#include "fsdp/checkpoint/reads.ipp"
#include "fsdp/checkpoint/safetensors.ipp"
#include "fsdp/checkpoint/safetensors_header.ipp"
