#pragma once
// Test helpers shared by the host tests.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fsdp/fsdp.hpp>

namespace fsdp_test {

/// Collective timeout for multi-rank tests: a broken collective fails the test within this bound, never hangs.
inline constexpr std::chrono::milliseconds timeout{10000};

template <class F>
void run_ranks(int world, F&& fn) {
  fsdp::comm::run_local(world, std::forward<F>(fn), {.timeout = timeout});
}

/// Three small units l0, l1, l2 (one parameter each, uneven sizes), wrapped with wrap::by_prefix{"l"}.
inline fsdp::ModelSpec three_units() {
  fsdp::ModelSpec s;
  s.add("l0.w", {8, 3}).add("l1.w", {5, 7}).add("l2.w", {16});
  return s;
}

/// Five units of uneven sizes (one smaller than the world at 7 ranks), a tie and a no-decay flag, wrapped with
/// wrap::by_prefix{"h."}: root (emb, head), h.0 (w, b), h.1, h.2, h.3.
inline fsdp::ModelSpec five_units() {
  fsdp::ModelSpec s;
  s.add("emb", {37, 5}).add("h.0.w", {9, 9}).add("h.0.b", {9}, {.flags = {.no_decay = true}, .init = fsdp::init::ones});
  s.add("h.1.w", {3}).add("h.2.w", {16, 17}).add("h.3.w", {2, 2}).tie("head", "emb");
  return s;
}

/// A fresh directory for one test case (under Bazel's TEST_TMPDIR, else /tmp), removed when the case ends.
struct scratch_dir {
  std::string root;
  explicit scratch_dir(const std::string& name) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root = std::string(tmp ? tmp : "/tmp") + "/" + name;
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
  }
  ~scratch_dir() { std::filesystem::remove_all(root); }
  std::string operator/(const std::string& name) const { return root + "/" + name; }
};

/// A file's bytes, and a file made of `bytes` (replacing any file of that name).
inline std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Runs `fn`, expects it to throw E, and returns the message (so tests can check what it names).
template <class E = std::exception, class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (...) {
    FAIL("an exception of another type than expected was thrown");
  }
  FAIL("no exception thrown");
  return {};
}

/// The world rank of every member of group `c` (this rank is `world_rank` of the world), in the group's rank order:
/// an all-gather on `be`'s compute stream.
template <class Comm, class Backend>
std::vector<int> members(Comm& c, int world_rank, Backend& be) {
  std::vector<float> all(static_cast<std::size_t>(c.size()));
  const float mine = static_cast<float>(world_rank);
  c.all_gather(&mine, all.data(), 1, fsdp::dtype::f32, be.compute_stream());
  return {all.begin(), all.end()};
}

/// The largest error of `got` against `want` (parameters by name, the same names and sizes), each element's against
/// its tensor's largest value: the trained values near zero are differences of the initial values and the updates,
/// and their own relative error says nothing about the training.
inline float worst_error(const std::map<std::string, std::vector<float>>& got,
                         const std::map<std::string, std::vector<float>>& want) {
  float worst = 0;
  for (const auto& [name, w] : want) {
    const std::vector<float>& g = got.at(name);
    REQUIRE(g.size() == w.size());
    float scale = 0;
    for (float v : w) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(g[i] - w[i]) / scale);
  }
  return worst;
}

/// Global parameters from each tensor rank's local ones (`local[t]`), as the spec places them.
inline std::map<std::string, std::vector<float>> assemble(
    const std::vector<std::map<std::string, std::vector<float>>>& local, const fsdp::ModelSpec& spec) {
  const int tensor = static_cast<int>(local.size());
  std::map<std::string, std::vector<float>> out;
  for (const fsdp::ParamSpec& p : spec.params()) {
    std::vector<float>& g = out[p.name];
    g.assign(static_cast<std::size_t>(p.numel()), 0.0f);
    fsdp::problems none;
    const std::vector<std::int64_t> shape = fsdp::local_shape(p.name, p.shape, p.tensor, tensor, none);
    for (int t = 0; t < tensor; ++t) {
      const std::vector<float>& l = local[static_cast<std::size_t>(t)].at(p.name);
      fsdp::for_each_global_run(shape, p.tensor, {tensor, t}, 0, static_cast<std::int64_t>(l.size()),
                                [&](std::int64_t global, std::int64_t offset, std::int64_t n) {
                                  std::copy_n(l.begin() + offset, n, g.begin() + global);
                                });
    }
  }
  return out;
}

/// One rank's master shard and optimizer state buffers, per unit (unit 0's master, its states, unit 1's ...), read
/// back after the model's streams have finished.
template <class M, class O>
std::vector<std::vector<float>> local_state(M& m, const O& opt) {
  std::vector<std::vector<float>> out;
  auto& be = m.backend();
  m.synchronize();
  for (std::size_t u = 0; u < m.size(); ++u) {
    const std::int64_t n = m.unit(u).layout().shard_numel();
    for (int k = -1; k < opt.states_per_element(); ++k) {
      std::vector<float> v(static_cast<std::size_t>(n));
      be.download(v.data(), k < 0 ? m.unit(u).master_shard() : opt.state(u, k), n * 4, be.compute_stream());
      be.synchronize(be.compute_stream());
      out.push_back(std::move(v));
    }
  }
  return out;
}

/// Whether two local_state()s hold the same bits.
inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  return true;
}

}  // namespace fsdp_test
