#pragma once
// basic_model<B, C, T>: model_core's work with the units typed in the compute dtype T (FsdpUnit's param() and
// grad()) and the pass ranges forward() / backward(); compiled once per backend, communicator and compute dtype
// (the layers: fsdp/model.hpp).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/model_core.hpp"
#include "fsdp/unit/fsdp_unit.hpp"

namespace fsdp {

/// A model as its trainer's loop sees it: model_core's work, and the units typed in the compute dtype (FsdpUnit's
/// param() and grad()) in the passes. Every Model whose policy has this backend, communicator and compute dtype is
/// one; a loop written over it (template <class B, class C, class T> void run(fsdp::basic_model<B, C, T>& model),
/// which a Model<P> argument deduces) compiles once per compute dtype in a program of many policies.
template <class B, class C, class Compute>
class basic_model : public model_core<B, C> {
  using core = model_core<B, C>;

 public:
  using compute_type = Compute;
  using unit_type = FsdpUnit<B, compute_type>;

  // ---- iteration ---------------------------------------------------------------------------------------------
  class pass_range;
  /// The forward pass: iterate it (units in the forward order, each gathered while it is current), or enter the
  /// units by name with enter() and close it with finish().
  pass_range forward() { return pass_range(this, pass_kind::forward); }
  /// The backward pass, in reverse forward order: each unit gathered and with a zeroed gradient buffer while it
  /// is current; a unit's gradient is reduced into its shard (or kept, under no-sync) as the pass moves past it.
  pass_range backward() { return pass_range(this, pass_kind::backward); }

  unit_type& unit(std::size_t i) { return views_[this->checked_unit(i)]; }
  unit_type& unit(std::string_view name) { return views_[core::unit(name).index()]; }

  // ---- the range returned by forward() / backward() ------------------------------------------------------------
  class pass_range {
   public:
    struct sentinel {};
    class iterator {
     public:
      unit_type& operator*() const { return m_->current(); }
      unit_type* operator->() const { return &**this; }
      iterator& operator++() {
        m_->advance(nullptr);
        ++pos_;
        return *this;
      }
      bool operator==(sentinel) const noexcept { return pos_ >= m_->size(); }

     private:
      friend class pass_range;
      iterator(basic_model* m, std::size_t pos) : m_(m), pos_(pos) {}
      basic_model* m_;
      std::size_t pos_;
    };

    /// Range iteration: the units in the pass order.
    iterator begin() {
      if (mode_ != mode::unused) detail::fail_usage("a model.", name_of(kind_), "() range can be iterated once");
      m_->begin_pass(kind_, nullptr);
      mode_ = mode::iterated;
      owns_pass_ = true;  // only a range whose pass began may abandon it
      return iterator(m_, 0);
    }
    sentinel end() const noexcept { return {}; }

    /// Explicit entry: leaves the current unit (if any) and enters `name`, which must be the next unit of the
    /// pass order (declared, wrapping or recorded); while the order is being recorded, any unit not yet entered.
    unit_type& enter(std::string_view name) {
      if (mode_ == mode::iterated)
        detail::fail_usage("model.", name_of(kind_), "(): enter('", name, "') on a range that is being iterated");
      if (mode_ == mode::finished)
        detail::fail_usage("model.", name_of(kind_), "(): enter('", name, "') after finish()");
      if (mode_ == mode::unused) {
        m_->begin_pass(kind_, &name);
        mode_ = mode::named;
        owns_pass_ = true;
      } else {
        m_->advance(&name);
      }
      return m_->current();
    }
    /// Leaves the last unit and ends the pass; every unit must have been entered.
    void finish() {
      if (mode_ != mode::named)
        detail::fail_usage("model.", name_of(kind_), "(): finish() ends a pass whose units were entered by name");
      m_->finish_pass();
      mode_ = mode::finished;
    }

    pass_range(const pass_range&) = delete;
    pass_range& operator=(const pass_range&) = delete;
    ~pass_range() {
      if (owns_pass_) m_->abandon_pass(kind_, mode_ == mode::named);
    }

   private:
    friend class basic_model;
    enum class mode : std::uint8_t { unused, iterated, named, finished };
    pass_range(basic_model* m, pass_kind k) : m_(m), kind_(k) {}
    basic_model* m_;
    pass_kind kind_;
    mode mode_ = mode::unused;
    bool owns_pass_ = false;
  };

 protected:
  basic_model(C& comm, init::rule default_init, const model_options& opt, const policy_facts& pf, model_blueprint bp)
      : core(comm, std::move(default_init), opt, pf, std::move(bp)) {
    views_.reserve(this->size());
    for (std::size_t u = 0; u < this->size(); ++u) views_.emplace_back(core::unit(u));
  }

 private:
  unit_type& current() { return views_[this->current_unit()]; }

  std::vector<unit_type> views_;
};

}  // namespace fsdp
