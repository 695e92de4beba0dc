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
// new model's backend (its comm_buffers category, which that model then reports; a survivor that leaves uses
// `staging`, or else the old model's), copied on the compute streams. It is written over the backend's allocate
// and copy, which the CUDA backend has too, but it has been compiled and run on the host backend (thread ranks)
// only. Not yet: tensor parallelism (refused), the loss scaler's state (the trainer's to carry over).
//
// After a failure during a step, elastic::agree tells the survivors which step they continue from and who holds it
// (plan::last_committed); committed_request and transfer_place then make the transfer, which accepts a model that
// the failure left mid-pass (its master shards and optimizer state are its last completed step's) and stages
// through the new model's backend, or `staging`, since the old one's streams may have failed (docs/reliability.md).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/memory/memory.hpp"
#include "fsdp/model_access.hpp"
#include "fsdp/optim/stateful.hpp"
#include "fsdp/plan/reshard.hpp"
#include "fsdp/policy/sharding.hpp"

namespace fsdp::elastic {

namespace request_detail {
/// A usage_error for `what` ("reshard", "join", "agree") on a model of `mesh` with expert groups.
inline void refuse_experts(const char* what, const device_mesh& mesh) {
  if (mesh.expert != 1)
    fsdp::detail::fail_usage(what, ": the model has expert groups of ", mesh.expert,
                             "; resharding with expert parallelism is not built yet (save a checkpoint, which holds "
                             "global expert tensors, and load it at the new mesh)");
}

/// The request of `what` ("reshard", "join") between grids `before` and `after`, with `model`'s units (the same on
/// both grids: a unit's layout does not depend on the grid but for its padding).
template <class M>
plan::reshard_request units_of(const char* what, M& model, plan::shard_grid before, plan::shard_grid after,
                               std::vector<int> survivors, std::vector<int> joins) {
  const device_mesh& mesh = model.mesh();
  if (mesh.tensor != 1)
    fsdp::detail::fail_usage(what, ": the model has tensor groups of ", mesh.tensor,
                             "; resharding with tensor parallelism is not built yet (save a checkpoint and load it at "
                             "the new mesh)");
  refuse_experts(what, mesh);
  plan::reshard_request q;
  q.before = before;
  q.after = after;
  q.survivors = std::move(survivors);
  q.joins = std::move(joins);
  for (std::size_t u = 0; u < model.size(); ++u) {
    const auto& l = model.unit(u).layout();
    if (l.world() != mesh.shards)
      fsdp::detail::fail_usage(what, ": unit '", model.unit(u).name(), "' is laid out over ", l.world(),
                               " ranks, not the shard group of ", mesh.shards);
    q.unit_names.push_back(model.unit(u).name());
    q.unit_numel.push_back(l.numel());
    q.align = l.align();
  }
  return q;
}
}  // namespace request_detail

/// The request for moving `model`'s state to a grid of `after` (replicas x shards), held by the old ranks `joins` in
/// order (plan::newcomer for a rank that joins holding nothing); `survivors`: the old ranks that take part (every
/// old rank of `joins` among them), ascending. A usage_error when the model's units are not laid out over its shard
/// group or it has tensor groups.
template <class M>
plan::reshard_request reshard_request_of(M& model, plan::shard_grid after, std::vector<int> survivors,
                                         std::vector<int> joins) {
  return request_detail::units_of("reshard", model, {model.mesh().replicas, model.mesh().shards}, after,
                                  std::move(survivors), std::move(joins));
}

/// The request a newcomer makes (a rank that joins holding nothing, plan::newcomer in `joins`): `to` is its model of
/// the new grid, built from the same spec and wrapping as the survivors'; `before` the survivors' grid. The survivors
/// make theirs with reshard_request_of(old model, to's grid, ...): the same request.
template <class M>
plan::reshard_request join_request_of(M& to, plan::shard_grid before, std::vector<int> survivors,
                                      std::vector<int> joins) {
  return request_detail::units_of("join", to, before, {to.mesh().replicas, to.mesh().shards}, std::move(survivors),
                                  std::move(joins));
}

namespace detail {

/// Both sides of reshard and join: `from` and `from_opt` null on a newcomer, `to` and `to_opt` null on a survivor
/// that leaves. `ranks` orders the participants: the survivors as q lists them, then the newcomers by new rank.
template <class FromM, class FromO, class ToM, class ToO, class Comm>
plan::reshard_plan move_state(const plan::reshard_request& q, FromM* from, const FromO* from_opt, ToM* to, ToO* to_opt,
                              Comm& ranks, typename ToM::backend_type* staging) {
  static_assert(std::is_same_v<typename FromM::backend_type, typename ToM::backend_type>,
                "fsdp::elastic::reshard: the old and new models have different backends");
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
    request_detail::refuse_experts(from ? "reshard" : "join", m);
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
  std::uint64_t from_steps = 0;  // what `from` holds: its completed steps, and its optimizer's updates
  long from_updates = 0;
  if (from) {
    model_access::require_committed(*from, "reshard (the old model)");
    from_steps = *model_access::committed_steps(*from);  // a value: require_committed passed
    from_updates = model_access::last_update_skipped(*from) ? from_opt->steps_if_last_skipped() : from_opt->steps();
  }
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

  // A healthy backend: the new model's, else `staging`, else the old model's (whose streams a failure may have left
  // failing).
  auto& be = to ? to->backend() : staging ? *staging : from->backend();
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
    if (from) counts[0] = from_steps, counts[1] = static_cast<std::uint64_t>(from_updates);
    auto header = be.allocate(sizeof counts, mem::comm_buffers, cs);
    be.copy(header.data(), counts, sizeof counts, cs);
    ranks.broadcast(header.data(), header.data(), 4, dtype::f32, 0, cs);
    be.copy(counts, header.data(), sizeof counts, cs);
    be.synchronize(cs);
    be.release_after(std::move(header), cs);
  }
  // pack: each run for another rank, buffer by buffer, at its pair's cursor
  std::vector<std::int64_t> cursor(static_cast<std::size_t>(n), 0);
  // Quietly: a survivor's streams may have failed in the step that failed (its trainer has seen that error); the
  // state sent is the last completed step's (require_committed), which no failed work touched.
  if (from) model_access::synchronize_quietly(*from);
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
        return k == 0 ? model_access::master_shard(to->unit(u)) : to_opt->state(u, static_cast<int>(k - 1));
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
    model_access::restore_step_count(*to, from ? from_steps : counts[0]);
    to_opt->restore_steps(from ? from_updates : static_cast<long>(counts[1]));
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
/// grid passes null for `to` and `to_opt` (and, when a failure may have left `from`'s streams failing, a healthy
/// `staging` backend). `to` must be between steps; `from` between steps, or left mid-pass by a failure (its master
/// shards and optimizer state are then its last completed step's: pass_cursor::require_committed). `to` is
/// overwritten (its gradients zeroed), its step count and `to_opt`'s update count become those of `from`'s last
/// completed step (model_access::committed_steps). Returns the plan (plan::describe prints it).
template <class FromM, optim::StatefulOptimizer FromO, class ToM, optim::StatefulOptimizer ToO, AllToAllCollective Comm>
plan::reshard_plan reshard(const plan::reshard_request& q, FromM& from, const FromO& from_opt, ToM* to, ToO* to_opt,
                           Comm& ranks, typename ToM::backend_type* staging = nullptr) {
  return detail::move_state(q, &from, &from_opt, to, to_opt, ranks, staging);
}

/// A newcomer's part of reshard (every survivor calls reshard with the same request, `ranks` the same
/// communicator): `to` and `to_opt`, built on the new grid from the same spec, wrapping and optimizer, receive this
/// rank's shards from the survivors peer to peer, and the survivors' step counts. No checkpoint is read.
template <class ToM, optim::StatefulOptimizer ToO, AllToAllCollective Comm>
plan::reshard_plan join(const plan::reshard_request& q, ToM& to, ToO& to_opt, Comm& ranks) {
  return detail::move_state(q, static_cast<ToM*>(nullptr), static_cast<const ToO*>(nullptr), &to, &to_opt, ranks,
                            static_cast<typename ToM::backend_type*>(nullptr));
}

/// Collective over `survivors_comm` (the survivors of a failure, ranked as `survivors` lists their old ranks:
/// comm::local_communicator::shrink gives both): what the survivors continue from, the same on every survivor.
/// Each survivor's completed steps, or plan::not_committed when its state is not a completed step's (an update
/// that failed part way), are exchanged (an all_gather on `staging`'s compute stream: a backend whose streams did
/// not fail, the model's may have) and plan::last_committed decides. A failure in a pass (a gather, a
/// reduce-scatter, the replicas' all-reduce) or in the gradient inspection leaves a survivor at its last completed
/// step; a survivor that finished the failed step while others did not makes that step the one continued from when
/// the survivors that finished it hold every shard.
template <class M, AllToAllCollective Comm, class Backend>
plan::committed_state agree(M& model, const std::vector<int>& survivors, Comm& survivors_comm, Backend& staging) {
  request_detail::refuse_experts("agree", model.mesh());  // before any collective: every survivor's mesh is the same
  const int n = survivors_comm.size();
  if (static_cast<int>(survivors.size()) != n)
    fsdp::detail::fail_usage("agree: ", survivors.size(), " survivors listed for a communicator of ", n, " ranks");
  const std::uint64_t mine = model_access::committed_steps(model).value_or(plan::not_committed);
  auto& cs = staging.compute_stream();
  auto send = staging.allocate(sizeof mine, mem::comm_buffers, cs);
  auto recv = staging.allocate(sizeof mine * static_cast<std::size_t>(n), mem::comm_buffers, cs);
  staging.copy(send.data(), &mine, sizeof mine, cs);
  survivors_comm.all_gather(send.data(), recv.data(), 2, dtype::f32, cs);  // the counts' bits, as two f32 each
  std::vector<std::uint64_t> steps(static_cast<std::size_t>(n));
  staging.copy(steps.data(), recv.data(), sizeof mine * static_cast<std::size_t>(n), cs);
  staging.synchronize(cs);
  staging.release_after(std::move(send), cs);
  staging.release_after(std::move(recv), cs);
  return plan::last_committed({model.mesh().replicas, model.mesh().shards}, survivors, steps);
}

/// The request that moves the agreed state `c` of `model`'s grid to `after`, on `joins` (old ranks of survivors, in
/// new-rank order): the holders send; a survivor that joins without holding the state receives as a
/// plan::newcomer (it calls elastic::join; a holder calls reshard). transfer_place says where each survivor stands
/// in the transfer's communicator.
template <class M>
plan::reshard_request committed_request(M& model, const plan::committed_state& c, plan::shard_grid after,
                                        std::vector<int> joins) {
  for (int& r : joins)
    if (std::find(c.holders.begin(), c.holders.end(), r) == c.holders.end()) r = plan::newcomer;
  return reshard_request_of(model, after, c.holders, std::move(joins));
}

/// (color, key) of old rank `me` for the split of the survivors' communicator that the transfer of
/// committed_request(.., c, .., joins) runs on: the holders first, ascending, then the survivors that receive, by
/// new rank (color 0); a survivor that neither holds the state nor joins takes no part (color 1).
inline std::pair<int, int> transfer_place(const plan::committed_state& c, const std::vector<int>& joins, int me) {
  const auto h = std::find(c.holders.begin(), c.holders.end(), me);
  if (h != c.holders.end()) return {0, static_cast<int>(h - c.holders.begin())};
  const auto j = std::find(joins.begin(), joins.end(), me);
  if (j != joins.end()) return {0, static_cast<int>(c.holders.size() + static_cast<std::size_t>(j - joins.begin()))};
  return {1, me};
}

}  // namespace fsdp::elastic
