#pragma once
// fsdp::elastic::reshard: a model's master shards and optimizer state moved, in memory and without a checkpoint, onto
// a model of another data-parallel grid, by the ranks that survive (fsdp/plan/reshard.hpp plans which elements go
// where). The old models of the survivors send, the new models of the ranks that join receive; a survivor that
// leaves the new grid still sends. After it, the new model and optimizer hold exactly what a checkpoint saved from
// the old ones and loaded into the new ones would (master shards, every optimizer state, the step counts).
//
// The moves are one all_to_all over a communicator of the survivors (rank i of it the old rank survivors[i]), every
// pair's share padded to the largest pair's, staged through two scratch buffers of the old model's backend (its
// comm_buffers category, which that model then reports), copied on the compute streams. It is written over the
// backend's allocate and copy, which the CUDA backend has too, but it has been compiled and run on the host backend
// (thread ranks) only. Not yet: tensor parallelism (refused), the loss scaler's state (the trainer's to carry over),
// a failure during a step (see docs/reliability.md).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/exec/model_access.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/optim/stateful.hpp"
#include "fsdp/plan/reshard.hpp"
#include "fsdp/sharding/sharding.hpp"

namespace fsdp::elastic {

/// The request for moving `model`'s state to a grid of `after` (replicas x shards), held by the old ranks `joins` in
/// order; `survivors`: the old ranks that take part (every rank of `joins` among them), ascending. A usage_error when
/// the model's units are not laid out over its shard group or it has tensor groups.
template <class M>
plan::reshard_request reshard_request_of(M& model, plan::shard_grid after, std::vector<int> survivors,
                                         std::vector<int> joins) {
  const device_mesh& mesh = model.mesh();
  if (mesh.tensor != 1)
    detail::fail_usage("reshard: the model has tensor groups of ", mesh.tensor,
                       "; resharding with tensor parallelism is not built yet (save a checkpoint and load it at the "
                       "new mesh)");
  plan::reshard_request q;
  q.before = {mesh.replicas, mesh.shards};
  q.after = after;
  q.survivors = std::move(survivors);
  q.joins = std::move(joins);
  for (std::size_t u = 0; u < model.size(); ++u) {
    const auto& l = model.unit(u).layout();
    if (l.world() != mesh.shards)
      detail::fail_usage("reshard: unit '", model.unit(u).name(), "' is laid out over ", l.world(),
                         " ranks, not the shard group of ", mesh.shards);
    q.unit_names.push_back(model.unit(u).name());
    q.unit_numel.push_back(l.numel());
    q.align = l.align();
  }
  return q;
}

/// Collective over `survivors` (every survivor calls it, with the same request): moves `from`'s master shards and
/// `from_opt`'s state onto `to` and `to_opt` by plan::make_reshard_plan(q). A survivor that does not join the new
/// grid passes null for `to` and `to_opt`. Both models must be between steps; `to` is overwritten (its gradients
/// zeroed), its step count and `to_opt`'s update count become `from`'s. Returns the plan (plan::describe prints it).
template <class FromM, optim::StatefulOptimizer FromO, class ToM, optim::StatefulOptimizer ToO, AllToAllCollective Comm>
plan::reshard_plan reshard(const plan::reshard_request& q, FromM& from, const FromO& from_opt, ToM* to, ToO* to_opt,
                           Comm& survivors) {
  const plan::reshard_plan p = plan::make_reshard_plan(q);
  const int me = from.comm().rank(), index = survivors.rank();
  if (static_cast<int>(q.survivors.size()) != survivors.size() || q.survivors[static_cast<std::size_t>(index)] != me)
    detail::fail_usage("reshard: rank ", index, " of the survivors' communicator (", survivors.size(),
                       " ranks) is old rank ", me, ", but the request lists ", q.survivors.size(),
                       " survivors in another order: make the communicator with the survivors ranked as listed");
  const auto joined = std::find(q.joins.begin(), q.joins.end(), me);
  const int mine = joined == q.joins.end() ? -1 : static_cast<int>(joined - q.joins.begin());
  if ((mine >= 0) != (to != nullptr) || (to == nullptr) != (to_opt == nullptr))
    detail::fail_usage("reshard: old rank ", me, mine >= 0 ? " joins the new grid as rank " : " leaves the new grid",
                       mine >= 0 ? std::to_string(mine) : std::string(),
                       mine >= 0 ? " and must pass its new model and optimizer" : " and passes no new model");
  const std::size_t states = from_opt.state_names().size(), buffers = states + 1;
  if (to) {
    const device_mesh& m = to->mesh();
    if (to->comm().rank() != mine || m.replicas != q.after.replicas || m.shards != q.after.shards || m.tensor != 1)
      detail::fail_usage("reshard: old rank ", me, " joins as rank ", mine, " of a ", q.after.replicas, " x ",
                         q.after.shards, " grid, and its new model is rank ", to->comm().rank(), " of ", m.replicas,
                         " x ", m.shards);
    if (to->size() != from.size())
      detail::fail_usage("reshard: the new model has ", to->size(), " units, the old one ", from.size());
    for (std::size_t u = 0; u < from.size(); ++u)
      if (to->unit(u).name() != from.unit(u).name() || to->unit(u).layout().numel() != q.unit_numel[u] ||
          to->unit(u).layout().shard_numel() != p.new_shard_numel[u])
        detail::fail_usage("reshard: unit ", u, " is '", to->unit(u).name(), "' of ", to->unit(u).layout().numel(),
                           " elements in the new model and '", from.unit(u).name(), "' of ", q.unit_numel[u],
                           " in the old one: build both from the same spec and wrapping");
    if (to_opt->name() != from_opt.name() || to_opt->state_names() != from_opt.state_names())
      detail::fail_usage("reshard: the new optimizer is ", to_opt->name(), " and the old one ", from_opt.name(),
                         ": their states must match");
  }
  model_access::require_between_steps(from, "reshard (the old model)");
  if (to) model_access::require_between_steps(*to, "reshard (the new model)");

  // Where each survivor's share for each other goes: per pair, the runs in plan order, `buffers` floats an element.
  const int n = survivors.size();
  std::vector<int> index_of(static_cast<std::size_t>(q.before.ranks()), -1);
  for (int i = 0; i < n; ++i) index_of[static_cast<std::size_t>(q.survivors[static_cast<std::size_t>(i)])] = i;
  std::vector<std::int64_t> pair(static_cast<std::size_t>(n) * n, 0);
  const auto sender = [&](const plan::reshard_run& r) { return index_of[static_cast<std::size_t>(r.from)]; };
  const auto receiver = [&](const plan::reshard_run& r) {
    return index_of[static_cast<std::size_t>(q.joins[static_cast<std::size_t>(r.to)])];
  };
  for (const plan::reshard_run& r : p.runs)
    if (sender(r) != receiver(r))
      pair[static_cast<std::size_t>(sender(r) * n + receiver(r))] += r.numel * static_cast<std::int64_t>(buffers);
  const std::int64_t count = std::max<std::int64_t>(1, *std::max_element(pair.begin(), pair.end()));

  auto& be = from.backend();
  auto& cs = be.compute_stream();
  const std::int64_t bytes = count * n * std::int64_t{sizeof(float)};
  auto send = be.allocate(bytes, mem::comm_buffers, cs), recv = be.allocate(bytes, mem::comm_buffers, cs);
  float* sp = static_cast<float*>(send.data());
  float* rp = static_cast<float*>(recv.data());
  const auto from_buffer = [&](std::size_t u, std::size_t k) -> const float* {
    return k == 0 ? from.unit(u).master_shard() : from_opt.state(u, static_cast<int>(k - 1));
  };
  // pack: each run for another rank, buffer by buffer, at its pair's cursor
  std::vector<std::int64_t> cursor(static_cast<std::size_t>(n), 0);
  from.synchronize();
  for (const plan::reshard_run& r : p.runs) {
    if (sender(r) != index || receiver(r) == index) continue;
    const int d = receiver(r);
    for (std::size_t k = 0; k < buffers; ++k) {
      be.copy(sp + static_cast<std::int64_t>(d) * count + cursor[static_cast<std::size_t>(d)],
              from_buffer(r.unit, k) + r.src_offset, r.numel * std::int64_t{sizeof(float)}, cs);
      cursor[static_cast<std::size_t>(d)] += r.numel;
    }
  }
  survivors.all_to_all(sp, rp, count, dtype::f32, cs);
  be.synchronize(cs);
  if (to) {
    model_access::replace_shards(*to, "reshard", [&] {
      auto& tb = to->backend();
      auto& ts = tb.compute_stream();
      const auto to_buffer = [&](std::size_t u, std::size_t k) -> float* {
        return k == 0 ? to->unit(u).master_shard() : to_opt->state(u, static_cast<int>(k - 1));
      };
      std::fill(cursor.begin(), cursor.end(), 0);
      for (const plan::reshard_run& r : p.runs) {
        if (r.to != mine) continue;
        const int s = sender(r);
        for (std::size_t k = 0; k < buffers; ++k) {
          const float* src = s == index
                                 ? from_buffer(r.unit, k) + r.src_offset
                                 : rp + static_cast<std::int64_t>(s) * count + cursor[static_cast<std::size_t>(s)];
          tb.copy(to_buffer(r.unit, k) + r.dst_offset, src, r.numel * std::int64_t{sizeof(float)}, ts);
          if (s != index) cursor[static_cast<std::size_t>(s)] += r.numel;
        }
      }
      tb.synchronize(ts);
    });
    model_access::restore_step_count(*to, from.step_count());
    to_opt->restore_steps(from_opt.steps());
  }
  be.release_after(std::move(send), cs);
  be.release_after(std::move(recv), cs);
  be.synchronize(cs);
  return p;
}

}  // namespace fsdp::elastic
