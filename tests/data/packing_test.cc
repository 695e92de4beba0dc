// Sequence packing: every token of the stream comes out exactly once, in order within its document, or is still in the
// packer's buffer or carried remainder; position ids, cu_seqlens, targets and loss masks are those of each document
// alone; a step's rows are the same at every world size and every rank gets the same real tokens within the step's
// longest piece; bad input and bad options are errors that name what is wrong; the background packer gives the same
// batches as packing in line, never waits while its queue holds a step, and its state resumes the same data through
// bytes and files, refusing corrupt ones.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <algorithm>
#include <cstdint>
#include <fsdp/data/async_packer.hpp>
#include <fsdp/data/packer_state.hpp>
#include <fsdp/data/packing.hpp>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/support.hpp"

namespace data = fsdp::data;
using data::token;
using fsdp_test::error_of;

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// `count` documents of skewed lengths: mostly 1 to 12 tokens, one in six 13 to 40, one in twenty-five 41 to 90 (longer
/// than the tests' 32-token rows, so split). Token ids are hashes of (document, position): any token out of place
/// shows.
struct skewed_source {
  std::uint64_t count = 0;
  static std::vector<token> document(std::uint64_t i) {
    const std::uint64_t h = mix(i);
    const std::uint64_t len = h % 25 == 0 ? 41 + (h >> 8) % 50 : h % 6 == 0 ? 13 + (h >> 8) % 28 : 1 + (h >> 8) % 12;
    std::vector<token> d(len);
    for (std::uint64_t k = 0; k < len; ++k) d[k] = static_cast<token>(mix(i * 1000003 + k) % 50000) + 1;
    return d;
  }
  std::optional<std::vector<token>> operator()(std::uint64_t i) const {
    if (i >= count) return std::nullopt;
    return document(i);
  }
};

/// Documents given as a list.
struct list_source {
  std::vector<std::vector<token>> docs;
  std::optional<std::vector<token>> operator()(std::uint64_t i) const {
    if (i >= docs.size()) return std::nullopt;
    return docs[i];
  }
};

data::packing_options small_rows() { return {.row_tokens = 32, .rows_per_step = 24, .lookahead = 256}; }

std::vector<data::packed_step> pack_all(const data::packing_options& o, skewed_source src) {
  data::packer p(o, src);
  std::vector<data::packed_step> steps;
  while (auto s = p.next()) steps.push_back(std::move(*s));
  return steps;
}

/// Checks a row against the documents its segments come from: tokens, positions restarting per segment, targets (the
/// document's next token, kept across a split), loss mask, cu_seqlens, padding.
void check_row(const data::packed_row& r, const data::packing_options& o) {
  const auto T = static_cast<std::size_t>(o.row_tokens);
  REQUIRE(r.tokens.size() == T);
  REQUIRE(r.targets.size() == T);
  REQUIRE(r.positions.size() == T);
  REQUIRE(r.loss_mask.size() == T);
  REQUIRE(r.cu_seqlens.size() == r.segments.size() + 1);
  CHECK(r.cu_seqlens[0] == 0);
  std::size_t at = 0;
  for (std::size_t s = 0; s < r.segments.size(); ++s) {
    const data::segment& g = r.segments[s];
    CHECK(g.start == static_cast<std::int32_t>(at));
    CHECK(r.cu_seqlens[s + 1] == g.start + g.length);
    const std::vector<token> doc = skewed_source::document(g.document);
    for (std::int32_t k = 0; k < g.length; ++k) {
      const std::size_t i = at + static_cast<std::size_t>(k), d = static_cast<std::size_t>(g.offset + k);
      CHECK(r.tokens[i] == doc[d]);
      CHECK(r.positions[i] == k);
      const bool has_target = d + 1 < doc.size();
      CHECK(r.loss_mask[i] == (has_target ? 1 : 0));
      CHECK(r.targets[i] == (has_target ? doc[d + 1] : o.pad));
    }
    at += static_cast<std::size_t>(g.length);
  }
  for (std::size_t i = at; i < T; ++i) {
    CHECK(r.tokens[i] == o.pad);
    CHECK(r.targets[i] == o.pad);
    CHECK(r.positions[i] == 0);
    CHECK(r.loss_mask[i] == 0);
  }
}

}  // namespace

TEST_CASE(
    "every token of the stream comes out once, in order within its document, with its own positions and targets") {
  const data::packing_options o = small_rows();
  const skewed_source src{.count = 3000};
  const std::vector<data::packed_step> steps = pack_all(o, src);
  std::map<std::uint64_t, std::vector<token>> rebuilt;  // document -> its tokens, piece by piece in offset order
  std::int64_t real = 0, loss = 0, split = 0;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const data::packed_step& s = steps[k];
    CHECK(s.step == k);
    REQUIRE(s.rows.size() == 24);
    // A step's rows are side by side: its pieces of one document (in different rows) in offset order, after the pieces
    // of earlier steps.
    std::vector<std::pair<const data::packed_row*, data::segment>> pieces;
    for (const data::packed_row& r : s.rows) {
      check_row(r, o);
      for (const data::segment& g : r.segments) pieces.emplace_back(&r, g);
    }
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
    for (const auto& [r, g] : pieces) {
      std::vector<token>& d = rebuilt[g.document];
      CHECK(static_cast<std::int64_t>(d.size()) == g.offset);  // pieces come out in order
      d.insert(d.end(), r->tokens.begin() + g.start, r->tokens.begin() + g.start + g.length);
      split += g.offset > 0 ? 1 : 0;
    }
    CHECK(s.real_tokens == std::accumulate(s.rows.begin(), s.rows.end(), std::int64_t{0},
                                           [](std::int64_t n, const auto& r) { return n + r.real_tokens(); }));
    real += s.real_tokens, loss += s.loss_tokens;
  }
  std::int64_t in = 0, targets = 0;
  REQUIRE(rebuilt.size() == src.count);
  for (std::uint64_t i = 0; i < src.count; ++i) {
    const std::vector<token> doc = skewed_source::document(i);
    CHECK(rebuilt[i] == doc);
    in += static_cast<std::int64_t>(doc.size()), targets += static_cast<std::int64_t>(doc.size()) - 1;
  }
  CHECK(real == in);
  CHECK(loss == targets);
  CHECK(split > 0);  // documents longer than a row were split and came out whole
  // The rows are full but for the last steps: the buffer reorders enough to fill them.
  CHECK(static_cast<double>(real) / static_cast<double>(steps.size() * 24 * 32) > 0.99);
}

namespace {
/// Steps first-fit-decreasing needs for the same pieces under the same buffer rules (the oldest piece first, a piece
/// left over keeps its document's later pieces back): each piece to the first row with room.
std::size_t first_fit_decreasing_steps(const data::packing_options& o, std::uint64_t count) {
  std::vector<std::pair<std::uint64_t, std::int64_t>> buffer;  // (document, tokens)
  std::uint64_t next = 0;
  std::int64_t carry = 0;
  std::size_t steps = 0;
  for (;;) {
    while (static_cast<std::int64_t>(buffer.size()) < o.lookahead && (carry > 0 || next < count)) {
      if (carry == 0) carry = static_cast<std::int64_t>(skewed_source::document(next++).size());
      const std::int64_t n = std::min(carry, o.row_tokens);
      buffer.emplace_back(next - 1, n);
      carry -= n;
    }
    if (buffer.empty()) return steps;
    std::vector<std::size_t> order(buffer.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin() + 1, order.end(),
                     [&](std::size_t a, std::size_t b) { return buffer[a].second > buffer[b].second; });
    std::vector<std::int64_t> load(static_cast<std::size_t>(o.rows_per_step), 0);
    std::vector<bool> placed(buffer.size(), false);
    std::vector<std::uint64_t> held_back;
    for (std::size_t i : order) {
      auto row =
          std::find_if(load.begin(), load.end(), [&](std::int64_t l) { return l + buffer[i].second <= o.row_tokens; });
      if (row == load.end() || std::find(held_back.begin(), held_back.end(), buffer[i].first) != held_back.end()) {
        held_back.push_back(buffer[i].first);
        continue;
      }
      *row += buffer[i].second;
      placed[i] = true;
    }
    std::vector<std::pair<std::uint64_t, std::int64_t>> rest;
    for (std::size_t i = 0; i < buffer.size(); ++i)
      if (!placed[i]) rest.push_back(buffer[i]);
    buffer = std::move(rest);
    ++steps;
  }
}
}  // namespace

TEST_CASE("least-filled placement packs into no more steps than first-fit-decreasing") {
  for (std::int64_t lookahead : {16, 48, 96, 256}) {
    CAPTURE(lookahead);
    data::packing_options o = small_rows();
    o.lookahead = lookahead;
    const std::size_t ours = pack_all(o, skewed_source{.count = 3000}).size();
    const std::size_t ffd = first_fit_decreasing_steps(o, 3000);
    CHECK(ours <= ffd);
  }
}

TEST_CASE("midway, the tokens read are the tokens packed plus those in the buffer and the carried remainder") {
  const data::packing_options o{.row_tokens = 32, .rows_per_step = 3, .lookahead = 5};
  data::packer p(o, skewed_source{.count = 400});
  std::int64_t packed = 0, read = 0;
  std::uint64_t counted = 0;  // documents in `read`
  bool carried = false;
  while (const auto s = p.next()) {
    packed += s->real_tokens;
    const data::packer_state& st = p.state();
    for (; counted < st.next_document; ++counted)
      read += static_cast<std::int64_t>(skewed_source::document(counted).size());
    std::int64_t held = 0;
    for (const data::piece& q : st.buffer) held += q.size();
    if (st.carry) held += st.carry->size(), carried = true;
    CHECK(read == packed + held);
    CHECK(st.buffer.size() <= 5);
  }
  CHECK(counted == 400);
  CHECK(packed == read);
  CHECK(carried);
}

TEST_CASE("a worked example: the oldest piece first, then longest first, each to the least-filled row") {
  // Rows of 8, two per step, four pieces looked ahead. Step 0 holds documents 0..3 (5, 3, 8, 2 tokens): 0 goes to row
  // 0, then 2 (8) to row 1, 1 (3) to row 0 (5 + 3 = 8), and 3 (2) fits in neither, so it waits. Step 1 reads 4 and 5
  // (7, 1 tokens) and the end: 3 (the oldest) to row 0, 4 to row 1, 5 to row 0 (2 + 1 < 7).
  list_source src{
      {{1, 2, 3, 4, 5}, {6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16}, {17, 18}, {19, 20, 21, 22, 23, 24, 25}, {26}}};
  data::packer p({.row_tokens = 8, .rows_per_step = 2, .lookahead = 4}, src);
  auto seg = [](std::uint64_t d, std::int32_t start, std::int32_t n) {
    return data::segment{.document = d, .offset = 0, .start = start, .length = n};
  };
  const auto s0 = p.next();
  REQUIRE(s0);
  CHECK(s0->rows[0].segments == std::vector{seg(0, 0, 5), seg(1, 5, 3)});
  CHECK(s0->rows[0].tokens == std::vector<token>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(s0->rows[0].targets == std::vector<token>{2, 3, 4, 5, 0, 7, 8, 0});
  CHECK(s0->rows[0].positions == std::vector<std::int32_t>{0, 1, 2, 3, 4, 0, 1, 2});
  CHECK(s0->rows[0].cu_seqlens == std::vector<std::int32_t>{0, 5, 8});
  CHECK(s0->rows[0].loss_mask == std::vector<std::uint8_t>{1, 1, 1, 1, 0, 1, 1, 0});
  CHECK(s0->rows[1].segments == std::vector{seg(2, 0, 8)});
  CHECK(p.state().buffer.size() == 1);
  CHECK(p.state().buffer[0].document == 3);
  const auto s1 = p.next();
  REQUIRE(s1);
  CHECK(s1->rows[0].segments == std::vector{seg(3, 0, 2), seg(5, 2, 1)});
  CHECK(s1->rows[0].tokens == std::vector<token>{17, 18, 26, 0, 0, 0, 0, 0});
  CHECK(s1->rows[0].cu_seqlens == std::vector<std::int32_t>{0, 2, 3});
  CHECK(s1->rows[1].segments == std::vector{seg(4, 0, 7)});
  CHECK(s1->real_tokens == 10);
  CHECK(s1->loss_tokens == 7);
  CHECK(s1->longest_piece == 7);
  CHECK(!p.next());
  // Two ranks: the fuller row (7 tokens) to rank 0, the other to rank 1.
  const data::rank_batch r0 = data::rank_share(*s1, 2, 0), r1 = data::rank_share(*s1, 2, 1);
  CHECK(r0.row_ids == std::vector<std::int64_t>{1});
  CHECK(r1.row_ids == std::vector<std::int64_t>{0});
  CHECK(r0.real_tokens == 7);
  CHECK(r1.real_tokens == 3);
  CHECK(r1.loss_tokens == 1);
  CHECK(r0.step_loss_tokens == 7);
}

TEST_CASE("a document longer than a row is split into row-sized pieces that keep every target") {
  std::vector<token> doc(20);
  std::iota(doc.begin(), doc.end(), 100);
  data::packer p({.row_tokens = 8, .rows_per_step = 1, .lookahead = 2}, list_source{{doc}});
  std::vector<data::packed_row> rows;
  while (auto s = p.next()) rows.push_back(s->rows[0]);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].segments == std::vector{data::segment{.document = 0, .offset = 0, .start = 0, .length = 8}});
  CHECK(rows[1].segments == std::vector{data::segment{.document = 0, .offset = 8, .start = 0, .length = 8}});
  CHECK(rows[2].segments == std::vector{data::segment{.document = 0, .offset = 16, .start = 0, .length = 4}});
  CHECK(rows[0].targets == std::vector<token>{101, 102, 103, 104, 105, 106, 107, 108});  // 108 starts the next piece
  CHECK(rows[1].positions == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(rows[2].targets == std::vector<token>{117, 118, 119, 0, 0, 0, 0, 0});
  CHECK(rows[2].loss_mask == std::vector<std::uint8_t>{1, 1, 1, 0, 0, 0, 0, 0});
  CHECK(rows[0].loss_tokens() + rows[1].loss_tokens() + rows[2].loss_tokens() == 19);
}

TEST_CASE(
    "a step's rows are the same at world sizes 1, 2, 3, 4 and 8; every rank gets the same real tokens within the "
    "step's longest piece") {
  const data::packing_options o = small_rows();
  const std::vector<data::packed_step> steps = pack_all(o, skewed_source{.count = 3000});
  std::int64_t worst = 0;
  for (int world : {1, 2, 3, 4, 8}) {
    CAPTURE(world);
    // Every rank's background packer, as a trainer runs it: together they hold each step's rows, once each.
    std::vector<std::unique_ptr<data::async_packer<skewed_source>>> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back(std::make_unique<data::async_packer<skewed_source>>(o, skewed_source{.count = 3000}, world, r));
    for (const data::packed_step& s : steps) {
      std::vector<int> owner(s.rows.size(), -1);
      std::int64_t lo = INT64_MAX, hi = 0;
      for (int r = 0; r < world; ++r) {
        const std::optional<data::rank_batch> b = ranks[static_cast<std::size_t>(r)]->next();
        REQUIRE(b);
        CHECK(b->step == s.step);
        REQUIRE(b->rows.size() == s.rows.size() / static_cast<std::size_t>(world));
        for (std::size_t i = 0; i < b->rows.size(); ++i) {
          const auto id = static_cast<std::size_t>(b->row_ids[i]);
          CHECK(owner[id] == -1);
          owner[id] = r;
          CHECK(b->rows[i] == s.rows[id]);
        }
        CHECK(b->step_real_tokens == s.real_tokens);
        CHECK(b->step_loss_tokens == s.loss_tokens);
        lo = std::min(lo, b->real_tokens), hi = std::max(hi, b->real_tokens);
      }
      CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      CHECK(hi - lo <= s.longest_piece);
      worst = std::max(worst, hi - lo);
    }
    for (auto& r : ranks) CHECK(!r->next());
  }
  CHECK(worst > 0);  // the bound is met, not trivially
  CHECK(worst <= 32);
}

TEST_CASE("bad options and bad input are errors that name what is wrong") {
  using fsdp::usage_error;
  auto make = [](data::packing_options o) { data::packer p(o, skewed_source{.count = 1}); };
  CHECK(
      error_of<usage_error>([&] { make({.row_tokens = 0, .rows_per_step = 2}); }) ==
      "fsdp: packing: row_tokens is 0; it is the tokens of one row (the model's context length) and must be positive");
  CHECK(
      error_of<usage_error>([&] { make({.row_tokens = -5, .rows_per_step = 2}); }) ==
      "fsdp: packing: row_tokens is -5; it is the tokens of one row (the model's context length) and must be positive");
  CHECK(error_of<usage_error>([&] { make({.row_tokens = 8, .rows_per_step = 0}); }) ==
        "fsdp: packing: rows_per_step is 0; it is the rows of one step over every rank and must be positive");
  CHECK(error_of<usage_error>([&] { make({.row_tokens = 8, .rows_per_step = 2, .lookahead = 0}); }) ==
        "fsdp: packing: lookahead is 0; it is the pieces of documents the packer may reorder and must be positive");
  CHECK(error_of<usage_error>([&] { make({.row_tokens = std::int64_t{1} << 40, .rows_per_step = 2}); }) ==
        "fsdp: packing: row_tokens is 1099511627776; position ids and cu_seqlens are 32-bit, so at most 2147483647");

  list_source with_empty{{{1, 2}, {3}, {}, {4}}};
  data::packer p({.row_tokens = 8, .rows_per_step = 1, .lookahead = 4}, with_empty);
  const std::string empty =
      "fsdp: packing: document 2 of the stream is empty; every document needs at least one token (drop empty "
      "documents from the source, or end each document with an end-of-text token)";
  CHECK(error_of<usage_error>([&] { p.next(); }) == empty);
  CHECK(p.state().next_document == 2);  // not read past it: a retry, or a state saved now, refuses it again
  CHECK(error_of<usage_error>([&] { p.next(); }) == empty);

  list_source long_one{{{1, 2}, std::vector<token>(9, 7)}};
  data::packer q({.row_tokens = 8, .rows_per_step = 1, .long_docs = data::long_documents::reject}, long_one);
  CHECK(error_of<usage_error>([&] { q.next(); }) ==
        "fsdp: packing: document 1 has 9 tokens, more than a row's 8; split it (long_documents::split) or raise "
        "row_tokens");
  CHECK(q.state().next_document == 1);

  const data::packing_options o{.row_tokens = 8, .rows_per_step = 6};
  CHECK(error_of<usage_error>([&] { data::async_packer a(o, skewed_source{.count = 1}, 4, 0); }) ==
        "fsdp: packing: 6 rows per step do not split over 4 ranks; choose rows_per_step a multiple of every world size "
        "you train at");
  CHECK(error_of<usage_error>([&] { data::async_packer a(o, skewed_source{.count = 1}, 3, 3); }) ==
        "fsdp: packing: rank 3 is outside a world of 3");
  CHECK(error_of<usage_error>([&] { data::async_packer a(o, skewed_source{.count = 1}, 3, 0, 0); }) ==
        "fsdp: packing: an async_packer's queue depth is 0; it must hold at least one step");
}

TEST_CASE("the background packer: a full queue is taken without waiting; an error arrives at its step") {
  const data::packing_options o{.row_tokens = 32, .rows_per_step = 4, .lookahead = 16};
  data::async_packer a(o, skewed_source{.count = 2000}, 2, 1, 3);
  for (int spin = 0; a.queued() < 3 && spin < 10000; ++spin) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(a.queued() == 3);
  for (int k = 0; k < 3; ++k) CHECK(a.next()->step == static_cast<std::uint64_t>(k));
  CHECK(a.waits() == 0);

  // Document 40 is empty: the steps before it come out, then the error, then again the error.
  struct hole {
    std::optional<std::vector<token>> operator()(std::uint64_t i) const {
      if (i == 40) return std::vector<token>{};
      return std::vector<token>(5, static_cast<token>(i));
    }
  };
  data::async_packer b({.row_tokens = 10, .rows_per_step = 2, .lookahead = 4}, hole{}, 1, 0);
  std::uint64_t before = 0;
  std::string message;
  for (;;) {
    try {
      b.next();
      ++before;
    } catch (const fsdp::usage_error& e) {
      message = e.what();
      break;
    }
  }
  CHECK(before == 10);  // documents 0..39 in 10 steps of four; the 11th step's reading reaches document 40
  CHECK(message ==
        "fsdp: packing: document 40 of the stream is empty; every document needs at least one token (drop empty "
        "documents from the source, or end each document with an end-of-text token)");
  CHECK(error_of<fsdp::usage_error>([&] { b.next(); }) == message);
}

TEST_CASE("the packer's state resumes the same data, through bytes and through a file") {
  const data::packing_options o = small_rows();
  const skewed_source src{.count = 1500};
  std::vector<data::rank_batch> whole;
  {
    data::async_packer a(o, src, 3, 2);
    while (auto b = a.next()) whole.push_back(std::move(*b));
  }
  REQUIRE(whole.size() > 10);
  fsdp_test::scratch_dir dir("packing_state");
  for (std::size_t stop : {std::size_t{0}, std::size_t{1}, std::size_t{7}, whole.size()}) {
    CAPTURE(stop);
    data::packer_state saved;
    {
      data::async_packer a(o, src, 3, 2, 2);
      for (std::size_t k = 0; k < stop; ++k) CHECK(a.next()->step == k);
      saved = a.state();  // the worker has packed ahead; the state is the trainer's
      data::save_state(dir / "data.state", o, saved);
    }
    CHECK(saved.step == stop);
    const data::packer_state loaded = data::load_state(dir / "data.state", o);
    CHECK(loaded == saved);
    CHECK(data::from_bytes(data::to_bytes(o, saved), o) == saved);
    data::async_packer resumed(o, src, 3, 2, 4, loaded);
    for (std::size_t k = stop; k < whole.size(); ++k) {
      const auto b = resumed.next();
      REQUIRE(b);
      CHECK(b->step == whole[k].step);
      CHECK(b->rows == whole[k].rows);
    }
    CHECK(!resumed.next());
  }
}

TEST_CASE("a corrupt, truncated or foreign packer state is refused with the reason") {
  using fsdp::checkpoint_error;
  const data::packing_options o{.row_tokens = 32, .rows_per_step = 4, .lookahead = 16};
  data::packer p(o, skewed_source{.count = 500});
  p.next(), p.next();
  const std::string good = data::to_bytes(o, p.state());
  auto read = [&](const std::string& b, data::packing_options with) {
    return error_of<checkpoint_error>([&] { data::from_bytes(b, with, "'s.state'"); });
  };
  std::string flipped = good;
  flipped[40] ^= 1;
  CHECK(read(flipped, o) == "fsdp: packer state 's.state': its checksum does not match its bytes (corrupted)");
  CHECK(read({good.begin(), good.begin() + 4}, o) ==
        "fsdp: packer state 's.state': does not start with \"FSDPPACK\": not a packer state");
  data::packing_options other = o;
  other.row_tokens = 64;
  CHECK(read(good, other) ==
        "fsdp: packer state 's.state': was saved with row_tokens 32 and the packer has 64; resume with the options it "
        "was saved with");
  other = o;
  other.long_docs = data::long_documents::reject;
  CHECK(read(good, other) ==
        "fsdp: packer state 's.state': was saved with long_docs split and the packer has reject; resume with the "
        "options it was saved with");
  // A truncated state with a recomputed checksum: the reader stops at the field that is cut.
  std::string cut = good.substr(0, good.size() - 8 - 6);
  fsdp::detail::put_u64le(cut, fsdp::fnv1a64(cut));
  const std::string m = read(cut, o);
  CHECK(m == "fsdp: packer state 's.state': a piece of document 30 claims 10 tokens, and 35 bytes are left");
  CHECK(error_of<checkpoint_error>([&] { data::load_state("/nonexistent/s.state", o); }) ==
        "fsdp: could not open the packer state '/nonexistent/s.state'");
}

TEST_CASE("the packer's state as base64 text, for a checkpoint's metadata: round trip and damage") {
  using fsdp::checkpoint_error;
  const data::packing_options o{.row_tokens = 32, .rows_per_step = 4, .lookahead = 16};
  data::packer p(o, skewed_source{.count = 500});
  for (int k = 0; k < 3; ++k) {
    const std::string text = data::to_text(o, p.state());
    CHECK(text.size() == (data::to_bytes(o, p.state()).size() + 2) / 3 * 4);
    CHECK(text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") ==
          std::string::npos);
    CHECK(data::from_text(text, o) == p.state());
    p.next();
  }
  std::string text = data::to_text(o, p.state());
  auto read = [&](const std::string& t) {
    return error_of<checkpoint_error>([&] { data::from_text(t, o, "in 'ckpt/manifest.json'"); });
  };
  CHECK(read(text.substr(0, text.size() - 1)) ==
        "fsdp: packer state in 'ckpt/manifest.json': " + std::to_string(text.size() - 1) +
            " characters of base64, not a multiple of 4 (cut?)");
  CHECK(read(text.substr(0, 12) + "*" + text.substr(13)) ==
        "fsdp: packer state in 'ckpt/manifest.json': character 12 is not base64");
  text[20] = text[20] == 'A' ? 'B' : 'A';
  CHECK(read(text) == "fsdp: packer state in 'ckpt/manifest.json': its checksum does not match its bytes (corrupted)");
}
