#pragma once
// The manifest's definitions (fsdp/checkpoint/manifest.hpp): included by that header, or compiled once under
// FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp). Only the .ipp files include nlohmann-json (json_fields.hpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/checksum.hpp"
#include "fsdp/checkpoint/checksum.ipp"  // xxh3_stream
#include "fsdp/checkpoint/json_fields.hpp"
#include "fsdp/checkpoint/manifest.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp::checkpoint {

FSDP_DECL std::vector<std::string> kinds_with(const std::vector<std::string>& states) {
  std::vector<std::string> k{std::string(param_kind)};
  k.insert(k.end(), states.begin(), states.end());
  return k;
}

FSDP_DECL std::vector<std::string> manifest::kinds() const {
  return kinds_with(optimizer ? optimizer->states : std::vector<std::string>{});
}
FSDP_DECL const tensor_record* manifest::tensor(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace detail {
inline constexpr std::string_view checksum_member = "\"manifest_xxh3\"";

/// Where the 16 digits of the checksum member's value start in `text` (its last occurrence), or what is wrong.
FSDP_DECL std::size_t checksum_digits(std::string_view text, std::string* problem) {
  const std::size_t key = text.rfind(checksum_member);
  if (key == std::string_view::npos) {
    *problem = "has no checksum of its own (no member \"manifest_xxh3\"): it was cut or damaged, or written by a "
               "version of this library that did not checksum its manifests (manifest version 1), which this one "
               "does not read";
    return std::string_view::npos;
  }
  std::size_t at = key + checksum_member.size();
  const auto space = [&] {
    while (at < text.size() && (text[at] == ' ' || text[at] == '\n' || text[at] == '\r' || text[at] == '\t')) ++at;
  };
  space();
  if (at < text.size() && text[at] == ':') ++at;
  else at = std::string_view::npos;
  if (at != std::string_view::npos) {
    space();
    if (at < text.size() && text[at] == '"' && at + 18 <= text.size() && text[at + 17] == '"') return at + 1;
  }
  *problem = "has a checksum member \"manifest_xxh3\" whose value is not a string of 16 digits";
  return std::string_view::npos;
}

/// XXH3 of `text` with the 16 characters at `digits` read as '0's.
FSDP_DECL std::uint64_t checksum_with_zeros(std::string_view text, std::size_t digits) {
  xxh3_stream h;
  static constexpr char zeros[16] = {'0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0'};
  h.add(text.data(), digits);
  h.add(zeros, 16);
  h.add(text.data() + digits + 16, text.size() - digits - 16);
  return h.value();
}
}  // namespace detail

FSDP_DECL std::string seal_manifest(std::string text) {
  std::string problem;
  const std::size_t digits = detail::checksum_digits(text, &problem);
  if (digits == std::string_view::npos) fsdp::detail::fail_usage("checkpoint::seal_manifest: the text ", problem);
  const std::string hex = hex64(detail::checksum_with_zeros(text, digits));
  text.replace(digits, 16, hex);
  return text;
}

FSDP_DECL void verify_manifest_checksum(std::string_view text, const std::string& doc) {
  std::string problem;
  const std::size_t digits = detail::checksum_digits(text, &problem);
  if (digits == std::string_view::npos) throw checkpoint_error(fsdp::detail::cat(doc, " ", problem));
  const std::optional<std::uint64_t> recorded = parse_hex64(text.substr(digits, 16));
  if (!recorded)
    throw checkpoint_error(
        fsdp::detail::cat(doc, " has a checksum (\"manifest_xxh3\") that is not 16 lowercase hexadecimal digits"));
  const std::uint64_t actual = detail::checksum_with_zeros(text, digits);
  if (actual != *recorded)
    throw checkpoint_error(fsdp::detail::cat(doc, " does not match its own checksum (xxh3 ", hex64(actual),
                                             ", recorded ", hex64(*recorded),
                                             "): it was changed or damaged after it was written"));
}

FSDP_DECL std::string to_json(const manifest& m) {
  using json = nlohmann::ordered_json;  // the fields in the order above
  json j;
  j["format"] = "fsdp-checkpoint";
  j["version"] = manifest_version;
  j["step"] = m.step;
  if (m.optimizer)
    j["optimizer"] = {{"name", m.optimizer->name}, {"steps", m.optimizer->steps}, {"states", m.optimizer->states}};
  else
    j["optimizer"] = nullptr;
  if (m.loss_scaler)
    j["loss_scaler"] = {{"scale", static_cast<double>(m.loss_scaler->scale)},
                        {"good_steps", m.loss_scaler->good_steps}};
  else
    j["loss_scaler"] = nullptr;
  j["metadata"] = json::object();
  for (const auto& [k, v] : m.metadata) j["metadata"][k] = v;
  j["world"] = m.world;
  j["mesh"] = {{"replicas", m.replicas}, {"shards", m.shards}, {"tensor", m.tensor_ranks}};
  j["strategy"] = m.strategy;
  j["compute_dtype"] = m.compute_dtype;
  j["tensors"] = json::array();
  for (const auto& t : m.tensors)
    j["tensors"].push_back(
        {{"name", t.name}, {"dtype", "F32"}, {"shape", t.shape}, {"placement", placement_name(t.placement)}});
  j["ties"] = json::object();
  for (const auto& [alias, target] : m.ties) j["ties"][alias] = target;
  j["files"] = json::array();
  for (const auto& f : m.files) {
    json pieces = json::array();
    for (const auto& p : f.pieces)
      pieces.push_back(
          {{"tensor", p.tensor}, {"kind", p.kind}, {"begin", p.begin}, {"end", p.end}, {"offset", p.offset}});
    json blocks = json::array();
    for (std::uint64_t b : f.blocks) blocks.push_back(hex64(b));
    j["files"].push_back({{"name", f.name},
                          {"rank", f.rank},
                          {"bytes", f.bytes},
                          {"xxh3", hex64(f.xxh3)},
                          {"block_bytes", f.block_bytes},
                          {"blocks", std::move(blocks)},
                          {"pieces", std::move(pieces)}});
  }
  j["manifest_xxh3"] = std::string(16, '0');  // last: sealed below
  return seal_manifest(j.dump(1) + "\n");
}

namespace detail {
/// How errors name a piece: "elements [0, 8) of 'emb' (exp_avg)".
FSDP_DECL std::string piece_text(const piece_record& p) {
  return fsdp::detail::cat("elements [", p.begin, ", ", p.end, ") of '", p.tensor, "' (", p.kind, ")");
}

/// A file name the manifest may name: one path component of printable characters, not "." or "..".
FSDP_DECL bool plain_file_name(std::string_view n) noexcept {
  if (n.empty() || n == "." || n == ".." || n.size() > 255) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return c != '/' && c != '\\' && static_cast<unsigned char>(c) >= 0x20; });
}
}  // namespace detail

FSDP_DECL manifest parse_manifest(std::string_view text, const std::string& doc) {
  namespace jf = json_fields;
  verify_manifest_checksum(text, doc);
  const jf::reader r{doc};
  const jf::json j = r.parse(text);
  r.object(j, "");
  if (r.string(r.member(j, "format", ""), "format") != "fsdp-checkpoint")
    r.fail("format", "must be \"fsdp-checkpoint\" (this is not a checkpoint manifest of this library)");
  if (const std::int64_t v = r.integer(r.member(j, "version", ""), "version"); v != manifest_version)
    r.fail("version", fsdp::detail::cat("is ", v, "; this library reads version ", manifest_version));
  manifest m;
  m.step = static_cast<std::uint64_t>(r.integer(r.member(j, "step", ""), "step"));

  if (const jf::json& o = r.member(j, "optimizer", ""); !o.is_null()) {
    optimizer_record rec;
    rec.name = r.string(r.member(o, "name", "optimizer"), "optimizer.name");
    rec.steps = r.integer(r.member(o, "steps", "optimizer"), "optimizer.steps");
    const jf::json& st = r.array(r.member(o, "states", "optimizer"), "optimizer.states");
    for (std::size_t i = 0; i < st.size(); ++i) {
      const std::string at = jf::at("optimizer.states", i);
      std::string s = r.string(st[i], at);
      if (s.empty() || s == param_kind)
        r.fail(at, fsdp::detail::cat("must be a name other than \"\" and \"", param_kind, "\""));
      if (std::find(rec.states.begin(), rec.states.end(), s) != rec.states.end()) r.fail(at, "repeats a state name");
      rec.states.push_back(std::move(s));
    }
    m.optimizer = std::move(rec);
  }
  if (const jf::json& s = r.member(j, "loss_scaler", ""); !s.is_null()) {
    const double scale = r.number(r.member(s, "scale", "loss_scaler"), "loss_scaler.scale");
    const float f = static_cast<float>(scale);
    if (!(scale > 0.0) || static_cast<double>(f) != scale || !(f < std::numeric_limits<float>::infinity()))
      r.fail("loss_scaler.scale", fsdp::detail::cat("must be a finite fp32 value > 0, got ", scale));
    m.loss_scaler = scaler_record{
        f, static_cast<int>(r.integer(r.member(s, "good_steps", "loss_scaler"), "loss_scaler.good_steps", 0, 1 << 30))};
  }
  const jf::json& meta = r.object(r.member(j, "metadata", ""), "metadata");
  for (auto it = meta.begin(); it != meta.end(); ++it)
    m.metadata[it.key()] = r.string(it.value(), jf::at("metadata", it.key()));

  m.world = static_cast<int>(r.integer(r.member(j, "world", ""), "world", 1, 1 << 24));
  const jf::json& mesh = r.member(j, "mesh", "");
  m.replicas = static_cast<int>(r.integer(r.member(mesh, "replicas", "mesh"), "mesh.replicas", 1, 1 << 24));
  m.shards = static_cast<int>(r.integer(r.member(mesh, "shards", "mesh"), "mesh.shards", 1, 1 << 24));
  if (const jf::json* t = r.optional_member(mesh, "tensor", "mesh"))  // absent before tensor parallelism: 1
    m.tensor_ranks = static_cast<int>(r.integer(*t, "mesh.tensor", 1, 1 << 24));
  if (static_cast<std::int64_t>(m.replicas) * m.shards * m.tensor_ranks != m.world)
    r.fail("mesh", fsdp::detail::cat("is ", m.replicas, " x ", m.shards, " x ", m.tensor_ranks,
                                     ", which is not the world of ", m.world));
  m.strategy = r.string(r.member(j, "strategy", ""), "strategy");
  m.compute_dtype = r.string(r.member(j, "compute_dtype", ""), "compute_dtype");

  const jf::json& ts = r.array(r.member(j, "tensors", ""), "tensors");
  std::map<std::string, std::size_t, std::less<>> tensor_index;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::string at = jf::at("tensors", i);
    tensor_record t;
    t.name = r.string(r.member(ts[i], "name", at), jf::at(at, "name"));
    if (t.name.empty()) r.fail(jf::at(at, "name"), "must not be empty");
    if (r.string(r.member(ts[i], "dtype", at), jf::at(at, "dtype")) != "F32")
      r.fail(jf::at(at, "dtype"), "must be \"F32\" (checkpoints hold fp32 master values)");
    const jf::json& shape = r.array(r.member(ts[i], "shape", at), jf::at(at, "shape"));
    std::int64_t numel = 1;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const std::int64_t n = r.integer(shape[d], jf::at(jf::at(at, "shape"), d), 1, ModelSpec::max_numel);
      if (numel > ModelSpec::max_numel / n)
        r.fail(jf::at(at, "shape"), fsdp::detail::cat("has more than ", ModelSpec::max_numel, " elements"));
      numel *= n;
      t.shape.push_back(n);
    }
    if (const jf::json* pl = r.optional_member(ts[i], "placement", at)) {  // absent before: replicated
      const std::string text = r.string(*pl, jf::at(at, "placement"));
      const std::optional<tensor_placement> p = parse_placement(text);
      if (!p)
        r.fail(jf::at(at, "placement"),
               fsdp::detail::cat("is '", text, "', which is none of \"replicated\", \"partial_grad\", \"split(d)\""));
      if (p->is_split() && static_cast<std::size_t>(p->dim) >= t.shape.size())
        r.fail(jf::at(at, "placement"),
               fsdp::detail::cat("splits dimension ", p->dim, ", which the shape does not have"));
      t.placement = *p;
    }
    if (!tensor_index.emplace(t.name, i).second)
      r.fail(jf::at(at, "name"), fsdp::detail::cat("repeats tensor '", t.name, "'"));
    m.tensors.push_back(std::move(t));
  }
  const jf::json& ties = r.object(r.member(j, "ties", ""), "ties");
  for (auto it = ties.begin(); it != ties.end(); ++it) {
    const std::string at = jf::at("ties", it.key());
    std::string target = r.string(it.value(), at);
    if (!tensor_index.count(target)) r.fail(at, fsdp::detail::cat("names '", target, "', which is not a tensor"));
    if (tensor_index.count(it.key())) r.fail(at, "is an alias that is also a tensor");
    m.ties[it.key()] = std::move(target);
  }

  const std::vector<std::string> kinds = m.kinds();
  // Per (tensor, kind): the element ranges the pieces cover, checked for exact cover below.
  std::map<std::pair<std::size_t, std::size_t>, std::vector<std::pair<std::int64_t, std::int64_t>>> cover;
  std::set<std::string> file_names;
  const jf::json& fs = r.array(r.member(j, "files", ""), "files");
  for (std::size_t i = 0; i < fs.size(); ++i) {
    const std::string at = jf::at("files", i);
    file_record f;
    f.name = r.string(r.member(fs[i], "name", at), jf::at(at, "name"));
    if (!detail::plain_file_name(f.name) || fsdp::detail::utf8_error(f.name) != std::string_view::npos)
      r.fail(jf::at(at, "name"), "must be a plain file name in the checkpoint directory");
    if (f.name == "manifest.json" || !file_names.insert(f.name).second)
      r.fail(jf::at(at, "name"), fsdp::detail::cat("repeats the file name '", f.name, "'"));
    f.rank = static_cast<int>(r.integer(r.member(fs[i], "rank", at), jf::at(at, "rank"), 0, m.world - 1));
    f.bytes = static_cast<std::uint64_t>(r.integer(r.member(fs[i], "bytes", at), jf::at(at, "bytes")));
    const auto hash = [&](const jf::json& v, const std::string& where) {
      const std::optional<std::uint64_t> h = parse_hex64(r.string(v, where));
      if (!h) r.fail(where, "must be 16 lowercase hexadecimal digits");
      return *h;
    };
    f.xxh3 = hash(r.member(fs[i], "xxh3", at), jf::at(at, "xxh3"));
    f.block_bytes = static_cast<std::uint64_t>(
        r.integer(r.member(fs[i], "block_bytes", at), jf::at(at, "block_bytes"), 4096, std::int64_t{1} << 30));
    const jf::json& blocks = r.array(r.member(fs[i], "blocks", at), jf::at(at, "blocks"));
    const std::uint64_t expected_blocks = (f.bytes + f.block_bytes - 1) / f.block_bytes;
    if (blocks.size() != expected_blocks)
      r.fail(jf::at(at, "blocks"), fsdp::detail::cat("has ", blocks.size(), " checksums; a file of ", f.bytes,
                                                     " bytes in blocks of ", f.block_bytes, " has ", expected_blocks));
    for (std::size_t b = 0; b < blocks.size(); ++b)
      f.blocks.push_back(hash(blocks[b], jf::at(jf::at(at, "blocks"), b)));
    const jf::json& pieces = r.array(r.member(fs[i], "pieces", at), jf::at(at, "pieces"));
    struct span {
      std::uint64_t begin, end;
      std::size_t piece;
      bool operator<(const span& o) const { return begin < o.begin || (begin == o.begin && end < o.end); }
    };
    std::vector<span> spans;  // byte ranges in the file
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const std::string pat = jf::at(jf::at(at, "pieces"), k);
      piece_record p;
      p.tensor = r.string(r.member(pieces[k], "tensor", pat), jf::at(pat, "tensor"));
      const auto t = tensor_index.find(p.tensor);
      if (t == tensor_index.end())
        r.fail(jf::at(pat, "tensor"), fsdp::detail::cat("names '", p.tensor, "', which is not a tensor"));
      p.kind = r.string(r.member(pieces[k], "kind", pat), jf::at(pat, "kind"));
      const auto kind = std::find(kinds.begin(), kinds.end(), p.kind);
      if (kind == kinds.end())
        r.fail(jf::at(pat, "kind"),
               fsdp::detail::cat("is '", p.kind, "', which is neither \"param\" nor a state of the optimizer"));
      const std::int64_t numel = m.tensors[t->second].numel();
      p.begin = r.integer(r.member(pieces[k], "begin", pat), jf::at(pat, "begin"), 0, numel - 1);
      p.end = r.integer(r.member(pieces[k], "end", pat), jf::at(pat, "end"), p.begin + 1, numel);
      p.offset = static_cast<std::uint64_t>(r.integer(r.member(pieces[k], "offset", pat), jf::at(pat, "offset")));
      if (p.offset > f.bytes || p.bytes() > f.bytes - p.offset)
        r.fail(pat, fsdp::detail::cat("(", detail::piece_text(p), ") ends at byte ", p.offset + p.bytes(),
                                      ", past the file's ", f.bytes, " bytes"));
      spans.push_back({p.offset, p.offset + p.bytes(), k});
      cover[{t->second, static_cast<std::size_t>(kind - kinds.begin())}].emplace_back(p.begin, p.end);
      f.pieces.push_back(std::move(p));
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t k = 1; k < spans.size(); ++k)
      if (spans[k].begin < spans[k - 1].end)
        r.fail(jf::at(at, "pieces"),
               fsdp::detail::cat("overlap in the file at byte ", spans[k].begin, ": ",
                                 detail::piece_text(f.pieces[spans[k - 1].piece]), " and ",
                                 detail::piece_text(f.pieces[spans[k].piece])));
    m.files.push_back(std::move(f));
  }
  for (std::size_t t = 0; t < m.tensors.size(); ++t)
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      auto& ranges = cover[{t, k}];
      std::sort(ranges.begin(), ranges.end());
      std::int64_t next = 0;
      for (const auto& [b, e] : ranges) {
        if (b != next)
          r.fail("files",
                 fsdp::detail::cat(b < next ? "overlap on" : "leave out", " elements [", std::min(b, next), ", ",
                                   std::max(b, next), ") of tensor '", m.tensors[t].name, "' (", kinds[k], ")"));
        next = e;
      }
      if (next != m.tensors[t].numel())
        r.fail("files", fsdp::detail::cat("leave out elements [", next, ", ", m.tensors[t].numel(), ") of tensor '",
                                          m.tensors[t].name, "' (", kinds[k], ")"));
    }
  return m;
}

}  // namespace fsdp::checkpoint
