// A small trainer written as single-process C trainers are: a residual MLP classifier whose weights live in one
// allocation, stacked per kind ([L, ...] for the blocks), its own kernels (plain loops), its own AdamW, a data
// loader, printf and exit. port.cc is this file ported to the library; README.md walks the diff.
//
//   original [--steps N] [--batch B] [--lr LR] [--dump FILE]
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, int t) {
  const float beta1_correction = 1.0f - powf(beta1, (float)t);
  const float beta2_correction = 1.0f - powf(beta2, (float)t);
  for (size_t i = 0; i < n; i++) {
    const float grad = grads[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * grad;
    const float vi = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    const float m_hat = mi / beta1_correction;
    const float v_hat = vi / beta2_correction;
    m[i] = mi;
    v[i] = vi;
    params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
  }
}

// ----------------------------------------------------------------------------
// training: `steps` steps of batch B from the weights in `params`, left there

static void train(ParameterTensors* params, const size_t* sizes, Config c, const float* teacher, int steps, int B,
                  float lr) {
  const size_t n = num_parameters(sizes);
  float* params_memory = params->win;
  ParameterTensors grads;
  float* grads_memory = malloc_and_point_parameters(&grads, sizes);
  float* m_memory = (float*)calloc(n, sizeof(float));
  float* v_memory = (float*)calloc(n, sizeof(float));
  Activations acts;
  float* acts_memory = malloc_activations(&acts, c, B);
  float* inputs = (float*)malloc((size_t)B * c.D * sizeof(float));
  int* targets = (int*)malloc((size_t)B * sizeof(int));
  for (int step = 0; step < steps; step++) {
    next_batch(inputs, targets, teacher, c, (long)step * B, B);
    const float* xL = acts.x + (size_t)c.L * B * c.C;

    // forward
    matmul_forward(acts.x, inputs, params->win, NULL, B, c.D, c.C);
    for (int l = 0; l < c.L; l++) block_forward(&acts, block_params(params, c, l), c, l, B);
    matmul_forward(acts.logits, xL, params->wout, NULL, B, c.C, c.K);
    const float loss = crossentropy_forward(acts.probs, acts.logits, targets, B, c.K);

    // backward
    memset(grads_memory, 0, n * sizeof(float));
    crossentropy_backward(acts.dlogits, acts.probs, targets, B, c.K);
    memset(acts.dx, 0, (size_t)B * c.C * sizeof(float));
    matmul_backward(acts.dx, grads.wout, NULL, acts.dlogits, xL, params->wout, B, c.C, c.K);
    for (int l = c.L - 1; l >= 0; l--)
      block_backward(&acts, block_params(params, c, l), block_params(&grads, c, l), c, l, B);
    matmul_backward(NULL, grads.win, NULL, acts.dx, inputs, params->win, B, c.D, c.C);

    // update
    adamw_update(params_memory, grads_memory, m_memory, v_memory, n, lr, 0.9f, 0.999f, 1e-8f, 0.01f, step + 1);
    printf("step %d: train loss %.9g\n", step, loss);
  }
  free(inputs);
  free(targets);
  free(acts_memory);
  free(grads_memory);
  free(m_memory);
  free(v_memory);
}

// ----------------------------------------------------------------------------

static void usage(const char* why) {
  fprintf(stderr, "%s\nusage: original [--steps N] [--batch B] [--lr LR] [--dump FILE]\n", why);
  exit(1);
}

int main(int argc, char** argv) {
  Config c = {.D = 32, .C = 64, .H = 128, .L = 4, .K = 10};
  int steps = 40, B = 32;
  float lr = 3e-3f;
  const char* dump = NULL;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage("missing value");
    if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--batch") == 0) B = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--lr") == 0) lr = (float)atof(argv[i + 1]);
    else if (strcmp(argv[i], "--dump") == 0) dump = argv[i + 1];
    else usage("unknown option");
  }
  if (steps < 1 || B < 1) usage("steps and batch must be positive");

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

  train(&params, sizes, c, teacher, steps, B, lr);

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
