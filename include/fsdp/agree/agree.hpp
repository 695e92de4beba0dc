#pragma once
// Ranks compare fingerprints (fsdp/agree/fingerprint.hpp) through any CollectivePolicy, on the backend's gather
// stream, before anything else is allocated or initialised:
//
//   1. every rank all-gathers a 16-byte digest of its fingerprint (FNV-1a of the encoded facts, and their length):
//      one all_gather of 4 f32 elements, the only collective when the ranks agree;
//   2. when any digest differs, every rank all-gathers every rank's encoded facts (padded to the longest), finds the
//      lowest rank whose digest differs from rank 0's and compares the two fact by fact.
//
// Every rank takes the same decision from the same gathered bytes, so every rank throws the same usage_error,
// naming the first differing fact and both ranks. The scratch buffers (mem::comm_buffers) are released before the
// function returns; a group of one compares nothing and issues nothing.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/agree/fingerprint.hpp"
#include "fsdp/backend/concept.hpp"
#include "fsdp/comm/concept.hpp"
#include "fsdp/core/bytes.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/hash.hpp"

namespace fsdp::agree {

namespace wire {
/// Every rank's `mine` (bytes, a multiple of 4) through one all_gather of f32 elements on `s`.
template <Backend B, CollectivePolicy C>
std::string all_gather_bytes(C& comm, B& be, const std::string& mine) {
  auto& s = be.gather_stream();
  const int world = comm.size();
  const std::int64_t bytes = static_cast<std::int64_t>(mine.size());
  auto send = be.allocate(bytes, mem::comm_buffers, s);
  auto recv = be.allocate(bytes * world, mem::comm_buffers, s);
  // The watched wait first: a copy from pageable memory waits for the stream's earlier work (mid-step, under
  // model_options::check_collectives: the gathers in flight) with no watchdog on a GPU.
  be.synchronize(s);
  be.upload(send.data(), mine.data(), bytes, s);
  comm.all_gather(send.data(), recv.data(), bytes / 4, dtype::f32, s);
  std::string out(static_cast<std::size_t>(bytes * world), '\0');
  be.synchronize(s);  // the collective's wait first (a copy to pageable memory cannot be interrupted)
  be.download(out.data(), recv.data(), bytes * world, s);
  be.release_after(std::move(send), s);
  be.release_after(std::move(recv), s);
  be.synchronize(s);
  return out;
}

}  // namespace wire

/// Every rank's string, by rank, on every rank (collective: every rank of `comm` calls it). One all_gather of 8
/// bytes per rank (the lengths), and a second one with the strings unless every string is empty.
template <Backend B, CollectivePolicy C>
std::vector<std::string> all_gather_strings(C& comm, B& be, const std::string& mine) {
  const int world = comm.size();
  if (world <= 1) return {mine};
  std::string len;
  fsdp::detail::put_u64le(len, mine.size());
  const std::string lens = wire::all_gather_bytes(comm, be, len);
  std::uint64_t longest = 0;
  for (int q = 0; q < world; ++q)
    longest = std::max(longest, fsdp::detail::get_u64le(lens, static_cast<std::size_t>(q) * 8));
  std::vector<std::string> out(static_cast<std::size_t>(world));
  if (longest == 0) return out;
  std::string padded = mine;
  padded.resize(static_cast<std::size_t>((longest + 3) / 4 * 4), '\0');
  const std::string all = wire::all_gather_bytes(comm, be, padded);
  for (int q = 0; q < world; ++q)
    out[static_cast<std::size_t>(q)] =
        all.substr(static_cast<std::size_t>(q) * padded.size(),
                   static_cast<std::size_t>(fsdp::detail::get_u64le(lens, static_cast<std::size_t>(q) * 8)));
  return out;
}

/// Every rank's outcome of a step that must fail on every rank together (collective): `mine` is this rank's
/// failure, or nothing. Returns every failure by rank (empty when every rank succeeded), the same on every rank,
/// so that every rank takes the same decision. One all_gather of 8 bytes per rank when every rank succeeded.
template <Backend B, CollectivePolicy C>
std::vector<std::pair<int, std::string>> failures(C& comm, B& be, const std::optional<std::string>& mine) {
  // "!" + message marks a failure, so that a failure with an empty message is still one.
  const std::vector<std::string> all = all_gather_strings(comm, be, mine ? "!" + *mine : std::string());
  std::vector<std::pair<int, std::string>> out;
  for (std::size_t q = 0; q < all.size(); ++q)
    if (!all[q].empty()) out.emplace_back(all.size() == 1 ? comm.rank() : static_cast<int>(q), all[q].substr(1));
  return out;
}

/// Runs `f` and returns the message of what it threw (less the library's "fsdp: " prefix), or nothing: this rank's
/// outcome of a step that every rank must pass or fail together (failures(), require_success()).
template <class F>
std::optional<std::string> outcome(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const std::exception& e) {
    return std::string(fsdp::detail::unprefixed(e));
  }
  return std::nullopt;
}

/// Throws E("<what>: <failure_text>" + tail) on every rank when any rank failed (collective), so that every rank
/// fails with the same message or none does.
template <class E, Backend B, CollectivePolicy C>
void require_success(C& comm, B& be, const std::optional<std::string>& mine, std::string_view what,
                     std::string_view tail = {});

/// "rank 2: <message>" per failure, ranks with the same message listed together ("ranks 0, 1, 3: <message>"),
/// in the order of the lowest rank of each message, joined by "; ".
inline std::string failure_text(const std::vector<std::pair<int, std::string>>& failed);

/// Compares `mine` with every other rank's (collective: every rank of `comm` calls it). Throws usage_error
/// "ranks disagree on <what>: <first difference>. <fix>" on every rank when they differ.
template <Backend B, CollectivePolicy C>
void require_agreement(C& comm, B& be, const fingerprint& mine, std::string_view what, std::string_view fix) {
  const int world = comm.size();
  if (world <= 1) return;
  const std::string encoded = mine.encode();
  std::string digest;
  fsdp::detail::put_u64le(digest, fnv1a64(encoded));
  fsdp::detail::put_u64le(digest, encoded.size());
  const std::string digests = wire::all_gather_bytes(comm, be, digest);
  int differs = -1;  // the lowest rank whose digest is not rank 0's
  for (int q = 1; q < world && differs < 0; ++q)
    if (digests.compare(static_cast<std::size_t>(q) * digest_bytes, digest_bytes, digests, 0, digest_bytes) != 0)
      differs = q;
  if (differs < 0) return;

  std::uint64_t longest = 0;
  for (int q = 0; q < world; ++q)
    longest = std::max(longest, fsdp::detail::get_u64le(digests, static_cast<std::size_t>(q) * digest_bytes + 8));
  const std::size_t padded = static_cast<std::size_t>((longest + 3) / 4 * 4);
  std::string mine_padded = encoded;
  mine_padded.resize(std::max<std::size_t>(padded, 4), '\0');
  const std::string all = wire::all_gather_bytes(comm, be, mine_padded);
  auto facts_of = [&](int q) {
    const std::size_t n =
        static_cast<std::size_t>(fsdp::detail::get_u64le(digests, static_cast<std::size_t>(q) * digest_bytes + 8));
    return fingerprint::decode(std::string_view(all).substr(static_cast<std::size_t>(q) * mine_padded.size(), n), q);
  };
  const fingerprint first = facts_of(0), other = facts_of(differs);
  const std::optional<std::string> diff = first.first_difference(other, 0, differs);
  fsdp::detail::fail_usage("ranks disagree on ", what, ": ",
                           diff ? *diff
                                : fsdp::detail::cat("rank 0 and rank ", differs,
                                                    " sent different digests of equal facts (corrupted in transit?)"),
                           ". ", fix);
}

template <class E, Backend B, CollectivePolicy C>
void require_success(C& comm, B& be, const std::optional<std::string>& mine, std::string_view what,
                     std::string_view tail) {
  const auto failed = failures(comm, be, mine);
  if (!failed.empty()) throw E(fsdp::detail::cat(what, ": ", failure_text(failed), tail));
}

inline std::string failure_text(const std::vector<std::pair<int, std::string>>& failed) {
  std::vector<std::pair<std::string, std::vector<int>>> by_message;
  for (const auto& f : failed) {  // not a structured binding: clang 14 cannot capture one in a lambda
    auto it = std::find_if(by_message.begin(), by_message.end(), [&](const auto& m) { return m.first == f.second; });
    if (it == by_message.end()) by_message.push_back({f.second, {f.first}});
    else it->second.push_back(f.first);
  }
  std::string out;
  for (const auto& [message, ranks] : by_message) {
    if (!out.empty()) out += "; ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += ": " + message;
  }
  return out;
}

}  // namespace fsdp::agree
