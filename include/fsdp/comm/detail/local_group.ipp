#pragma once
// The in-process group's collectives (fsdp/comm/detail/local_group.hpp): the ranks' rendezvous for each, the
// reduction, the waiting board that names who waits on whom, and a failure's abort. Included by that header, or
// compiled once by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp); the group's ranks (making
// it, its links, splits, shrinks and grows) are in local_group.members.ipp.
#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include "fsdp/comm/detail/local_group.hpp"

namespace fsdp::comm::detail {

FSDP_DECL std::string op_desc::str() const {
  if (kind < 0) return "barrier";
  if (kind == int(collective::all_to_all_v)) {
    const std::size_t world = counts.size() / 2, shown = 16;  // a large group's first 16 counts, then how many more
    const auto list = [&](std::size_t from) {
      std::string l = "[";
      for (std::size_t q = 0; q < world && q < shown; ++q) l += (q ? ", " : "") + std::to_string(counts[from + q]);
      if (world > shown) l += ", ... " + std::to_string(world - shown) + " more";
      return l + "]";
    };
    return "all_to_all_v(send=" + list(0) + ", recv=" + list(world) + ", " + std::string(name_of(type)) + ")";
  }
  std::string s = std::string(name_of(static_cast<collective>(kind))) + "(count=" + std::to_string(count) +
                  ", " + std::string(name_of(type));
  if (kind == int(collective::reduce_scatter) || kind == int(collective::all_reduce))
    s += ", " + std::string(name_of(op));
  if (kind == int(collective::broadcast)) s += ", root=" + std::to_string(root);
  return s + ")";
}

FSDP_DECL std::vector<int> split_members(const std::vector<std::pair<int, int>>& all, int color) {
  std::vector<int> members;
  for (std::size_t q = 0; q < all.size(); ++q)
    if (all[q].first == color) members.push_back(static_cast<int>(q));
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[static_cast<std::size_t>(a)].second < all[static_cast<std::size_t>(b)].second;
  });
  return members;
}

FSDP_DECL std::string members_label(const std::vector<int>& members) {
  std::string s = "[ranks ";
  for (std::size_t i = 0; i < members.size(); ++i) s += (i ? ", " : "") + std::to_string(members[i]);
  return s + "]";
}

FSDP_DECL void local_group::inject(const op_desc& d, std::uint64_t seq, int rank) const {
  if (!fault_ || d.kind < 0) return;
  fault_(collective_site{static_cast<collective>(d.kind), d.count, d.type, seq, rank,
                         ids_[static_cast<std::size_t>(rank)], label_});
}

FSDP_DECL void local_group::board_entry::post(const who& what, const round& r) {
  std::vector<int> for_ids;
  for (int q = 0; q < g.world_; ++q)
    if (!r.present[static_cast<std::size_t>(q)]) for_ids.push_back(g.ids_[static_cast<std::size_t>(q)]);
  std::lock_guard b(g.board_->mu);
  wait_board::waiting& w = g.board_->by_id[id];
  // described only when a timeout asks: the group, its description and the waiter's frame outlive the entry
  if (!posted)
    w.where = [&g = what.g, d = what.d, seq = what.seq, rank = what.rank] { return g.describe(d, seq, rank); };
  w.for_ids = std::move(for_ids);
  posted = true;
}

FSDP_DECL local_group::board_entry::~board_entry() {
  if (!posted) return;
  std::lock_guard b(g.board_->mu);
  g.board_->by_id.erase(id);
}

FSDP_DECL std::string local_group::waiting_chain(const round& r) const {
  bool renumbered = false;  // a split, shrunk or grown group: its ranks are not the world's
  for (int q = 0; q < world_; ++q) renumbered = renumbered || ids_[static_cast<std::size_t>(q)] != q;
  const auto ids_text = [](const std::vector<int>& ids) {
    std::string t;
    for (int i : ids) t += (t.empty() ? "" : ", ") + std::to_string(i);
    return t;
  };
  std::string out;
  std::lock_guard b(board_->mu);
  for (int q = 0; q < world_; ++q) {
    if (r.present[static_cast<std::size_t>(q)]) continue;
    const int id = ids_[static_cast<std::size_t>(q)];
    auto it = board_->by_id.find(id);
    if (!renumbered && it == board_->by_id.end()) continue;  // a world rank in no collective: said already
    out += "; rank " + std::to_string(q) + (renumbered ? " here is world rank " + std::to_string(id) : "");
    std::vector<int> seen{id};
    int last = id;
    bool cycle = false;
    while (it != board_->by_id.end()) {
      out += std::string(last == id ? ", itself" : ", in turn") + " waiting in " + it->second.where() +
             " for world rank(s) " + ids_text(it->second.for_ids);
      const int next = it->second.for_ids.front();  // posted only while some rank is missing
      if (std::find(seen.begin(), seen.end(), next) != seen.end()) {
        cycle = true;
        break;
      }
      seen.push_back(next);
      last = next;
      it = board_->by_id.find(next);
    }
    if (cycle)
      out += ": these ranks wait for each other (their collectives were issued in different orders)";
    else if (last == id)
      out += ", which is in no collective";
    else
      out += "; world rank " + std::to_string(last) + " is in no collective: the world waits for it";
  }
  return out;
}

FSDP_DECL void local_group::abort(const std::string& reason) noexcept {
  {
    std::lock_guard lk(mu_);
    abort_locked(reason);
  }
  // The children one at a time, each taken under the lock and aborted outside it: nothing here allocates, so an abort
  // for want of memory still reaches every sub-group.
  for (std::size_t i = 0;; ++i) {
    std::shared_ptr<local_group> g;
    {
      std::lock_guard lk(mu_);
      if (i >= children_.size()) break;
      g = children_[i].group;
    }
    g->abort(reason);
  }
}

FSDP_DECL bool local_group::aborted() const {
  std::lock_guard lk(mu_);
  return aborted_;
}

FSDP_DECL void local_group::rank_returned(int rank) {
  {
    std::lock_guard lk(mu_);
    if (!returned_.at(static_cast<std::size_t>(rank))) ++returned_count_;
    returned_[static_cast<std::size_t>(rank)] = true;
  }
  cv_.notify_all();
  for (const auto& c : children())  // the sub-groups it belongs to learn it too
    for (std::size_t i = 0; i < c.members.size(); ++i)
      if (c.members[i] == rank) c.group->rank_returned(static_cast<int>(i));
}

FSDP_DECL std::string local_group::describe(const op_desc& d, std::uint64_t seq, int rank) const {
  return "local" + label_ + " " + d.str() + " #" + std::to_string(seq) + " on rank " + std::to_string(rank);
}

FSDP_DECL std::vector<const void*> local_group::meet(std::uint64_t seq, int rank, const op_desc& d, const void* token) {
  const who what{*this, d, seq, rank};
  if (d.kind >= 0 && delay_) std::this_thread::sleep_for(delay_(static_cast<collective>(d.kind), seq, rank));
  inject(d, seq, rank);
  round& r = arrive(seq, rank, d, token, nullptr, what);
  return r.send;  // complete: no rank writes it again in this round
}

FSDP_DECL void local_group::part(std::uint64_t seq, int rank, const op_desc& d, const void* token,
                                 const token_fn& before_leaving, const token_fn& on_abort) {
  const who what{*this, d, seq, rank};
  std::unique_lock lk(mu_);
  round& r = rounds_.at(seq);
  publish(r, rank, token);
  // Step 1: every rank has enqueued its reads and published the mark of their end.
  switch (wait_until(lk, [&] { return r.done == world_; }, std::chrono::steady_clock::now() + timeout_)) {
    case outcome::done: break;
    case outcome::aborted: leave_failed(lk, seq, r, on_abort, what.str() + " aborted: " + reason_, /*drain=*/true);
    case outcome::timed_out: {
      const std::string msg = what.str() + " timed out after " + std::to_string(timeout_.count()) +
                              " ms waiting for the other ranks to finish: rank(s) " + unpublished(r) +
                              " never finished it";
      abort_locked(msg);
      leave_failed(lk, seq, r, on_abort, msg, /*drain=*/false);  // the ranks that did not publish are stuck
    }
  }
  // Step 2: this rank's stream waits for the others' marks.
  if (before_leaving) {
    const std::vector<const void*> tokens = r.parting;
    lk.unlock();
    try {
      before_leaving(tokens);
    } catch (const std::exception& e) {
      lk.lock();
      const std::string msg = what.str() + " failed: " + e.what();
      abort_locked(msg);
      leave_failed(lk, seq, r, on_abort, msg, /*drain=*/true, /*rethrow=*/true);
    }
    lk.lock();
  }
  ++r.ran;
  cv_.notify_all();
  // Step 3: every rank's stream waits for the others' marks; only now may anyone reuse or destroy its tokens.
  switch (wait_until(lk, [&] { return r.ran == world_; }, std::chrono::steady_clock::now() + timeout_)) {
    case outcome::done: break;
    case outcome::aborted: leave_failed(lk, seq, r, on_abort, what.str() + " aborted: " + reason_, /*drain=*/true);
    case outcome::timed_out: {
      const std::string msg = what.str() + " timed out after " + std::to_string(timeout_.count()) +
                              " ms waiting for the other ranks to leave it";
      abort_locked(msg);
      leave_failed(lk, seq, r, on_abort, msg, /*drain=*/true);
    }
  }
  leave(seq, r);
}

FSDP_DECL std::vector<const void*> local_group::abandon(std::uint64_t seq, int rank, const void* token,
                                                       const std::string& reason) {
  std::unique_lock lk(mu_);
  abort_locked(reason);
  round& r = rounds_.at(seq);
  publish(r, rank, token);
  (void)wait_until(lk, [&] { return r.done == world_; }, std::chrono::steady_clock::now() + timeout_, false);
  std::vector<const void*> tokens = r.parting;
  leave(seq, r);
  return tokens;
}

FSDP_DECL void local_group::run(std::uint64_t seq, int rank, const op_desc& d, const void* send, void* recv) {
  const who what{*this, d, seq, rank};
  if (d.kind >= 0 && delay_) std::this_thread::sleep_for(delay_(static_cast<collective>(d.kind), seq, rank));
  inject(d, seq, rank);
  if (world_ == 1) {  // nobody to meet: the same result, without the rendezvous
    run_alone(d, send, recv, what);
    return;
  }
  round& r = arrive(seq, rank, d, send, recv, what);
  if (d.kind < 0) {
    depart(seq, rank, nullptr, what);
    return;
  }
  const auto kind = static_cast<collective>(d.kind);
  const std::size_t esize = size_of(d.type);
  const std::size_t bytes = static_cast<std::size_t>(d.count) * esize;
  const std::int64_t unsharded =
      static_cast<std::int64_t>(bytes) *
      (kind == collective::all_gather || kind == collective::reduce_scatter || kind == collective::all_to_all ? world_
                                                                                                              : 1);
  const link_model& link = r.link;
  const bool modelled = link.bytes_per_second > 0;  // else no clock is read
  const auto modelled_end = r.start + link.duration(kind, unsharded, world_);
  std::vector<unsigned char> tmp;
  if (!link.move_data) {
    if (modelled) std::this_thread::sleep_until(modelled_end);
    depart(seq, rank, nullptr, what);
    return;
  }
  if (kind == collective::all_to_all_v) {  // counts that disagree: every rank leaves, nothing moved, and says so
    const std::string wrong =
        uneven_mismatch(world_, [&](int q) -> const std::vector<std::int64_t>& { return r.descs[q]->counts; });
    if (!wrong.empty()) {
      depart(seq, rank, nullptr, what);
      throw comm_error(what.str() + ": " + wrong);
    }
  }
  switch (kind) {
    case collective::all_gather:
      for (int q = 0; q < world_; ++q) {
        char* dst = static_cast<char*>(recv) + bytes * static_cast<std::size_t>(q);
        if (dst != r.send[q] && bytes) std::memcpy(dst, r.send[q], bytes);
      }
      break;
    case collective::broadcast:  // the root's recv too, when it is not its send (as NCCL)
      if (bytes && recv != r.send[d.root]) std::memcpy(recv, r.send[d.root], bytes);
      break;
    case collective::reduce_scatter:
      tmp = reduce(r, d, static_cast<std::size_t>(rank) * static_cast<std::size_t>(d.count));
      break;
    case collective::all_reduce:
      tmp = reduce(r, d, 0);
      break;
    case collective::all_to_all:  // block `rank` of every rank's send, in rank order
      tmp.resize(bytes * static_cast<std::size_t>(world_));
      for (int q = 0; q < world_ && bytes; ++q)
        std::memcpy(tmp.data() + bytes * static_cast<std::size_t>(q),
                    static_cast<const char*>(r.send[q]) + bytes * static_cast<std::size_t>(rank), bytes);
      break;
    case collective::all_to_all_v: {  // rank q's block for `rank`, in rank order, each as long as q sends it
      const uneven_blocks mine(d.counts, world_, esize);
      tmp.resize(mine.recv_bytes());
      for (int q = 0; q < world_; ++q) {
        const std::size_t n = static_cast<std::size_t>(mine.recv_count(q)) * esize;
        const std::size_t from = uneven_blocks(r.descs[q]->counts, world_, esize).send_at(rank);
        if (n) std::memcpy(tmp.data() + mine.recv_at(q), static_cast<const char*>(r.send[q]) + from, n);
      }
      break;
    }
  }
  // Send buffers may alias receive buffers (in-place collectives): write results only once every rank has
  // finished reading the inputs.
  if (modelled) std::this_thread::sleep_until(modelled_end);
  depart(seq, rank, nullptr, what);
  if (!tmp.empty()) std::memcpy(recv, tmp.data(), tmp.size());
}

FSDP_DECL std::vector<local_group::child> local_group::children() const {
  std::lock_guard lk(mu_);
  return children_;
}

FSDP_DECL void local_group::abort_locked(const std::string& reason) noexcept {
  if (!aborted_) {
    aborted_ = true;
    try {
      reason_ = reason;
    } catch (const std::bad_alloc&) {  // the abort stands; its reason is what fits without memory
      reason_ = "out of memory";       // (short enough for the string's own storage: no allocation)
    }
  }
  cv_.notify_all();
}

FSDP_DECL void local_group::publish(round& r, int rank, const void* token) {
  r.parting[rank] = token;
  r.published[rank] = true;
  ++r.done;
  cv_.notify_all();
}

FSDP_DECL std::string local_group::unpublished(const round& r) const {
  std::string s;
  for (int q = 0; q < world_; ++q)
    if (!r.published[q]) s += (s.empty() ? "" : ", ") + std::to_string(q);
  return s;
}

FSDP_DECL void local_group::leave(std::uint64_t seq, round& r) {
  if (++r.left == world_) rounds_.erase(seq);
}

FSDP_DECL void local_group::leave_failed(std::unique_lock<std::mutex>& lk, std::uint64_t seq, round& r,
                                         const token_fn& on_abort, std::string failure, bool drain, bool rethrow) {
  if (drain && wait_until(lk, [&] { return r.done == world_; }, std::chrono::steady_clock::now() + timeout_, false) ==
                   outcome::timed_out)
    failure += "; rank(s) " + unpublished(r) + " did not finish their part within " + std::to_string(timeout_.count()) +
               " ms after that, so their reads of this rank's memory may still be running";
  const std::vector<const void*> tokens = r.parting;
  leave(seq, r);
  lk.unlock();
  if (on_abort) on_abort(tokens);
  if (rethrow) throw;
  throw comm_error(failure);
}

FSDP_DECL void local_group::run_alone(const op_desc& d, const void* send, void* recv, const who& what) {
  bool move_data = true;
  {
    std::unique_lock lk(mu_);
    if (aborted_) {
      const std::string why = reason_;
      lk.unlock();
      throw comm_error(what.str() + " aborted: " + why);
    }
    move_data = link_.move_data;
  }
  if (d.kind < 0 || !move_data) return;  // a modelled link that moves no data leaves buffers alone
  const std::size_t bytes = static_cast<std::size_t>(d.count) * size_of(d.type);
  const auto kind = static_cast<collective>(d.kind);
  if (kind == collective::all_gather || kind == collective::broadcast || kind == collective::all_to_all ||
      kind == collective::all_to_all_v) {  // all_to_all_v: `count` is what it sends, all of it to itself
    if (bytes && recv != send) std::memcpy(recv, send, bytes);
    return;
  }
  reduce_in_rank_order(d.type, d.op, 1, static_cast<std::size_t>(d.count), [&](int) { return send; }, recv);
}

FSDP_DECL std::vector<unsigned char> local_group::reduce(const round& r, const op_desc& d, std::size_t offset) const {
  const std::size_t n = static_cast<std::size_t>(d.count);
  const std::size_t skip = offset * size_of(d.type);
  std::vector<unsigned char> out(n * size_of(d.type));
  reduce_in_rank_order(d.type, d.op, world_, n,
                       [&](int q) { return static_cast<const unsigned char*>(r.send[q]) + skip; }, out.data());
  return out;
}

FSDP_DECL void local_group::fail(std::unique_lock<std::mutex>& lk, const std::string& msg) {
  abort_locked(msg);
  lk.unlock();
  throw comm_error(msg);
}

FSDP_DECL std::string local_group::missing(const round& r) const {
  std::string s;
  for (int q = 0; q < world_; ++q)
    if (!r.present[q]) s += (s.empty() ? "" : ", ") + std::to_string(q);
  return s;
}

FSDP_DECL local_group::round& local_group::arrive(std::uint64_t seq, int rank, const op_desc& d, const void* send,
                                                 void* /*recv*/, const who& what) {
  std::unique_lock lk(mu_);
  if (aborted_) {
    const std::string why = reason_;
    lk.unlock();
    throw comm_error(what.str() + " aborted: " + why);
  }
  round& r = rounds_[seq];
  if (r.first_rank < 0) {
    r.desc = d;
    r.first_rank = rank;
    r.send.assign(world_, nullptr);
    r.descs.assign(world_, nullptr);
    r.parting.assign(world_, nullptr);
    r.present.assign(world_, false);
    r.published.assign(world_, false);
    r.link = link_;
  } else if (!r.desc.matches(d)) {
    fail(lk, "collective mismatch at #" + std::to_string(seq) + ": rank " + std::to_string(r.first_rank) +
                 " issued " + r.desc.str() + " but rank " + std::to_string(rank) + " issued " + d.str());
  }
  r.send[rank] = send;
  r.descs[rank] = &d;
  r.present[rank] = true;
  if (++r.arrived == world_ && r.link.bytes_per_second > 0) r.start = std::chrono::steady_clock::now();
  cv_.notify_all();
  wait(lk, [&] { return r.arrived == world_; }, what, "waiting for the other ranks", r);
  return r;  // std::map nodes are stable; the round lives until every rank has left it
}

FSDP_DECL void local_group::depart(std::uint64_t seq, int rank, const void* token, const who& what,
                                   std::vector<const void*>* tokens) {
  std::unique_lock lk(mu_);
  round& r = rounds_.at(seq);
  r.parting[rank] = token;
  ++r.done;
  cv_.notify_all();
  wait(lk, [&] { return r.done == world_; }, what, "waiting for the other ranks to finish", r);
  if (tokens) *tokens = r.parting;
  if (++r.left == world_) rounds_.erase(seq);
}

}  // namespace fsdp::comm::detail
