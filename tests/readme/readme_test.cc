// README.md's example, compiled and run. The README's ```cpp block is the region of this file between "// readme:"
// and "// end of readme block", verbatim (without the region's indentation): the first case holds the two to each
// other, so an edit in one place and not the other fails here; the second runs the region on a model the README's
// calls fit: two bias-free linear layers y = W1 (W0 x) fitted to a fixed linear target by two thread ranks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/fsdp.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/programs.hpp"

namespace {

/// The first ```cpp block of a Markdown text.
std::string first_cpp_block(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (!inside && line == "```cpp") {
      inside = true;
    } else if (inside && line == "```") {
      return out;
    } else if (inside) {
      out += line + "\n";
    }
  }
  return out;
}

/// The region of this file's text between "// readme:" and "// end of readme block", each line without the
/// indentation of the opening line.
std::string readme_region(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  std::size_t indent = std::string::npos;
  for (std::string line; std::getline(in, line);) {
    const std::size_t first = line.find_first_not_of(' ');
    const std::string body = first == std::string::npos ? "" : line.substr(first);
    if (indent == std::string::npos && body == "// readme:") {
      indent = first;
    } else if (indent != std::string::npos && body == "// end of readme block") {
      return out;
    } else if (indent != std::string::npos) {
      out += (line.size() > indent ? line.substr(indent) : std::string()) + "\n";
    }
  }
  return out;
}

// The trainer's own code the README's calls stand for: a forward and a backward per layer, on this rank's batch;
// each step's loss kept by rank (what the second case checks).
constexpr int in = 8, hidden = 4, batch = 16;
std::vector<std::vector<float>> losses(2);
struct my_trainer {
  explicit my_trainer(int r) : rank(r) {}
  int rank = 0;
  std::vector<float> x = std::vector<float>(batch * in), h = std::vector<float>(batch * hidden),
                     y = std::vector<float>(batch), dy = std::vector<float>(batch),
                     dh = std::vector<float>(batch * hidden);
  float loss = 0;

  void next_batch(int step) {
    for (int i = 0; i < batch * in; ++i) x[i] = std::sin(0.37f * float((step * 2 + rank) * batch * in + i));
  }
  static float target(const float* xs) {
    float t = 0;
    for (int i = 0; i < in; ++i) t += (i % 2 ? 0.5f : -0.25f) * xs[i];
    return t;
  }
  void forward(std::size_t layer, const float* w) {
    const int n_in = layer == 0 ? in : hidden, n_out = layer == 0 ? hidden : 1;
    const float* a = layer == 0 ? x.data() : h.data();
    float* out = layer == 0 ? h.data() : y.data();
    for (int s = 0; s < batch; ++s)
      for (int j = 0; j < n_out; ++j) {
        float v = 0;
        for (int i = 0; i < n_in; ++i) v += w[j * n_in + i] * a[s * n_in + i];
        out[s * n_out + j] = v;
      }
    if (layer == 1) {
      loss = 0;
      for (int s = 0; s < batch; ++s) {
        const float e = y[s] - target(&x[s * in]);
        loss += e * e / batch;
        dy[s] = 2 * e / batch;
      }
      losses[static_cast<std::size_t>(rank)].push_back(loss);
    }
  }
  void backward(std::size_t layer, const float* w, float* g) {
    if (layer == 1) {
      for (int j = 0; j < hidden; ++j) {
        g[j] = 0;
        for (int s = 0; s < batch; ++s) g[j] += dy[s] * h[s * hidden + j];
      }
      for (int s = 0; s < batch; ++s)
        for (int j = 0; j < hidden; ++j) dh[s * hidden + j] = dy[s] * w[j];
      return;
    }
    for (int j = 0; j < hidden; ++j)
      for (int i = 0; i < in; ++i) {
        g[j * in + i] = 0;
        for (int s = 0; s < batch; ++s) g[j * in + i] += dh[s * hidden + j] * x[s * in + i];
      }
  }
};

}  // namespace

TEST_CASE("README.md's example is this file's region, verbatim") {
  // Bazel runs the test in its runfiles tree, where the files keep their workspace paths; CMake's CTest says where
  // they are (tests/CMakeLists.txt)
  const std::string readme = fsdp_tests::file_bytes(fsdp_tests::program("FSDP_README_MD", "README.md"));
  const std::string self =
      fsdp_tests::file_bytes(fsdp_tests::program("FSDP_README_SOURCE", "tests/readme/readme_test.cc"));
  const std::string block = first_cpp_block(readme), region = readme_region(self);
  REQUIRE(!region.empty());
  CHECK(block == region);
}

TEST_CASE("README.md's example trains: two thread ranks fit a two-layer model, the loss falls a hundredfold") {
  const int steps = 150;
  // readme:
  using Policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  fsdp::comm::run_local(2, [&](fsdp::comm::local_communicator& comm) {  // 2 ranks, as threads
    fsdp::ModelSpec spec;
    spec.add("layers.0.w", {4, 8}).add("layers.1.w", {1, 4});  // one FSDP unit per layer
    fsdp::Model<Policy> model(comm, spec, fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.3f, 7});
    fsdp::optim::adamw opt(model, {.lr = 0.05f});  // its state sharded like the parameters
    my_trainer t(comm.rank());                     // your kernels, your data
    for (int step = 0; step < steps; ++step) {
      t.next_batch(step);
      for (auto& unit : model.forward())  // each unit gathered just before you use it, released after
        t.forward(unit.index(), unit.param(unit.name() + ".w").data());
      for (auto& unit : model.backward())  // your gradients reduce-scattered into shards behind you
        t.backward(unit.index(), unit.param(unit.name() + ".w").data(), unit.grad(unit.name() + ".w").data());
      opt.step();  // each rank updates its shards only
      opt.zero_grad();
    }
  });
  // end of readme block
  for (const auto& l : losses) {
    REQUIRE(l.size() == std::size_t(steps));
    CHECK(l.back() < l.front() / 100);
  }
}
