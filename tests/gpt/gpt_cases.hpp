#pragma once
// What the GPT tests share: a model small enough for 30 steps at four world sizes in seconds, and a run on thread
// ranks that returns every rank's result.
#include <vector>

#include "examples/04_gpt_host/gpt_host.hpp"

namespace gpt_tests {

using bf16_policy =
    fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
using fp32_policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full>;

/// 2 layers of width 32, context 16, vocabulary 32; 12 sequences split over 1, 2, 3 and 4 ranks; 30 steps.
inline gpt::config small() {
  gpt::config c;
  c.model = {.vocab = 32, .context = 16, .width = 32, .heads = 4, .layers = 2};
  c.global_batch = 12;
  c.steps = 30;
  c.opt.total = 30;
  c.opt.lr = 1e-2f;
  c.options.check_views = true;  // a view of the example used past its unit's release fails the test, named
  return c;
}

/// Every rank's result of gpt::train on `world` thread ranks.
template <class Policy>
std::vector<gpt::result> train(int world, const gpt::config& c) {
  std::vector<gpt::result> out(static_cast<std::size_t>(world));
  fsdp::comm::run_local(world, [&](fsdp::comm::local_communicator& comm) {
    out[static_cast<std::size_t>(comm.rank())] = gpt::train<Policy>(comm, c);
  });
  return out;
}

}  // namespace gpt_tests
