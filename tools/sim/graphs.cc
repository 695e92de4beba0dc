// CUDA graphs for the simulated GPU: stream capture, instantiation and launch, which GPGPU-Sim's runtime lacks.
// tools/sim-check builds this file into a shared library and preloads it (LD_PRELOAD) into every program it runs on
// the simulator, so that a program which captures a step into a CUDA graph and launches it runs there as it would on
// a GPU: what a capturing stream is given is recorded instead of run, and each launch issues the recorded work again.
//
// What it models, after the CUDA runtime's documentation of stream capture:
//   - cudaStreamBeginCapture(s, mode) .. cudaStreamEndCapture(s, &graph): kernels (<<<>>> and cudaLaunchKernel),
//     cudaMemcpyAsync, cudaMemsetAsync and cudaLaunchHostFunc issued to a stream of the capture are recorded, with
//     each kernel's arguments copied (their sizes read from the program's PTX, which the simulator has extracted into
//     its run directory). An event recorded on a capturing stream marks a point of the capture; a stream that waits
//     on it joins the capture (a fork); every stream that joined must be joined back (the origin waits on an event
//     recorded on it after its last work) before the end, or the end fails with cudaErrorStreamCaptureUnjoined.
//   - Refused as the runtime refuses them, each invalidating the capture: a capturing stream waiting on an event
//     recorded outside the capture (cudaErrorStreamCaptureIsolation); cudaStreamSynchronize / cudaStreamQuery of a
//     capturing stream, and under the global and thread-local modes cudaMalloc, cudaFree, cudaMemcpy, cudaMemset and
//     cudaDeviceSynchronize from the capturing thread (cudaErrorStreamCaptureUnsupported). cudaEventQuery and
//     cudaEventSynchronize of an event last recorded in a capture: cudaErrorCapturedEvent.
//   - cudaGraphInstantiate(WithFlags), cudaGraphLaunch(exec, s): the recorded work issued on `s` in the order it was
//     captured. That order is one the graph's dependencies allow (work is captured after what it depends on), and the
//     simulator runs one operation at a time anyway; a launch is ordered after the earlier work of `s`, and the later
//     work of `s` after it, as on a GPU. cudaGraphGetNodes (the count), cudaStreamIsCapturing, the destroys.
// Not modelled: stream-ordered allocation inside a capture (cudaMallocAsync, cudaMallocFromPoolAsync and cudaFreeAsync
// on a capturing stream are refused with cudaErrorStreamCaptureUnsupported, where a GPU would add memory nodes),
// graphs built by hand, graph updates, child graphs, concurrent branches. Nothing here is part of the library.
#include <cuda_runtime_api.h>
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "next_symbol.hpp"

namespace {

using sim::next;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "sim graphs: %s\n", why.c_str());
  std::abort();
}

struct launch_config {
  dim3 grid, block;
  std::size_t shared = 0;
  cudaStream_t stream = nullptr;
};

// One captured operation.
struct op {
  enum kind_t { kernel, copy, set, host_function } kind;
  explicit op(kind_t k) : kind(k) {}
  const void* function = nullptr;                   // kernel: its host stub
  launch_config config;                             // kernel
  std::vector<std::vector<unsigned char>> args;     // kernel: each argument's bytes
  void* dst = nullptr;                              // copy, set
  const void* src = nullptr;                        // copy
  std::size_t bytes = 0;                            // copy, set
  cudaMemcpyKind copy_kind = cudaMemcpyDefault;     // copy
  int value = 0;                                    // set
  cudaHostFn_t host = nullptr;                      // host_function
  void* user = nullptr;                             // host_function
};

// What each stream of a capture has done (its count of operations, a join counting as one) and how far it has seen
// every stream's work (through the events it waited on): the end checks that the origin has seen all of it.
using horizon = std::map<cudaStream_t, long>;

struct capture {
  cudaStream_t origin;
  cudaStreamCaptureMode mode;
  std::thread::id thread;
  std::vector<op> ops;
  std::map<cudaStream_t, long> done;    // operations (and the join) per stream
  std::map<cudaStream_t, horizon> seen; // per stream: what it is ordered after
  cudaError_t invalid = cudaSuccess;    // the error that invalidated it
};

struct graph {
  std::vector<op> ops;
};

std::mutex mu;
std::map<cudaStream_t, std::shared_ptr<capture>> capturing;  // each stream of a capture under way
struct event_mark {
  std::weak_ptr<capture> in;  // the capture it was recorded in (expired once it ended)
  horizon at;                 // what the recording stream had seen
};
std::map<cudaEvent_t, event_mark> captured_events;  // events whose last record was in a capture
std::map<const void*, std::string> kernel_names;    // host stub -> mangled name (__cudaRegisterFunction)
std::map<std::string, std::vector<std::size_t>> param_sizes;  // from the PTX in the run directory
thread_local std::vector<launch_config> pushed;     // <<<>>>'s configurations, taken by the launch

// ---- kernel parameters, read from the PTX the simulator extracted into its run directory ---------------------------
std::size_t scalar_bytes(const std::string& type) {
  static const std::map<std::string, std::size_t> sizes = {
      {".u8", 1},  {".s8", 1},  {".b8", 1},  {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2},
      {".u32", 4}, {".s32", 4}, {".b32", 4}, {".f32", 4}, {".u64", 8}, {".s64", 8}, {".b64", 8},
      {".f64", 8}};
  auto it = sizes.find(type);
  return it == sizes.end() ? 0 : it->second;
}

void read_ptx(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  for (std::size_t at = text.find(".entry "); at != std::string::npos; at = text.find(".entry ", at + 1)) {
    const std::size_t open = text.find('(', at);
    const std::size_t close = text.find(')', open);
    if (open == std::string::npos || close == std::string::npos) break;
    std::string name = text.substr(at + 7, open - at - 7);
    name.erase(std::remove_if(name.begin(), name.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n'; }),
               name.end());
    std::vector<std::size_t> sizes;
    std::stringstream params(text.substr(open + 1, close - open - 1));
    std::string decl;
    while (std::getline(params, decl, ',')) {
      std::stringstream words(decl);
      std::string w, type, last;
      while (words >> w) {
        if (scalar_bytes(w) != 0) type = w;
        last = w;
      }
      if (type.empty()) continue;  // "()": no parameters
      std::size_t n = 1;
      if (const std::size_t b = last.find('['); b != std::string::npos) n = std::stoul(last.substr(b + 1));
      sizes.push_back(scalar_bytes(type) * n);
    }
    param_sizes[name] = sizes;
  }
}

const std::vector<std::size_t>& sizes_of(const void* function) {
  auto name = kernel_names.find(function);
  if (name == kernel_names.end()) die("a kernel launched under capture was never registered");
  auto it = param_sizes.find(name->second);
  if (it == param_sizes.end()) {  // read the run directory's PTX (the simulator extracts it before the first launch)
    if (DIR* d = opendir(".")) {
      while (dirent* e = readdir(d)) {
        const std::string f = e->d_name;
        if (f.size() > 4 && f.compare(f.size() - 4, 4, ".ptx") == 0) read_ptx(f);
      }
      closedir(d);
    }
    it = param_sizes.find(name->second);
    if (it == param_sizes.end()) die("no PTX in the run directory declares kernel " + name->second);
  }
  return it->second;
}

// ---- the capture's bookkeeping (callers hold mu) -------------------------------------------------------------------
std::shared_ptr<capture> capture_of(cudaStream_t s) {
  auto it = capturing.find(s);
  return it == capturing.end() ? nullptr : it->second;
}

void note_work(capture& c, cudaStream_t s) { c.seen[s][s] = ++c.done[s]; }

cudaError_t invalidate(capture& c, cudaError_t why) {
  if (c.invalid == cudaSuccess) c.invalid = why;
  return why;
}

// Records `o` when `s` is capturing: returns true and sets *rc (the capture's error once invalidated).
bool record(cudaStream_t s, op&& o, cudaError_t* rc) {
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<capture> c = capture_of(s);
  if (!c) return false;
  if (c->invalid != cudaSuccess) {
    *rc = cudaErrorStreamCaptureInvalidated;
    return true;
  }
  c->ops.push_back(std::move(o));
  note_work(*c, s);
  *rc = cudaSuccess;
  return true;
}

// An operation the capture mode forbids on the capturing thread (global: on any thread).
cudaError_t unsafe_call() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [s, c] : capturing) {
    if (c->mode == cudaStreamCaptureModeRelaxed) continue;
    if (c->mode == cudaStreamCaptureModeThreadLocal && c->thread != std::this_thread::get_id()) continue;
    return invalidate(*c, cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}

// ---- issuing (the simulator's own entry points) --------------------------------------------------------------------
using push_t = unsigned (*)(dim3, dim3, std::size_t, cudaStream_t);
using launch_t = cudaError_t (*)(const void*, dim3, dim3, void**, std::size_t, cudaStream_t);

cudaError_t issue_kernel(const void* function, const launch_config& cfg, void** args, const char* entry) {
  static const auto push = next<push_t>("__cudaPushCallConfiguration");
  const auto launch = next<launch_t>(entry);
  push(cfg.grid, cfg.block, cfg.shared, cfg.stream);
  return launch(function, cfg.grid, cfg.block, args, cfg.shared, cfg.stream);
}

cudaError_t launch(const void* function, const launch_config& cfg, void** args, const char* entry) {
  op o(op::kernel);
  o.function = function;
  o.config = cfg;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (capture_of(cfg.stream)) {
      const std::vector<std::size_t>& sizes = sizes_of(function);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const auto* p = static_cast<const unsigned char*>(args[i]);
        o.args.emplace_back(p, p + sizes[i]);
      }
    }
  }
  cudaError_t rc;
  if (record(cfg.stream, std::move(o), &rc)) return rc;
  return issue_kernel(function, cfg, args, entry);
}

cudaError_t replay(const op& o, cudaStream_t s) {
  switch (o.kind) {
    case op::kernel: {
      launch_config cfg = o.config;
      cfg.stream = s;
      std::vector<void*> args;
      for (const auto& a : o.args) args.push_back(const_cast<unsigned char*>(a.data()));
      return issue_kernel(o.function, cfg, args.data(), "__cudaLaunchKernel");
    }
    case op::copy: {
      static const auto copy =
          next<cudaError_t (*)(void*, const void*, std::size_t, cudaMemcpyKind, cudaStream_t)>("cudaMemcpyAsync");
      return copy(o.dst, o.src, o.bytes, o.copy_kind, s);
    }
    case op::set: {
      static const auto set = next<cudaError_t (*)(void*, int, std::size_t, cudaStream_t)>("cudaMemsetAsync");
      return set(o.dst, o.value, o.bytes, s);
    }
    case op::host_function: {
      static const auto host = next<cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*)>("cudaLaunchHostFunc");
      return host(s, o.host, o.user);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace

extern "C" {

// ---- registration and launches -------------------------------------------------------------------------------------
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function, const char* device_name,
                            int thread_limit, uint3* tid, uint3* bid, dim3* block, dim3* grid, int* warp_size) {
  static const auto real = next<void (*)(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*, dim3*,
                                         int*)>("__cudaRegisterFunction");
  {
    std::lock_guard<std::mutex> lock(mu);
    kernel_names[host_function] = device_function;
  }
  real(handle, host_function, device_function, device_name, thread_limit, tid, bid, block, grid, warp_size);
}

// <<<>>> pushes its configuration, then the stub launches: the push is held here and made at the launch (or never,
// when the launch is captured), since the simulator reads its configuration from the push.
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream) {
  pushed.push_back({grid, block, shared, stream});
  return 0;
}

cudaError_t __cudaLaunchKernel(const void* function, dim3, dim3, void** args, std::size_t, cudaStream_t) {
  if (pushed.empty()) die("a kernel launched without a pushed configuration");
  const launch_config cfg = pushed.back();
  pushed.pop_back();
  return launch(function, cfg, args, "__cudaLaunchKernel");
}

cudaError_t __cudaLaunchKernel_ptsz(const void* function, dim3, dim3, void** args, std::size_t, cudaStream_t) {
  if (pushed.empty()) die("a kernel launched without a pushed configuration");
  const launch_config cfg = pushed.back();
  pushed.pop_back();
  return launch(function, cfg, args, "__cudaLaunchKernel_ptsz");
}

cudaError_t cudaLaunchKernel(const void* function, dim3 grid, dim3 block, void** args, std::size_t shared,
                             cudaStream_t stream) {
  return launch(function, {grid, block, shared, stream}, args, "__cudaLaunchKernel");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  static const auto real =
      next<cudaError_t (*)(void*, const void*, std::size_t, cudaMemcpyKind, cudaStream_t)>("cudaMemcpyAsync");
  op o(op::copy);
  o.dst = dst;
  o.src = src;
  o.bytes = bytes;
  o.copy_kind = kind;
  cudaError_t rc;
  if (record(s, std::move(o), &rc)) return rc;
  return real(dst, src, bytes, kind, s);
}

cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(void*, int, std::size_t, cudaStream_t)>("cudaMemsetAsync");
  op o(op::set);
  o.dst = dst;
  o.value = value;
  o.bytes = bytes;
  cudaError_t rc;
  if (record(s, std::move(o), &rc)) return rc;
  return real(dst, value, bytes, s);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user) {
  static const auto real = next<cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*)>("cudaLaunchHostFunc");
  op o(op::host_function);
  o.host = fn;
  o.user = user;
  cudaError_t rc;
  if (record(s, std::move(o), &rc)) return rc;
  return real(s, fn, user);
}

// ---- events: a record in a capture marks a point of it; a wait on one forks the waiting stream into it ------------
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(cudaEvent_t, cudaStream_t)>("cudaEventRecord");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::shared_ptr<capture> c = capture_of(s)) {
      if (c->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
      captured_events[e] = {c, c->seen[s]};
      return cudaSuccess;
    }
    captured_events.erase(e);
  }
  return real(e, s);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  static const auto real = next<cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned)>("cudaStreamWaitEvent");
  {
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<capture> waiter = capture_of(s);
    auto mark = captured_events.find(e);
    std::shared_ptr<capture> recorded = mark == captured_events.end() ? nullptr : mark->second.in.lock();
    if (waiter) {
      if (waiter->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
      if (recorded != waiter) return invalidate(*waiter, cudaErrorStreamCaptureIsolation);
      for (auto& [stream, n] : mark->second.at) waiter->seen[s][stream] = std::max(waiter->seen[s][stream], n);
      return cudaSuccess;
    }
    if (recorded) {  // a fork: `s` joins the capture, ordered after the record
      if (recorded->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
      capturing[s] = recorded;
      recorded->seen[s] = mark->second.at;
      note_work(*recorded, s);  // the join: the origin must see past it
      return cudaSuccess;
    }
    if (mark != captured_events.end()) return cudaErrorCapturedEvent;  // recorded in a capture that has ended
  }
  return real(s, e, flags);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  static const auto real = next<cudaError_t (*)(cudaEvent_t)>("cudaEventQuery");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (captured_events.count(e)) return cudaErrorCapturedEvent;
  }
  return real(e);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  static const auto real = next<cudaError_t (*)(cudaEvent_t)>("cudaEventSynchronize");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (captured_events.count(e)) return cudaErrorCapturedEvent;
  }
  return real(e);
}

// ---- what a capturing stream, or a capturing thread, may not do -----------------------------------------------------
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(cudaStream_t)>("cudaStreamSynchronize");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::shared_ptr<capture> c = capture_of(s)) return invalidate(*c, cudaErrorStreamCaptureUnsupported);
  }
  return real(s);
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(cudaStream_t)>("cudaStreamQuery");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::shared_ptr<capture> c = capture_of(s)) return invalidate(*c, cudaErrorStreamCaptureUnsupported);
  }
  return real(s);
}

cudaError_t cudaDeviceSynchronize() {
  static const auto real = next<cudaError_t (*)()>("cudaDeviceSynchronize");
  if (cudaError_t rc = unsafe_call(); rc != cudaSuccess) return rc;
  return real();
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  static const auto real = next<cudaError_t (*)(void**, std::size_t)>("cudaMalloc");
  if (cudaError_t rc = unsafe_call(); rc != cudaSuccess) return rc;
  return real(p, bytes);
}

cudaError_t cudaFree(void* p) {
  static const auto real = next<cudaError_t (*)(void*)>("cudaFree");
  if (cudaError_t rc = unsafe_call(); rc != cudaSuccess) return rc;
  return real(p);
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  static const auto real = next<cudaError_t (*)(void*, const void*, std::size_t, cudaMemcpyKind)>("cudaMemcpy");
  if (cudaError_t rc = unsafe_call(); rc != cudaSuccess) return rc;
  return real(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  static const auto real = next<cudaError_t (*)(void*, int, std::size_t)>("cudaMemset");
  if (cudaError_t rc = unsafe_call(); rc != cudaSuccess) return rc;
  return real(dst, value, bytes);
}

// Stream-ordered allocation in a capture would be a graph's memory node on a GPU: not modelled, refused.
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(void**, std::size_t, cudaStream_t)>("cudaMallocAsync");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::shared_ptr<capture> c = capture_of(s)) return invalidate(*c, cudaErrorStreamCaptureUnsupported);
  }
  return real(p, bytes, s);
}

cudaError_t cudaMallocFromPoolAsync(void** p, std::size_t bytes, cudaMemPool_t pool, cudaStream_t s) {
  static const auto real =
      next<cudaError_t (*)(void**, std::size_t, cudaMemPool_t, cudaStream_t)>("cudaMallocFromPoolAsync");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::shared_ptr<capture> c = capture_of(s)) return invalidate(*c, cudaErrorStreamCaptureUnsupported);
  }
  return real(p, bytes, pool, s);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(void*, cudaStream_t)>("cudaFreeAsync");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (std::shared_ptr<capture> c = capture_of(s)) return invalidate(*c, cudaErrorStreamCaptureUnsupported);
  }
  return real(p, s);
}

// ---- capture, instantiation, launch ---------------------------------------------------------------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return cudaErrorStreamCaptureUnsupported;
  std::lock_guard<std::mutex> lock(mu);
  if (capturing.count(s)) return cudaErrorIllegalState;
  auto c = std::make_shared<capture>();
  c->origin = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->seen[s] = {};
  c->done[s] = 0;
  capturing[s] = c;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* out) {
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<capture> c = capture_of(s);
  if (!c) return cudaErrorIllegalState;
  if (c->origin != s) return invalidate(*c, cudaErrorStreamCaptureUnmatched);
  cudaError_t rc = c->invalid;
  if (rc == cudaSuccess)
    for (auto& [stream, n] : c->done)
      if (stream != s && c->seen[s][stream] < n) rc = cudaErrorStreamCaptureUnjoined;
  for (auto it = capturing.begin(); it != capturing.end();)
    it = it->second == c ? capturing.erase(it) : std::next(it);
  *out = nullptr;
  if (rc == cudaSuccess) *out = reinterpret_cast<cudaGraph_t>(new graph{std::move(c->ops)});
  return rc == cudaSuccess ? cudaSuccess : (c->invalid != cudaSuccess ? cudaErrorStreamCaptureInvalidated : rc);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<capture> c = capture_of(s);
  *status = !c ? cudaStreamCaptureStatusNone
               : (c->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive);
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, std::size_t* count) {
  if (!g || nodes) return cudaErrorNotSupported;  // the count only
  *count = reinterpret_cast<graph*>(g)->ops.size();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!g) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(new graph(*reinterpret_cast<graph*>(g)));
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long flags) {
  return cudaGraphInstantiate(exec, g, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return cudaErrorInvalidValue;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (capture_of(s)) return cudaErrorNotSupported;  // a graph launched into a capture: not modelled
  }
  for (const op& o : reinterpret_cast<graph*>(exec)->ops)
    if (cudaError_t rc = replay(o, s); rc != cudaSuccess) return rc;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete reinterpret_cast<graph*>(g);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<graph*>(exec);
  return cudaSuccess;
}

}  // extern "C"
