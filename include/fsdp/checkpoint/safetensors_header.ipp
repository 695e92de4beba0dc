#pragma once
// The safetensors header's definitions (fsdp/checkpoint/safetensors_header.hpp): included by that header, or
// compiled once under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/json_fields.hpp"
#include "fsdp/checkpoint/safetensors_header.hpp"
#include "fsdp/core/bytes.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp::safetensors {

FSDP_DECL const tensor_info* header::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

FSDP_DECL std::uint64_t dtype_bytes(std::string_view d) noexcept {
  static constexpr std::pair<std::string_view, std::uint64_t> known[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  for (const auto& [name, bytes] : known)
    if (name == d) return bytes;
  return 0;
}

FSDP_DECL std::uint64_t header_length(std::string_view first, std::uint64_t file_size, const std::string& doc) {
  if (file_size < 8 || first.size() < 8)
    throw checkpoint_error(fsdp::detail::cat(doc, " has ", file_size, " bytes: too short for a header"));
  const std::uint64_t n = fsdp::detail::get_u64le(first, 0);
  if (n > max_header_bytes || n > file_size - 8)
    throw checkpoint_error(fsdp::detail::cat(doc, ": its header length is ", n, " bytes, more than ",
                                       n > max_header_bytes
                                           ? fsdp::detail::cat("the limit of ", max_header_bytes)
                                           : fsdp::detail::cat("the ", file_size - 8, " bytes after the length")));
  return n;
}

FSDP_DECL header parse_header(std::string_view text, std::uint64_t data_bytes, const std::string& doc) {
  namespace jf = checkpoint::json_fields;
  const jf::reader r{doc, "tensor"};
  const jf::json j = r.parse(text);
  r.object(j, "");
  header h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const std::string at = fsdp::detail::cat("tensor '", name, "'");
    auto field = [&](std::string_view key) { return fsdp::detail::cat(at, ": ", key); };
    if (name == "__metadata__") {
      const jf::json& meta = r.object(it.value(), "__metadata__");
      for (auto m = meta.begin(); m != meta.end(); ++m)
        h.metadata[m.key()] = r.string(m.value(), jf::at("__metadata__", m.key()));
      continue;
    }
    tensor_info t;
    t.name = name;
    t.dtype = r.string(r.member(it.value(), "dtype", at), field("dtype"));
    const std::uint64_t esize = dtype_bytes(t.dtype);
    if (esize == 0) r.fail(field("dtype"), fsdp::detail::cat("is '", t.dtype, "', which is not a safetensors dtype"));
    const jf::json& shape = r.array(r.member(it.value(), "shape", at), field("shape"));
    std::int64_t numel = 1;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const std::int64_t n = r.integer(shape[d], jf::at(field("shape"), d), 0, ModelSpec::max_numel);
      if (n > 0 && numel > ModelSpec::max_numel / n)
        r.fail(field("shape"), fsdp::detail::cat("has more than ", ModelSpec::max_numel, " elements"));
      numel *= n;
      t.shape.push_back(n);
    }
    const jf::json& off = r.array(r.member(it.value(), "data_offsets", at), field("data_offsets"));
    if (off.size() != 2) r.fail(field("data_offsets"), "must hold two numbers, [begin, end]");
    t.begin = static_cast<std::uint64_t>(r.integer(off[0], field("data_offsets[0]")));
    t.end = static_cast<std::uint64_t>(r.integer(off[1], field("data_offsets[1]")));
    if (t.end < t.begin || t.end > data_bytes)
      r.fail(field("data_offsets"), fsdp::detail::cat("are [", t.begin, ", ", t.end, "], which is not a range of the ",
                                                data_bytes, " bytes of data"));
    if (t.end - t.begin != static_cast<std::uint64_t>(numel) * esize)
      r.fail(at, fsdp::detail::cat("holds ", t.end - t.begin, " bytes, but ", numel, " elements of ", t.dtype, " take ",
                             static_cast<std::uint64_t>(numel) * esize));
    h.tensors.push_back(std::move(t));
  }
  // The tensors tile the data section: no gap, no overlap, nothing after the last.
  std::vector<const tensor_info*> by_offset;
  for (const tensor_info& t : h.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const tensor_info* a, const tensor_info* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t next = 0;
  const tensor_info* before = nullptr;
  for (const tensor_info* t : by_offset) {
    const std::string at = fsdp::detail::cat("tensor '", t->name, "'");
    if (t->begin > next)
      r.fail(at, fsdp::detail::cat("begins at byte ", t->begin, " of the data, leaving bytes [", next, ", ", t->begin,
                             ") unused; a safetensors file's tensors tile its data exactly"));
    if (t->begin < next)
      r.fail(at, fsdp::detail::cat("begins at byte ", t->begin, " of the data, inside tensor '", before->name, "' [",
                             before->begin, ", ", before->end, ")"));
    next = t->end;
    before = t;
  }
  if (next != data_bytes)
    r.fail("", fsdp::detail::cat("ends its last tensor at byte ", next, " of its ", data_bytes,
                           " bytes of data; a safetensors file's tensors tile its data exactly"));
  return h;
}

FSDP_DECL std::string make_header(const std::vector<tensor_info>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    j["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) j["__metadata__"][k] = v;
  }
  for (const tensor_info& t : tensors)
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  std::string text = j.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string out;
  fsdp::detail::put_u64le(out, text.size());
  return out + text;
}

}  // namespace fsdp::safetensors
