#pragma once
// model_core's passes (the class: fsdp/model_core.hpp): a pass begun, advanced, finished or abandoned, and each
// unit entered and left through the scheduler's decisions. Not in the class, so not inline: a translation unit that
// declares the core's instance extern (fsdp/instances.hpp: FSDP_EXTERN_MODEL) does not compile them.
#include "fsdp/model_core.hpp"

namespace fsdp {

template <class B, class C>
void model_core<B, C>::abandon_pass(pass_kind k, bool named) {
  if (cursor_.pass() != k) return;
  end_unit_range();
  cursor_.abandon(named);
}

template <class B, class C>
void model_core<B, C>::begin_pass(pass_kind k, const std::string_view* name) {
  cursor_.require_idle(k == pass_kind::forward ? "model.forward()" : "model.backward()");
  sched_.check_begin(k);
  if (stamp_.pending() >= trace::stamper<backend_type>::flush_above) stamp_.flush(backend());  // never waits
  cursor_.begin(k, name);  // a wrong first unit throws here: nothing has happened, the model stays usable
  sched_.begin_pass(k);
  stamp_.set_step(sched_.step());
  enter_current();  // on failure the pass is abandoned with the reason (no range owns it yet)
}

template <class B, class C>
void model_core<B, C>::advance(const std::string_view* name) {
  cursor_.check_advance(name);
  const pass_kind k = cursor_.pass();
  leave_current();
  if (cursor_.next(name))
    enter_current();
  else
    sched_.end_pass(k);
}

template <class B, class C>
void model_core<B, C>::finish_pass() {
  cursor_.check_finish();
  const pass_kind k = cursor_.pass();
  leave_current();
  cursor_.end();
  sched_.end_pass(k);
}

template <class B, class C>
void model_core<B, C>::enter_current() {
  const pass_kind k = cursor_.pass();
  const std::size_t u = cursor_.current();
  std::optional<detail::sched::shortage> short_of;
  try {
    short_of = sched_.enter(k, cursor_.order(), cursor_.pos(), executor());
  } catch (const std::exception& e) {
    cursor_.abandon_with(std::string(detail::unprefixed(e)));
    throw;
  }
  if (short_of) {
    const std::string why = short_of->message(units_.index);
    cursor_.abandon_with(why);
    detail::fail_usage(why);
  }
  exec_.compute_begin(k, u);
  unit_range_ = exec_.ranges().start(backend(),
                                     k == pass_kind::forward ? trace::range_kind::forward : trace::range_kind::backward,
                                     static_cast<int>(u));
}

template <class B, class C>
void model_core<B, C>::leave_current() {
  const pass_kind k = cursor_.pass();
  end_unit_range();
  exec_.compute_end(k, cursor_.current());
  try {
    sched_.leave(k, cursor_.order(), cursor_.pos(), executor());
  } catch (const std::exception& e) {  // a release or reduction failed: the pass cannot go on
    cursor_.abandon_with(std::string(detail::unprefixed(e)));
    throw;
  }
}

}  // namespace fsdp
