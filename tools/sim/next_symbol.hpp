#pragma once
// For the libraries tools/sim-check preloads into simulated runs (graphs.cc, waits.cc): the next definition of a
// runtime function after the calling library's own (dlsym's RTLD_NEXT: another preloaded library's, or the
// simulator's). Aborts, naming the function, where there is none.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace sim {
// Internal to each library that includes it: with external linkage, the two libraries' instantiations would be one
// symbol, resolved to the first library's, and dlsym's RTLD_NEXT (relative to the library making the call) would hand
// the second library its own function back.
namespace {

template <class F>
F next(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p) {
    std::fprintf(stderr, "sim: the simulator's runtime has no %s\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

}  // namespace
}  // namespace sim
