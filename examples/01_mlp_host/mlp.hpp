#pragma once
// A small MLP trainer written the way a user of the library writes one: the layer kernels and the training loop
// are the user's; the library gathers each layer's parameters just in time, reduces its gradients into shards
// and steps the optimizer on the local shards. Shared by main.cc and the parity tests.
//
// The layer code is generic in the weight type W, the precision policy's compute type: weights are read as W and
// widened to fp32, products accumulate in fp32, gradients are stored as W once per backward (as a bf16 GEMM with
// fp32 accumulation does). Activations stay fp32. With W = float every operation is the plain fp32 loop.
//
// With model.tensor_parallel = T the layers are Megatron's pairs: an even layer is column-parallel (its weight and
// bias split on the output dimension: each tensor rank computes its slice of the outputs), the odd layer after it
// row-parallel (its weight split on the input dimension: each tensor rank's partial product is all-reduced over
// the model's tensor_comm(), and its bias, replicated, added once); a last layer without a partner is replicated.
// The column-parallel layer's input gradient is all-reduced in backward. A tensor group reads one data-parallel
// rank's samples.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fsdp/fsdp.hpp>

namespace mlp {

struct config {
  std::vector<int> dims{16, 64, 64, 64, 8};  ///< input, hidden..., output: one FSDP unit per layer
  int global_batch = 48;
  int steps = 20;
  std::uint64_t seed = 1;
  std::string optimizer = "adamw";  ///< "adamw" or "sgd"
  float lr = 3e-3f;
  float momentum = 0.9f;        ///< sgd only
  float weight_decay = 0.01f;
  bool verbose = false;          ///< rank 0 prints a line per step
  /// Scheduling options (order, slots, per-unit resharding, recorder, ...). model.accumulation.micro_batches
  /// splits each rank's batch into that many micro-batches per optimizer step.
  fsdp::model_options model{};
  fsdp::grad::options grad{};    ///< clipping, non-finite checks, loss scaling
  /// fp16: the loss (so every gradient) is multiplied by this scaler's scale; grad.scaler should be the same one.
  const fsdp::grad::loss_scaler* loss_scale = nullptr;
  /// Called before each phase of each step ("forward", "backward", "optimizer", "loss": the loss's all-reduce) with
  /// the step: where a test makes a rank fail (tests/model/elastic_test.cc).
  std::function<void(int step, const char* phase)> before{};
};

struct result {
  std::vector<float> losses;                          ///< global mean loss per step
  std::vector<fsdp::grad::report> reports;            ///< what each optimizer step did with the gradients
  std::map<std::string, std::vector<float>> params;  ///< final full parameters
  fsdp::memory_stats memory;                         ///< this rank's accounting after training
  fsdp::memory_stats exported;                       ///< and after gather_full_params (its buffer comes and goes)
  fsdp::memory_figures planned;                      ///< the planner's peaks for this rank
  fsdp::memory_figures planned_between;              ///< what the planner says stays between steps
  fsdp::memory_stats host_memory;                    ///< the host domain's accounting (offloaded buffers)
  fsdp::memory_figures planned_host;                 ///< the planner's host peaks
  fsdp::plan::link_bytes planned_link;               ///< what the planner says a step moves over the host link
  double seconds = 0;
  /// Collectives of this rank's shard group and (hybrid sharding) replicate group, before gather_full_params.
  fsdp::collective_stats shard_group, replicate_group;
  fsdp::collective_stats tensor_group;  ///< the tensor group's (the trainer's all-reduces), with tensor_parallel > 1
};

inline std::string wname(std::size_t l) { return "layers." + std::to_string(l) + ".w"; }
inline std::string bname(std::size_t l) { return "layers." + std::to_string(l) + ".b"; }

/// Layer l's part under tensor parallelism (see the top): column-parallel, row-parallel, or replicated.
enum class tp_part { column, row, replicated };
inline tp_part tp_part_of(std::size_t l, std::size_t layers) {
  if (l % 2 == 1) return tp_part::row;
  return l + 1 < layers ? tp_part::column : tp_part::replicated;
}

/// layers.L.w [out, in] (normal 1/sqrt(in)), layers.L.b [out] (zeros, no weight decay), placed as tp_part_of says.
inline fsdp::ModelSpec make_spec(const config& c) {
  fsdp::ModelSpec spec;
  const std::size_t layers = c.dims.size() - 1;
  for (std::size_t l = 0; l < layers; ++l) {
    const float std = 1.0f / std::sqrt(static_cast<float>(c.dims[l]));
    const tp_part part = tp_part_of(l, layers);
    const fsdp::tensor_placement w = part == tp_part::column ? fsdp::tp::split(0)
                                     : part == tp_part::row  ? fsdp::tp::split(1)
                                                             : fsdp::tp::replicated;
    spec.add(wname(l), {c.dims[l + 1], c.dims[l]}, {.init = fsdp::init::normal{std, c.seed}, .tensor = w});
    spec.add(bname(l), {c.dims[l + 1]},
             {.flags = {.no_decay = true},
              .init = fsdp::init::zeros,
              .tensor = part == tp_part::column ? fsdp::tp::split(0) : fsdp::tp::replicated});
  }
  return spec;
}

// ---- synthetic data: every sample is a pure function of (seed, step, global sample index) -------------------
inline float hash_uniform(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  using fsdp::init::detail::mix;
  return static_cast<float>(2.0 * fsdp::init::detail::unit(mix(mix(mix(a) ^ b) ^ c)) - 1.0);
}
/// Inputs x[n, in] and targets t[n, out] for global samples [first, first + n) of `step`.
inline void make_batch(const config& c, int step, int first, int n, std::vector<float>& x, std::vector<float>& t) {
  const int in = c.dims.front(), out = c.dims.back();
  x.assign(static_cast<std::size_t>(n) * in, 0.0f);
  t.assign(static_cast<std::size_t>(n) * out, 0.0f);
  for (int s = 0; s < n; ++s) {
    const auto g = static_cast<std::uint64_t>(first + s);
    for (int f = 0; f < in; ++f) x[s * in + f] = hash_uniform(c.seed + 1000 + step, g, f);
    for (int j = 0; j < out; ++j) {  // teacher: t_j = sin(sum_f x_f * a_jf)
      float z = 0;
      for (int f = 0; f < in; ++f) z += x[s * in + f] * hash_uniform(c.seed + 7, j, f);
      t[s * out + j] = std::sin(z);
    }
  }
}

// ---- the user's layer kernels (host loops standing in for their CUDA kernels) --------------------------------
/// y[n, out] = x[n, in] W^T + b, then ReLU unless `last`.
template <class W>
void linear_forward(const float* x, const W* w, const W* b, float* y, int n, int in, int out, bool relu) {
  for (int s = 0; s < n; ++s)
    for (int o = 0; o < out; ++o) {
      float acc = float(b[o]);
      for (int i = 0; i < in; ++i) acc += x[s * in + i] * float(w[o * in + i]);
      y[s * out + o] = relu && acc < 0.0f ? 0.0f : acc;
    }
}
/// Given dy (already masked by the ReLU): dW += dy^T x, db += sum dy, dx = dy W. The weight gradients accumulate
/// in fp32 and are added into dw / db (W) once.
template <class W>
void linear_backward(const float* x, const W* w, const float* dy, W* dw, W* db, float* dx, int n, int in, int out) {
  std::vector<float> gw(static_cast<std::size_t>(out) * in, 0.0f), gb(static_cast<std::size_t>(out), 0.0f);
  for (int s = 0; s < n; ++s)
    for (int o = 0; o < out; ++o) {
      const float d = dy[s * out + o];
      gb[o] += d;
      for (int i = 0; i < in; ++i) gw[o * in + i] += d * x[s * in + i];
    }
  for (std::size_t k = 0; k < gw.size(); ++k) dw[k] = W(float(dw[k]) + gw[k]);
  for (std::size_t k = 0; k < gb.size(); ++k) db[k] = W(float(db[k]) + gb[k]);
  if (dx)
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < in; ++i) {
        float acc = 0;
        for (int o = 0; o < out; ++o) acc += dy[s * out + o] * float(w[o * in + i]);
        dx[s * in + i] = acc;
      }
}
/// Squared error over n samples divided by `denominator` (n * out for a mean over these samples; the rank's
/// whole batch for a micro-batch, so that micro-batch gradients add up to the batch's); writes dL/dy multiplied
/// by `loss_scale` (fp16 loss scaling) and returns the unscaled loss.
inline float mse(const float* y, const float* t, float* dy, int n, int out, int denominator, float loss_scale = 1.0f) {
  float loss = 0;
  const float mean = 1.0f / static_cast<float>(denominator), scale = loss_scale / static_cast<float>(denominator);
  for (int k = 0; k < n * out; ++k) {
    const float d = y[k] - t[k];
    loss += d * d;
    dy[k] = 2.0f * d * scale;
  }
  return loss * mean;
}
inline float mse(const float* y, const float* t, float* dy, int n, int out) { return mse(y, t, dy, n, out, n * out); }

/// Builds the optimizer named by c.optimizer for `model` and returns run(optimizer). Shared by the host and CUDA
/// examples.
template <class ModelT, class Run>
result with_optimizer(ModelT& model, const config& c, Run&& run) {
  if (c.optimizer == "adamw") {
    fsdp::optim::adamw opt(model, {.lr = c.lr, .weight_decay = c.weight_decay, .grad = c.grad});
    return run(opt);
  }
  if (c.optimizer == "sgd") {
    fsdp::optim::sgd opt(model, {.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay, .grad = c.grad});
    return run(opt);
  }
  throw fsdp::usage_error("unknown optimizer '" + c.optimizer + "' (adamw or sgd)");
}

/// Runs steps [first, first + count) of the training schedule on `model` with `opt` (the data of step s is a pure
/// function of (seed, s), so a run can stop after a checkpoint and go on from it), appending each step's loss and
/// report to `r`. All ranks call it together. Each step runs c.model.accumulation.micro_batches forward and backward
/// passes over consecutive parts of the rank's slice of the global batch.
template <class ModelT, class Opt>
void run_steps(ModelT& model, Opt& opt, const config& c, int first, int count, result& r) {
  using W = typename ModelT::compute_type;
  // the data-parallel ranks share the batch; a tensor group's ranks read the same samples
  const fsdp::device_mesh& mesh = model.mesh();
  const int world = mesh.data_parallel(), rank = mesh.data_parallel_rank(model.comm().rank());
  const int tensor = mesh.tensor, trank = mesh.tensor_rank(model.comm().rank());
  if (c.global_batch % world != 0)
    throw fsdp::usage_error("global batch " + std::to_string(c.global_batch) + " does not split over " +
                            std::to_string(world) + " data-parallel ranks");
  const int n = c.global_batch / world, k = c.model.accumulation.micro_batches;
  if (k < 1 || n % k != 0)
    throw fsdp::usage_error("a rank's batch of " + std::to_string(n) + " does not split into " + std::to_string(k) +
                            " micro-batches");
  const int m = n / k;
  const std::size_t layers = c.dims.size() - 1;
  std::vector<float> x, t;
  std::vector<std::vector<float>> act(layers + 1), dact(layers + 1);
  auto& cs = model.backend().compute_stream();
  const auto tensor_sum = [&](std::vector<float>& v) {  // a partial sum over the tensor group, on the compute stream
    model.tensor_comm()->all_reduce(v.data(), v.data(), static_cast<std::int64_t>(v.size()), fsdp::dtype::f32,
                                    fsdp::reduce_op::sum, cs);
  };
  const std::vector<W> no_bias(static_cast<std::size_t>(*std::max_element(c.dims.begin(), c.dims.end())), W(0.0f));
  // layer l's inputs and outputs on this rank: a column-parallel layer's outputs and a row-parallel one's inputs
  // are the tensor rank's slice
  const auto local_in = [&](std::size_t l) {
    return tensor > 1 && tp_part_of(l, layers) == tp_part::row ? c.dims[l] / tensor : c.dims[l];
  };
  const auto local_out = [&](std::size_t l) {
    return tensor > 1 && tp_part_of(l, layers) == tp_part::column ? c.dims[l + 1] / tensor : c.dims[l + 1];
  };
  for (int step = first; step < first + count; ++step) {
    const auto ts = std::chrono::steady_clock::now();
    float loss = 0;
    const auto phase = [&](const char* what) {
      if (c.before) c.before(step, what);
    };
    for (int mb = 0; mb < k; ++mb) {
      if (mb == 0) phase("forward");
      make_batch(c, step, rank * n + mb * m, m, x, t);
      act[0] = x;
      std::size_t l = 0;
      for (auto& unit : model.forward()) {
        const int in = local_in(l), out = local_out(l);
        act[l + 1].assign(static_cast<std::size_t>(m) * out, 0.0f);
        if (tensor > 1 && tp_part_of(l, layers) == tp_part::row) {  // partial products, the bias once, then the sum
          linear_forward<W>(act[l].data(), unit.param(wname(l)).data(),
                            trank == 0 ? unit.param(bname(l)).data() : no_bias.data(), act[l + 1].data(), m, in, out,
                            false);
          tensor_sum(act[l + 1]);
          if (l + 1 < layers)
            for (float& v : act[l + 1]) v = v < 0.0f ? 0.0f : v;
        } else {
          linear_forward<W>(act[l].data(), unit.param(wname(l)).data(), unit.param(bname(l)).data(), act[l + 1].data(),
                            m, in, out, l + 1 < layers);
        }
        ++l;
      }
      dact[layers].assign(act[layers].size(), 0.0f);
      loss += mse(act[layers].data(), t.data(), dact[layers].data(), m, c.dims.back(), n * c.dims.back(),
                  c.loss_scale ? c.loss_scale->scale() : 1.0f);
      if (mb == 0) phase("backward");
      for (auto& unit : model.backward()) {
        --l;
        const int in = local_in(l), out = local_out(l);
        if (l + 1 < layers)  // through the ReLU of this layer's output
          for (std::size_t q = 0; q < act[l + 1].size(); ++q)
            if (act[l + 1][q] <= 0.0f) dact[l + 1][q] = 0.0f;
        dact[l].assign(static_cast<std::size_t>(m) * in, 0.0f);
        linear_backward<W>(act[l].data(), unit.param(wname(l)).data(), dact[l + 1].data(), unit.grad(wname(l)).data(),
                           unit.grad(bname(l)).data(), l > 0 ? dact[l].data() : nullptr, m, in, out);
        if (l > 0 && tensor > 1 && tp_part_of(l, layers) == tp_part::column) tensor_sum(dact[l]);
      }
    }
    phase("optimizer");
    r.reports.push_back(opt.step());
    opt.zero_grad();
    phase("loss");
    // The printed loss is the global mean: the average of the ranks' local means (a tensor group's are equal).
    model.comm().all_reduce(&loss, &loss, 1, fsdp::dtype::f32, fsdp::reduce_op::avg, cs);
    r.losses.push_back(loss);
    if (c.verbose && model.comm().rank() == 0) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count();
      std::printf("step %3d  loss %.6f  time %.2f ms\n", step, loss, ms);
      std::fflush(stdout);
    }
  }
}

/// The model train() builds: one unit per layer (wrap::by_prefix{"layers."}).
template <class Policy>
fsdp::Model<Policy> make_model(typename Policy::communicator& comm, const config& c) {
  return fsdp::Model<Policy>(comm, make_spec(c), fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{}, c.model);
}

/// Trains `model` for c.steps steps (train() below). Written over fsdp::basic_model (what a Model<P> is to its
/// trainer's loop: its backend, communicator and compute dtype, without the rest of its policy), so that a program
/// of many policies compiles it once per compute dtype, not once per policy.
template <class B, class C, class T>
result train_model(fsdp::basic_model<B, C, T>& model, const config& c) {
  auto run = [&](auto& opt) {
    result r;
    const fsdp::memory_plan plan = fsdp::plan_memory(model, opt);
    r.planned = plan.peak;
    r.planned_between = plan.between_steps;
    r.planned_host = plan.host_peak;
    r.planned_link = plan.link;
    const auto t0 = std::chrono::steady_clock::now();
    run_steps(model, opt, c, 0, c.steps, r);
    model.synchronize();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.memory = model.memory();
    r.host_memory = model.host_memory();
    r.shard_group = model.shard_comm().stats();
    if (auto* rc = model.replicate_comm()) r.replicate_group = rc->stats();
    if (auto* tc = model.tensor_comm()) r.tensor_group = tc->stats();
    r.params = fsdp::weights::gather_full_params(model);
    r.exported = model.memory();
    return r;
  };
  return with_optimizer(model, c, run);
}

/// Trains on this rank's slice of every global batch for c.steps steps; all ranks call it together.
template <class Policy>
result train(typename Policy::communicator& comm, const config& c) {
  fsdp::Model<Policy> model(comm, make_spec(c), fsdp::wrap::by_prefix{"layers."}, fsdp::init::normal{}, c.model);
  return train_model(model, c);
}

}  // namespace mlp
