#pragma once
// fsdp::elastic::reshard: a model's master shards and optimizer state moved, in memory and without a checkpoint, onto
// a model of another data-parallel grid, by the ranks that survive (fsdp/plan/reshard.hpp plans which elements go
// where). The old models of the survivors send, the new models of the ranks that join receive; a survivor that
// leaves the new grid still sends. After it, the new model and optimizer hold exactly what a checkpoint saved from
// the old ones and loaded into the new ones would (master shards, every optimizer state, the step counts).
//
// A rank that joins the job holding nothing (a replacement) takes part with elastic::join: it receives its shards
// from the survivors, and their step counts.
//
// The moves are one all_to_all over a communicator of the survivors (rank i of it the old rank survivors[i]; the
// newcomers after them), every pair's share padded to the largest pair's, staged through two scratch buffers of the
// old model's backend (a newcomer's: its new model's; the comm_buffers category, which that model then reports),
// copied on the compute streams. It is written over the
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

/// The request a newcomer makes (a rank that joins holding nothing, plan::newcomer in `joins`): `to` is its model of
/// the new grid, built from the same spec and wrapping as the survivors'; `before` the survivors' grid. The survivors
/// make theirs with reshard_request_of(old model, to's grid, ...): the same request.
template <class M>
plan::reshard_request join_request_of(M& to, plan::shard_grid before, std::vector<int> survivors,
                                      std::vector<int> joins) {
  const device_mesh& mesh = to.mesh();
  if (mesh.tensor != 1)
    detail::fail_usage("join: the model has tensor groups of ", mesh.tensor,
                       "; resharding with tensor parallelism is not built yet (save a checkpoint and load it at the "
                       "new mesh)");
  plan::reshard_request q;
  q.before = before;
  q.after = {mesh.replicas, mesh.shards};
  q.survivors = std::move(survivors);
  q.joins = std::move(joins);
  for (std::size_t u = 0; u < to.size(); ++u) {
    const auto& l = to.unit(u).layout();
    q.unit_names.push_back(to.unit(u).name());
    q.unit_numel.push_back(l.numel());
    q.align = l.align();
  }
  return q;
}

namespace detail {

/// Both sides of reshard and join: `from` and `from_opt` null on a newcomer, `to` and `to_opt` null on a survivor
/// that leaves. `ranks` orders the participants: the survivors as q lists them, then the newcomers by new rank.
template <class FromM, class FromO, class ToM, class ToO, class Comm>
plan::reshard_plan move_state(const plan::reshard_request& q, FromM* from, const FromO* from_opt, ToM* to, ToO* to_opt,
                              Comm& ranks) {
  const plan::reshard_plan p = plan::make_reshard_plan(q);
  const int survivors = static_cast<int>(q.survivors.size());
  std::vector<int> newcomers;  // the new rank of each newcomer, in order
  for (std::size_t i = 0; i < q.joins.size(); ++i)
    if (q.joins[i] == plan::newcomer) newcomers.push_back(static_cast<int>(i));
  const int n = ranks.size(), index = ranks.rank();
  if (n != survivors + static_cast<int>(newcomers.size()))
    fsdp::detail::fail_usage("reshard: the communicator has ", n, " ranks, and the request ", survivors,
                             " survivor(s) and ", newcomers.size(),
                             " newcomer(s): make it of the survivors, ranked "
                             "as listed, then the newcomers by new rank");
  int mine = -1;  // this rank's rank in the new grid, or -1 when it leaves
  if (from) {
    const int me = from->comm().rank();
    if (index >= survivors || q.survivors[static_cast<std::size_t>(index)] != me)
      fsdp::detail::fail_usage("reshard: rank ", index, " of the survivors' communicator (", n, " ranks) is old rank ",
                               me, ", but the request lists ", survivors,
                               " survivors in another order: make the communicator with the survivors ranked as "
                               "listed, then the newcomers");
    const auto joined = std::find(q.joins.begin(), q.joins.end(), me);
    mine = joined == q.joins.end() ? -1 : static_cast<int>(joined - q.joins.begin());
    if ((mine >= 0) != (to != nullptr) || (to == nullptr) != (to_opt == nullptr))
      fsdp::detail::fail_usage("reshard: old rank ", me,
                               mine >= 0 ? " joins the new grid as rank " : " leaves the new grid",
                               mine >= 0 ? std::to_string(mine) : std::string(),
                               mine >= 0 ? " and must pass its new model and optimizer" : " and passes no new model");
  } else {
    if (index < survivors)
      fsdp::detail::fail_usage("join: rank ", index, " of the communicator is a newcomer, but the request's first ",
                               survivors, " ranks are the survivors: make the communicator with the survivors first");
    mine = newcomers[static_cast<std::size_t>(index - survivors)];
  }
  const std::size_t states = (from_opt ? from_opt->state_names() : to_opt->state_names()).size(), buffers = states + 1;
  if (to) {
    const device_mesh& m = to->mesh();
    if (to->comm().rank() != mine || m.replicas != q.after.replicas || m.shards != q.after.shards || m.tensor != 1)
      fsdp::detail::fail_usage(from ? "reshard: old rank " : "join: newcomer ",
                               from ? from->comm().rank() : index - survivors, " joins as rank ", mine, " of a ",
                               q.after.replicas, " x ", q.after.shards, " grid, and its new model is rank ",
                               to->comm().rank(), " of ", m.replicas, " x ", m.shards);
    if (to->size() != q.unit_numel.size())
      fsdp::detail::fail_usage("reshard: the new model has ", to->size(), " units, the old one ", q.unit_numel.size());
    for (std::size_t u = 0; u < to->size(); ++u)
      if (to->unit(u).name() != q.unit_names[u] || to->unit(u).layout().numel() != q.unit_numel[u] ||
          to->unit(u).layout().shard_numel() != p.new_shard_numel[u])
        fsdp::detail::fail_usage("reshard: unit ", u, " is '", to->unit(u).name(), "' of ",
                                 to->unit(u).layout().numel(), " elements in the new model and '", q.unit_names[u],
                                 "' of ", q.unit_numel[u],
                                 " in the old one: build both from the same spec and wrapping");
    if (from_opt && (to_opt->name() != from_opt->name() || to_opt->state_names() != from_opt->state_names()))
      fsdp::detail::fail_usage("reshard: the new optimizer is ", to_opt->name(), " and the old one ", from_opt->name(),
                               ": their states must match");
  }
  if (from) model_access::require_between_steps(*from, "reshard (the old model)");
  if (to) model_access::require_between_steps(*to, from ? "reshard (the new model)" : "join (the new model)");

  // Where each survivor's share for each other goes: per pair, the runs in plan order, `buffers` floats an element.
  std::vector<int> index_of(static_cast<std::size_t>(q.before.ranks()), -1);
  for (int i = 0; i < survivors; ++i) index_of[static_cast<std::size_t>(q.survivors[static_cast<std::size_t>(i)])] = i;
  std::vector<int> index_of_new(q.joins.size(), -1);
  for (std::size_t i = 0; i < q.joins.size(); ++i)
    index_of_new[i] =
        q.joins[i] == plan::newcomer
            ? survivors + static_cast<int>(std::find(newcomers.begin(), newcomers.end(), int(i)) - newcomers.begin())
            : index_of[static_cast<std::size_t>(q.joins[i])];
  std::vector<std::int64_t> pair(static_cast<std::size_t>(n) * n, 0);
  const auto sender = [&](const plan::reshard_run& r) { return index_of[static_cast<std::size_t>(r.from)]; };
  const auto receiver = [&](const plan::reshard_run& r) { return index_of_new[static_cast<std::size_t>(r.to)]; };
  for (const plan::reshard_run& r : p.runs)
    if (sender(r) != receiver(r))
      pair[static_cast<std::size_t>(sender(r) * n + receiver(r))] += r.numel * static_cast<std::int64_t>(buffers);
  const std::int64_t count = std::max<std::int64_t>(1, *std::max_element(pair.begin(), pair.end()));

  auto& be = from ? from->backend() : to->backend();
  auto& cs = be.compute_stream();
  const std::int64_t bytes = count * n * std::int64_t{sizeof(float)};
  auto send = be.allocate(bytes, mem::comm_buffers, cs), recv = be.allocate(bytes, mem::comm_buffers, cs);
  float* sp = static_cast<float*>(send.data());
  float* rp = static_cast<float*>(recv.data());
  const auto from_buffer = [&](std::size_t u, std::size_t k) -> const float* {
    return k == 0 ? from->unit(u).master_shard() : from_opt->state(u, static_cast<int>(k - 1));
  };
  // A newcomer learns the step counts from survivor 0: a broadcast of their bits (two 64-bit counts as four f32).
  std::uint64_t counts[2] = {0, 0};
  if (!newcomers.empty()) {
    if (from) counts[0] = from->step_count(), counts[1] = static_cast<std::uint64_t>(from_opt->steps());
    auto header = be.allocate(sizeof counts, mem::comm_buffers, cs);
    be.copy(header.data(), counts, sizeof counts, cs);
    ranks.broadcast(header.data(), header.data(), 4, dtype::f32, 0, cs);
    be.copy(counts, header.data(), sizeof counts, cs);
    be.synchronize(cs);
    be.release_after(std::move(header), cs);
  }
  // pack: each run for another rank, buffer by buffer, at its pair's cursor
  std::vector<std::int64_t> cursor(static_cast<std::size_t>(n), 0);
  if (from) from->synchronize();
  for (const plan::reshard_run& r : p.runs) {
    if (sender(r) != index || receiver(r) == index) continue;
    const int d = receiver(r);
    for (std::size_t k = 0; k < buffers; ++k) {
      be.copy(sp + static_cast<std::int64_t>(d) * count + cursor[static_cast<std::size_t>(d)],
              from_buffer(r.unit, k) + r.src_offset, r.numel * std::int64_t{sizeof(float)}, cs);
      cursor[static_cast<std::size_t>(d)] += r.numel;
    }
  }
  ranks.all_to_all(sp, rp, count, dtype::f32, cs);
  be.synchronize(cs);
  if (to) {
    model_access::replace_shards(*to, from ? "reshard" : "join", [&] {
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
    model_access::restore_step_count(*to, from ? from->step_count() : counts[0]);
    to_opt->restore_steps(from ? from_opt->steps() : static_cast<long>(counts[1]));
  }
  be.release_after(std::move(send), cs);
  be.release_after(std::move(recv), cs);
  be.synchronize(cs);
  return p;
}

}  // namespace detail

/// Collective over `ranks`: the survivors (ranked as the request lists them), then the newcomers by new rank (none
/// unless the request has plan::newcomer entries: elastic::join is their part). Moves `from`'s master shards and
/// `from_opt`'s state onto `to` and `to_opt` by plan::make_reshard_plan(q). A survivor that does not join the new
/// grid passes null for `to` and `to_opt`. Both models must be between steps; `to` is overwritten (its gradients
/// zeroed), its step count and `to_opt`'s update count become `from`'s. Returns the plan (plan::describe prints it).
template <class FromM, optim::StatefulOptimizer FromO, class ToM, optim::StatefulOptimizer ToO, AllToAllCollective Comm>
plan::reshard_plan reshard(const plan::reshard_request& q, FromM& from, const FromO& from_opt, ToM* to, ToO* to_opt,
                           Comm& ranks) {
  return detail::move_state(q, &from, &from_opt, to, to_opt, ranks);
}

/// A newcomer's part of reshard (every survivor calls reshard with the same request, `ranks` the same
/// communicator): `to` and `to_opt`, built on the new grid from the same spec, wrapping and optimizer, receive this
/// rank's shards from the survivors peer to peer, and the survivors' step counts. No checkpoint is read.
template <class ToM, optim::StatefulOptimizer ToO, AllToAllCollective Comm>
plan::reshard_plan join(const plan::reshard_request& q, ToM& to, ToO& to_opt, Comm& ranks) {
  return detail::move_state(q, static_cast<ToM*>(nullptr), static_cast<const ToO*>(nullptr), &to, &to_opt, ranks);
}

}  // namespace fsdp::elastic
