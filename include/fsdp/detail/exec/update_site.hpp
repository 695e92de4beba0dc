#pragma once
// What an optimizer gives a step, and where its updates run. An optimizer describes its update of one unit as
// element functions (ElementFunction: fsdp/backend/concept.hpp) over the unit's shard pieces; the step program
// (fsdp/plan/detail/program.hpp) decides where each unit's update runs, and the executor hands the optimizer an
// update_site there:
//
//   on the device   site.run(n, f) is Backend::for_each on the compute stream; site.at(p) is where the device finds
//                   the unit's master, gradient or state pointer p: p itself, or the staging slot a host-resident
//                   part was copied into (a device step over offloaded parts)
//   on the host     site.run(n, f) adds a host loop to the unit's host function (fsdp/policy/offload.hpp: all
//                   three parts offloaded), run on the executor's host threads (kernels::host_pool); site.at(p)
//                   is p
//
// optimizer_work is the step's side of the optimizer: inspect() before any update (the gradient inspection; false
// skips the update on every rank), update(u, site) for each unit, states(u) (its state buffers, which a device step
// over offloaded state stages). Model::step takes it through fsdp/model_access.hpp.
#include <cstdint>
#include <functional>
#include <vector>

#include "fsdp/backend/concept.hpp"
#include "fsdp/kernels/host_pool.hpp"

namespace fsdp::detail::exec {

/// Where a device step finds a unit's parts: the staging slot of each host-resident part.
class staged_parts {
 public:
  /// The device address of `p`: inside a staged part, the same element of its slot; else `p` itself.
  template <class T>
  T* on_device(T* p) const noexcept {
    for (const part& s : parts_)
      if (p >= s.host && p < s.host + s.numel) return s.device + (p - s.host);
    return p;
  }
  /// The `numel` fp32 values at `host` are at `device` for this step.
  void add(const float* host, float* device, std::int64_t numel) { parts_.push_back({host, device, numel}); }
  void clear() noexcept { parts_.clear(); }
  bool empty() const noexcept { return parts_.empty(); }

 private:
  struct part {
    const float* host;
    float* device;
    std::int64_t numel;
  };
  std::vector<part> parts_;
};

template <Backend B>
class update_site {
 public:
  /// On the device (the compute stream of `be`), at the staged parts of `staged` (null: none).
  static update_site device(B& be, const staged_parts* staged) { return update_site(&be, staged, nullptr); }
  /// On the host: the work goes into `work`, which the executor runs in the unit's host function, on `pool`'s
  /// threads (which must outlive the work).
  static update_site host(std::vector<std::function<void()>>& work, kernels::host_pool& pool) {
    update_site s(nullptr, nullptr, &work);
    s.pool_ = &pool;
    return s;
  }

  bool on_host() const noexcept { return host_ != nullptr; }
  /// Where the update finds `p` (a master, gradient or state pointer of the unit).
  template <class T>
  T* at(T* p) const noexcept {
    return staged_ ? staged_->on_device(p) : p;
  }
  /// f(i) for every i in [0, n), where this site runs.
  template <ElementFunction F>
  void run(std::int64_t n, const F& f) {
    if (n <= 0) return;
    if (host_)
      host_->push_back([n, f, pool = pool_] { pool->for_each(n, f); });
    else
      be_->for_each(n, f, be_->compute_stream());
  }

 private:
  update_site(B* be, const staged_parts* staged, std::vector<std::function<void()>>* host)
      : be_(be), staged_(staged), host_(host) {}
  B* be_;
  const staged_parts* staged_;
  std::vector<std::function<void()>>* host_;
  kernels::host_pool* pool_ = nullptr;
};

/// The optimizer's side of a step (see the top of the file).
template <Backend B>
struct optimizer_work {
  /// Before any update, after every reduction: true to apply the updates (the gradient inspection may skip them).
  std::function<bool()> inspect;
  /// Unit u's update at `site`.
  std::function<void(std::size_t u, update_site<B>& site)> update;
  /// Unit u's state buffers (fp32, laid out as its master shard), for a device step that stages them.
  std::function<std::vector<float*>(std::size_t u)> states;
  /// State buffers per unit (fp32 values per shard element).
  int state_count = 0;
  /// Recorded by inspect() on the compute stream once the inspection's decision is in host memory: an update on the
  /// host (a host function) reads it there, so it waits for this first. Null: the updates need nothing of it.
  const typename B::event* decided = nullptr;
  /// Once every update is issued, before the scheduler's after_step (the optimizer's count of updates, after every
  /// update that reads the step's rule).
  std::function<void()> finish;
};

}  // namespace fsdp::detail::exec
