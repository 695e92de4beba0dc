#pragma once
// Sequence packing: variable-length documents streamed into rows of a fixed token budget, with attention kept
// inside each document, and every rank of a step given the same number of real tokens (within one document).
// Independent of the model, the backend and the communicator: a trainer of any kind takes a step's rows as plain
// vectors (tokens, targets, position ids, cu_seqlens, loss mask) and copies them where its kernels want them.
//
// The rules, all deterministic (the packed data is a pure function of the source and the options):
// - Reading: documents are read from the source by index, 0, 1, 2, ..., each once, into a look-ahead buffer of
//   `lookahead` pieces; the buffer is refilled before each step.
// - Long documents: a document longer than a row is split (long_documents::split) into consecutive pieces of
//   row_tokens tokens, the last one shorter; each piece is packed as its own segment (its position ids restart at
//   0 and attention does not cross into the previous piece), and the last token of every piece but the
//   document's last keeps its target, the next piece's first token, so no prediction is lost. A split document
//   enters the buffer one piece at a time: what is not in it yet is the carried remainder. With
//   long_documents::reject such a document is an error instead.
// - Packing a step: the step's rows_per_step rows are filled from the buffer, the oldest piece first (so a piece
//   waits at most `lookahead` steps), then the others longest first (ties in stream order), each into the row
//   with the fewest tokens (ties: the lower row), or left in the buffer for a later step when it does not fit
//   there (then it fits in no row), as are the later pieces of its document, so a document's pieces come out in
//   order (a piece in the same step as the one before it, or later, in another row). Every placed piece goes to a
//   least-filled row, so the rows of a step differ by at most the longest piece placed in it.
// - Ranks: a step's rows are the same for every world size; a world size W (a divisor of rows_per_step) deals
//   them out in serpentine order of their real tokens (the fullest row to rank 0, the next to rank 1, ..., then
//   back from rank W-1), rows_per_step / W to each rank. Serpentine dealing keeps the ranks' real tokens within
//   the largest difference between two rows, so within the longest piece of the step.
// - Targets: the target of a token is the next token of its document; a document's last token, and padding, have
//   none (loss mask 0). A step's loss tokens (every rank's) are known to every rank, so a trainer can normalise
//   its loss sum by them without a collective.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::data {

using token = std::int32_t;

/// What to do with a document longer than a row.
enum class long_documents : std::uint8_t {
  split,   ///< consecutive pieces of row_tokens tokens, each its own segment, every target kept
  reject,  ///< a usage_error naming the document
};

inline const char* to_string(long_documents l) { return l == long_documents::split ? "split" : "reject"; }

struct packing_options {
  std::int64_t row_tokens = 0;     ///< tokens per row (a model's context length); positive
  std::int64_t rows_per_step = 0;  ///< rows of a step over every rank; a multiple of each world size trained at
  std::int64_t lookahead = 64;     ///< pieces held in the look-ahead buffer; positive
  long_documents long_docs = long_documents::split;
  token pad = 0;  ///< the token id of padding (its loss mask is 0; it belongs to no segment)
};

/// A usage_error for options that cannot pack (naming the option and its value), or nothing.
FSDP_DECL void validate(const packing_options& o);

/// A document, or the piece of one that is packed as a segment.
struct piece {
  std::uint64_t document = 0;  ///< its index in the stream
  std::int64_t offset = 0;     ///< of its first token within the document
  std::vector<token> tokens;
  bool has_next = false;  ///< the document goes on after this piece: its last token's target is `next`
  token next = 0;

  std::int64_t size() const { return static_cast<std::int64_t>(tokens.size()); }
  bool operator==(const piece&) const = default;
};

/// One segment of a row: which piece of which document lies where.
struct segment {
  std::uint64_t document = 0;
  std::int64_t offset = 0;  ///< within the document
  std::int32_t start = 0;   ///< within the row
  std::int32_t length = 0;
  bool operator==(const segment&) const = default;
};

/// One packed row of row_tokens positions: its segments, back to back from position 0, then padding.
struct packed_row {
  std::vector<token> tokens;             ///< row_tokens ids; padding is options.pad
  std::vector<token> targets;            ///< the next token of each token's document; options.pad where masked
  std::vector<std::int32_t> positions;   ///< restarting at 0 at each segment; 0 on padding
  std::vector<std::int32_t> cu_seqlens;  ///< 0, then each segment's end: segments + 1 entries (varlen attention's)
  std::vector<std::uint8_t> loss_mask;   ///< 1 where targets holds a target
  std::vector<segment> segments;         ///< in stream order

  /// Tokens that belong to a document (the rest is padding).
  std::int64_t real_tokens() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  /// Tokens with a target.
  std::int64_t loss_tokens() const { return std::accumulate(loss_mask.begin(), loss_mask.end(), std::int64_t{0}); }
  bool operator==(const packed_row&) const = default;
};

/// A step's rows over every rank, the same for every world size.
struct packed_step {
  std::uint64_t step = 0;
  std::vector<packed_row> rows;
  std::int64_t real_tokens = 0, loss_tokens = 0;  ///< over every row
  std::int64_t longest_piece = 0;                 ///< the longest segment placed: the balance bound
};

/// One rank's share of a step.
struct rank_batch {
  std::uint64_t step = 0;
  std::vector<packed_row> rows;                             ///< in the step's row order
  std::vector<std::int64_t> row_ids;                        ///< each row's index within the step
  std::int64_t real_tokens = 0, loss_tokens = 0;            ///< this rank's
  std::int64_t step_real_tokens = 0, step_loss_tokens = 0;  ///< every rank's: the loss's denominator
};

/// A usage_error unless `world` ranks can share `rows` rows a step evenly.
FSDP_DECL void check_world(std::int64_t rows, int world);
/// A usage_error unless `rank` is one of `world`'s.
FSDP_DECL void check_rank(int world, int rank);

/// Which of a step's rows each rank takes: rows in serpentine order of their real tokens (ties: the lower row),
/// each rank's list in row order. A usage_error when `world` does not divide the rows.
FSDP_DECL std::vector<std::vector<std::int64_t>> deal_rows(const std::vector<std::int64_t>& row_real_tokens, int world);

/// Rank `rank` of `world`'s share of a step.
FSDP_DECL rank_batch rank_share(const packed_step& s, int world, int rank);

/// Where a packer stands in its stream: what a checkpoint keeps to resume the same data (packer_state.hpp writes
/// and reads it). Tokens read = tokens packed + tokens in `buffer` and `carry`.
struct packer_state {
  std::uint64_t step = 0;           ///< steps packed
  std::uint64_t next_document = 0;  ///< the first document not read yet
  bool stream_ended = false;        ///< the source said there are no more documents
  std::vector<piece> buffer;        ///< the look-ahead buffer, in stream order
  std::optional<piece> carry;       ///< the rest of a split document, not in the buffer yet
  bool operator==(const packer_state&) const = default;
};

/// A source of documents: source(i) is document i of the stream, or nothing after the last one. The packer asks
/// for 0, 1, 2, ... in order, each once (from next_document on, after a restore), so a streaming source may
/// ignore the index or check it.
template <class S>
concept DocumentSource = requires(S& s, std::uint64_t i) {
  { s(i) } -> std::convertible_to<std::optional<std::vector<token>>>;
};

/// A packer's state as the packer holds it: pieces shared and never changed once made, so a snapshot (what
/// async_packer keeps after every step) copies pointers, not tokens; value() makes the packer_state.
struct packer_snapshot {
  std::uint64_t step = 0, next_document = 0;
  bool stream_ended = false;
  std::vector<std::shared_ptr<const piece>> buffer;
  std::shared_ptr<const piece> carry;  ///< a split document's tokens from carry->offset on, of which
  std::int64_t carry_taken = 0;        ///< the first carry_taken are in the buffer already

  /// The state as a value (tokens copied).
  packer_state value() const;
};

/// Packs a stream of documents step by step, on the caller's thread (async_packer runs one on a worker).
template <DocumentSource Source>
class packer {
 public:
  packer(packing_options o, Source source, const packer_state& state = {}) : o_(o), source_(std::move(source)) {
    validate(o_);
    st_.step = state.step, st_.next_document = state.next_document, st_.stream_ended = state.stream_ended;
    for (const piece& p : state.buffer) {
      if (p.tokens.empty() || p.size() > o_.row_tokens)
        detail::fail_usage("packing: the restored state holds a piece of document ", p.document, " with ",
                           p.tokens.size(), " tokens, which does not fit a row of ", o_.row_tokens,
                           " (was it saved with other options?)");
      st_.buffer.push_back(std::make_shared<const piece>(p));
    }
    if (state.carry) {
      if (state.carry->tokens.empty())
        detail::fail_usage("packing: the restored state carries an empty remainder of document ",
                           state.carry->document);
      st_.carry = std::make_shared<const piece>(*state.carry);
    }
  }

  const packing_options& options() const { return o_; }
  /// Where the packer stands: a value (tokens copied), and the cheap snapshot it is made from.
  packer_state state() const { return st_.value(); }
  const packer_snapshot& snapshot() const { return st_; }

  /// The next step's rows, or nothing when the stream is exhausted and nothing is left to pack.
  std::optional<packed_step> next() {
    fill();
    if (st_.buffer.empty()) return std::nullopt;
    const auto R = static_cast<std::size_t>(o_.rows_per_step);
    // The oldest piece first, then the rest longest first, ties in stream order (the buffer's order).
    std::vector<std::size_t> order(st_.buffer.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin() + 1, order.end(),
                     [&](std::size_t a, std::size_t b) { return st_.buffer[a]->size() > st_.buffer[b]->size(); });
    std::vector<std::int64_t> load(R, 0);
    std::vector<std::vector<std::size_t>> members(R);
    std::vector<bool> placed(st_.buffer.size(), false);
    packed_step s;
    s.step = st_.step;
    // Split documents with a piece left for a later step: their later pieces wait too (only pieces that are not a
    // document's last can hold one back, so the list stays short).
    std::vector<std::uint64_t> held_back;
    for (std::size_t i : order) {
      const piece& p = *st_.buffer[i];
      const auto row = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      const std::int64_t n = p.size();
      if (load[row] + n > o_.row_tokens ||  // fits in no row: stays for a later step
          (p.offset > 0 && std::find(held_back.begin(), held_back.end(), p.document) != held_back.end())) {
        if (p.has_next) held_back.push_back(p.document);
        continue;
      }
      load[row] += n;
      members[row].push_back(i);
      placed[i] = true;
      s.longest_piece = std::max(s.longest_piece, n);
    }
    for (std::size_t r = 0; r < R; ++r) {
      std::sort(members[r].begin(), members[r].end());  // stream order within the row
      s.rows.push_back(make_row(members[r]));
      s.real_tokens += s.rows.back().real_tokens();
      s.loss_tokens += s.rows.back().loss_tokens();
    }
    std::vector<std::shared_ptr<const piece>> rest;
    for (std::size_t i = 0; i < st_.buffer.size(); ++i)
      if (!placed[i]) rest.push_back(std::move(st_.buffer[i]));
    st_.buffer = std::move(rest);
    ++st_.step;
    return s;
  }

 private:
  void fill() {
    while (static_cast<std::int64_t>(st_.buffer.size()) < o_.lookahead) {
      if (st_.carry) {
        take_piece_of_carry();
        continue;
      }
      if (st_.stream_ended) return;
      const std::uint64_t index = st_.next_document;
      std::optional<std::vector<token>> doc = source_(index);
      if (!doc) {
        st_.stream_ended = true;
        return;
      }
      // A refused document is not counted as read: the state stays before it, and a retry refuses it again.
      if (doc->empty())
        detail::fail_usage("packing: document ", index,
                           " of the stream is empty; every document needs at least one token (drop empty documents "
                           "from the source, or end each document with an end-of-text token)");
      const auto n = static_cast<std::int64_t>(doc->size());
      if (n > o_.row_tokens && o_.long_docs == long_documents::reject)
        detail::fail_usage("packing: document ", index, " has ", n, " tokens, more than a row's ", o_.row_tokens,
                           "; split it (long_documents::split) or raise row_tokens");
      ++st_.next_document;
      auto p = std::make_shared<piece>(piece{.document = index, .offset = 0, .tokens = std::move(*doc)});
      if (n <= o_.row_tokens) {
        st_.buffer.push_back(std::move(p));
        continue;
      }
      st_.carry = std::move(p);
      st_.carry_taken = 0;
    }
  }

  // Moves the carried document's next row_tokens tokens (or the rest) into the buffer as a piece.
  void take_piece_of_carry() {
    const piece& c = *st_.carry;
    const std::int64_t left = c.size() - st_.carry_taken;
    const std::int64_t n = std::min(left, o_.row_tokens);
    const auto from = c.tokens.begin() + static_cast<std::ptrdiff_t>(st_.carry_taken);
    const bool more = n < left;
    st_.buffer.push_back(std::make_shared<const piece>(
        piece{.document = c.document,
              .offset = c.offset + st_.carry_taken,
              .tokens = std::vector<token>(from, from + static_cast<std::ptrdiff_t>(n)),
              .has_next = more,
              .next = more ? c.tokens[static_cast<std::size_t>(st_.carry_taken + n)] : token{0}}));
    st_.carry_taken += n;
    if (!more) st_.carry.reset(), st_.carry_taken = 0;
  }

  packed_row make_row(const std::vector<std::size_t>& members) const {
    const auto T = static_cast<std::size_t>(o_.row_tokens);
    packed_row r;
    r.tokens.assign(T, o_.pad), r.targets.assign(T, o_.pad), r.positions.assign(T, 0), r.loss_mask.assign(T, 0);
    r.cu_seqlens.push_back(0);
    std::size_t at = 0;
    for (std::size_t i : members) {
      const piece& p = *st_.buffer[i];
      const std::size_t n = p.tokens.size();
      std::copy(p.tokens.begin(), p.tokens.end(), r.tokens.begin() + static_cast<std::ptrdiff_t>(at));
      for (std::size_t k = 0; k < n; ++k) {
        r.positions[at + k] = static_cast<std::int32_t>(k);
        const bool last = k + 1 == n;
        if (!last || p.has_next) {
          r.targets[at + k] = last ? p.next : p.tokens[k + 1];
          r.loss_mask[at + k] = 1;
        }
      }
      r.segments.push_back({.document = p.document,
                            .offset = p.offset,
                            .start = static_cast<std::int32_t>(at),
                            .length = static_cast<std::int32_t>(n)});
      at += n;
      r.cu_seqlens.push_back(static_cast<std::int32_t>(at));
    }
    return r;
  }

  packing_options o_;
  Source source_;
  packer_snapshot st_;
};

}  // namespace fsdp::data

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/data/packing.ipp"
#endif
