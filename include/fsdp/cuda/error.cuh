#pragma once
// Errors of the CUDA runtime and NCCL, and the wrappers that check their return codes.
//
// Three flavours per library (stdexec throw_on_cuda_error.cuh), each a single statement that cannot swallow
// an `else`, each evaluating its argument exactly once:
//   FSDP_CUDA_CHECK(expr)   / FSDP_NCCL_CHECK(expr)    throw cuda_error / nccl_error (host API code paths)
//   FSDP_CUDA_ASSERT(expr)  / FSDP_NCCL_ASSERT(expr)   print to stderr and std::abort(), in debug and release
//   FSDP_CUDA_LOG(expr)     / FSDP_NCCL_LOG(expr)      print to stderr and continue (destructors, cleanup)
// After a CUDA error is reported, cudaGetLastError() is called so that a non-sticky error does not resurface
// in the next unrelated check. The library never calls exit().
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "fsdp/core/error.hpp"

namespace fsdp {

namespace detail {
/// The enumerator's name, like cudaGetErrorName does for CUDA (NCCL has only ncclGetErrorString).
constexpr const char* nccl_result_name(ncclResult_t code) noexcept {
  switch (code) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t(unknown)";
  }
}
}  // namespace detail

/// A CUDA runtime call failed. Carries the code, the failed expression and where it was checked.
class cuda_error : public std::runtime_error {
 public:
  /// `hint`, when non-empty, is appended to the message (what it means, what to do).
  cuda_error(cudaError_t code, const char* expression, const char* file, int line, const std::string& hint = {})
      : std::runtime_error(message(code, expression, file, line, hint)),
        code_(code),
        expression_(expression ? expression : ""),
        file_(file ? file : ""),
        line_(line) {}

  cudaError_t code() const noexcept { return code_; }
  const char* expression() const noexcept { return expression_.c_str(); }
  const char* file() const noexcept { return file_.c_str(); }
  int line() const noexcept { return line_; }

  static std::string message(cudaError_t code, const char* expression, const char* file, int line,
                             const std::string& hint = {}) {
    std::string m = detail::cat("fsdp: CUDA call '", expression ? expression : "", "' failed with ",
                                cudaGetErrorName(code), " (", cudaGetErrorString(code), ") at ", file ? file : "?",
                                ":", line);
    if (!hint.empty()) m += detail::cat(": ", hint);
    return m;
  }

 private:
  cudaError_t code_;
  std::string expression_;
  std::string file_;
  int line_;
};

/// An NCCL call failed. Carries the code, the failed expression and where it was checked.
class nccl_error : public std::runtime_error {
 public:
  nccl_error(ncclResult_t code, const char* expression, const char* file, int line, const std::string& hint = {})
      : std::runtime_error(message(code, expression, file, line, hint)),
        code_(code),
        expression_(expression ? expression : ""),
        file_(file ? file : ""),
        line_(line) {}

  ncclResult_t code() const noexcept { return code_; }
  const char* expression() const noexcept { return expression_.c_str(); }
  const char* file() const noexcept { return file_.c_str(); }
  int line() const noexcept { return line_; }

  static std::string message(ncclResult_t code, const char* expression, const char* file, int line,
                             const std::string& hint = {}) {
    std::string m =
        detail::cat("fsdp: NCCL call '", expression ? expression : "", "' failed with ", detail::nccl_result_name(code),
                    " (", ncclGetErrorString(code), ") at ", file ? file : "?", ":", line);
    if (!hint.empty()) m += detail::cat(": ", hint);
    // NCCL keeps a human-readable description of the last failure (e.g. which argument was invalid).
    if (const char* last = ncclGetLastError(nullptr); last && *last) m += detail::cat(" [NCCL: ", last, "]");
    if (code == ncclSystemError || code == ncclRemoteError)
      m += "; run with NCCL_DEBUG=WARN (or INFO) on every rank to see which peer or resource failed";
    return m;
  }

 private:
  ncclResult_t code_;
  std::string expression_;
  std::string file_;
  int line_;
};

namespace detail {

// The failure paths are out of the way of the success path: the macros inline only a comparison.

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cuda_error(cudaError_t code, const char* expr,
                                                                    const char* file, int line) {
  cuda_error e(code, expr, file, line);
  (void)cudaGetLastError();  // clear the (non-sticky) error now that it is reported
  throw e;
}

[[noreturn, gnu::cold, gnu::noinline]] inline void abort_cuda_error(cudaError_t code, const char* expr,
                                                                    const char* file, int line) noexcept {
  std::fprintf(stderr, "%s (FSDP_CUDA_ASSERT: aborting)\n", cuda_error::message(code, expr, file, line).c_str());
  std::fflush(stderr);
  std::abort();
}

[[gnu::cold, gnu::noinline]] inline void log_cuda_error(cudaError_t code, const char* expr, const char* file,
                                                        int line) noexcept {
  try {
    std::fprintf(stderr, "%s (FSDP_CUDA_LOG: continuing)\n", cuda_error::message(code, expr, file, line).c_str());
  } catch (...) {  // building the message allocates; a log call must not throw
    std::fprintf(stderr, "fsdp: CUDA call '%s' failed with %s at %s:%d (FSDP_CUDA_LOG: continuing)\n", expr,
                 cudaGetErrorName(code), file, line);
  }
  (void)cudaGetLastError();
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_nccl_error(ncclResult_t code, const char* expr,
                                                                    const char* file, int line) {
  throw nccl_error(code, expr, file, line);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void abort_nccl_error(ncclResult_t code, const char* expr,
                                                                    const char* file, int line) noexcept {
  std::fprintf(stderr, "%s (FSDP_NCCL_ASSERT: aborting)\n", nccl_error::message(code, expr, file, line).c_str());
  std::fflush(stderr);
  std::abort();
}

[[gnu::cold, gnu::noinline]] inline void log_nccl_error(ncclResult_t code, const char* expr, const char* file,
                                                        int line) noexcept {
  try {
    std::fprintf(stderr, "%s (FSDP_NCCL_LOG: continuing)\n", nccl_error::message(code, expr, file, line).c_str());
  } catch (...) {
    std::fprintf(stderr, "fsdp: NCCL call '%s' failed with %s at %s:%d (FSDP_NCCL_LOG: continuing)\n", expr,
                 nccl_result_name(code), file, line);
  }
}

}  // namespace detail
}  // namespace fsdp

// The argument is variadic so that expressions with top-level commas (template arguments) need no extra
// parentheses; it is evaluated exactly once and its text is what the error reports.
#define FSDP_DETAIL_CALL_CHECK(type, success, on_error, ...)                   \
  do {                                                                         \
    const type fsdp_detail_status_ = (__VA_ARGS__);                            \
    if (fsdp_detail_status_ != success)                                        \
      on_error(fsdp_detail_status_, #__VA_ARGS__, __FILE__, __LINE__);         \
  } while (0)

#define FSDP_CUDA_CHECK(...) \
  FSDP_DETAIL_CALL_CHECK(::cudaError_t, ::cudaSuccess, ::fsdp::detail::throw_cuda_error, __VA_ARGS__)
#define FSDP_CUDA_ASSERT(...) \
  FSDP_DETAIL_CALL_CHECK(::cudaError_t, ::cudaSuccess, ::fsdp::detail::abort_cuda_error, __VA_ARGS__)
#define FSDP_CUDA_LOG(...) \
  FSDP_DETAIL_CALL_CHECK(::cudaError_t, ::cudaSuccess, ::fsdp::detail::log_cuda_error, __VA_ARGS__)

#define FSDP_NCCL_CHECK(...) \
  FSDP_DETAIL_CALL_CHECK(::ncclResult_t, ::ncclSuccess, ::fsdp::detail::throw_nccl_error, __VA_ARGS__)
#define FSDP_NCCL_ASSERT(...) \
  FSDP_DETAIL_CALL_CHECK(::ncclResult_t, ::ncclSuccess, ::fsdp::detail::abort_nccl_error, __VA_ARGS__)
#define FSDP_NCCL_LOG(...) \
  FSDP_DETAIL_CALL_CHECK(::ncclResult_t, ::ncclSuccess, ::fsdp::detail::log_nccl_error, __VA_ARGS__)
