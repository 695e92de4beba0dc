#pragma once
// checkpoint::load (fsdp/checkpoint/checkpoint.hpp): the manifest and the model's fit checked, then the shards read
// into host staging and uploaded (the default), or read straight into the model's memory (load_options::in_place).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/agree/agree.hpp"
#include "fsdp/agree/fingerprint.hpp"
#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/detail/shared.hpp"
#include "fsdp/checkpoint/directory.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/checkpoint/options.hpp"
#include "fsdp/checkpoint/reads.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/detail/schedule/pass_cursor.hpp"
#include "fsdp/layout/sharded_tensor.hpp"
#include "fsdp/model_access.hpp"

namespace fsdp::checkpoint::detail {

namespace sched = fsdp::detail::sched;  // the scheduler (fsdp/detail/schedule/)

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
        const std::vector<extent>& pieces = where.at({v.name, kinds[k]});
        global_runs(m, v, [&](std::int64_t global, std::int64_t at, std::int64_t count) {
          plan_reads(pieces, global, global + count, sizeof(float),
                     shard + static_cast<std::uint64_t>(v.shard_offset + at) * sizeof(float), out.per_file);
        });
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
  // The one text a model torn by this load quotes in every refusal until a load succeeds (model_core::tear_shards):
  // "a checkpoint load from 'DIR' that HOW".
  auto tear = [&](const std::string& how) {
    model_access::tear_shards(m, fsdp::detail::cat("a checkpoint load from '", dir, "' that ", how), opt != nullptr);
  };
  // What both kinds of load ask first: the manifest, and whether it fits the model (and optimizer).
  auto read_and_fit = [&] {
    man = read_manifest(dir);
    check_fits(m, opt, man, lo, dir);
  };
  if (!lo.in_place) {
    staging_shards staging;
    const std::optional<std::string> mine = agree::outcome([&] {
      read_and_fit();
      staging = read_shards(m, opt, dir, man);
    });
    require_success(m, mine, untouched);
    model_access::replace_shards(
        m, "a checkpoint load",
        [&] {
          // Everything was read and verified: only the backend can fail now (a CUDA stream's error), and then the
          // shards are torn.
          tear("did not finish (its uploads into the shards failed)");
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
      read_and_fit();
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
          tear(fsdp::detail::cat("did not finish, in place (", what, " torn)"));
          torn = agree::outcome([&] { write_in_place(m, man, files, plan); });
        },
        covers);
    const auto failed = agree::failures(m.comm(), m.backend(), torn);
    if (!failed.empty()) {
      const std::string text = agree::failure_text(failed);
      tear(fsdp::detail::cat("failed part way, in place (", what, " torn): ", text));
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

}  // namespace fsdp::checkpoint::detail

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/detail/load.ipp"
#endif
