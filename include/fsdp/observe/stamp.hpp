#pragma once
// Stamping a rank's trace events (fsdp/observe/trace.hpp). Host-side notes happen now; stream-side stamps happen
// when the stream reaches them, and how they are timed depends on the backend:
//
//   host callbacks   (backend::host, any backend without timing marks) a function on the stream records the
//                    event with the host clock when it runs. Notes are recorded at once.
//   timing marks     (backend::cuda; the optional hook TimingMarks below) the stamp records a timing mark (a CUDA
//                    event with timing) on the stream and keeps it pending on the host; nothing runs on the host
//                    for it. flush() resolves the marks that have completed: t_ns = the reference's host time
//                    relative to the recorder's origin + the mark's elapsed time since the reference. Notes are
//                    queued with their host time and recorded by the same flush, so a flush records a rank's
//                    events in time order and `seq` keeps saying the order they happened.
//
// A flush never waits. A mark not complete yet stays pending, and so does every event it may turn out to precede
// (the marks after it on its stream; on other streams and among the notes, whatever is later than the last
// completed mark of its stream): nothing pending is lost or given a time it did not have, and a later flush
// records it. The Model flushes in synchronize() (where every stream has finished: everything is recorded), before
// a pass once flush_above events are pending (so a program that never synchronizes keeps a bounded number of
// marks), and in its destructor (close(): what never completed, a stream that did not finish, is dropped and
// counted there).
//
// The reference: a mark the backend records on a stream of its own that has no other work and waits for; its host
// time is read once the wait returns, so it is late by at most that round trip (microseconds on a GPU), and stream
// times are never earlier than they happened (as far as the GPU's clock and the host's run at one rate). One
// reference serves until no mark is pending (after a flush that recorded everything); the next stamp takes a new
// one, so elapsed times stay short (cudaEventElapsedTime is a float of milliseconds: 1e-7 of the span). A new
// reference's time is never earlier than the last time recorded, so each stream's times never decrease. A note and a
// stream event closer in time than the reference's round trip may be recorded in either order.
//
// With no recorder nothing is recorded and nothing is submitted to any stream.
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <vector>

#include "fsdp/comm/concept.hpp"
#include "fsdp/observe/trace.hpp"
#include "fsdp/core/unit_state.hpp"

namespace fsdp::trace {

/// Optional backend hook: timing marks (backend::cuda implements it with CUDA events; backend/concept.hpp's
/// Backend does not require it).
///   record_reference()    a mark known to have completed at host time `at` (steady clock), not earlier than it did
///   record_mark(s)        a mark recorded on stream s (a handle the backend owns; copyable)
///   elapsed_since(r, m)   time from the reference to the mark, or nullopt while the mark has not completed; never
///                         waits
///   release_mark(m)       gives a mark (or a reference's mark) back to the backend once it is no longer needed
template <class B>
concept TimingMarks =
    std::default_initializable<typename B::timing_mark> && std::copyable<typename B::timing_mark> &&
    requires(B& b, typename B::stream& s, const typename B::timing_reference& r, const typename B::timing_mark& m) {
      { b.record_reference() } -> std::same_as<typename B::timing_reference>;
      { r.mark } -> std::convertible_to<typename B::timing_mark>;
      { r.at } -> std::convertible_to<std::chrono::steady_clock::time_point>;
      { b.record_mark(s) } -> std::same_as<typename B::timing_mark>;
      { b.elapsed_since(r, m) } -> std::same_as<std::optional<std::chrono::nanoseconds>>;
      b.release_mark(m);
    };

namespace detail {
template <class B, bool = TimingMarks<B>>
struct marks_of {
  struct timing_mark {};
  struct timing_reference {};
};
template <class B>
struct marks_of<B, true> {
  using timing_mark = typename B::timing_mark;
  using timing_reference = typename B::timing_reference;
};
}  // namespace detail

/// One rank's stamps, for the streams of one backend. Used by the rank's host thread only (the recorder it
/// writes to may be shared).
template <class Backend>
class stamper {
 public:
  using stream = typename Backend::stream;
  /// true: stream-side events are timed with the backend's timing marks and recorded by flush().
  static constexpr bool timed = TimingMarks<Backend>;
  /// The Model flushes before a pass once this many events are pending.
  static constexpr std::size_t flush_above = 4096;

  stamper(recorder* rec, int rank) : rec_(rec), rank_(rank) {}
  stamper(const stamper&) = delete;
  stamper& operator=(const stamper&) = delete;

  bool on() const noexcept { return rec_ != nullptr; }
  /// The step later events belong to (the scheduler's step counter).
  void set_step(std::uint64_t step) noexcept { step_ = step; }

  /// A host-side event, happening now (recorded now, or by the next flush when stream events are timed).
  void note(kind k, pass_kind p, int unit, std::int64_t bytes = 0, bool ahead = false,
            collective c = collective::all_gather) {
    if (!rec_) return;
    if constexpr (timed) {
      entry x;
      x.e = make(k, p, unit, bytes, ahead, c);
      x.t_ns = rec_->since_origin(recorder::clock::now());
      x.resolved = true;
      x.order = next_order_++;
      lane_of(nullptr).q.push_back(x);
    } else {
      rec_->record(make(k, p, unit, bytes, ahead, c));
    }
  }

  /// A stream-side event, happening when stream `s` of backend `b` reaches this point.
  void stamp(Backend& b, stream& s, kind k, pass_kind p, int unit, std::int64_t bytes = 0,
             collective c = collective::all_gather) {
    if (!rec_) return;
    if constexpr (timed) {
      if (!ref_) anchor(b);
      lane& l = lane_of(&s);  // before the mark, so that only the push can fail once the backend has recorded it
      entry x;
      x.e = make(k, p, unit, bytes, false, c);
      x.order = next_order_++;
      x.mark = b.record_mark(s);
      l.q.push_back(x);
      ++marks_pending_;
    } else {
      b.host_callback(s, [rec = rec_, e = make(k, p, unit, bytes, false, c)] { rec->record(e); });
    }
  }

  /// Records every pending event that is final (see the file's comment), in time order; never waits. A backend
  /// error while a mark is read propagates, and what was pending stays pending. Nothing to do without timing marks.
  void flush(Backend& b) {
    if constexpr (timed) {
      if (!rec_) return;
      record_ready(b, resolve(b));
    }
  }

  /// Events stamped or noted and not recorded yet (always 0 without timing marks).
  std::size_t pending() const noexcept {
    std::size_t n = 0;
    for (const lane& l : lanes_) n += l.q.size();
    return n;
  }

  /// Before the backend goes (the Model's destructor, after its streams were waited for): records what can be
  /// recorded (every completed mark and every note, in time order), gives every mark back to the backend and
  /// returns how many stream-side events were dropped because their marks never completed. Never throws.
  std::size_t close(Backend& b) noexcept {
    std::size_t dropped = 0;
    if constexpr (timed) {
      if (!rec_) return 0;
      try {
        (void)resolve(b);
      } catch (...) {  // a failed stream: its marks count as dropped below
      }
      try {
        record_ready(b, never);  // nothing can come after this: every resolved event is final
      } catch (...) {
      }
      for (lane& l : lanes_) {
        for (entry& x : l.q) {
          if (x.resolved) continue;
          release(b, x.mark);
          ++dropped;
        }
        l.q.clear();
      }
      marks_pending_ = 0;
      if (ref_) release(b, ref_->mark);
      ref_.reset();
    }
    return dropped;
  }

 private:
  using timing_mark = typename detail::marks_of<Backend>::timing_mark;
  using timing_reference = typename detail::marks_of<Backend>::timing_reference;
  static constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();

  struct entry {
    event e;
    std::int64_t t_ns = 0;  ///< once resolved
    bool resolved = false;
    std::uint64_t order = 0;  ///< stamp order: ties in time keep it
    timing_mark mark{};       ///< until resolved
  };
  /// One stream's pending stamps in stream order (notes: the lane without a stream).
  struct lane {
    const stream* s = nullptr;
    std::deque<entry> q;
    std::int64_t floor = 0;  ///< no unresolved mark of this lane is earlier: its last resolved time, or the reference's
  };

  lane& lane_of(const stream* s) {
    for (lane& l : lanes_)
      if (l.s == s) return l;
    lanes_.push_back(lane{s, {}, ref_t_});
    return lanes_.back();
  }

  /// A new reference; only when no mark is pending, so every pending mark shares one.
  void anchor(Backend& b) {
    if constexpr (timed) {
      timing_reference r = b.record_reference();
      ref_t_ = std::max(rec_->since_origin(r.at), last_t_);
      ref_ = r;
      for (lane& l : lanes_) l.floor = ref_t_;
    }
  }

  /// Resolves, per stream and in stream order, the marks that have completed, up to the first that has not.
  /// Returns the time before which every event is final: the earliest floor of a stream with an incomplete mark
  /// (`never` when every mark has completed).
  std::int64_t resolve(Backend& b) {
    std::int64_t bound = never;
    if constexpr (timed) {
      for (lane& l : lanes_) {
        if (!l.s) continue;  // notes are final when made
        for (entry& x : l.q) {
          if (x.resolved) continue;
          const std::optional<std::chrono::nanoseconds> d = b.elapsed_since(*ref_, x.mark);
          if (!d) {
            bound = std::min(bound, l.floor);
            break;
          }
          x.t_ns = ref_t_ + d->count();
          x.resolved = true;
          l.floor = std::max(l.floor, x.t_ns);
          release(b, x.mark);
          x.mark = {};
          --marks_pending_;
        }
      }
    }
    return bound;
  }

  /// Records the resolved events at or before `bound` in time order (stamp order among equal times). Once no mark
  /// is pending, the reference is given back: the next stamp takes a new one.
  void record_ready(Backend& b, std::int64_t bound) {
    std::vector<entry> ready;
    for (lane& l : lanes_)
      while (!l.q.empty() && l.q.front().resolved && l.q.front().t_ns <= bound) {
        ready.push_back(l.q.front());
        l.q.pop_front();
      }
    std::sort(ready.begin(), ready.end(), [](const entry& a, const entry& c) {
      return a.t_ns != c.t_ns ? a.t_ns < c.t_ns : a.order < c.order;
    });
    for (const entry& x : ready) {
      rec_->record_at(x.e, x.t_ns);
      last_t_ = std::max(last_t_, x.t_ns);
    }
    if (marks_pending_ == 0 && ref_) {
      release(b, ref_->mark);
      ref_.reset();
    }
  }

  static void release(Backend& b, const timing_mark& m) noexcept {
    if constexpr (timed) {
      try {
        b.release_mark(m);
      } catch (...) {  // the backend keeps every mark it made and frees them when it goes
      }
    }
  }

  event make(kind k, pass_kind p, int unit, std::int64_t bytes, bool ahead, collective c) const {
    event e;
    e.rank = rank_;
    e.what = k;
    e.pass = p;
    e.unit = unit;
    e.step = step_;
    e.bytes = bytes;
    e.ahead = ahead;
    e.coll = c;
    return e;
  }

  recorder* rec_;
  int rank_;
  std::uint64_t step_ = 0;
  // timing marks only
  std::vector<lane> lanes_;
  std::optional<timing_reference> ref_;
  std::int64_t ref_t_ = 0;  ///< the reference's time relative to the recorder's origin
  std::int64_t last_t_ = std::numeric_limits<std::int64_t>::min();  ///< latest time recorded
  std::size_t marks_pending_ = 0;
  std::uint64_t next_order_ = 0;
};

}  // namespace fsdp::trace
