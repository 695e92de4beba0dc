// original.cc ported to the library: the same model, kernels, AdamW arithmetic and data, trained on N thread ranks
// with fully sharded parameters, gradients and optimizer state. README.md walks the diff.
//
//   port [--ranks N] [--steps N] [--batch B] [--lr LR] [--dump FILE]
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include <fsdp/fsdp.hpp>

// ----------------------------------------------------------------------------
// the model: x0 = Win in; x_{l+1} = x_l + W2[l] relu(W1[l] x_l + b1[l]) + b2[l]; logits = Wout x_L

typedef struct {
  int D;  // input features
  int C;  // channels
  int H;  // hidden width of a block
  int L;  // blocks
  int K;  // classes
} Config;

#define NUM_PARAMETER_TENSORS 6
typedef struct {
  float* win;   // [C, D]
  float* w1;    // [L, H, C]
  float* b1;    // [L, H]
  float* w2;    // [L, C, H]
  float* b2;    // [L, C]
  float* wout;  // [K, C]
} ParameterTensors;

static void fill_in_parameter_sizes(size_t* sizes, Config c) {
  sizes[0] = (size_t)c.C * c.D;
  sizes[1] = (size_t)c.L * c.H * c.C;
  sizes[2] = (size_t)c.L * c.H;
  sizes[3] = (size_t)c.L * c.C * c.H;
  sizes[4] = (size_t)c.L * c.C;
  sizes[5] = (size_t)c.K * c.C;
}

static size_t num_parameters(const size_t* sizes) {
  size_t n = 0;
  for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) n += sizes[i];
  return n;
}

// one allocation for every tensor, the struct's pointers into it
static float* malloc_and_point_parameters(ParameterTensors* p, const size_t* sizes) {
  float* memory = (float*)calloc(num_parameters(sizes), sizeof(float));
  if (memory == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  float** ptrs[NUM_PARAMETER_TENSORS] = {&p->win, &p->w1, &p->b1, &p->w2, &p->b2, &p->wout};
  float* at = memory;
  for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
    *ptrs[i] = at;
    at += sizes[i];
  }
  return memory;
}

// one block's slices of the stacked tensors
typedef struct {
  float *w1, *b1, *w2, *b2;
} BlockParams;

static BlockParams block_params(const ParameterTensors* p, Config c, int l) {
  BlockParams b = {p->w1 + (size_t)l * c.H * c.C, p->b1 + (size_t)l * c.H, p->w2 + (size_t)l * c.C * c.H,
                   p->b2 + (size_t)l * c.C};
  return b;
}

// the stacked tensors as the library sees them, declared once: layer l of each is parameter "h.<l>.<kind>" of
// unit "h.<l>"
static fsdp::weights::stacked<ParameterTensors> blocks_of(Config c) {
  return {"h.",
          c.L,
          {{"w1", &ParameterTensors::w1, {c.H, c.C}},
           {"b1", &ParameterTensors::b1, {c.H}},
           {"w2", &ParameterTensors::w2, {c.C, c.H}},
           {"b2", &ParameterTensors::b2, {c.C}}}};
}

static fsdp::ModelSpec make_spec(Config c) {
  fsdp::ModelSpec spec;
  spec.add("win", {c.C, c.D});
  blocks_of(c).add_to(spec);
  spec.add("wout", {c.K, c.C});
  return spec;
}

// where parameter `name` lives: a stacked tensor's layer, or win or wout
static fsdp::weights::target slice_of(const ParameterTensors* p, Config c, const std::string& name) {
  if (name == "win") return {p->win, (int64_t)c.C * c.D};
  if (name == "wout") return {p->wout, (int64_t)c.K * c.C};
  return blocks_of(c).slice(*p, name);
}

// ----------------------------------------------------------------------------
// random numbers (xorshift*), weights and data

static uint32_t random_u32(uint64_t* state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float random_f32(uint64_t* state) { return (float)(random_u32(state) >> 8) / 16777216.0f; }

static void init_parameters(ParameterTensors* p, Config c, uint64_t seed) {
  uint64_t state = seed;
  const float win_scale = 1.0f / sqrtf((float)c.D), c_scale = 1.0f / sqrtf((float)c.C),
              h_scale = 1.0f / sqrtf((float)c.H);
  for (size_t i = 0; i < (size_t)c.C * c.D; i++) p->win[i] = (2.0f * random_f32(&state) - 1.0f) * win_scale;
  for (size_t i = 0; i < (size_t)c.L * c.H * c.C; i++) p->w1[i] = (2.0f * random_f32(&state) - 1.0f) * c_scale;
  for (size_t i = 0; i < (size_t)c.L * c.C * c.H; i++) p->w2[i] = (2.0f * random_f32(&state) - 1.0f) * h_scale;
  for (size_t i = 0; i < (size_t)c.K * c.C; i++) p->wout[i] = (2.0f * random_f32(&state) - 1.0f) * c_scale;
  // biases start at zero (calloc)
}

// sample i: D features from its own seed, labelled by a fixed random linear teacher
static void next_batch(float* inputs, int* targets, const float* teacher, Config c, long first, int B) {
  for (int b = 0; b < B; b++) {
    uint64_t state = 0x9E3779B97F4A7C15ull ^ (uint64_t)(first + b + 1);
    float* x = inputs + (size_t)b * c.D;
    for (int d = 0; d < c.D; d++) x[d] = 2.0f * random_f32(&state) - 1.0f;
    int best = 0;
    float best_score = -INFINITY;
    for (int k = 0; k < c.K; k++) {
      float score = 0.0f;
      for (int d = 0; d < c.D; d++) score += teacher[k * c.D + d] * x[d];
      if (score > best_score) best_score = score, best = k;
    }
    targets[b] = best;
  }
}

// ----------------------------------------------------------------------------
// kernels

// out[B, OUT] = inp[B, IN] w[OUT, IN]^T (+ bias[OUT])
static void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int B, int IN, int OUT) {
  for (int b = 0; b < B; b++)
    for (int o = 0; o < OUT; o++) {
      float sum = bias != NULL ? bias[o] : 0.0f;
      for (int i = 0; i < IN; i++) sum += inp[b * IN + i] * w[o * IN + i];
      out[b * OUT + o] = sum;
    }
}

// accumulates: dinp += dout w, dw += dout^T inp, dbias += sum over b of dout (each skipped when NULL)
static void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                            int B, int IN, int OUT) {
  if (dinp != NULL)
    for (int b = 0; b < B; b++)
      for (int o = 0; o < OUT; o++)
        for (int i = 0; i < IN; i++) dinp[b * IN + i] += dout[b * OUT + o] * w[o * IN + i];
  for (int o = 0; o < OUT; o++)
    for (int b = 0; b < B; b++) {
      const float d = dout[b * OUT + o];
      for (int i = 0; i < IN; i++) dw[o * IN + i] += d * inp[b * IN + i];
      if (dbias != NULL) dbias[o] += d;
    }
}

static void relu_forward(float* out, const float* inp, int N) {
  for (int i = 0; i < N; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}
static void relu_backward(float* dinp, const float* inp, const float* dout, int N) {
  for (int i = 0; i < N; i++) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}
static void residual_forward(float* out, const float* a, const float* b, int N) {
  for (int i = 0; i < N; i++) out[i] = a[i] + b[i];
}

// probs = softmax(logits); returns the mean cross-entropy over the B rows
static float crossentropy_forward(float* probs, const float* logits, const int* targets, int B, int K) {
  double total = 0.0;
  for (int b = 0; b < B; b++) {
    const float* z = logits + b * K;
    float* p = probs + b * K;
    float maxv = z[0];
    for (int k = 1; k < K; k++) maxv = z[k] > maxv ? z[k] : maxv;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += (p[k] = expf(z[k] - maxv));
    for (int k = 0; k < K; k++) p[k] /= sum;
    total += -logf(p[targets[b]]);
  }
  return (float)(total / B);
}
// dlogits = (probs - onehot(targets)) / B
static void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int B, int K) {
  for (int b = 0; b < B; b++)
    for (int k = 0; k < K; k++) dlogits[b * K + k] = (probs[b * K + k] - (k == targets[b] ? 1.0f : 0.0f)) / B;
}

// ----------------------------------------------------------------------------
// activations, the blocks' forward and backward

typedef struct {
  float* x;        // [L + 1, B, C] block inputs, then x_L
  float* a;        // [L, B, H] W1 x + b1
  float* r;        // [L, B, H] relu(a)
  float* h;        // [B, C] scratch: W2 r + b2
  float* logits;   // [B, K]
  float* probs;    // [B, K]
  float* dx;       // [B, C] d loss / d x_l, then d loss / d x_{l-1}
  float* dnext;    // [B, C]
  float* dr;       // [B, H]
  float* da;       // [B, H]
  float* dlogits;  // [B, K]
} Activations;

static float* malloc_activations(Activations* acts, Config c, int B) {
  const size_t BC = (size_t)B * c.C, BH = (size_t)B * c.H, BK = (size_t)B * c.K;
  const size_t sizes[11] = {(c.L + 1) * BC, c.L * BH, c.L * BH, BC, BK, BK, BC, BC, BH, BH, BK};
  float** ptrs[11] = {&acts->x,  &acts->a,     &acts->r,  &acts->h,  &acts->logits, &acts->probs,
                      &acts->dx, &acts->dnext, &acts->dr, &acts->da, &acts->dlogits};
  size_t total = 0;
  for (int i = 0; i < 11; i++) total += sizes[i];
  float* memory = (float*)calloc(total, sizeof(float));
  if (memory == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (int i = 0; i < 11; i++) {
    *ptrs[i] = memory;
    memory += sizes[i];
  }
  return *ptrs[0];
}

static void block_forward(Activations* acts, BlockParams p, Config c, int l, int B) {
  const size_t BC = (size_t)B * c.C, BH = (size_t)B * c.H;
  const float* x = acts->x + l * BC;
  float* a = acts->a + l * BH;
  float* r = acts->r + l * BH;
  matmul_forward(a, x, p.w1, p.b1, B, c.C, c.H);
  relu_forward(r, a, (int)BH);
  matmul_forward(acts->h, r, p.w2, p.b2, B, c.H, c.C);
  residual_forward(acts->x + (l + 1) * BC, x, acts->h, (int)BC);
}

// takes acts->dx = d loss / d x_{l+1}, leaves d loss / d x_l there; adds block l's gradients into g
static void block_backward(Activations* acts, BlockParams p, BlockParams g, Config c, int l, int B) {
  const size_t BC = (size_t)B * c.C, BH = (size_t)B * c.H;
  memset(acts->dr, 0, BH * sizeof(float));
  matmul_backward(acts->dr, g.w2, g.b2, acts->dx, acts->r + l * BH, p.w2, B, c.H, c.C);
  memset(acts->da, 0, BH * sizeof(float));
  relu_backward(acts->da, acts->a + l * BH, acts->dr, (int)BH);
  memcpy(acts->dnext, acts->dx, BC * sizeof(float));  // the residual path
  matmul_backward(acts->dnext, g.w1, g.b1, acts->da, acts->x + l * BC, p.w1, B, c.C, c.H);
  float* t = acts->dx;
  acts->dx = acts->dnext;
  acts->dnext = t;
}

// ----------------------------------------------------------------------------
// the optimizer

// adamw_update's loop body as the library's per-element rule: the library keeps m and v (sharded, in the memory
// plan, in checkpoints) and runs the rule over this rank's shard of every parameter
struct adamw_update {
  static constexpr int states = 2;  // m, v
  float lr, beta1, beta2, eps, weight_decay, beta1_correction, beta2_correction;
  void operator()(float& param, float grad, float* s, bool) const {
    float* m = s;
    float* v = s + 1;
    const float mi = beta1 * *m + (1.0f - beta1) * grad;
    const float vi = beta2 * *v + (1.0f - beta2) * grad * grad;
    const float m_hat = mi / beta1_correction;
    const float v_hat = vi / beta2_correction;
    *m = mi;
    *v = vi;
    param -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * param);
  }
};
static adamw_update adamw_at(float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
  return {lr, beta1, beta2, eps, weight_decay, 1.0f - powf(beta1, (float)t), 1.0f - powf(beta2, (float)t)};
}

// ----------------------------------------------------------------------------
// training: `steps` steps of batch B from the weights in `params`, left there; on each rank, its B / ranks
// samples of every step

using Model = fsdp::Model<fsdp::policy<fsdp::sharding::full_shard>>;

static fsdp::rank_memory train(fsdp::comm::local_communicator& comm, ParameterTensors* params, Config c,
                               const float* teacher, int steps, int global_B, float lr) {
  const int rank = comm.rank(), B = global_B / comm.size();
  const fsdp::weights::stacked<ParameterTensors> blocks = blocks_of(c);
  // the FSDP units: one per block ("h.<l>"), one for the input projection ("win"), one for the head ("wout")
  Model model(comm, make_spec(c), fsdp::wrap::by_function{[&](const fsdp::ParamSpec& p) {
                const std::string unit = blocks.unit_of(p.name);
                return unit.empty() ? p.name : unit;
              }});
  fsdp::weights::load(model,
                      [&](const std::string& name) -> fsdp::weights::tensor { return slice_of(params, c, name); });
  fsdp::optim::elementwise opt(model, "adamw", {"m", "v"});
  Activations acts;
  float* acts_memory = malloc_activations(&acts, c, B);
  float* inputs = (float*)malloc((size_t)B * c.D * sizeof(float));
  int* targets = (int*)malloc((size_t)B * sizeof(int));
  for (int step = 0; step < steps; step++) {
    next_batch(inputs, targets, teacher, c, (long)step * global_B + (long)rank * B, B);
    const float* xL = acts.x + (size_t)c.L * B * c.C;
    float loss = 0.0f;

    // forward: the units in order (win, h.0 .. h.L-1, wout), each gathered just before and released after
    for (auto& unit : model.forward()) {
      if (unit.name() == "win") {
        matmul_forward(acts.x, inputs, unit.param("win").data(), NULL, B, c.D, c.C);
      } else if (unit.name() == "wout") {
        matmul_forward(acts.logits, xL, unit.param("wout").data(), NULL, B, c.C, c.K);
        loss = crossentropy_forward(acts.probs, acts.logits, targets, B, c.K);
      } else {
        const ParameterTensors lp = blocks.params(unit);  // the unit's layer alone: its layer 0
        block_forward(&acts, block_params(&lp, c, 0), c, blocks.layer_of(unit.name()), B);
      }
    }

    // backward: in reverse; each unit's gradient buffers start at zero and are reduce-scattered behind us
    for (auto& unit : model.backward()) {
      if (unit.name() == "wout") {
        crossentropy_backward(acts.dlogits, acts.probs, targets, B, c.K);
        memset(acts.dx, 0, (size_t)B * c.C * sizeof(float));
        matmul_backward(acts.dx, unit.grad("wout").data(), NULL, acts.dlogits, xL, unit.param("wout").data(), B, c.C,
                        c.K);
      } else if (unit.name() == "win") {
        matmul_backward(NULL, unit.grad("win").data(), NULL, acts.dx, inputs, unit.param("win").data(), B, c.D, c.C);
      } else {
        const ParameterTensors lp = blocks.params(unit), lg = blocks.grads(unit);
        block_backward(&acts, block_params(&lp, c, 0), block_params(&lg, c, 0), c, blocks.layer_of(unit.name()), B);
      }
    }

    // update: the rule for update t over this rank's shards
    opt.step([&](long t) { return adamw_at(lr, 0.9f, 0.999f, 1e-8f, 0.01f, (int)t); });
    opt.zero_grad();  // the gradient shards accumulate until zeroed (micro-batches)
    comm.all_reduce(&loss, &loss, 1, fsdp::dtype::f32, fsdp::reduce_op::avg, model.backend().compute_stream());
    if (rank == 0) printf("step %d: train loss %.9g\n", step, loss);
  }
  free(inputs);
  free(targets);
  free(acts_memory);
  const fsdp::rank_memory row = fsdp::memory_row(model, opt);
  // the trained weights back into the stacked tensors (rank 0's; the others skip every parameter)
  fsdp::weights::store(model, [&](const std::string& name) {
    return rank == 0 ? slice_of(params, c, name) : fsdp::weights::target{};
  });
  return row;
}

// ----------------------------------------------------------------------------

static void usage(const char* why) {
  fprintf(stderr, "%s\nusage: port [--ranks N] [--steps N] [--batch B] [--lr LR] [--dump FILE]\n", why);
  exit(1);
}

int main(int argc, char** argv) {
  Config c = {.D = 32, .C = 64, .H = 128, .L = 4, .K = 10};
  int steps = 40, B = 32, ranks = 1;
  float lr = 3e-3f;
  const char* dump = NULL;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage("missing value");
    if (strcmp(argv[i], "--ranks") == 0) ranks = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--batch") == 0) B = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--lr") == 0) lr = (float)atof(argv[i + 1]);
    else if (strcmp(argv[i], "--dump") == 0) dump = argv[i + 1];
    else usage("unknown option");
  }
  if (steps < 1 || B < 1 || ranks < 1) usage("ranks, steps and batch must be positive");
  if (B % ranks != 0) usage("the batch must split evenly over the ranks");

  size_t sizes[NUM_PARAMETER_TENSORS];
  fill_in_parameter_sizes(sizes, c);
  const size_t n = num_parameters(sizes);
  ParameterTensors params;
  float* params_memory = malloc_and_point_parameters(&params, sizes);
  init_parameters(&params, c, 1337);
  float* teacher = (float*)malloc((size_t)c.K * c.D * sizeof(float));
  uint64_t teacher_state = 42;
  for (int i = 0; i < c.K * c.D; i++) teacher[i] = 2.0f * random_f32(&teacher_state) - 1.0f;
  printf("%zu parameters, %d blocks, batch %d\n", n, c.L, B);

  // one thread per rank; a rank's error ends every rank and is rethrown here (never exit() inside a rank)
  std::vector<fsdp::rank_memory> memory(ranks);
  try {
    fsdp::comm::run_local(ranks, [&](fsdp::comm::local_communicator& comm) {
      memory[comm.rank()] = train(comm, &params, c, teacher, steps, B, lr);
    });
  } catch (const std::exception& e) {
    fprintf(stderr, "%s\n", e.what());
    exit(1);
  }
  printf("%s", fsdp::memory_table(memory).c_str());

  if (dump != NULL) {
    FILE* f = fopen(dump, "wb");
    if (f == NULL || fwrite(params_memory, sizeof(float), n, f) != n || fclose(f) != 0) {
      fprintf(stderr, "could not write %s\n", dump);
      exit(1);
    }
  }
  free(teacher);
  free(params_memory);
  return 0;
}
