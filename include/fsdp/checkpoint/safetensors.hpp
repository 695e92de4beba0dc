#pragma once
// Weights in and out in the safetensors format, without gathering the model on any rank:
//
//   fsdp::safetensors::save(model, "model.safetensors");                  // collective: every parameter, fp32
//   fsdp::safetensors::load(model, "hf.safetensors", {.name_of = fn});     // collective: into the master shards
//
// save: every rank computes the same header; rank 0 creates "<file>.partial" with the header at its final size;
// the ranks of the first replica write their elements of every parameter in place (pwrite), converted to the
// chosen dtype (F32, BF16 or F16, rounded to nearest even); rank 0 renames the file into place once every rank has
// flushed. Tied aliases are not written (the file holds each storage once, as the package's own writer does).
//
// load: every rank reads the header, maps each parameter's name to a tensor of the file (options.name_of, the
// identity by default), checks that every parameter has its tensor with the same shape and a dtype it can hold
// exactly (F32, BF16, F16) and that the file holds no other tensor (unless options.allow_unused), then reads only
// the bytes of its own shards. Every failure is a checkpoint_error on every rank together, before any parameter
// changes; optimizer state and step counts are left alone (a fine-tuning start), gradients are zeroed.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/checkpoint/detail/shared.hpp"
#include "fsdp/checkpoint/io.hpp"
#include "fsdp/checkpoint/reads.hpp"
#include "fsdp/checkpoint/safetensors_header.hpp"
#include "fsdp/core/config.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/core/text.hpp"
#include "fsdp/model_access.hpp"

namespace fsdp::safetensors {

/// A parameter's name in the model -> its tensor's name in the file.
using name_map = std::function<std::string(std::string_view)>;

struct save_options {
  dtype type = dtype::f32;                        ///< of every tensor in the file: f32, bf16 or f16 (fp8, whose
                                                  ///< values need scales, is refused; a load reads it exactly)
  std::map<std::string, std::string> metadata{};  ///< the file's "__metadata__"
  name_map name_of{};                             ///< model name -> file name; the identity when empty
  bool overwrite = false;                         ///< replace an existing file (otherwise an error)
  checkpoint::fault_hook fault{};                 ///< tests: called before each file-system change
};

struct load_options {
  name_map name_of{};         ///< model name -> file name; the identity when empty
  bool allow_unused = false;  ///< tensors of the file that no parameter maps to are ignored instead of refused
};

/// Reads and checks the header of a safetensors file (no rank-collective). `data_start` receives the byte where
/// the data section begins.
FSDP_DECL header read_header(const checkpoint::io::file& f, std::uint64_t* data_start = nullptr);

namespace detail {

inline std::string mapped(const name_map& fn, const std::string& name) { return fn ? fn(name) : name; }

inline std::string_view st_dtype(dtype t) { return row_of(t).safetensors; }

/// The safetensors names of the library's dtypes, as a sentence lists them: "F32, BF16 and F16".
FSDP_DECL std::string st_dtypes_text();

/// The file's tensors, in spec order, with their offsets: every rank computes the same.
template <class M>
std::vector<tensor_info> layout_of(const M& m, const save_options& so) {
  std::vector<tensor_info> out;
  std::uint64_t at = 0;
  const std::uint64_t esize = size_of(so.type);
  std::map<std::string, std::string> taken;  // file name -> parameter
  for (const ParamSpec& p : m.spec().params()) {
    if (p.is_tied()) continue;
    tensor_info t;
    t.name = mapped(so.name_of, p.name);
    if (t.name.empty() || fsdp::detail::utf8_error(t.name) != std::string_view::npos || t.name == "__metadata__")
      fsdp::detail::fail_usage("safetensors::save: parameter '", p.name, "' maps to the name '",
                               fsdp::detail::printable(t.name),
                               "', which a safetensors file cannot hold (empty, not UTF-8, or \"__metadata__\")");
    if (const auto [it, fresh] = taken.emplace(t.name, p.name); !fresh)
      fsdp::detail::fail_usage("safetensors::save: parameters '", it->second, "' and '", p.name, "' both map to '",
                               t.name, "'");
    t.dtype = std::string(st_dtype(so.type));
    t.shape = checkpoint::detail::global_shape_of(m, p);  // the whole tensor, whatever the tensor and expert groups
    t.begin = at;
    at += static_cast<std::uint64_t>(t.numel()) * esize;
    t.end = at;
    out.push_back(std::move(t));
  }
  return out;
}

/// Converts `n` fp32 values into `type`'s bytes at `out` (rounded once).
FSDP_DECL void encode(const float* in, std::size_t n, dtype type, std::vector<char>& out);

/// fp32 values of `n` elements of the library's dtype `type` (exact).
FSDP_DECL void decode(const char* in, std::size_t n, dtype type, float* out);

}  // namespace detail

/// Collective: writes every parameter's value (the fp32 masters, converted to options.type) into the safetensors
/// file `path`, each rank writing its own elements.
template <class M>
void save(M& m, const std::string& path, const save_options& so = {}) {
  namespace ci = checkpoint::detail;
  namespace io = checkpoint::io;
  model_access::require_between_steps(m, "a safetensors save");
  if (path.empty()) fsdp::detail::fail_usage("safetensors::save: the path is empty");
  if (!is_dtype(so.type) || is_scaled(so.type))
    fsdp::detail::fail_usage("safetensors::save: save_options::type is ", name_of(so.type),
                       is_dtype(so.type) ? ", whose values need a scale beside them, which the file would not hold"
                                         : ", not a dtype",
                       "; save in f32, bf16 or f16");
  for (const auto& [k, v] : so.metadata)
    if (fsdp::detail::utf8_error(k) != std::string_view::npos || fsdp::detail::utf8_error(v) != std::string_view::npos)
      fsdp::detail::fail_usage("safetensors::save: metadata entry '", fsdp::detail::printable(k),
                               "' is not valid UTF-8");
  const std::vector<tensor_info> tensors = detail::layout_of(m, so);
  std::map<std::string, const tensor_info*, std::less<>> by_param;  // layout_of keeps the stored parameters' order
  {
    std::size_t i = 0;
    for (const ParamSpec& p : m.spec().params())
      if (!p.is_tied()) by_param[p.name] = &tensors[i++];
  }
  const std::string head = make_header(tensors, so.metadata);
  auto& comm = m.comm();
  const int rank = comm.rank();
  fingerprint fp;
  fp.add("safetensors::save", "path", path).add("safetensors::save", "dtype", std::string(name_of(so.type)));
  agree::require_agreement(comm, m.backend(), fp, "a safetensors save",
                           "Every rank must call safetensors::save with the same path and options");
  m.synchronize();
  const std::string partial = path + ".partial", what = fsdp::detail::cat("safetensors save to '", path, "' failed");
  const std::uint64_t total = head.size() + (tensors.empty() ? 0 : tensors.back().end);

  std::optional<std::string> mine;
  if (rank == 0)
    mine = agree::outcome([&] {
      if (!so.overwrite && io::exists(path))
        io::fail(fsdp::detail::cat("'", path, "' already exists; pass save_options::overwrite to replace it"));
      if (so.fault) so.fault({rank, "create", partial});
      io::file f = io::create(partial);
      if (so.fault) so.fault({rank, "write", partial});
      f.write_at(head.data(), head.size(), 0);
      f.resize(total);
      f.close();
    });
  ci::require_success_removing(m, mine, partial, what);

  mine.reset();
  if (ci::writes_file(m))
    mine = agree::outcome([&] {
      io::file f = io::open_write(partial);
      ci::host_reader<typename M::backend_type> reader(m.backend());
      std::vector<char> bytes;
      const std::uint64_t esize = size_of(so.type);
      for (std::size_t u = 0; u < m.size(); ++u) {
        const float* master = reader.read(model_access::master_shard(m.unit(u)), m.unit(u).layout().shard_numel());
        for (const ShardedTensor& v : m.unit(u).shard_views()) {
          if (v.empty() || !ci::writes_param(m, v.name)) continue;
          const tensor_info& t = *by_param.at(v.name);
          ci::global_runs(m, v, [&](std::int64_t global, std::int64_t at, std::int64_t count) {
            detail::encode(master + v.shard_offset + at, static_cast<std::size_t>(count), so.type, bytes);
            if (so.fault) so.fault({rank, "write", partial});
            f.write_at(bytes.data(), bytes.size(), head.size() + t.begin + static_cast<std::uint64_t>(global) * esize);
          });
        }
      }
      if (so.fault) so.fault({rank, "fsync", partial});
      f.sync();
      f.close();
    });
  if (const auto failed = agree::failures(comm, m.backend(), mine); !failed.empty())
    ci::fail_removing(m, failed, partial, what);
  mine.reset();
  if (rank == 0)
    mine = agree::outcome([&] { io::commit(partial, path, so.fault, rank); });
  ci::require_success_removing(m, mine, partial, what);
}

/// Collective: sets every parameter's master shard from the safetensors file `path` (see above).
template <class M>
header load(M& m, const std::string& path, const load_options& lo = {}) {
  namespace ci = checkpoint::detail;
  namespace io = checkpoint::io;
  model_access::require_between_steps(m, "a safetensors load");
  fingerprint fp;
  fp.add("safetensors::load", "path", path);
  agree::require_agreement(m.comm(), m.backend(), fp, "a safetensors load",
                           "Every rank must call safetensors::load with the same path");
  m.synchronize();
  header h;
  std::vector<std::vector<float>> staging(m.size());
  const std::optional<std::string> mine = agree::outcome([&] {
    const io::file f = io::open_read(path);
    std::uint64_t data_start = 0;
    h = read_header(f, &data_start);
    const std::string doc = fsdp::detail::cat("the safetensors file '", path, "'");
    // Every stored parameter has its tensor, of its shape, in a dtype an fp32 master holds exactly.
    std::map<std::string, const tensor_info*> of_param;
    std::map<std::string, std::string> used;  // file name -> parameter
    for (const ParamSpec& p : m.spec().params()) {
      if (p.is_tied()) continue;
      const std::vector<std::int64_t> shape = ci::global_shape_of(m, p);
      const std::string name = detail::mapped(lo.name_of, p.name);
      const tensor_info* t = h.find(name);
      const std::string which = name == p.name
                                    ? fsdp::detail::cat("tensor '", name, "'")
                                    : fsdp::detail::cat("tensor '", name, "' (for parameter '", p.name, "')");
      if (!t) io::fail(fsdp::detail::cat(doc, " has no ", which, " ", fsdp::detail::shape_text(shape)));
      if (t->shape != shape)
        io::fail(fsdp::detail::cat(doc, ": ", which, " is ", fsdp::detail::shape_text(t->shape), " in the file but ",
                                   fsdp::detail::shape_text(shape), " in the model"));
      if (!dtype_of_safetensors(t->dtype))
        io::fail(fsdp::detail::cat(doc, ": ", which, " is ", t->dtype,
                                   ", which an fp32 master parameter cannot hold exactly (", detail::st_dtypes_text(),
                                   " can)"));
      if (const auto [it, fresh] = used.emplace(name, p.name); !fresh)
        io::fail(fsdp::detail::cat(doc, ": parameters '", it->second, "' and '", p.name, "' both map to tensor '", name,
                                   "'"));
      of_param[p.name] = t;
    }
    if (!lo.allow_unused)
      for (const tensor_info& t : h.tensors)
        if (!used.count(t.name))
          io::fail(fsdp::detail::cat(doc, " holds tensor '", t.name, "' ", fsdp::detail::shape_text(t.shape),
                               ", which no parameter of the model maps to (load_options::allow_unused ignores it)"));
    // This rank's elements only: one read per piece, then the conversion to fp32.
    std::vector<std::vector<checkpoint::read_op>> ops(1);
    // per piece: its bytes as read (ops point into them; moving an element keeps its bytes where they are), the
    // tensor and where its fp32 values go
    std::vector<std::pair<std::vector<char>, std::pair<const tensor_info*, float*>>> raw;
    for (std::size_t u = 0; u < m.size(); ++u) {
      staging[u].assign(static_cast<std::size_t>(m.unit(u).layout().shard_numel()), 0.0f);
      for (const ShardedTensor& v : m.unit(u).shard_views()) {
        if (v.empty()) continue;
        const tensor_info* t = of_param.at(v.name);
        const std::uint64_t esize = dtype_bytes(t->dtype);
        raw.emplace_back(std::vector<char>(static_cast<std::size_t>(v.local_numel()) * esize),
                         std::make_pair(t, staging[u].data() + v.shard_offset));
        const checkpoint::extent whole{0, t->numel(), 0, data_start + t->begin};
        char* into = raw.back().first.data();
        ci::global_runs(m, v, [&](std::int64_t global, std::int64_t at, std::int64_t count) {
          checkpoint::plan_reads({whole}, global, global + count, esize, into + at * std::int64_t(esize), ops);
        });
      }
    }
    checkpoint::read_ranges(f, f.size(), std::move(ops[0]));
    for (const auto& [bytes, dest] : raw)
      detail::decode(bytes.data(), bytes.size() / dtype_bytes(dest.first->dtype),
                     *dtype_of_safetensors(dest.first->dtype), dest.second);
  });
  ci::require_success(m, mine,
                      fsdp::detail::cat("safetensors load from '", path, "' failed (no parameter was modified)"));
  model_access::replace_shards(m, "a safetensors load", [&] {
    auto& be = m.backend();
    for (std::size_t u = 0; u < m.size(); ++u)
      be.upload(model_access::master_shard(m.unit(u)), staging[u].data(),
                static_cast<std::int64_t>(staging[u].size() * sizeof(float)), be.compute_stream());
    be.synchronize(be.compute_stream());
  });
  return h;
}

}  // namespace fsdp::safetensors

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/checkpoint/safetensors.ipp"
#endif
