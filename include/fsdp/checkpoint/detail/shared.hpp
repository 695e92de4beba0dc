#pragma once
// What a checkpoint save, a checkpoint load and the safetensors files share (fsdp/checkpoint/checkpoint.hpp,
// safetensors.hpp): file names, the block writer, the file records' wire form, the kinds of values per parameter,
// reading backend memory from the host, and the failures every rank reports together.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/checkpoint/reads.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/mesh.hpp"
#include "fsdp/layout/sharded_tensor.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/spec/model_spec.hpp"
#include "fsdp/spec/placement.hpp"

namespace fsdp::checkpoint::detail {

FSDP_DECL std::string shard_file_name(int index, int count);

/// Where the elements of `v` (this rank's part of parameter v.name's local tensor, as shard_views gives it) lie in
/// the global parameter, whose row-major element order checkpoints and safetensors files keep: f(global_first,
/// offset in v, count) per contiguous run (one run unless the parameter is split across tensor groups; a share of
/// a stack of experts begins where the shares of the expert ranks before it end).
template <class M, class F>
void global_runs(M& m, const ShardedTensor& v, F&& f) {
  const ParamSpec& p = m.spec().at(v.name);
  const int rank = m.comm().rank();
  const tensor_coords t{m.mesh().tensor, m.mesh().tensor_rank(rank)};
  const expert_coords e{m.mesh().expert, m.mesh().expert_rank(rank)};
  for_each_global_run(p.shape, p.tensor, t, v.begin, v.local_numel(), std::forward<F>(f),
                      expert_base(p.shape, p.tensor, p.experts, t, e));
}

/// The global shape of parameter `p` of the model's spec (its local shape): split dimensions times the tensor
/// group, a stack of experts times the expert group.
template <class M>
std::vector<std::int64_t> global_shape_of(const M& m, const ParamSpec& p) {
  std::vector<std::int64_t> shape = global_shape(p.shape, p.tensor, m.mesh().tensor);
  if (p.experts) shape[0] *= m.mesh().expert;
  return shape;
}

/// Whether this rank writes a file of global tensors: the ranks of the mesh's first replica (fsdp/core/mesh.hpp's
/// replicate dimension), which hold every shard once between them.
template <class M>
bool writes_file(M& m) {
  return fsdp::mesh::coordinate(m.mesh(), m.comm().rank(), mesh_dim::replicate) == 0;
}
/// How many ranks write a file (writes_file).
template <class M>
int file_count(M& m) {
  return m.mesh().world() / fsdp::mesh::size(m.mesh(), mesh_dim::replicate);
}

/// Whether this rank, one that writes a file, writes its elements of parameter `name`: its slice of a split
/// parameter, a parameter every tensor rank holds whole on tensor rank 0 only; and a dense parameter on expert rank
/// 0 only where the expert dimension comes out of the replicas (each expert rank holds it whole then).
template <class M>
bool writes_param(M& m, const std::string& name) {
  const ParamSpec& p = m.spec().at(name);
  const int rank = m.comm().rank();
  return (p.tensor.is_split() || m.mesh().tensor_rank(rank) == 0) &&
         (p.experts || fsdp::mesh::experts_from_shards(m.mesh()) || m.mesh().expert_rank(rank) == 0);
}

/// "run/ckpt/" -> "run/ckpt": the directory as every message names it.
FSDP_DECL std::string normalised(std::string dir);

/// Appends bytes to a new file, checksumming every block: small pieces gather in a buffer (written 16 MiB at a
/// time), whole blocks of a large piece go to the file straight from the caller's memory.
class block_writer {
 public:
  block_writer(io::file f, std::uint64_t block_bytes, const fault_hook& fault, int rank);

  void append(const void* data, std::uint64_t n);
  /// Writes what is left, flushes the file to storage and closes it; fills in its size and checksums (the
  /// whole file's: XXH3 of its blocks' checksums, 8 little-endian bytes each).
  void finish(file_record& rec);

 private:
  /// `n` bytes at the file's end: whole blocks (the last block of the file may be shorter).
  void write_blocks(const char* p, std::uint64_t n);

  io::file f_;
  std::uint64_t block_, flush_at_;
  const fault_hook& fault_;
  int rank_;
  std::vector<char> buf_;
  std::uint64_t written_ = 0;
  std::vector<std::uint64_t> blocks_;
};

// A file record on the wire from a writing rank to rank 0 (little-endian integers, strings with their length).
FSDP_DECL std::string encode(const file_record& r);
/// Reads what encode() wrote (on the same library: the ranks agreed on it at construction).
FSDP_DECL file_record decode(std::string_view in);

/// The kinds a model (and optimizer) holds per parameter: "param", then the optimizer's state names.
template <class O>
std::vector<std::string> kinds_of(const O* opt) {
  return kinds_with(opt ? opt->state_names() : std::vector<std::string>{});
}

/// Whether backend B's buffers are host memory (B::host_addressable, see fsdp/backend/concept.hpp).
template <class B>
inline constexpr bool host_addressable = requires { requires B::host_addressable; };

/// Host-readable fp32 values of backend buffers, for writers: backend memory the host can read is returned as it
/// is (the caller synchronized the model); otherwise it is downloaded into a reused staging buffer (the download
/// writes every element: no zeroing). A pointer stays valid until the next read().
template <class B>
class host_reader {
 public:
  explicit host_reader(B& be) : be_(be) {}
  const float* read(const float* src, std::int64_t n) {
    if constexpr (host_addressable<B>) {
      return src;
    } else {
      float* staging = staging_.at_least(static_cast<std::uint64_t>(n));
      be_.download(staging, src, n * std::int64_t{sizeof(float)}, be_.compute_stream());
      be_.synchronize(be_.compute_stream());
      return staging;
    }
  }

 private:
  B& be_;
  reused_buffer<float> staging_;
};

/// Every rank throws `what: <failures>` after rank 0 removed the partial output `partial` (collective): the message
/// says whether it was removed, the same on every rank (nothing, where there was nothing to remove).
template <class M>
[[noreturn]] void fail_removing(M& m, const std::vector<std::pair<int, std::string>>& failed,
                                const std::string& partial, const std::string& what, std::string_view tail = {}) {
  std::string cleanup;
  if (m.comm().rank() == 0) {
    std::string why;
    std::error_code ec;
    if (!std::filesystem::exists(partial, ec) && !ec)
      cleanup.clear();
    else
      cleanup = io::remove_all(partial, &why) ? fsdp::detail::cat("; '", partial, "' was removed")
                                              : fsdp::detail::cat("; '", partial, "' could not be removed (", why, ")");
  }
  // every rank names the same cleanup outcome: rank 0's, told through one more exchange
  const std::vector<std::string> told = agree::all_gather_strings(m.comm(), m.backend(), cleanup);
  throw checkpoint_error(fsdp::detail::cat(what, ": ", agree::failure_text(failed), told[0], tail));
}

/// Backend memory of kind k of unit u: the master shard, or optimizer state k - 1.
template <class M, class O>
float* buffer_of(M& m, O* opt, std::size_t u, std::size_t k) {
  if (k == 0) return model_access::master_shard(m.unit(u));
  return opt->state(u, static_cast<int>(k - 1));
}

template <class M>
std::vector<tensor_record> tensors_of(const M& m, std::map<std::string, std::string>& ties) {
  std::vector<tensor_record> out;
  for (const ParamSpec& p : m.spec().params()) {
    if (p.is_tied())
      ties[p.name] = p.tied_to;
    else
      out.push_back({p.name, global_shape_of(m, p), p.tensor});
  }
  return out;
}

/// Throws checkpoint_error on every rank when any rank failed (collective: agree::require_success).
template <class M>
void require_success(M& m, const std::optional<std::string>& mine, std::string_view what) {
  agree::require_success<checkpoint_error>(m.comm(), m.backend(), mine, what);
}

/// require_success for a step that writes into the partial output `partial`: on any rank's failure, rank 0 removes
/// it first (fail_removing), so a failed save leaves nothing behind.
template <class M>
void require_success_removing(M& m, const std::optional<std::string>& mine, const std::string& partial,
                              const std::string& what, std::string_view tail = {}) {
  const auto failed = agree::failures(m.comm(), m.backend(), mine);
  if (!failed.empty()) fail_removing(m, failed, partial, what, tail);
}

/// Stands for "no optimizer" in the parameters-only overloads.
struct no_optimizer {
  std::string_view name() const noexcept { return "none"; }
  const std::vector<std::string>& state_names() const noexcept {
    static const std::vector<std::string> none;
    return none;
  }
  long steps() const noexcept { return 0; }
  const float* state(std::size_t, int) const noexcept { return nullptr; }
  float* state(std::size_t, int) noexcept { return nullptr; }
  void restore_steps(long) noexcept {}
};

}  // namespace fsdp::checkpoint::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/detail/shared.ipp"
#endif
