#pragma once
// Error types thrown at the host API. Every message says what happened, where (unit, parameter, rank,
// collective) and, where it helps, what to do about it.
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace fsdp {

/// Misuse of the API or bad input: wrong shapes, duplicate names, a unit used in the wrong state.
class usage_error : public std::runtime_error {
 public:
  explicit usage_error(const std::string& what) : std::runtime_error("fsdp: " + what) {}
};

/// A collective failed, timed out, or ranks disagreed about which collective comes next.
class comm_error : public std::runtime_error {
 public:
  explicit comm_error(const std::string& what) : std::runtime_error("fsdp: " + what) {}
};

/// Memory could not be had: the message says how many bytes, for what, on which rank or device and, from a Model,
/// for which unit and its largest parameter.
class memory_error : public std::runtime_error {
 public:
  explicit memory_error(const std::string& what) : std::runtime_error("fsdp: " + what) {}
};

/// A checkpoint or weights file could not be written or read: a failed write, a missing, truncated or corrupted
/// file, a manifest or header that does not parse, a tensor missing, unexpected or of another shape. Thrown on
/// every rank together, naming the file and the ranks; a load that throws has modified no parameter.
class checkpoint_error : public std::runtime_error {
 public:
  explicit checkpoint_error(const std::string& what) : std::runtime_error("fsdp: " + what) {}
};

namespace detail {
/// Builds a message from streamable parts: detail::cat("unit '", name, "' has ", n, " params").
template <class... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

/// A library error's message without its "fsdp: " prefix, for quoting it inside another message.
inline std::string_view unprefixed(const std::exception& e) noexcept {
  std::string_view m = e.what();
  if (m.starts_with("fsdp: ")) m.remove_prefix(6);
  return m;
}

/// Throws usage_error(message). Not a template: fail_usage's instantiations, one per call site's parts, each hold only
/// a call to cat and one to this, not the throw's code.
[[noreturn]] inline void throw_usage(std::string message) { throw usage_error(message); }

template <class... Parts>
[[noreturn]] void fail_usage(Parts&&... parts) {
  throw_usage(cat(std::forward<Parts>(parts)...));
}
}  // namespace detail

}  // namespace fsdp
