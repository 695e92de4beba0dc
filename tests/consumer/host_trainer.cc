// A user's host trainer built against the installed package: a two-layer linear model y = W1 (W0 x) fitted to a
// fixed linear target by two thread ranks under full_shard with AdamW. Exits 0 when the loss fell a hundredfold.
#include <fsdp/fsdp.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {
constexpr int in = 8, hidden = 4, batch = 16;  // per rank

float target(const float* x) {
  float t = 0;
  for (int i = 0; i < in; ++i) t += (i % 2 ? 0.5f : -0.25f) * x[i];
  return t;
}
}  // namespace

int main() {
  using Policy = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next>;
  std::vector<float> losses;
  fsdp::comm::run_local(2, [&](fsdp::comm::local_communicator& comm) {
    fsdp::ModelSpec spec;
    spec.add("layers.0.w", {hidden, in}).add("layers.1.w", {1, hidden});
    fsdp::Model<Policy> model(comm, spec, fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{0.3f, 7});
    fsdp::optim::adamw opt(model, {.lr = 0.05f});
    std::vector<float> x(batch * in), h(batch * hidden), y(batch), dy(batch), dh(batch * hidden);
    for (int step = 0; step < 150; ++step) {
      for (int s = 0; s < batch; ++s)  // this rank's samples of the step
        for (int i = 0; i < in; ++i)
          x[s * in + i] = std::sin(0.37f * float((step * 2 + comm.rank()) * batch * in + s * in + i));
      float loss = 0;
      for (auto& unit : model.forward()) {
        if (unit.index() == 0) {
          const float* w0 = unit.param("layers.0.w").data();
          for (int s = 0; s < batch; ++s)
            for (int j = 0; j < hidden; ++j) {
              float a = 0;
              for (int i = 0; i < in; ++i) a += w0[j * in + i] * x[s * in + i];
              h[s * hidden + j] = a;
            }
        } else {
          const float* w1 = unit.param("layers.1.w").data();
          for (int s = 0; s < batch; ++s) {
            float a = 0;
            for (int j = 0; j < hidden; ++j) a += w1[j] * h[s * hidden + j];
            y[s] = a;
            const float d = a - target(&x[s * in]);
            loss += d * d / float(batch);
            dy[s] = 2.0f * d / float(batch * comm.size());  // the gradient of the global mean
          }
        }
      }
      for (auto& unit : model.backward()) {
        if (unit.index() == 1) {
          const float* w1 = unit.param("layers.1.w").data();
          float* g1 = unit.grad("layers.1.w").data();
          for (int s = 0; s < batch; ++s)
            for (int j = 0; j < hidden; ++j) {
              g1[j] += dy[s] * h[s * hidden + j];
              dh[s * hidden + j] = dy[s] * w1[j];
            }
        } else {
          float* g0 = unit.grad("layers.0.w").data();
          for (int s = 0; s < batch; ++s)
            for (int j = 0; j < hidden; ++j)
              for (int i = 0; i < in; ++i) g0[j * in + i] += dh[s * hidden + j] * x[s * in + i];
        }
      }
      opt.step();
      opt.zero_grad();
      auto& cs = model.backend().compute_stream();
      model.comm().all_reduce(&loss, &loss, 1, fsdp::dtype::f32, fsdp::reduce_op::avg, cs);
      model.synchronize();
      if (comm.rank() == 0) losses.push_back(loss);
    }
  });
  std::printf("host_trainer: loss %.3g after 1 step, %.3g after %zu steps\n", losses.front(), losses.back(),
              losses.size());
  if (!(losses.back() < losses.front() / 100)) {
    std::printf("host_trainer: FAILED: the loss did not fall a hundredfold\n");
    return 1;
  }
  std::printf("host_trainer: OK\n");
  return 0;
}
