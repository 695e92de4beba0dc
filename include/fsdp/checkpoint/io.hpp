#pragma once
// The file system as checkpoints and weights files use it (POSIX): files written whole or at offsets, flushed
// with fsync, published with rename; byte ranges read with pread. Every failure is a checkpoint_error naming the
// file, the operation, the bytes and the system's reason ("could not write 4194304 bytes to 'ck/shard-00001-of-
// 00004.bin' at byte 8388608: File too large").
//
// A fault hook (io_event, fault_hook) is called before each operation that changes the file system, so that tests
// can make one rank's write fail, or kill the process between two writes; it is empty in normal use.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::checkpoint {

/// An operation a writer is about to perform: `op` is "create", "write", "fsync", "rename" or "remove"; `path`
/// the file or directory.
struct io_event {
  int rank = 0;
  std::string_view op;
  std::string_view path;
};
/// Called before each such operation; may throw (the operation then fails with that message) or end the process.
using fault_hook = std::function<void(const io_event&)>;

namespace io {

FSDP_DECL std::string reason(int err);

[[noreturn]] FSDP_DECL void fail(const std::string& what);

/// An open file descriptor, closed on destruction (errors there are ignored: close() reports them when called).
class file {
 public:
  file() = default;
  file(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  file(file&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  file& operator=(file&& o) noexcept {
    if (this != &o) {
      drop();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  ~file() { drop(); }

  const std::string& path() const noexcept { return path_; }

  /// Writes all `n` bytes at byte `at` (pwrite, resumed after partial writes and signals).
  void write_at(const void* data, std::uint64_t n, std::uint64_t at);
  /// Reads all `n` bytes at byte `at`; a file that ends first is named as truncated.
  void read_at(void* data, std::uint64_t n, std::uint64_t at) const;
  std::uint64_t size() const;
  /// Sets the file's size (zeros past the old end).
  void resize(std::uint64_t n);
  void sync();
  /// Closes the file; a failure (a delayed write error) is reported.
  void close();

 private:
  void drop() noexcept;
  int fd_ = -1;
  std::string path_;
};

/// A new file (replacing any file of that name), for writing.
FSDP_DECL file create(const std::string& path);
/// An existing file, for writing at offsets.
FSDP_DECL file open_write(const std::string& path);
FSDP_DECL file open_read(const std::string& path);

/// Flushes a directory's entries (a file created or renamed in it) to storage.
FSDP_DECL void sync_dir(const std::string& dir);
/// Renames `from` to `to` (atomic within a file system); `to` must not be a non-empty directory.
FSDP_DECL void rename(const std::string& from, const std::string& to);
FSDP_DECL void make_dir(const std::string& dir);
/// Removes a file or a directory tree; false (with the reason in `why`) when it could not.
FSDP_DECL bool remove_all(const std::string& path, std::string* why = nullptr) noexcept;
/// Whether anything exists at `path` (a failure to tell is reported).
FSDP_DECL bool exists(const std::string& path);
/// The directory a path is in ("." for a bare name).
FSDP_DECL std::string parent_of(const std::string& path);

/// The commit of a save: renames `partial` to `target` and syncs the directory they are in, calling `fault` (as
/// rank `rank`) before each. A failed rename leaves `partial` for the caller to remove; a failed sync after it
/// says that `target` is complete (only a crash before the file system writes the rename back could lose it).
FSDP_DECL void commit(const std::string& partial, const std::string& target, const fault_hook& fault, int rank);

}  // namespace io
}  // namespace fsdp::checkpoint

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/io.ipp"
#endif
