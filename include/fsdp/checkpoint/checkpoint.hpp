#pragma once
// Sharded checkpoints: every rank writes its shards of the fp32 master parameters and of the optimizer's state in
// parallel; a load, on any world size, mesh and sharding strategy, reads only the byte ranges its own shards need.
//
//   checkpoint::save(model, opt, "run/ckpt-000100", {.metadata = {...}, .loss_scaler = &scaler});
//   checkpoint::load(model, opt, *checkpoint::latest("run"), {.loss_scaler = &scaler});
//
// A checkpoint is a directory: manifest.json (fsdp/checkpoint/manifest.hpp) and one file per rank of the first
// replica, shard-00001-of-00004.bin, holding that rank's elements of every parameter and optimizer state as raw
// fp32, piece by piece, in global element order (not the flat layout's: so any layout can read them).
//
// Save is atomic: the files are written into "<dir>.partial", flushed (fsync) and checksummed (XXH3 per file and
// per 4 MiB block); rank 0 then writes the manifest and renames the directory to <dir>, the commit. A crash before
// the rename leaves the previous checkpoints untouched and a "<dir>.partial" that latest() ignores and the next
// save of <dir> replaces. A load verifies every block it reads. Every failure (a write, a missing, truncated or
// corrupted file, a manifest that does not parse, a tensor missing, unexpected or of another shape, ranks that
// disagree on the directory or step) is a checkpoint_error (usage_error for misuse) thrown on every rank
// together; a load that throws has modified nothing, unless load_options::in_place let it write before its last
// read (then the model refuses every use but a load until one succeeds).
//
// Saved: master parameters, optimizer state and update count, Model::step_count(), the loss scaler (when given),
// the user's metadata strings. Not saved: gradients (save and load happen between steps; a load zeroes them), the
// trainer's data position and RNG (keep them in the metadata), the optimizer's options (the trainer's code).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/checkpoint/reads.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/exec/model_access.hpp"
#include "fsdp/grad/loss_scaler.hpp"

namespace fsdp::checkpoint {

static_assert(std::endian::native == std::endian::little, "checkpoint files hold little-endian fp32 values");

/// What checkpoint::save and load need of an optimizer (fsdp::optim::sgd and adamw have it).
template <class O>
concept StatefulOptimizer = requires(O& o, const O& co, std::size_t u, int k, long n) {
  { co.name() } -> std::convertible_to<std::string_view>;
  { co.state_names() } -> std::convertible_to<const std::vector<std::string>&>;
  { co.steps() } -> std::convertible_to<long>;
  { co.state(u, k) } -> std::same_as<const float*>;
  { o.state(u, k) } -> std::same_as<float*>;
  o.restore_steps(n);
};

struct save_options {
  std::map<std::string, std::string> metadata{};    ///< the trainer's strings (UTF-8), kept in the manifest
  const grad::loss_scaler* loss_scaler = nullptr;   ///< its scale and good-step count are kept
  std::uint64_t block_bytes = default_block_bytes;  ///< checksummed block size: a power of two in [4 KiB, 1 GiB]
  fault_hook fault{};                               ///< tests: called before each file-system change
};

struct load_options {
  /// Restored from the checkpoint. A resume (a load with an optimizer) requires it exactly when the checkpoint
  /// holds a scaler's state; a parameters-only load ignores the checkpoint's scaler unless one is given.
  grad::loss_scaler* loss_scaler = nullptr;
  /// Reads straight into the model's memory where the backend's is host memory (backend::host), otherwise (CUDA)
  /// through two reused 4 MiB host buffers uploaded while the next is read: no host copy of the shards, at the
  /// speed of the reads. The price: a read or checksum that fails after the first byte was written leaves the
  /// parameters (and the optimizer's state) torn, and the model then refuses every use but another
  /// checkpoint::load (with the optimizer, if this one had it) until one succeeds. Everything else that can refuse
  /// a load (the manifest, the model's fit, the files' presence and sizes) is still checked before any write.
  /// Without it, a load stages the rank's whole shards in host memory first and a failed load modifies nothing.
  bool in_place = false;
};

/// A checkpoint directory found by scan().
struct entry {
  std::string path;
  enum class status : std::uint8_t { complete, partial, unreadable } state = status::partial;
  std::uint64_t step = 0;  ///< complete only
  std::string problem;     ///< unreadable: why
};

/// Reads and checks `dir`/manifest.json (no rank-collective: any process may call it).
FSDP_DECL manifest read_manifest(const std::string& dir);

/// The checkpoint directories under `root`, by name: complete (a manifest that parses), partial (a save that did
/// not commit: the name ends in ".partial") or unreadable (with the reason).
FSDP_DECL std::vector<entry> scan(const std::string& root);

/// The complete checkpoint under `root` with the highest step (the last by name among equal steps), or nothing.
/// Partial saves are ignored; so are unreadable ones (scan() lists them with the reason).
FSDP_DECL std::optional<std::string> latest(const std::string& root);

/// The open checkpoint file `f` has the size its record says.
FSDP_DECL void check_size(const io::file& f, const file_record& rec);

/// Reads every file of the checkpoint `dir` whole and checks its size, whole-file and block checksums (a tool, for
/// one process: a load checks only the blocks it reads). Returns the problems found, empty when there are none.
FSDP_DECL std::vector<std::string> verify(const std::string& dir);

namespace detail {

FSDP_DECL std::string shard_file_name(int index, int count);

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
inline constexpr bool host_addressable = requires {
  requires B::host_addressable;
};

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
  if (k == 0) return m.unit(u).master_shard();
  return opt->state(u, static_cast<int>(k - 1));
}

/// Writes this rank's file: for each unit, each kind, each parameter piece this rank holds, its fp32 values.
template <class M, class O>
file_record write_shard_file(M& m, const O* opt, const std::string& partial, const std::string& name,
                             const save_options& so) {
  const int rank = m.comm().rank();
  file_record rec;
  rec.name = name;
  rec.rank = rank;
  const std::string path = partial + "/" + name;
  if (so.fault) so.fault({rank, "create", path});
  block_writer w(io::create(path), so.block_bytes, so.fault, rank);
  const std::vector<std::string> kinds = kinds_of(opt);
  host_reader<typename M::backend_type> reader(m.backend());
  std::uint64_t offset = 0;
  for (std::size_t u = 0; u < m.size(); ++u) {
    const std::int64_t n = m.unit(u).layout().shard_numel();
    const std::vector<ShardedTensor> views = m.unit(u).shard_views();
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      const float* src = reader.read(buffer_of(m, const_cast<O*>(opt), u, k), n);
      for (const ShardedTensor& v : views) {
        if (v.empty()) continue;
        const std::uint64_t bytes = static_cast<std::uint64_t>(v.local_numel()) * sizeof(float);
        w.append(src + v.shard_offset, bytes);
        rec.pieces.push_back({v.name, kinds[k], v.begin, v.end, offset});
        offset += bytes;
      }
    }
  }
  w.finish(rec);
  return rec;
}

template <class M>
std::vector<tensor_record> tensors_of(const M& m, std::map<std::string, std::string>& ties) {
  std::vector<tensor_record> out;
  for (const ParamSpec& p : m.spec().params()) {
    if (p.is_tied())
      ties[p.name] = p.tied_to;
    else
      out.push_back({p.name, p.shape});
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

template <class M, class O>
void save(M& m, const O* opt, std::string dir, const save_options& so) {
  model_access::require_between_steps(m, "a checkpoint save");
  dir = normalised(std::move(dir));
  if (so.block_bytes < 4096 || so.block_bytes > (std::uint64_t{1} << 30) || !std::has_single_bit(so.block_bytes))
    fsdp::detail::fail_usage("checkpoint::save: block_bytes must be a power of two in [4096, 2^30], got ",
                             so.block_bytes);
  for (const auto& [k, v] : so.metadata) {
    if (fsdp::detail::utf8_error(k) != std::string_view::npos)
      fsdp::detail::fail_usage(fsdp::detail::utf8_problem("checkpoint metadata key", k));
    if (fsdp::detail::utf8_error(v) != std::string_view::npos)
      fsdp::detail::fail_usage(
          fsdp::detail::utf8_problem(fsdp::detail::cat("checkpoint metadata value of '", k, "'"), v));
  }
  auto& comm = m.comm();
  const int rank = comm.rank();
  const std::uint64_t step = m.step_count();
  fingerprint fp;
  fp.add("checkpoint::save", "directory", dir).add("checkpoint::save", "step", std::to_string(step));
  fp.add("checkpoint::save", "optimizer", opt ? std::string(opt->name()) : std::string("none"));
  agree::require_agreement(comm, m.backend(), fp, "a checkpoint save",
                           "Every rank must call checkpoint::save with the same directory, after the same step");
  m.synchronize();
  const std::string partial = dir + ".partial", what = fsdp::detail::cat("checkpoint save to '", dir, "' failed");

  // 1. Rank 0 makes the partial directory (replacing one a crashed save left); <dir> itself must not exist.
  std::optional<std::string> mine;
  if (rank == 0)
    mine = agree::outcome([&] {
      if (io::exists(dir))
        io::fail(fsdp::detail::cat("'", dir,
                             "' already exists; a checkpoint is never overwritten: save to a new directory "
                             "or remove it first"));
      if (io::exists(partial)) {
        if (so.fault) so.fault({rank, "remove", partial});
        std::string why;
        if (!io::remove_all(partial, &why))
          io::fail(fsdp::detail::cat("could not remove '", partial,
                                     "' (left by an earlier save that did not finish): ", why));
      }
      if (so.fault) so.fault({rank, "create", partial});
      io::make_dir(partial);
    });
  require_success(m, mine, what);  // nothing was made: a failure here removes nothing, not even an older .partial

  // 2. The first replica's ranks write their files in parallel; rank 0 receives every file's record.
  const device_mesh mesh = m.mesh();
  std::string sent;
  if (mesh.replica(rank) == 0) {
    const std::string name = shard_file_name(mesh.shard_rank(rank), mesh.shards);
    mine = agree::outcome([&] { sent = encode(write_shard_file(m, opt, partial, name, so)); });
    if (mine) sent = "!" + *mine;
  }
  const std::vector<std::string> records = agree::all_gather_strings(comm, m.backend(), sent);
  std::vector<std::pair<int, std::string>> failed;
  for (std::size_t q = 0; q < records.size(); ++q)
    if (records[q].starts_with("!")) failed.emplace_back(static_cast<int>(q), records[q].substr(1));
  if (!failed.empty()) fail_removing(m, failed, partial, what, "; earlier checkpoints are untouched");

  // 3. Rank 0 writes the manifest and commits by renaming the directory. A failure before the rename removes the
  //    partial directory; one after it (syncing the parent directory) says that the checkpoint is in place.
  mine.reset();
  if (rank == 0)
    mine = agree::outcome([&] {
      manifest man;
      man.step = step;
      if (opt) man.optimizer = optimizer_record{std::string(opt->name()), opt->steps(), opt->state_names()};
      if (so.loss_scaler) man.loss_scaler = scaler_record{so.loss_scaler->scale(), so.loss_scaler->good_steps()};
      man.metadata = so.metadata;
      man.world = comm.size();
      man.replicas = mesh.replicas;
      man.shards = mesh.shards;
      man.strategy = std::string(m.facts().strategy.name);  // any layer of a model: Model<P>, basic_model, model_core
      man.compute_dtype = std::string(name_of(m.facts().precision.compute));
      man.tensors = tensors_of(m, man.ties);
      for (const std::string& r : records)
        if (!r.empty()) man.files.push_back(decode(r));
      const std::string text = to_json(man), path = partial + "/manifest.json";
      if (so.fault) so.fault({rank, "create", path});
      io::file f = io::create(path);
      if (so.fault) so.fault({rank, "write", path});
      f.write_at(text.data(), text.size(), 0);
      if (so.fault) so.fault({rank, "fsync", path});
      f.sync();
      f.close();
      io::sync_dir(partial);
      io::commit(partial, dir, so.fault, rank);
    });
  require_success_removing(m, mine, partial, what, "; earlier checkpoints are untouched");
}

/// Where this rank's elements of every kind come from and go: per checkpoint file, the reads; and the byte ranges
/// of the destinations no piece covers (a shard's padding), which a load zeroes (`offset` unused).
struct shard_reads {
  std::vector<std::vector<read_op>> per_file;
  std::vector<read_op> zeros;
};

/// The reads that fill, for every unit u and kind k, the shard_numel fp32 values at dest(u, k) (a host or backend
/// address: nothing is written here).
template <class M, class O, class Dest>
shard_reads plan_shard_reads(M& m, const O* opt, const manifest& man, Dest&& dest) {
  const std::vector<std::string> kinds = kinds_of(opt);
  // The checkpoint's pieces by (tensor, kind), sorted: where each element range lies.
  std::map<std::pair<std::string, std::string>, std::vector<extent>, std::less<>> where;
  for (std::size_t f = 0; f < man.files.size(); ++f)
    for (const piece_record& p : man.files[f].pieces)
      where[{p.tensor, p.kind}].push_back({p.begin, p.end, f, p.offset});
  for (auto& [key, ex] : where)
    std::sort(ex.begin(), ex.end(), [](const extent& a, const extent& b) { return a.begin < b.begin; });

  shard_reads out;
  out.per_file.resize(man.files.size());
  for (std::size_t u = 0; u < m.size(); ++u) {
    const std::int64_t n = m.unit(u).layout().shard_numel();
    const std::vector<ShardedTensor> views = m.unit(u).shard_views();
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      char* shard = reinterpret_cast<char*>(dest(u, k));
      auto zero = [&](std::int64_t from, std::int64_t to) {
        if (from < to)
          out.zeros.push_back({0, static_cast<std::uint64_t>(to - from) * sizeof(float), shard + from * sizeof(float)});
      };
      std::int64_t covered = 0;  // views are in layout order: the gaps between them and the tail are zeroed
      for (const ShardedTensor& v : views) {
        if (v.empty()) continue;
        zero(covered, v.shard_offset);
        covered = v.shard_offset + v.local_numel();
        plan_reads(where.at({v.name, kinds[k]}), v.begin, v.end, sizeof(float),
                   shard + static_cast<std::uint64_t>(v.shard_offset) * sizeof(float), out.per_file);
      }
      zero(covered, n);
    }
  }
  return out;
}

/// The checkpoint files this rank reads (`per_file` not empty), opened, their sizes checked.
FSDP_DECL std::vector<io::file> open_files(const std::string& dir, const manifest& man,
                                           const std::vector<std::vector<read_op>>& per_file);

/// Performs every read of `plan` into `sink`, verifying every block read.
template <class Sink>
void read_files(const manifest& man, const std::vector<io::file>& files, shard_reads& plan, Sink& sink) {
  for (std::size_t f = 0; f < man.files.size(); ++f) {
    if (plan.per_file[f].empty()) continue;
    const file_record& rec = man.files[f];
    const block_sums sums{rec.block_bytes, &rec.blocks};
    read_ranges(files[f], rec.bytes, std::move(plan.per_file[f]), sink, &sums);
  }
}

/// Every rank's elements of every kind, read from the checkpoint into host staging.
/// Per unit, per kind: shard_numel fp32 values.
using staging_shards = std::vector<std::vector<std::unique_ptr<float[]>>>;

template <class M, class O>
staging_shards read_shards(M& m, const O* opt, const std::string& dir, const manifest& man) {
  const std::size_t kinds = kinds_of(opt).size();
  staging_shards staging(m.size());
  for (std::size_t u = 0; u < m.size(); ++u) {
    const std::size_t n = static_cast<std::size_t>(m.unit(u).layout().shard_numel());
    staging[u].resize(kinds);
    for (std::size_t k = 0; k < kinds; ++k) {
      try {
        staging[u][k].reset(new float[n]);  // the reads fill the pieces; the rest is zeroed below
      } catch (const std::bad_alloc&) {
        throw memory_error(fsdp::detail::cat("could not allocate ", n * sizeof(float),
                                             " bytes of host staging for unit '", m.unit(u).name(), "' (",
                                             kinds_of(opt)[k], ")"));
      }
    }
  }
  shard_reads plan = plan_shard_reads(m, opt, man, [&](std::size_t u, std::size_t k) { return staging[u][k].get(); });
  for (const read_op& z : plan.zeros) std::memset(z.dest, 0, static_cast<std::size_t>(z.bytes));
  const std::vector<io::file> files = open_files(dir, man, plan.per_file);
  host_sink sink;
  read_files(man, files, plan, sink);
  return staging;
}

FSDP_DECL std::string names_text(const std::vector<std::string>& names);

/// The checkpoint fits the model (and optimizer): the same stored tensors with the same shapes, the same
/// optimizer states, a loss scaler where one is expected. Throws checkpoint_error naming the first mismatch.
template <class M, class O>
void check_fits(const M& m, const O* opt, const manifest& man, const load_options& lo, const std::string& dir) {
  const std::string at = fsdp::detail::cat("checkpoint '", dir, "': ");
  std::map<std::string, std::string> ties;
  const std::vector<tensor_record> mine = tensors_of(m, ties);
  for (const tensor_record& t : mine) {
    const tensor_record* saved = man.tensor(t.name);
    if (!saved)
      io::fail(fsdp::detail::cat(at, "the model's parameter '", t.name, "' ", fsdp::detail::shape_text(t.shape),
                           " is not in the checkpoint"));
    if (saved->shape != t.shape)
      io::fail(fsdp::detail::cat(at, "parameter '", t.name, "' is ", fsdp::detail::shape_text(saved->shape),
                           " in the checkpoint but ", fsdp::detail::shape_text(t.shape), " in the model"));
  }
  for (const tensor_record& t : man.tensors)
    if (std::none_of(mine.begin(), mine.end(), [&](const tensor_record& x) { return x.name == t.name; }))
      io::fail(fsdp::detail::cat(
          at, "the checkpoint holds tensor '", t.name, "' ", fsdp::detail::shape_text(t.shape), ", which ",
          ties.count(t.name) ? "the model ties to '" + ties[t.name] + "'" : std::string("the model does not have")));
  if (opt) {
    if (!man.optimizer)
      io::fail(fsdp::detail::cat(at,
                           "it holds no optimizer state (saved without an optimizer); load the parameters alone "
                           "with checkpoint::load(model, dir)"));
    if (man.optimizer->name != opt->name() || man.optimizer->states != opt->state_names())
      io::fail(fsdp::detail::cat(at, "saved by ", man.optimizer->name, " with states ",
                                 names_text(man.optimizer->states), "; this optimizer is ", opt->name(),
                                 " with states ", names_text(opt->state_names())));
    if (man.loss_scaler && !lo.loss_scaler)
      io::fail(fsdp::detail::cat(at, "it holds a loss scaler's state (scale ", man.loss_scaler->scale, ", ",
                           man.loss_scaler->good_steps,
                           " good steps); pass load_options::loss_scaler to resume with it"));
  }
  if (lo.loss_scaler && !man.loss_scaler)
    io::fail(
        fsdp::detail::cat(at, "load_options::loss_scaler is given but the checkpoint holds no loss scaler's state"));
}

/// A load in place, once nothing can refuse it any more: zeroes the shards' padding and reads every piece straight
/// into the backend's memory where the host can address it, otherwise through upload_sink's two chunk buffers.
template <class M>
void write_in_place(M& m, const manifest& man, const std::vector<io::file>& files, shard_reads& plan) {
  auto& be = m.backend();
  using B = typename M::backend_type;
  for (const read_op& z : plan.zeros) be.fill_zero(z.dest, static_cast<std::int64_t>(z.bytes), be.compute_stream());
  if constexpr (host_addressable<B>) {
    be.synchronize(be.compute_stream());  // no stream touches the shards any more: the reads write them from here
    host_sink sink;
    read_files(man, files, plan, sink);
  } else {
    upload_sink<B> sink(be);
    try {
      read_files(man, files, plan, sink);
      sink.finish();
    } catch (...) {
      model_access::synchronize_quietly(m);  // uploads from the sink's buffers may be in flight
      throw;
    }
  }
}

template <class M, class O>
manifest load(M& m, O* opt, std::string dir, const load_options& lo) {
  const sched::restores covers = opt ? sched::restores::shards_and_state : sched::restores::shards;
  model_access::require_restorable(m, "a checkpoint load", covers);
  dir = normalised(std::move(dir));
  fingerprint fp;
  fp.add("checkpoint::load", "directory", dir);
  fp.add("checkpoint::load", "optimizer", opt ? std::string(opt->name()) : std::string("none"));
  fp.add("checkpoint::load", "in_place", lo.in_place ? "true" : "false");
  agree::require_agreement(m.comm(), m.backend(), fp, "a checkpoint load",
                           "Every rank must call checkpoint::load with the same directory and load_options::in_place");
  m.synchronize();
  manifest man;
  const std::string untouched =
      fsdp::detail::cat("checkpoint load from '", dir, "' failed (no parameter was modified)");
  if (!lo.in_place) {
    staging_shards staging;
    const std::optional<std::string> mine = agree::outcome([&] {
      man = read_manifest(dir);
      check_fits(m, opt, man, lo, dir);
      staging = read_shards(m, opt, dir, man);
    });
    require_success(m, mine, untouched);
    model_access::replace_shards(
        m, "a checkpoint load",
        [&] {
          // Everything was read and verified: only the backend can fail now (a CUDA stream's error), and then the
          // shards are torn.
          model_access::tear_shards(m,
                                    fsdp::detail::cat("a checkpoint load from '", dir,
                                                      "' that did not finish (its uploads into the shards failed)"),
                                    opt != nullptr);
          auto& be = m.backend();
          for (std::size_t u = 0; u < m.size(); ++u)
            for (std::size_t k = 0; k < staging[u].size(); ++k)
              be.upload(buffer_of(m, opt, u, k), staging[u][k].get(),
                        m.unit(u).layout().shard_numel() * std::int64_t{sizeof(float)}, be.compute_stream());
          be.synchronize(be.compute_stream());  // the staging goes when this function returns
        },
        covers);
  } else {
    // Everything that can refuse the load is asked before the first byte is written: then a failure modifies
    // nothing. Only a read or a checksum can fail after that, and the model is torn.
    shard_reads plan;
    std::vector<io::file> files;
    const std::optional<std::string> mine = agree::outcome([&] {
      man = read_manifest(dir);
      check_fits(m, opt, man, lo, dir);
      plan = plan_shard_reads(m, opt, man, [&](std::size_t u, std::size_t k) { return buffer_of(m, opt, u, k); });
      files = open_files(dir, man, plan.per_file);
    });
    require_success(m, mine, untouched);
    // Torn from the first write until every rank agrees that every rank's writes succeeded: an exception that
    // escapes in between (the stream's own error after the writes, a peer lost during the agreement) leaves it so.
    const char* what = opt ? "the parameters and the optimizer's state are" : "the parameters are";
    std::optional<std::string> torn;
    model_access::replace_shards(
        m, "a checkpoint load",
        [&] {
          model_access::tear_shards(
              m,
              fsdp::detail::cat("a checkpoint load from '", dir, "' that did not finish, in place (", what, " torn)"),
              opt != nullptr);
          torn = agree::outcome([&] { write_in_place(m, man, files, plan); });
        },
        covers);
    const auto failed = agree::failures(m.comm(), m.backend(), torn);
    if (!failed.empty()) {
      const std::string text = agree::failure_text(failed);
      model_access::tear_shards(m,
                                fsdp::detail::cat("a checkpoint load from '", dir, "' that failed part way, in place (",
                                                  what, " torn): ", text),
                                opt != nullptr);
      throw checkpoint_error(fsdp::detail::cat("checkpoint load from '", dir, "' failed part way, in place (", what,
                                         " torn: load a checkpoint before using the model): ", text));
    }
  }
  model_access::mend_shards(m);
  if (opt) {
    model_access::restore_step_count(m, man.step);
    opt->restore_steps(static_cast<long>(man.optimizer->steps));
  }
  if (lo.loss_scaler && man.loss_scaler) lo.loss_scaler->restore(man.loss_scaler->scale, man.loss_scaler->good_steps);
  return man;
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

}  // namespace detail

/// Collective: saves the model's master parameters and `opt`'s state into the new directory `dir` (see above).
template <class M, StatefulOptimizer O>
void save(M& model, const O& opt, const std::string& dir, const save_options& options = {}) {
  detail::save(model, &opt, dir, options);
}
/// Collective: saves the master parameters alone (no optimizer state: a load then resumes no optimizer).
template <class M>
void save(M& model, const std::string& dir, const save_options& options = {}) {
  detail::save(model, static_cast<const detail::no_optimizer*>(nullptr), dir, options);
}
/// Collective: a resume. Replaces the master parameters, `opt`'s state and update count, the model's step count
/// and (options.loss_scaler) the scaler with the checkpoint's, on any world size, mesh and strategy. Returns the
/// manifest (its metadata, step, ...).
template <class M, StatefulOptimizer O>
manifest load(M& model, O& opt, const std::string& dir, const load_options& options = {}) {
  return detail::load(model, &opt, dir, options);
}
/// Collective: replaces the master parameters alone (fine-tuning from a checkpoint); optimizer state, step counts
/// and gradients stay as they are, except that gradients are zeroed.
template <class M>
manifest load(M& model, const std::string& dir, const load_options& options = {}) {
  return detail::load(model, static_cast<detail::no_optimizer*>(nullptr), dir, options);
}

}  // namespace fsdp::checkpoint

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/checkpoint.ipp"
#endif
