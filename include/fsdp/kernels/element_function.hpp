#pragma once
// What Backend::for_each runs, written once: the backends' for_each (backend/concept.hpp) and the wider kernels'
// refinements of it (kernels/cooperative.hpp: QuadFunction, BlockFunction) name this concept.
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace fsdp {

/// What Backend::for_each runs: a value (trivially copyable, so it travels as a CUDA kernel's parameter) called
/// with each element's index, on the host and in device code alike (an FSDP_HD operator()). Calls for different
/// indices may run at once (a kernel's threads; the host pool of offloading's host step, kernels/host_pool.hpp), so
/// f(i) must touch element i's data alone.
template <class F>
concept ElementFunction = std::is_trivially_copyable_v<F> && std::invocable<const F&, std::int64_t>;

}  // namespace fsdp
