// Waits that sleep, for the simulated GPU. GPGPU-Sim's runtime waits by spinning: its simulation thread polls the
// stream manager while it has no work, and a host thread in cudaStreamSynchronize, cudaEventSynchronize or
// cudaDeviceSynchronize polls (taking the stream's lock each time) until the simulation thread has run what it waits
// for. A program with several ranks, each a host thread, keeps a core busy per waiting rank and slows the one thread
// that simulates; two runs side by side (tools/sim-check) share two cores with every spinning thread of both.
// tools/sim-check builds this file into a shared library and preloads it (LD_PRELOAD) into every run: the same waits,
// asked the same questions (cudaStreamQuery, cudaEventQuery, the stream manager's own test), with a sleep between
// asks that grows from 10 us to 1 ms while the answer stays "not yet". Answers are the runtime's, so ordering and
// results are as without it; only the CPU a wait takes changes. Nothing here is part of the library.
#include <cuda_runtime_api.h>
#include <time.h>

#include <atomic>

#include "next_symbol.hpp"

namespace {

using sim::next;

// Sleeps between asks: 10 us, doubling to 1 ms.
class backoff {
 public:
  void pause() {
    timespec t{0, ns_};
    nanosleep(&t, nullptr);
    if (ns_ < 1'000'000) ns_ *= 2;
  }
  void reset() { ns_ = 10'000; }

 private:
  long ns_ = 10'000;
};

// The stream manager the simulation thread polls (the first it asks about): cudaDeviceSynchronize waits for it to
// empty before the runtime's own wait, which then finds the simulation idle at once or within an operation.
std::atomic<void*> manager{nullptr};

using empty_fn = bool (*)(void*);
empty_fn real_empty_protected() {
  static const auto real = next<empty_fn>("_ZN14stream_manager15empty_protectedEv");
  return real;
}

}  // namespace

// bool stream_manager::empty_protected(): asked in a loop by the simulation thread while it waits for work, and once
// after each operation. An empty answer sleeps first (growing while the manager stays empty), so an idle simulation
// thread sleeps instead of spinning; work is seen within the sleep (at most 1 ms after a long idle spell).
extern "C" bool _ZN14stream_manager15empty_protectedEv(void* self) {
  thread_local backoff wait;
  void* expected = nullptr;
  manager.compare_exchange_strong(expected, self);
  const bool empty = real_empty_protected()(self);
  if (empty) {
    wait.pause();
  } else {
    wait.reset();
  }
  return empty;
}

extern "C" {

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  static const auto real = next<cudaError_t (*)(cudaStream_t)>("cudaStreamSynchronize");
  static const auto query = next<cudaError_t (*)(cudaStream_t)>("cudaStreamQuery");
  for (backoff wait; query(s) == cudaErrorNotReady;) wait.pause();
  return real(s);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  static const auto real = next<cudaError_t (*)(cudaEvent_t)>("cudaEventSynchronize");
  static const auto query = next<cudaError_t (*)(cudaEvent_t)>("cudaEventQuery");
  for (backoff wait; query(e) == cudaErrorNotReady;) wait.pause();
  return real(e);
}

cudaError_t cudaDeviceSynchronize() {
  static const auto real = next<cudaError_t (*)()>("cudaDeviceSynchronize");
  if (void* m = manager.load()) {
    for (backoff wait; !real_empty_protected()(m);) wait.pause();
  }
  return real();
}

}  // extern "C"
