#pragma once
// Stamping a rank's trace events (fsdp/observe/trace.hpp): host-side notes are recorded now, stream-side stamps
// when the stream reaches them (through the backend's host callback). With no recorder nothing is recorded and
// nothing is submitted to any stream.
#include <cstdint>

#include "fsdp/comm/concept.hpp"
#include "fsdp/observe/trace.hpp"
#include "fsdp/unit/state.hpp"

namespace fsdp::trace {

class stamper {
 public:
  stamper(recorder* rec, int rank) : rec_(rec), rank_(rank) {}

  bool on() const noexcept { return rec_ != nullptr; }
  /// The step later events belong to (the scheduler's step counter).
  void set_step(std::uint64_t step) noexcept { step_ = step; }

  /// A host-side event, recorded now.
  void note(kind k, pass_kind p, int unit, std::int64_t bytes = 0, bool ahead = false,
            collective c = collective::all_gather) const {
    if (rec_) rec_->record(make(k, p, unit, bytes, ahead, c));
  }
  /// A stream-side event, recorded when stream `s` of backend `b` reaches this point.
  template <class Backend>
  void stamp(Backend& b, typename Backend::stream& s, kind k, pass_kind p, int unit, std::int64_t bytes = 0,
             collective c = collective::all_gather) const {
    if (rec_) b.host_callback(s, [rec = rec_, e = make(k, p, unit, bytes, false, c)] { rec->record(e); });
  }

 private:
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
};

}  // namespace fsdp::trace
