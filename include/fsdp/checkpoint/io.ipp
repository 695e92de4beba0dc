#pragma once
// The file operations' definitions (fsdp/checkpoint/io.hpp): included by that header, or compiled once under
// FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "fsdp/checkpoint/io.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::checkpoint::io {

FSDP_DECL std::string reason(int err) { return std::error_code(err, std::generic_category()).message(); }

FSDP_DECL void fail(const std::string& what) { throw checkpoint_error(what); }

FSDP_DECL void file::write_at(const void* data, std::uint64_t n, std::uint64_t at) {
  const char* p = static_cast<const char*>(data);
  std::uint64_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd_, p + done, static_cast<std::size_t>(n - done), static_cast<off_t>(at + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail(fsdp::detail::cat("could not write ", n, " bytes to '", path_, "' at byte ", at, ": ",
                       w < 0 ? reason(errno) : std::string("the system wrote nothing")));
    done += static_cast<std::uint64_t>(w);
  }
}

FSDP_DECL void file::read_at(void* data, std::uint64_t n, std::uint64_t at) const {
  char* p = static_cast<char*>(data);
  std::uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, static_cast<std::size_t>(n - done), static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      fail(fsdp::detail::cat("could not read ", n, " bytes of '", path_, "' at byte ", at, ": ", reason(errno)));
    if (r == 0)
      fail(fsdp::detail::cat("'", path_, "' ends at byte ", at + done, ", before the ", n, " bytes at byte ", at,
                       " were read: the file is truncated"));
    done += static_cast<std::uint64_t>(r);
  }
}

FSDP_DECL std::uint64_t file::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(fsdp::detail::cat("could not stat '", path_, "': ", reason(errno)));
  return static_cast<std::uint64_t>(st.st_size);
}

FSDP_DECL void file::resize(std::uint64_t n) {
  if (::ftruncate(fd_, static_cast<off_t>(n)) != 0)
    fail(fsdp::detail::cat("could not set the size of '", path_, "' to ", n, " bytes: ", reason(errno)));
}

FSDP_DECL void file::sync() {
  if (::fsync(fd_) != 0) fail(fsdp::detail::cat("could not flush '", path_, "' to storage (fsync): ", reason(errno)));
}

FSDP_DECL void file::close() {
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0) fail(fsdp::detail::cat("could not close '", path_, "': ", reason(errno)));
}

FSDP_DECL void file::drop() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

FSDP_DECL file create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(fsdp::detail::cat("could not create '", path, "': ", reason(errno)));
  return file(fd, path);
}

FSDP_DECL file open_write(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(fsdp::detail::cat("could not open '", path, "' for writing: ", reason(errno)));
  return file(fd, path);
}

FSDP_DECL file open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(fsdp::detail::cat("could not open '", path, "': ", reason(errno)));
  return file(fd, path);
}

FSDP_DECL void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(fsdp::detail::cat("could not open the directory '", dir, "': ", reason(errno)));
  file d(fd, dir);
  d.sync();
}

FSDP_DECL void rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail(fsdp::detail::cat("could not rename '", from, "' to '", to, "': ", reason(errno)));
}

FSDP_DECL void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0)
    fail(fsdp::detail::cat("could not create the directory '", dir, "': ", reason(errno)));
}

FSDP_DECL bool remove_all(const std::string& path, std::string* why) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec && why) *why = ec.message();
  return !ec;
}

FSDP_DECL bool exists(const std::string& path) {
  std::error_code ec;
  const bool e = std::filesystem::exists(path, ec);
  if (ec) fail(fsdp::detail::cat("could not tell whether '", path, "' exists: ", ec.message()));
  return e;
}

FSDP_DECL std::string parent_of(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

FSDP_DECL void commit(const std::string& partial, const std::string& target, const fault_hook& fault, int rank) {
  if (fault) fault({rank, "rename", partial});
  rename(partial, target);
  const std::string dir = parent_of(target);
  try {
    if (fault) fault({rank, "fsync", dir});
    sync_dir(dir);
  } catch (const std::exception& e) {
    fail(fsdp::detail::cat(fsdp::detail::unprefixed(e), " after the rename: '", target,
                     "' is complete, but a crash before the file system writes the rename back may lose it"));
  }
}

}  // namespace fsdp::checkpoint::io
