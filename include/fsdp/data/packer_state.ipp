#pragma once
// The packer state's reading and writing (fsdp/data/packer_state.hpp): included by that header, or compiled once
// by fsdp/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fsdp/core/bytes.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/hash.hpp"
#include "fsdp/data/packer_state.hpp"

namespace fsdp::data {

namespace detail {

inline constexpr std::string_view magic = "FSDPPACK";
inline constexpr std::uint32_t version = 1;

class writer {
 public:
  template <class T>
  void put(T v) {
    fsdp::detail::put_le(out, v);
  }
  void put_piece(const piece& p) {
    put<std::uint64_t>(p.document), put<std::int64_t>(p.offset), put<std::uint8_t>(p.has_next ? 1 : 0);
    put<std::int32_t>(p.next), put<std::uint64_t>(p.tokens.size());
    for (token t : p.tokens) put<token>(t);
  }
  std::string out;
};

class reader {
 public:
  /// Reads `bytes` from byte `at` on (error messages count from byte 0).
  reader(std::string_view bytes, std::string_view what, std::size_t at = 0) : b_(bytes), what_(what), at_(at) {}
  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    const T v = fsdp::detail::get_le<T>(b_, at_);
    at_ += sizeof(T);
    return v;
  }
  piece get_piece() {
    piece p;
    p.document = get<std::uint64_t>("a piece's document");
    p.offset = get<std::int64_t>("a piece's offset");
    p.has_next = get<std::uint8_t>("a piece's has_next") != 0;
    p.next = get<std::int32_t>("a piece's next token");
    const auto n = get<std::uint64_t>("a piece's token count");
    if (n == 0 || n > left() / sizeof(token))
      fail(fsdp::detail::cat("a piece of document ", p.document, " claims ", n, " tokens, and ", left(),
                             " bytes are left"));
    p.tokens.resize(n);
    for (token& t : p.tokens) t = get<token>("a piece's tokens");
    return p;
  }
  std::size_t left() const { return b_.size() - at_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw checkpoint_error(fsdp::detail::cat("packer state ", what_, ": ", why));
  }

 private:
  void need(std::size_t n, const char* field) const {
    if (left() < n) fail(fsdp::detail::cat("ends at byte ", b_.size(), " inside ", field, " (truncated?)"));
  }
  std::string_view b_;
  std::string_view what_;
  std::size_t at_ = 0;
};

}  // namespace detail

FSDP_DECL std::string to_bytes(const packing_options& o, const packer_state& s) {
  detail::writer w;
  w.out = detail::magic;
  w.put(detail::version);
  w.put(o.row_tokens), w.put(o.rows_per_step), w.put(o.lookahead), w.put(static_cast<std::uint8_t>(o.long_docs));
  w.put(o.pad);
  w.put(s.step), w.put(s.next_document), w.put<std::uint8_t>(s.stream_ended ? 1 : 0);
  w.put<std::uint64_t>(s.buffer.size());
  for (const piece& p : s.buffer) w.put_piece(p);
  w.put<std::uint8_t>(s.carry ? 1 : 0);
  if (s.carry) w.put_piece(*s.carry);
  w.put(fnv1a64(w.out));
  return std::move(w.out);
}

FSDP_DECL packer_state from_bytes(std::string_view bytes, const packing_options& o, std::string_view what) {
  detail::reader r(bytes, what);
  if (bytes.size() < detail::magic.size() + sizeof(std::uint64_t) || !bytes.starts_with(detail::magic))
    r.fail("does not start with \"FSDPPACK\": not a packer state");
  const std::size_t body = bytes.size() - sizeof(std::uint64_t);
  if (fnv1a64(bytes.substr(0, body)) != fsdp::detail::get_le<std::uint64_t>(bytes, body))
    r.fail("its checksum does not match its bytes (corrupted)");
  detail::reader b(bytes.substr(0, body), what, detail::magic.size());
  if (const auto v = b.get<std::uint32_t>("the version"); v != detail::version)
    r.fail(fsdp::detail::cat("has version ", v, "; this library reads version ", detail::version));
  packing_options saved;
  saved.row_tokens = b.get<std::int64_t>("row_tokens");
  saved.rows_per_step = b.get<std::int64_t>("rows_per_step");
  saved.lookahead = b.get<std::int64_t>("lookahead");
  const auto ld = b.get<std::uint8_t>("long_docs");
  if (ld > 1) r.fail(fsdp::detail::cat("long_docs is ", int{ld}, ", neither split (0) nor reject (1)"));
  saved.long_docs = static_cast<long_documents>(ld);
  saved.pad = b.get<token>("pad");
  auto differs = [&](const char* name, auto was, auto is) {
    if (was != is)
      r.fail(fsdp::detail::cat("was saved with ", name, " ", was, " and the packer has ", is,
                               "; resume with the options it was saved with"));
  };
  differs("row_tokens", saved.row_tokens, o.row_tokens);
  differs("rows_per_step", saved.rows_per_step, o.rows_per_step);
  differs("lookahead", saved.lookahead, o.lookahead);
  differs("long_docs", std::string(to_string(saved.long_docs)), std::string(to_string(o.long_docs)));
  differs("pad", saved.pad, o.pad);
  packer_state s;
  s.step = b.get<std::uint64_t>("step");
  s.next_document = b.get<std::uint64_t>("next_document");
  s.stream_ended = b.get<std::uint8_t>("stream_ended") != 0;
  const auto n = b.get<std::uint64_t>("the buffer's piece count");
  if (n > static_cast<std::uint64_t>(o.lookahead))
    r.fail(fsdp::detail::cat("holds ", n, " pieces in a look-ahead buffer of ", o.lookahead));
  for (std::uint64_t i = 0; i < n; ++i) s.buffer.push_back(b.get_piece());
  if (b.get<std::uint8_t>("has_carry") != 0) s.carry = b.get_piece();
  if (b.left() != 0) r.fail(fsdp::detail::cat(b.left(), " bytes follow the state before its checksum"));
  return s;
}

FSDP_DECL std::string to_text(const packing_options& o, const packer_state& s) {
  static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const std::string b = to_bytes(o, s);
  std::string out;
  out.reserve((b.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < b.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, b.size() - i);
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? static_cast<unsigned char>(b[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k) out += k <= n ? digits[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

FSDP_DECL packer_state from_text(std::string_view text, const packing_options& o, std::string_view what) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  if (text.size() % 4 != 0)
    throw checkpoint_error(fsdp::detail::cat("packer state ", what, ": ", text.size(),
                                             " characters of base64, not a multiple of 4 (cut?)"));
  std::string b;
  b.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    std::uint32_t v = 0;
    int pad = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const bool tail = i + 4 == text.size() && k >= 2 && c == '=' && (k == 3 || text[i + 3] == '=');
      const int d = tail ? 0 : value(c);
      if (d < 0)
        throw checkpoint_error(fsdp::detail::cat("packer state ", what, ": character ", i + k, " is not base64"));
      pad += tail ? 1 : 0;
      v = v << 6 | static_cast<std::uint32_t>(d);
    }
    for (int k = 0; k < 3 - pad; ++k) b.push_back(static_cast<char>((v >> (16 - 8 * k)) & 0xff));
  }
  return from_bytes(b, o, what);
}

FSDP_DECL void save_state(const std::string& path, const packing_options& o, const packer_state& s) {
  const std::string bytes = to_bytes(o, s);
  const std::string partial = path + ".partial";
  {
    std::ofstream f(partial, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) throw checkpoint_error("could not write the packer state '" + partial + "'");
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) throw checkpoint_error("could not rename '" + partial + "' to '" + path + "': " + ec.message());
}

FSDP_DECL packer_state load_state(const std::string& path, const packing_options& o) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw checkpoint_error("could not open the packer state '" + path + "'");
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw checkpoint_error("could not read the packer state '" + path + "'");
  return from_bytes(raw, o, "'" + path + "'");
}

}  // namespace fsdp::data
