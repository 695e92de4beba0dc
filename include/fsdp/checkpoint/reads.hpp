#pragma once
// Reading only what a rank needs: given where a tensor's elements lie in files (extents), the byte ranges that
// fill one rank's elements [begin, end) (plan_reads), and the reads of one file (read_ranges): nearby ranges are
// read together in chunks of at most chunk_bytes, and, when the file has block checksums, every block a read
// touches is read whole and verified before any byte of it is copied on. Where the bytes go is a sink's: host
// memory (host_sink), into which a chunk that lies inside one destination is read straight, or a backend's memory
// that the host cannot address, which receives verified chunks only (upload_sink). Shared by checkpoint loads
// and safetensors imports.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/memory/memory.hpp"

namespace fsdp::checkpoint {

/// Elements [begin, end) of one tensor, stored contiguously at byte `offset` of file `file`.
struct extent {
  std::int64_t begin = 0, end = 0;
  std::size_t file = 0;
  std::uint64_t offset = 0;
};

/// `bytes` bytes at byte `offset` of a file, to be copied to `dest`.
struct read_op {
  std::uint64_t offset = 0, bytes = 0;
  char* dest = nullptr;
};

/// Appends to per_file[file] the reads that fill elements [begin, end) of a tensor stored as `extents` (sorted by
/// begin, covering the tensor once: the manifest or header parser checked it), `elem_bytes` each, into `dest`.
FSDP_DECL void plan_reads(const std::vector<extent>& extents, std::int64_t begin, std::int64_t end,
                          std::uint64_t elem_bytes, char* dest, std::vector<std::vector<read_op>>& per_file);

/// Block checksums of a file: the loader verifies every block it reads.
struct block_sums {
  std::uint64_t block_bytes = 0;
  const std::vector<std::uint64_t>* sums = nullptr;
};

/// Checks block `index` (`len` bytes at byte `at` of the file `path`) against its checksum in `sums`.
FSDP_DECL void check_block(const std::string& path, std::uint64_t index, std::uint64_t at, const char* data,
                           std::uint64_t len, const std::vector<std::uint64_t>& sums);

/// A host buffer reused from call to call, reallocated only to grow (its contents are not kept).
template <class T>
class reused_buffer {
 public:
  /// At least `n` elements, valid until the next call.
  T* at_least(std::uint64_t n) {
    if (n > held_) {
      buf_.reset();  // the old one goes first: at most one is held
      buf_.reset(new T[static_cast<std::size_t>(n)]);
      held_ = n;
    }
    return buf_.get();
  }

 private:
  std::unique_ptr<T[]> buf_;
  std::uint64_t held_ = 0;
};

/// read_ranges' sink for destinations in host memory: a chunk that lies inside one destination is read straight
/// into it (`direct`); other chunks go through one reused buffer and are copied out.
class host_sink {
 public:
  static constexpr bool direct = true;
  /// A buffer for the next chunk of `n` bytes (valid until the next call).
  char* chunk(std::uint64_t n) { return buf_.at_least(n); }
  /// `n` verified bytes for `dest`.
  void deliver(char* dest, const char* src, std::uint64_t n) { std::memcpy(dest, src, static_cast<std::size_t>(n)); }
  /// Every byte of the chunk was delivered.
  void chunk_done() {}

 private:
  reused_buffer<char> buf_;
};

namespace detail {
/// upload_sink's pinned buffers and events, on a backend that has them (none otherwise).
template <class B, bool Pinned>
struct pinned_parts {
  struct nothing {};
  nothing buffer[2], ready, done;
};
template <class B>
struct pinned_parts<B, true> {
  typename B::buffer buffer[2];
  typename B::event ready, done;
};
}  // namespace detail

/// read_ranges' sink for a Backend's memory that the host cannot address (a checkpoint load in place on
/// backend::cuda): a chunk is read into one of two reused host buffers, verified, and uploaded while the next chunk
/// is read into the other.
///
/// On a backend with pinned host memory and an upload stream (OffloadBackend: backend::cuda), the buffers are
/// pinned (allocate_host, accounted to the host domain's comm buffers while the load runs) and the uploads are
/// issued on the upload stream, so they run while the host reads the next chunk: before a buffer is refilled the
/// host waits for the upload stream, which by then has had a whole chunk's read to finish that buffer's uploads;
/// the compute stream is never synchronized. The upload stream first waits for the compute stream's work so far
/// (what touched the shards last), and finish() makes the compute stream wait for the uploads (later gathers wait
/// on the compute stream) and waits for the upload stream, so that the buffers may go. From pageable memory
/// (new[]) a copy returns only once its stream has run it, so nothing overlapped, and the compute stream was
/// synchronized once a chunk (checkpoint_test counts both). Elsewhere: pageable buffers and the compute stream.
/// After a failure the caller synchronizes every stream before the sink goes (the uploads may be in flight).
template <class B>
class upload_sink {
 public:
  static constexpr bool direct = false;
  /// Pinned buffers and the upload stream.
  static constexpr bool pinned = OffloadBackend<B>;

  explicit upload_sink(B& be) : be_(be) {
    if constexpr (pinned) {
      be_.record(p_.ready, be_.compute_stream());
      be_.wait(be_.upload_stream(), p_.ready);
    }
  }
  char* chunk(std::uint64_t n) {
    cur_ ^= 1;
    if constexpr (pinned) {
      typename B::buffer& b = p_.buffer[cur_];
      if (static_cast<std::uint64_t>(b.bytes()) < n) {
        be_.release_after(std::move(b), stream());  // waits for its uploads (a pinned buffer's release blocks)
        b = be_.allocate_host(static_cast<std::int64_t>(n), mem::comm_buffers);
      }
      return static_cast<char*>(b.data());
    } else {
      return buf_[cur_].at_least(n);
    }
  }
  void deliver(char* dest, const char* src, std::uint64_t n) { pending_.push_back({dest, src, n}); }
  void chunk_done() {
    be_.synchronize(stream());  // the other buffer's uploads, issued a chunk ago, have finished
    for (const upload& u : pending_) be_.upload(u.dest, u.src, static_cast<std::int64_t>(u.bytes), stream());
    pending_.clear();
  }
  void finish() {
    if constexpr (pinned) {
      be_.record(p_.done, be_.upload_stream());
      be_.wait(be_.compute_stream(), p_.done);
    }
    be_.synchronize(stream());
  }

 private:
  typename B::stream& stream() {
    if constexpr (pinned) return be_.upload_stream();
    else return be_.compute_stream();
  }
  struct upload {
    char* dest;
    const char* src;
    std::uint64_t bytes;
  };
  B& be_;
  reused_buffer<char> buf_[2];  // pageable (no pinned memory)
  detail::pinned_parts<B, pinned> p_;
  int cur_ = 1;
  std::vector<upload> pending_;
};

/// Performs `ops` on the open file `f` of `file_bytes` bytes (its size was checked), handing the bytes to `sink`
/// (host_sink's interface). Reads merge ranges less than `gap` bytes apart; with `check`, they grow to whole
/// blocks, each verified against its checksum before the sink receives a byte of it (a direct read lands in the
/// destination first). A read is at most `chunk_bytes` (4 MiB: a chunk is checksummed while it is still in the
/// CPU's cache, which made loads twice as fast as 64 MiB chunks on the development machine).
template <class Sink>
void read_ranges(const io::file& f, std::uint64_t file_bytes, std::vector<read_op> ops, Sink& sink,
                 const block_sums* check = nullptr, std::uint64_t chunk_bytes = std::uint64_t{4} << 20,
                 std::uint64_t gap = std::uint64_t{1} << 20) {
  if (ops.empty()) return;
  std::sort(ops.begin(), ops.end(), [](const read_op& a, const read_op& b) { return a.offset < b.offset; });
  const std::uint64_t align = check ? check->block_bytes : 1;
  chunk_bytes = std::max(chunk_bytes / align * align, align);
  auto run = [&](std::uint64_t lo, std::uint64_t hi, std::size_t first, std::size_t last) {  // ops [first, last)
    std::size_t from = first;  // ops ending before the chunk are done
    for (std::uint64_t at = lo; at < hi; at += chunk_bytes) {
      const std::uint64_t n = std::min(chunk_bytes, hi - at);
      while (from < last && ops[from].offset + ops[from].bytes <= at) ++from;
      // A chunk inside one op is read straight into its destination; otherwise through the buffer.
      const char* data = nullptr;
      std::size_t direct = last;
      if constexpr (Sink::direct)
        for (std::size_t i = from; i < last && ops[i].offset <= at; ++i)
          if (ops[i].offset + ops[i].bytes >= at + n) direct = i;
      if (direct < last) {
        char* d = ops[direct].dest + (at - ops[direct].offset);
        f.read_at(d, n, at);
        data = d;
      } else {
        char* b = sink.chunk(n);
        f.read_at(b, n, at);
        data = b;
      }
      if (check)
        for (std::uint64_t b = at; b < at + n; b += align)
          check_block(f.path(), b / align, b, data + (b - at), std::min(align, at + n - b), *check->sums);
      for (std::size_t i = from; i < last && ops[i].offset < at + n; ++i) {
        if (i == direct) continue;
        const read_op& o = ops[i];
        const std::uint64_t s = std::max(o.offset, at), e = std::min(o.offset + o.bytes, at + n);
        if (s < e) sink.deliver(o.dest + (s - o.offset), data + (s - at), e - s);
      }
      sink.chunk_done();
    }
  };
  std::size_t first = 0;
  std::uint64_t lo = ops[0].offset / align * align, hi = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const std::uint64_t s = ops[i].offset / align * align;
    const std::uint64_t e = std::min((ops[i].offset + ops[i].bytes + align - 1) / align * align, file_bytes);
    if (i > first && s > hi + gap) {
      run(lo, hi, first, i);
      first = i;
      lo = s;
      hi = 0;
    }
    hi = std::max(hi, e);
  }
  run(lo, hi, first, ops.size());
}

/// read_ranges into host memory.
FSDP_DECL void read_ranges(const io::file& f, std::uint64_t file_bytes, std::vector<read_op> ops,
                           const block_sums* check = nullptr);

}  // namespace fsdp::checkpoint

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/reads.ipp"
#endif
