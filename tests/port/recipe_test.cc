// The porting recipe (docs/porting.md), compiled and run. Every ```cpp block of the recipe is a region of this file,
// verbatim (between "// recipe:" and "// end of recipe block"), one region each, and the regions run here on
// a small trainer of the recipe's kind: a tied-embedding model whose per-layer weights are stacked [L, ...] buffers,
// a strategy chosen by name, its weights handed in from those buffers, the root's gradient written first in
// backward. The first case holds the recipe's text to this file, so a snippet edited in one place and not the other
// fails here.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/programs.hpp"
#include "tests/support/support.hpp"

namespace {

/// The ```cpp blocks of a Markdown text, in order.
std::vector<std::string> doc_blocks(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (!inside && line == "```cpp") {
      inside = true;
      out.emplace_back();
    } else if (inside && line == "```") {
      inside = false;
    } else if (inside) {
      out.back() += line + "\n";
    }
  }
  return out;
}

/// The regions of this file's text between a line "// recipe: ..." and a line "// end of recipe block" (each line
/// without the region's indentation, that of its opening line).
std::vector<std::string> source_regions(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::size_t indent = std::string::npos;
  for (std::string line; std::getline(in, line);) {
    const std::size_t first = line.find_first_not_of(' ');
    const std::string body = first == std::string::npos ? "" : line.substr(first);
    if (indent == std::string::npos && body.starts_with("// recipe:")) {
      indent = first;
      out.emplace_back();
    } else if (indent != std::string::npos && body == "// end of recipe block") {
      indent = std::string::npos;
    } else if (indent != std::string::npos) {
      out.back() += (line.size() > indent ? line.substr(indent) : std::string()) + "\n";
    }
  }
  return out;
}

// ---- the trainer's own code: its sizes, its stacked parameters, its kernels ------------------------------------
constexpr int V = 16, T = 8, C = 4, L = 3;

struct parameters {  // as a C trainer keeps them: one buffer per kind, layers stacked
  std::vector<float> wte = std::vector<float>(V * C), wpe = std::vector<float>(T * C);
  std::vector<float> ln1w = std::vector<float>(L * C), attn_w = std::vector<float>(L * 3 * C * C);
};
struct trainer_params {
  float *wte, *wpe, *ln1w, *attn_w;
};

int layer_of(const std::string& name) { return std::stoi(name.substr(2, name.find('.', 2) - 2)); }

/// A block's forward and backward, standing in for the trainer's kernels: they read the weights they are given.
float checksum(const float* w, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += w[i];
  return s;
}
void block_forward(const float* attn_w, float& x) { x += checksum(attn_w, 3 * C * C); }
void block_backward(const float* attn_w, float* d_attn_w, float& x) {
  for (int i = 0; i < 3 * C * C; ++i) d_attn_w[i] = x + attn_w[i];
}

using host = fsdp::backend::host;
using local = fsdp::comm::local_communicator;

}  // namespace

TEST_CASE("every block of the porting recipe is compiled here, verbatim and in order") {
  const std::string doc = fsdp_tests::file_bytes(fsdp_tests::program("FSDP_PORTING_MD", "docs/porting.md"));
  const std::string self =
      fsdp_tests::file_bytes(fsdp_tests::program("FSDP_RECIPE_SOURCE", "tests/port/recipe_test.cc"));
  const std::vector<std::string> blocks = doc_blocks(doc), regions = source_regions(self);
  CHECK(blocks.size() >= 6);
  CHECK(regions.size() == blocks.size());
  for (const std::string& block : blocks) {
    CAPTURE(block);
    CHECK(std::find(regions.begin(), regions.end(), block) != regions.end());
  }
}

TEST_CASE("the recipe runs: a tied-embedding model chosen by name, its stacked weights handed in, one step") {
  parameters storage;
  for (std::size_t i = 0; i < storage.wte.size(); ++i) storage.wte[i] = 0.01f * float(i);
  for (std::size_t i = 0; i < storage.attn_w.size(); ++i) storage.attn_w[i] = 0.001f * float(i % 97);
  trainer_params params{storage.wte.data(), storage.wpe.data(), storage.ln1w.data(), storage.attn_w.data()};
  fsdp_test::run_ranks(1, [&](local& comm) {
    // clang-format off
    // recipe: 1. describe the parameters
    fsdp::ModelSpec spec;
    spec.add("wte", {V, C}).add("wpe", {T, C});
    for (int l = 0; l < L; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      spec.add(p + "ln1.w", {C}, {.flags = {.no_decay = true}}).add(p + "attn.w", {3 * C, C}) /* ... */;
    }
    spec.tie("lm_head.w", "wte");   // the head is the embedding: one storage, gradients summed
    // end of recipe block
    const fsdp::wrap::by_prefix wrap{"h."};
    const std::string strategy = "full_shard";
    // recipe: 3. a model chosen at run time, kept in the trainer's struct
    using host = fsdp::backend::host;
    using local = fsdp::comm::local_communicator;
    struct trainer {
      std::unique_ptr<fsdp::basic_model<host, local, float>> model;
      std::optional<fsdp::optim::adamw<fsdp::model_core<host, local>>> opt;
    };
    trainer t;
    using model_ptr = std::unique_ptr<fsdp::basic_model<host, local, float>>;
    t.model = fsdp::select("--strategy", strategy, [&](auto s) -> model_ptr {
      return std::make_unique<fsdp::Model<fsdp::policy<typename decltype(s)::type>>>(comm, spec, wrap);
    }, fsdp::by_name<fsdp::sharding::full_shard, fsdp::sharding::shard_grad_op, fsdp::sharding::no_shard>());
    t.opt.emplace(*t.model, fsdp::optim::adamw_options{.lr = 3e-4f});
    // end of recipe block
    // recipe: 5. hand in your weights
    fsdp::weights::load(*t.model, [&](const std::string& name) -> fsdp::weights::tensor {
      if (name == "wte") return {params.wte, V * C};
      if (name == "wpe") return {params.wpe, T * C};
      const int l = layer_of(name);  // "h.3.attn.w" -> 3
      if (name.ends_with(".ln1.w")) return fsdp::weights::layer(params.ln1w, C, l);  // layer l of [L, C]
      if (name.ends_with(".attn.w")) return fsdp::weights::layer(params.attn_w, 3 * C * C, l);  // of [L, 3C, C]
      return {};  // refused on every rank, named
    });
    // end of recipe block
    auto& model = *t.model;
    float x = 0.0f;
    // recipe: 6. the loop
    for (auto& u : model.forward())
      if (u.name() != "root") block_forward(u.param(u.name() + ".attn.w").data(), x);
    for (auto& u : model.backward())
      if (u.name() != "root") {
        const std::string w = u.name() + ".attn.w";  // "h.0.attn.w"
        block_backward(u.param(w).data(), u.grad(w).data(), x);
      }
    // end of recipe block
    // clang-format on
    // the weights handed in are the ones the loop read: every block's checksum of its layer of the stacked buffer
    float expected = 0.0f;
    for (int l = 0; l < L; ++l) expected += checksum(params.attn_w + l * 3 * C * C, 3 * C * C);
    CHECK(x == expected);
    t.opt->step();
    t.opt->zero_grad();
    // clang-format off
    // recipe: 8. memory, measured against planned
    const std::vector<fsdp::rank_memory> rows = {fsdp::memory_row(model, *t.opt)};  // every rank's, with thread ranks
    std::puts(fsdp::memory_table(rows).c_str());
    // end of recipe block
    // clang-format on
    CHECK(fsdp::memory_table(rows).ends_with("\nevery rank within its plan\n"));
  });
}

TEST_CASE("the recipe's stacked layers: one declaration gives the spec, the weights handed in and the views") {
  parameters storage;
  for (std::size_t i = 0; i < storage.attn_w.size(); ++i) storage.attn_w[i] = 0.001f * float(i % 89);
  for (std::size_t i = 0; i < storage.ln1w.size(); ++i) storage.ln1w[i] = 1.0f + float(i);
  trainer_params params{storage.wte.data(), storage.wpe.data(), storage.ln1w.data(), storage.attn_w.data()};
  fsdp_test::run_ranks(2, [&](local& comm) {
    float x = 0.0f;
    // clang-format off
    // recipe: 6. layers stacked in [L, ...] buffers
    const fsdp::weights::stacked<trainer_params> layers{"h.", L, {
        {"ln1.w", &trainer_params::ln1w, {C}, {.flags = {.no_decay = true}}},
        {"attn.w", &trainer_params::attn_w, {3 * C, C}}}};
    fsdp::ModelSpec spec;
    spec.add("wte", {V, C}).add("wpe", {T, C});
    layers.add_to(spec);  // h.0.ln1.w, h.0.attn.w, h.1.ln1.w, ...
    spec.tie("lm_head.w", "wte");
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> model(comm, spec, fsdp::wrap::by_prefix{"h."});
    fsdp::weights::load(model, [&](const std::string& name) -> fsdp::weights::tensor {
      if (name == "wte") return {params.wte, V * C};
      if (name == "wpe") return {params.wpe, T * C};
      return layers.slice(params, name);  // layer l of the stacked buffer; {} for a name not the stack's
    });
    for (auto& u : model.forward())
      if (u.name() != "root") {
        const trainer_params lp = layers.params(u);  // lp.attn_w: where params.attn_w + l * 3 * C * C was
        block_forward(lp.attn_w, x);
      }
    for (auto& u : model.backward())
      if (u.name() != "root") {
        const trainer_params lp = layers.params(u), lg = layers.grads(u);
        block_backward(lp.attn_w, lg.attn_w, x);
      }
    // end of recipe block
    // clang-format on
    // the spec the declaration wrote, with the kind's flags: what the recipe's section 1 writes by hand
    std::vector<std::string> names;
    for (const auto& p : spec.params()) names.push_back(p.name + (p.flags.no_decay ? " no_decay" : ""));
    CHECK(names == std::vector<std::string>{"wte", "wpe", "h.0.ln1.w no_decay", "h.0.attn.w", "h.1.ln1.w no_decay",
                                            "h.1.attn.w", "h.2.ln1.w no_decay", "h.2.attn.w", "lm_head.w"});
    // the loop read every layer's slice of the stacked buffer, and wrote its gradients into the unit's buffers
    float expected = 0.0f;
    for (int l = 0; l < L; ++l) expected += checksum(params.attn_w + l * 3 * C * C, 3 * C * C);
    CHECK(x == expected);
    const auto full = fsdp::weights::gather_full_params(model);
    CHECK(full.at("h.2.ln1.w") == std::vector<float>(storage.ln1w.begin() + 2 * C, storage.ln1w.end()));
  });
}

TEST_CASE("the recipe's early gradient: the head's part of the root's gradient written first in backward") {
  fsdp_test::run_ranks(2, [&](local& comm) {
    fsdp::ModelSpec spec;
    spec.add("wte", {V, C});
    for (int l = 0; l < L; ++l) spec.add("h." + std::to_string(l) + ".attn.w", {3 * C, C});
    // clang-format off
    // recipe: 6. a gradient computed outside its unit's window
    fsdp::model_options o;
    o.early_grads = {"root"};
    o.grad_slots = 3;   // the root holds one gradient slot for the whole pass; 3 keeps a reduction overlapping
    // backward, first unit: head_backward(..., /*dwte=*/root.grad("wte").data(), ...);  accumulates into it
    // backward, root unit:  embedding_backward(..., /*dwte=*/root.grad("wte").data(), ...);  adds the rest
    // end of recipe block
    // clang-format on
    fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>> model(comm, spec, fsdp::wrap::by_prefix{"h."},
                                                                fsdp::init::normal{}, o);
    fsdp::optim::sgd opt(model, {.lr = 0.0f});
    for (auto& u : model.forward()) (void)u;
    auto& root = model.unit("root");
    for (auto& u : model.backward()) {
      if (u.name() == "h.2")
        for (float& g : root.grad("wte")) g = 1.0f;  // the head's part, first in backward
      if (u.name() == "root")
        for (float& g : root.grad("wte")) g += 2.0f;  // the embedding's
    }
    model.synchronize();
    for (const auto& v : root.shard_views())
      for (std::int64_t i = v.begin; i < v.end; ++i) CHECK(root.grad_shard()[v.shard_offset + (i - v.begin)] == 3.0f);
    opt.step();
    opt.zero_grad();
    model.synchronize();
    CHECK(model.memory().peak == fsdp::plan_memory(model, opt).peak);
  });
}
