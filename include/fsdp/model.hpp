#pragma once
// Model<Policy>: one rank's units under a policy. In three layers, each a header, so that the code compiles once
// per backend and communicator, not once per policy (docs/architecture.md):
//
//   fsdp/model_core.hpp    model_core<B, C>: does the work (the parts it is composed of are listed there)
//   fsdp/basic_model.hpp   basic_model<B, C, T>: the units typed in the compute dtype, and the pass ranges
//   fsdp/model.hpp         Model<Policy>: the policy's types and facts, and its constructor (can_implement<Policy>)
#include <utility>

#include "fsdp/basic_model.hpp"
#include "fsdp/can_implement.hpp"
#include "fsdp/init/init.hpp"
#include "fsdp/options/model_options.hpp"
#include "fsdp/policy.hpp"
#include "fsdp/policy/wrap.hpp"
#include "fsdp/spec/model_spec.hpp"

namespace fsdp {

/// One rank's model under `Policy` (the header's top says what it is made of). Its code is model_core's, shared by
/// every policy with the same backend and communicator, and basic_model's (the typed units), shared by those with
/// the same compute dtype too; what is the policy's own is here: its types and facts, and can_implement<Policy>.
template <class Policy>
class Model : public basic_model<typename Policy::backend_type, typename Policy::communicator,
                                 typename Policy::precision::compute_type> {
  using base = basic_model<typename Policy::backend_type, typename Policy::communicator,
                           typename Policy::precision::compute_type>;

 public:
  using policy_type = Policy;
  using strategy = typename Policy::sharding;
  using prefetch = typename Policy::prefetch;
  using precision = typename Policy::precision;
  using offload_policy = typename Policy::offload;
  using typename base::communicator;

  /// Builds this rank's units. Everything that could refuse the model is asked first, before any memory or
  /// collective (fsdp/can_implement.hpp, whose first refusal is thrown as a usage_error); then the ranks compare
  /// what they built (fsdp/agree/agree.hpp); then the master shards are materialised from the init rule.
  template <WrappingPolicy W>
  Model(communicator& comm, const ModelSpec& spec, const W& wrap, init::rule default_init = init::normal{},
        model_options opt = {})
      : Model(comm, std::move(default_init), opt, required(can_implement<Policy>(spec, wrap, opt, comm.size()))) {}

 private:
  static model_blueprint required(implementability r) {
    if (!r) throw usage_error(r.refusals.front().sentence);
    return std::move(r.blueprint);
  }
  Model(communicator& comm, init::rule default_init, const model_options& opt, model_blueprint bp)
      : base(comm, std::move(default_init), opt, facts_of_policy<Policy>(bp.mesh.data_parallel()), std::move(bp)) {}
};

}  // namespace fsdp
