#pragma once
// checkpoint::save (fsdp/checkpoint/checkpoint.hpp): each rank's file, then rank 0's manifest and the commit.
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/agree/fingerprint.hpp"
#include "fsdp/checkpoint/detail/shared.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/checkpoint/options.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/layout/sharded_tensor.hpp"
#include "fsdp/model_access.hpp"

namespace fsdp::checkpoint::detail {

/// Writes this rank's file: for each unit, each kind, each parameter piece this rank holds (and writes:
/// writes_param), its fp32 values, and a piece record per run of them in the global parameter.
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
        if (v.empty() || !writes_param(m, v.name)) continue;
        const std::uint64_t bytes = static_cast<std::uint64_t>(v.local_numel()) * sizeof(float);
        w.append(src + v.shard_offset, bytes);
        global_runs(m, v, [&](std::int64_t global, std::int64_t at, std::int64_t count) {
          rec.pieces.push_back({v.name, kinds[k], global, global + count, offset + std::uint64_t(at) * sizeof(float)});
        });
        offset += bytes;
      }
    }
  }
  w.finish(rec);
  return rec;
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

  // 2. The first replica's ranks (every tensor rank of each of its shards: world ranks [0, file_count)) write
  //    their files in parallel; rank 0 receives every file's record.
  const device_mesh mesh = m.mesh();
  std::string sent;
  if (writes_file(m)) {
    const std::string name = shard_file_name(rank, file_count(m));
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
      man.tensor_ranks = mesh.tensor;
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

}  // namespace fsdp::checkpoint::detail
