#pragma once
// The host backend's definitions (fsdp/backend/host.hpp): included by that header, or compiled once by fsdp/src.hpp
// under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "fsdp/backend/detail/capture_rules.hpp"
#include "fsdp/backend/host.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::backend {

FSDP_DECL void host::buffer_free::operator()(void* p, std::int64_t bytes) const noexcept {
  if (pool) (void)pool->free(detail::pool_model::any, bytes);  // destroyed outside stream order
  if (pinned) pinned->remove(p);
  if (p) ::operator delete(p, std::align_val_t{alignment});
}

FSDP_DECL host::event::event() : s_(std::make_shared<detail::event_state>()) {}

FSDP_DECL host::host(int rank, host_options opt)
    : opt_(opt),
      rank_(rank),
      compute_(stream_name(rank, "compute"), opt.threaded_compute, opt.spin),
      gather_(stream_name(rank, "all_gather"), opt.threaded_streams, opt.spin),
      reduce_(stream_name(rank, "reduce"), opt.threaded_streams, opt.spin),
      upload_(stream_name(rank, "upload"), opt.threaded_streams, opt.spin),
      download_(stream_name(rank, "download"), opt.threaded_streams, opt.spin),
      host_work_(stream_name(rank, "host_work"), opt.threaded_streams, opt.spin) {}

FSDP_DECL void host::record(event& e, stream& s) {
  if (captured(s, [this, &e, &s] { record(e, s); })) {
    recorded_in_capture_.recorded(e.s_.get());
    return;
  }
  count(s, &atomic_counts::records);
  e.frees_ = pool_.record(index_of(s));
  const std::uint64_t target = e.s_->next_target();
  if (!s.threaded()) {  // an inline stream has reached this point already
    e.s_->complete(target, s.error());
    return;
  }
  s.submit([st = e.s_, target, &s] { st->complete(target, s.error()); }, /*always=*/true);
}

FSDP_DECL bool host::done(const event& e) const {
  if (capture_) refuse_in_capture("done(event)", detail::capture_rules::event_query);
  if (e.s_->completed.load() < e.s_->snapshot()) return false;
  if (e.s_->failed.load()) {  // the stream failed before it got there: its error, as a wait would give it
    std::exception_ptr err;
    {
      std::lock_guard lk(e.s_->mu);
      err = e.s_->error;
    }
    if (err) std::rethrow_exception(err);
  }
  return true;
}

FSDP_DECL bool host::failed_before(const event& e) const noexcept {
  return e.s_->completed.load() >= e.s_->snapshot() && e.s_->failed.load();
}

FSDP_DECL void host::wait(stream& s, const event& e) {
  if (s.capture()) {  // a wait on a record made before the capture is dropped: a replay starts after all of it
    if (recorded_in_capture_.in_capture(e.s_.get())) captured(s, [this, &e, &s] { wait(s, e); });
    return;
  }
  count(s, &atomic_counts::waits);
  const std::uint64_t target = e.s_->snapshot();
  if (target == 0) return;
  pool_.wait(index_of(s), e.frees_);
  const auto timeout = opt_.wait_timeout;
  const auto spin = opt_.spin;
  if (!s.threaded()) {
    if (auto err = e.s_->wait(target, timeout, s.name(), spin)) std::rethrow_exception(err);
    return;
  }
  s.submit(
      [st = e.s_, target, timeout, spin, &s] {
        if (auto err = st->wait(target, timeout, s.name(), spin)) s.set_error(err);
      },
      /*always=*/true);
}

FSDP_DECL void host::host_callback(stream& s, std::function<void()> fn) {
  if (captured(s, [this, &s, fn] { host_callback(s, fn); })) return;
  count(s, &atomic_counts::host_functions);
  const auto d = copy_delay(s, 0);
  if (d.count() > 0)
    s.submit([d, fn = std::move(fn)] {
      std::this_thread::sleep_for(d);
      fn();
    });
  else
    s.submit(std::move(fn));
}

FSDP_DECL void host::synchronize(stream& s) {
  if (capture_) refuse_in_capture("synchronize(stream '" + s.name() + "')", detail::capture_rules::host_wait);
  count(s, &atomic_counts::synchronizes);
  s.drain(opt_.wait_timeout);
}

FSDP_DECL issue_counts host::issued() const {
  issue_counts all;
  for (const auto& c : issued_) all = all + c.get();
  return all;
}

FSDP_DECL host::buffer host::allocate(std::int64_t bytes, mem category, stream& first_use) {
  if (bytes < 0)
    fsdp::detail::fail_usage("backend::host::allocate: negative size ", bytes, " bytes for ", name_of(category));
  if (capture_)
    refuse_in_capture(fsdp::detail::cat("allocate(", bytes, " bytes of ", name_of(category), ")"),
                      detail::capture_rules::memory_taken);
  buffer b = take(bytes, category);  // nothing is counted when it fails
  pool_.allocate(index_of(first_use), bytes);
  count(first_use, &atomic_counts::allocations);
  return b;
}

FSDP_DECL host::buffer host::allocate_host(std::int64_t bytes, mem category) {
  if (bytes < 0)
    fsdp::detail::fail_usage("backend::host::allocate_host: negative size ", bytes, " bytes for ", name_of(category));
  try {
    void* p = take_bytes(bytes);
    if (p) pinned_.add(p, bytes);  // cannot throw past a taken block: see pinned_blocks::add
    return buffer(p, bytes, category, &host_memory_, buffer_free{nullptr, p ? &pinned_ : nullptr});
  } catch (const std::bad_alloc&) {
    throw memory_error(fsdp::detail::cat("backend::host on rank ", rank_, ": could not allocate ", bytes,
                                         " bytes of host memory for ", name_of(category), " (std::bad_alloc; ",
                                         host_memory_.stats().current.total, " bytes of host memory held now)"));
  }
}

FSDP_DECL void host::release_after(buffer&& b, stream& s) {
  if (!b) return;
  if (capture_)
    refuse_in_capture(fsdp::detail::cat("release_after(", b.bytes(), " bytes of ", name_of(b.category()), ")"),
                      detail::capture_rules::memory_given_back);
  count(s, &atomic_counts::frees);
  const bool modelled = b.free_.pool != nullptr;
  b.stop_accounting();
  b.free_.pool = nullptr;  // the pool model's free is the stream's, below
  auto reached = modelled ? pool_.free(index_of(s), b.bytes()) : nullptr;
  if (!s.threaded()) {  // an inline stream has reached this point already
    if (reached) reached->store(true, std::memory_order_release);
    b.reset();
    return;
  }
  auto holder = std::make_shared<buffer>(std::move(b));
  s.submit(
      [holder, reached]() mutable {
        holder->reset();
        if (reached) reached->store(true, std::memory_order_release);
      },
      /*always=*/true);
}

FSDP_DECL void* host::take_bytes(std::int64_t bytes) {
  return bytes > 0 ? ::operator new(static_cast<std::size_t>(bytes), std::align_val_t{buffer_free::alignment})
                   : nullptr;
}

FSDP_DECL host::buffer host::take(std::int64_t bytes, mem category) {
  try {
    return buffer(take_bytes(bytes), bytes, category, &memory_, buffer_free{&pool_});
  } catch (const std::bad_alloc&) {
    throw memory_error(fsdp::detail::cat("backend::host on rank ", rank_, ": could not allocate ", bytes, " bytes of ",
                                         name_of(category), " (std::bad_alloc: more than this process can have; ",
                                         memory_.stats().current.total, " bytes held now)"));
  }
}

FSDP_DECL void host::fill_zero(void* dst, std::int64_t bytes, stream& s) {
  if (bytes <= 0) return;
  if (captured(s, [=, this, &s] { fill_zero(dst, bytes, s); })) return;
  count(s, &atomic_counts::memory_ops);
  s.submit([=] { std::memset(dst, 0, static_cast<std::size_t>(bytes)); });
}

FSDP_DECL void host::copy(void* dst, const void* src, std::int64_t bytes, stream& s) {
  if (bytes <= 0 || dst == src) return;
  if (captured(s, [=, this, &s] { copy(dst, src, bytes, s); })) return;
  count(s, &atomic_counts::memory_ops);
  s.submit([=, d = copy_delay(s, bytes)] {
    std::this_thread::sleep_for(d);
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  });
}

FSDP_DECL void host::upload(void* dst, const void* host_src, std::int64_t bytes, stream& s) {
  if (capture_ && bytes > 0 && !pinned_.contains(host_src)) refuse_pageable("an upload from");
  copy(dst, host_src, bytes, s);  // counted (or captured) there
  if (bytes > 0 && !pinned_.contains(host_src)) pageable_wait(s, "an upload from");
}

FSDP_DECL void host::download(void* host_dst, const void* src, std::int64_t bytes, stream& s) {
  if (capture_ && bytes > 0 && !pinned_.contains(host_dst)) refuse_pageable("a download to");
  copy(host_dst, src, bytes, s);
  if (bytes > 0 && !pinned_.contains(host_dst)) pageable_wait(s, "a download to");
}

FSDP_DECL void host::convert(void* dst, dtype dst_type, const void* src, dtype src_type, std::int64_t n, float scale,
                             stream& s) {
  if (n <= 0) return;
  if (captured(s, [=, this, &s] { convert(dst, dst_type, src, src_type, n, scale, s); })) return;
  count(s, &atomic_counts::kernels);
  s.submit([=] { kernels::host_loops::convert(dst, dst_type, src, src_type, n, scale); });
}

FSDP_DECL void host::accumulate(float* dst, const void* src, dtype src_type, std::int64_t n, float scale, stream& s) {
  if (n <= 0) return;
  if (captured(s, [=, this, &s] { accumulate(dst, src, src_type, n, scale, s); })) return;
  count(s, &atomic_counts::kernels);
  s.submit([=, d = delay("accumulate")] {
    std::this_thread::sleep_for(d);
    kernels::host_loops::accumulate(dst, src, src_type, n, scale);
  });
}

FSDP_DECL void host::squared_norm(const float* x, std::int64_t n, float* out, stream& s) {
  if (captured(s, [=, this, &s] { squared_norm(x, n, out, s); })) return;
  count(s, &atomic_counts::kernels);
  s.submit([=] {
    double acc = 0;
    for (std::int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
    *out = static_cast<float>(acc);
  });
}

FSDP_DECL void host::pageable_wait(stream& s, const char* what) {
  if (s.wait_idle(opt_.wait_timeout)) return;
  const comm_error e(fsdp::detail::cat(
      "backend::host: ", what, " pageable host memory on stream '", s.name(), "' waited ", opt_.wait_timeout.count(),
      " ms for the stream's earlier work and still waits: on a GPU this copy blocks the "
      "host with no watchdog (cudaMemcpyAsync from or to pageable memory returns only once "
      "the stream reaches it). Synchronize the stream first (a watched wait), or copy "
      "through allocate_host() memory"));
  s.set_error(std::make_exception_ptr(e));
  throw e;
}

FSDP_DECL void host::begin_capture() {
  if (capture_) refuse_in_capture("begin_capture()", detail::capture_rules::second_begin);
  capture_ = std::make_unique<std::vector<std::function<void()>>>();
  for (stream* s : {&compute_, &gather_, &reduce_, &upload_, &download_, &host_work_}) s->set_capture(capture_.get());
}

FSDP_DECL host::graph host::end_capture() {
  if (!capture_) fsdp::detail::fail_usage("backend::host on rank ", rank_, ": end_capture() without a begin_capture()");
  graph g;
  g.calls_ = std::move(*capture_);
  abandon_capture();  // the streams issue again
  return g;
}

FSDP_DECL void host::abandon_capture() noexcept {
  if (!capture_) return;
  for (stream* s : {&compute_, &gather_, &reduce_, &upload_, &download_, &host_work_}) s->set_capture(nullptr);
  capture_.reset();
  recorded_in_capture_.clear();
}

FSDP_DECL void host::replay(const graph& g) {
  if (capture_) refuse_in_capture("replay(graph)", detail::capture_rules::replay_inside);
  // Everything issued before starts the replay, as a CUDA graph's launch follows all earlier work (the waits dropped
  // at the capture were on it): here the host waits for it, which the device does there.
  for (stream* s : {&compute_, &gather_, &reduce_, &upload_, &download_, &host_work_}) s->drain(opt_.wait_timeout);
  ++replays_;
  for (const std::function<void()>& call : g.calls_) call();
}

FSDP_DECL void host::refuse_in_capture(std::string_view call, std::string_view why) const {
  detail::capture_rules::refuse("host", rank_, call, why);
}

FSDP_DECL void host::refuse_pageable(const char* what) const {
  refuse_in_capture(fsdp::detail::cat(what, " pageable host memory"), detail::capture_rules::pageable_copy);
}

FSDP_DECL std::chrono::microseconds host::copy_delay(const stream& s, std::int64_t bytes) const {
  if (!opt_.copy_delay || (&s != &upload_ && &s != &download_ && &s != &host_work_))
    return std::chrono::microseconds{0};
  return opt_.copy_delay(&s == &upload_ ? "upload" : &s == &download_ ? "download" : "host_work", bytes);
}

FSDP_DECL int host::index_of(const stream& s) const {
  if (&s == &compute_) return 0;
  if (&s == &gather_) return 1;
  if (&s == &reduce_) return 2;
  if (&s == &upload_) return 3;
  if (&s == &download_) return 4;
  if (&s == &host_work_) return 5;
  fsdp::detail::fail_usage("backend::host: stream '", s.name(), "' is not one of this backend's streams");
}

}  // namespace fsdp::backend
