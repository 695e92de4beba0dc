#pragma once
// The file system as checkpoints and weights files use it (POSIX): files written whole or at offsets, flushed
// with fsync, published with rename; byte ranges read with pread. Every failure is a checkpoint_error naming the
// file, the operation, the bytes and the system's reason ("could not write 4194304 bytes to 'ck/shard-00001-of-
// 00004.bin' at byte 8388608: File too large").
//
// A fault hook (io_event, fault_hook) is called before each operation that changes the file system, so that tests
// can make one rank's write fail, or kill the process between two writes; it is empty in normal use.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

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

inline std::string reason(int err) { return std::error_code(err, std::generic_category()).message(); }

[[noreturn]] inline void fail(const std::string& what) { throw checkpoint_error(what); }

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
  void write_at(const void* data, std::uint64_t n, std::uint64_t at) {
    const char* p = static_cast<const char*>(data);
    std::uint64_t done = 0;
    while (done < n) {
      const ssize_t w = ::pwrite(fd_, p + done, static_cast<std::size_t>(n - done), static_cast<off_t>(at + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        fail(detail::cat("could not write ", n, " bytes to '", path_, "' at byte ", at, ": ",
                         w < 0 ? reason(errno) : std::string("the system wrote nothing")));
      done += static_cast<std::uint64_t>(w);
    }
  }
  /// Reads all `n` bytes at byte `at`; a file that ends first is named as truncated.
  void read_at(void* data, std::uint64_t n, std::uint64_t at) const {
    char* p = static_cast<char*>(data);
    std::uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, p + done, static_cast<std::size_t>(n - done), static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(detail::cat("could not read ", n, " bytes of '", path_, "' at byte ", at, ": ", reason(errno)));
      if (r == 0)
        fail(detail::cat("'", path_, "' ends at byte ", at + done, ", before the ", n, " bytes at byte ", at,
                         " were read: the file is truncated"));
      done += static_cast<std::uint64_t>(r);
    }
  }
  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(detail::cat("could not stat '", path_, "': ", reason(errno)));
    return static_cast<std::uint64_t>(st.st_size);
  }
  /// Sets the file's size (zeros past the old end).
  void resize(std::uint64_t n) {
    if (::ftruncate(fd_, static_cast<off_t>(n)) != 0)
      fail(detail::cat("could not set the size of '", path_, "' to ", n, " bytes: ", reason(errno)));
  }
  void sync() {
    if (::fsync(fd_) != 0) fail(detail::cat("could not flush '", path_, "' to storage (fsync): ", reason(errno)));
  }
  /// Closes the file; a failure (a delayed write error) is reported.
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) fail(detail::cat("could not close '", path_, "': ", reason(errno)));
  }

 private:
  void drop() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::string path_;
};

/// A new file (replacing any file of that name), for writing.
inline file create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(detail::cat("could not create '", path, "': ", reason(errno)));
  return file(fd, path);
}
/// An existing file, for writing at offsets.
inline file open_write(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(detail::cat("could not open '", path, "' for writing: ", reason(errno)));
  return file(fd, path);
}
inline file open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(detail::cat("could not open '", path, "': ", reason(errno)));
  return file(fd, path);
}

/// Flushes a directory's entries (a file created or renamed in it) to storage.
inline void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(detail::cat("could not open the directory '", dir, "': ", reason(errno)));
  file d(fd, dir);
  d.sync();
}
/// Renames `from` to `to` (atomic within a file system); `to` must not be a non-empty directory.
inline void rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail(detail::cat("could not rename '", from, "' to '", to, "': ", reason(errno)));
}
inline void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0) fail(detail::cat("could not create the directory '", dir, "': ", reason(errno)));
}
/// Removes a file or a directory tree; false (with the reason in `why`) when it could not.
inline bool remove_all(const std::string& path, std::string* why = nullptr) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec && why) *why = ec.message();
  return !ec;
}
/// Whether anything exists at `path` (a failure to tell is reported).
inline bool exists(const std::string& path) {
  std::error_code ec;
  const bool e = std::filesystem::exists(path, ec);
  if (ec) fail(detail::cat("could not tell whether '", path, "' exists: ", ec.message()));
  return e;
}
/// The directory a path is in ("." for a bare name).
inline std::string parent_of(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

/// The commit of a save: renames `partial` to `target` and syncs the directory they are in, calling `fault` (as
/// rank `rank`) before each. A failed rename leaves `partial` for the caller to remove; a failed sync after it
/// says that `target` is complete (only a crash before the file system writes the rename back could lose it).
inline void commit(const std::string& partial, const std::string& target, const fault_hook& fault, int rank) {
  if (fault) fault({rank, "rename", partial});
  rename(partial, target);
  const std::string dir = parent_of(target);
  try {
    if (fault) fault({rank, "fsync", dir});
    sync_dir(dir);
  } catch (const std::exception& e) {
    fail(detail::cat(detail::unprefixed(e), " after the rename: '", target,
                     "' is complete, but a crash before the file system writes the rename back may lose it"));
  }
}

}  // namespace io
}  // namespace fsdp::checkpoint
