// Static checks of the concepts and of policy composition. Archetypes (minimal types that model a concept and
// nothing more) show each concept is neither wider nor narrower than intended.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
// First: the common models are compiled once, in tests/support (fsdp/instances.hpp).
#include "tests/support/instances.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/support/support.hpp"

namespace archetype {

/// The least a communicator must offer, over backend B.
template <class B>
struct basic_communicator {
  using backend_type = B;
  using stream = typename backend_type::stream;
  int rank() const { return 0; }
  int size() const { return 1; }
  void all_gather(const void*, void*, std::int64_t, fsdp::dtype, stream&) {}
  void reduce_scatter(const void*, void*, std::int64_t, fsdp::dtype, fsdp::reduce_op, stream&) {}
  void all_reduce(const void*, void*, std::int64_t, fsdp::dtype, fsdp::reduce_op, stream&) {}
  void broadcast(const void*, void*, std::int64_t, fsdp::dtype, int, stream&) {}
  void barrier() {}
  fsdp::collective_stats stats() const { return {}; }
};
using communicator = basic_communicator<fsdp::backend::host>;
/// The same without broadcast: not a communicator.
struct no_broadcast {
  using backend_type = fsdp::backend::host;
  using stream = backend_type::stream;
  int rank() const { return 0; }
  int size() const { return 1; }
  void all_gather(const void*, void*, std::int64_t, fsdp::dtype, stream&) {}
  void reduce_scatter(const void*, void*, std::int64_t, fsdp::dtype, fsdp::reduce_op, stream&) {}
  void all_reduce(const void*, void*, std::int64_t, fsdp::dtype, fsdp::reduce_op, stream&) {}
  void barrier() {}
  fsdp::collective_stats stats() const { return {}; }
};

struct strategy {
  using sharding_concept = fsdp::sharding_tag;
  static constexpr std::string_view name = "archetype";
  static constexpr bool shards_params = true;
  static constexpr bool reshard_after_forward = true;
  static constexpr int shard_group_size(int w) { return w; }
  static constexpr int replicate_group_size(int) { return 1; }
};
/// All the facts but no opt-in tag: a strategy must say it is one.
struct untagged_strategy {
  static constexpr std::string_view name = "untagged";
  static constexpr bool shards_params = true;
  static constexpr bool reshard_after_forward = true;
  static constexpr int shard_group_size(int w) { return w; }
  static constexpr int replicate_group_size(int) { return 1; }
};

struct wrapping {
  std::vector<std::string> assign(const fsdp::ModelSpec&) const { return {}; }
};
struct wrong_wrapping {
  std::vector<int> assign(const fsdp::ModelSpec&) const { return {}; }
};

}  // namespace archetype

static_assert(fsdp::CollectivePolicy<archetype::communicator>);
static_assert(!fsdp::CollectivePolicy<archetype::no_broadcast>);
static_assert(fsdp::CollectivePolicy<fsdp::comm::local_communicator>);

// The optional capabilities (fsdp/comm/concept.hpp): the least communicator has none, and the library's calls give
// what the list says in its place; comm::local has split, backend options and says its collectives overlap.
static_assert(!fsdp::LabelledCollective<archetype::communicator> &&
              !fsdp::SplittableCollective<archetype::communicator> &&
              !fsdp::ConfiguringCollective<archetype::communicator> &&
              !fsdp::SerialCollective<archetype::communicator> &&
              !fsdp::DeviceMeasuredCollective<archetype::communicator> &&
              !fsdp::ConnectingCollective<archetype::communicator>);
static_assert(fsdp::SplittableCollective<fsdp::comm::local_communicator> &&
              fsdp::ConfiguringCollective<fsdp::comm::local_communicator> &&
              fsdp::SerialCollective<fsdp::comm::local_communicator> &&
              !fsdp::LabelledCollective<fsdp::comm::local_communicator> &&
              !fsdp::DeviceMeasuredCollective<fsdp::comm::local_communicator> &&
              !fsdp::ConnectingCollective<fsdp::comm::local_communicator>);
namespace archetype {
/// Each capability with a signature a step away from the list's: none of them counts.
struct near_capabilities : basic_communicator<fsdp::backend::host> {
  void label(int) {}                                       // not a string_view
  basic_communicator<fsdp::backend::host> split(int, int);  // not the same communicator
  int backend_options() { return 0; }                      // the backend is not made from it
  void serial_collectives() const {}                       // not a bool
  void device_bytes() const {}                             // not a byte count
  void connect(const std::vector<fsdp::collective_use>&) {}  // without connect_bytes()
};
/// Device bytes alone: measured, and its device_bytes() counted, without connecting anything.
struct measured_only : basic_communicator<fsdp::backend::host> {
  std::int64_t device_bytes() const { return 1 << 20; }
};
}  // namespace archetype
static_assert(fsdp::DeviceMeasuredCollective<archetype::measured_only> &&
              !fsdp::ConnectingCollective<archetype::measured_only>);
static_assert(fsdp::CollectivePolicy<archetype::near_capabilities> &&
              !fsdp::LabelledCollective<archetype::near_capabilities> &&
              !fsdp::SplittableCollective<archetype::near_capabilities> &&
              !fsdp::ConfiguringCollective<archetype::near_capabilities> &&
              !fsdp::SerialCollective<archetype::near_capabilities> &&
              !fsdp::DeviceMeasuredCollective<archetype::near_capabilities> &&
              !fsdp::ConnectingCollective<archetype::near_capabilities>);

static_assert(fsdp::ShardingStrategy<archetype::strategy>);
static_assert(!fsdp::ShardingStrategy<archetype::untagged_strategy>);
static_assert(fsdp::ShardingStrategy<fsdp::sharding::full_shard>);
static_assert(fsdp::ShardingStrategy<fsdp::sharding::shard_grad_op>);
static_assert(fsdp::ShardingStrategy<fsdp::sharding::no_shard>);
static_assert(!fsdp::ShardingStrategy<int>);

static_assert(fsdp::WrappingPolicy<archetype::wrapping>);
static_assert(!fsdp::WrappingPolicy<archetype::wrong_wrapping>);
static_assert(fsdp::WrappingPolicy<fsdp::wrap::by_prefix> && fsdp::WrappingPolicy<fsdp::wrap::by_size> &&
              fsdp::WrappingPolicy<fsdp::wrap::by_function>);

static_assert(fsdp::PrefetchPolicy<fsdp::prefetch::none> && fsdp::PrefetchPolicy<fsdp::prefetch::next>);
static_assert(fsdp::prefetch::backward_pre<2>::backward_depth == 2 &&
              fsdp::prefetch::backward_pre<2>::forward_depth == 0);
static_assert(fsdp::prefetch::forward<3>::forward_depth == 3 && fsdp::prefetch::forward<3>::backward_depth == 0);
static_assert(!fsdp::PrefetchPolicy<fsdp::sharding::full_shard>);
static_assert(fsdp::PrefetchPolicy<fsdp::prefetch::backward_post> && fsdp::prefetch::backward_post::post_backward &&
              fsdp::prefetch::backward_post::backward_depth == 1 && fsdp::prefetch::backward_post::forward_depth == 0);
static_assert(fsdp::PrefetchPolicy<fsdp::prefetch::explicit_schedule> &&
              fsdp::prefetch::explicit_schedule::by_schedule);
static_assert(!fsdp::prefetch::next::post_backward && !fsdp::prefetch::next::by_schedule);
namespace archetype {
struct prefetch_facts {  // the minimum a prefetch policy reports
  using prefetch_concept = fsdp::prefetch_tag;
  static constexpr int forward_depth = 2;
  static constexpr int backward_depth = 0;
  static constexpr bool post_backward = false;
  static constexpr bool by_schedule = false;
};
struct prefetch_without_timing {  // says nothing about when the backward prefetch is issued
  using prefetch_concept = fsdp::prefetch_tag;
  static constexpr int forward_depth = 2;
  static constexpr int backward_depth = 0;
  static constexpr bool by_schedule = false;
};
}  // namespace archetype
static_assert(fsdp::PrefetchPolicy<archetype::prefetch_facts>);
namespace archetype {
/// The least a backend must offer (backend/concept.hpp); `with_norm = false` leaves out squared_norm.
template <bool with_norm>
struct backend_t {
  struct stream {};
  struct event {};
  class buffer {
   public:
    buffer() = default;
    buffer(buffer&&) noexcept = default;
    buffer& operator=(buffer&&) noexcept = default;
    void* data() const { return nullptr; }
    template <class T>
    T* as() const {
      return nullptr;
    }
    std::int64_t bytes() const { return 0; }
    fsdp::mem category() const { return fsdp::mem::comm_buffers; }
    explicit operator bool() const { return false; }
  };
  explicit backend_t(int) {}
  stream& compute_stream() { return s; }
  stream& gather_stream() { return s; }
  stream& reduce_stream() { return s; }
  void record(event&, stream&) {}
  void wait(stream&, const event&) {}
  void host_callback(stream&, std::function<void()>) {}
  void synchronize(stream&) {}
  buffer allocate(std::int64_t, fsdp::mem, stream&) { return {}; }
  void release_after(buffer&&, stream&) {}
  fsdp::MemoryTracker& memory() { return tracker; }
  void fill_zero(void*, std::int64_t, stream&) {}
  void copy(void*, const void*, std::int64_t, stream&) {}
  void upload(void*, const void*, std::int64_t, stream&) {}
  void download(void*, const void*, std::int64_t, stream&) {}
  void convert(void*, fsdp::dtype, const void*, fsdp::dtype, std::int64_t, float, stream&) {}
  void accumulate(float*, const void*, fsdp::dtype, std::int64_t, float, stream&) {}
  void squared_norm(const float*, std::int64_t, float*, stream&)
    requires with_norm
  {}
  template <fsdp::ElementFunction F>
  void for_each(std::int64_t, const F&, stream&) {}
  stream s;
  fsdp::MemoryTracker tracker;
};
/// A precision policy whose master is not fp32, and one whose compute type has no dtype.
struct double_master {
  using precision_concept = fsdp::precision_tag;
  using compute_type = fsdp::bfloat16;
  using master_type = double;
  using reduce_type = float;
};
struct double_compute {
  using precision_concept = fsdp::precision_tag;
  using compute_type = double;
  using master_type = float;
  using reduce_type = float;
};
/// A gather type wider than the compute type (more bytes than casting first), and one of the same width in another
/// dtype (two roundings): both refused; a narrower one is the wire precision.
template <class Compute, class Gather>
struct gathered_in {
  using precision_concept = fsdp::precision_tag;
  using compute_type = Compute;
  using master_type = float;
  using reduce_type = float;
  using gather_type = Gather;
};
}  // namespace archetype
static_assert(fsdp::Backend<archetype::backend_t<true>>);
static_assert(!fsdp::Backend<archetype::backend_t<false>>);
// The archetype communicator over the archetype backend: with them the unit executor compiles completely (every
// member instantiated below), so the concepts promise no less than the executor uses.
static_assert(fsdp::CollectivePolicy<archetype::basic_communicator<archetype::backend_t<true>>>);
template class fsdp::detail::exec::unit_executor<archetype::backend_t<true>,
                                                 archetype::basic_communicator<archetype::backend_t<true>>>;
static_assert(fsdp::Backend<fsdp::backend::host>);
// Of the backend's optional hooks (fsdp/backend/concept.hpp), the host backend has done(event) alone; the least
// backend none.
static_assert(fsdp::PollingBackend<fsdp::backend::host> && !fsdp::ReservingBackend<fsdp::backend::host> &&
              !fsdp::HostMappingBackend<fsdp::backend::host>);
static_assert(!fsdp::PollingBackend<archetype::backend_t<true>> && !fsdp::ReservingBackend<archetype::backend_t<true>>);
static_assert(fsdp::ElementType<float> && fsdp::ElementType<fsdp::bfloat16> && fsdp::ElementType<fsdp::float16>);
static_assert(!fsdp::ElementType<double> && !fsdp::ElementType<std::uint16_t>);
static_assert(fsdp::PrecisionPolicy<fsdp::precision::mixed<fsdp::bfloat16>>);
static_assert(fsdp::PrecisionPolicy<fsdp::precision::mixed<fsdp::float16, float, fsdp::float16>>);
static_assert(!fsdp::PrecisionPolicy<archetype::double_master> && !fsdp::PrecisionPolicy<archetype::double_compute>);
static_assert(fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16>>() ==
              fsdp::precision_facts{fsdp::dtype::bf16, fsdp::dtype::f32, fsdp::dtype::f32});
static_assert(std::is_same_v<fsdp::precision::full, fsdp::precision::mixed<float>>);
static_assert(!fsdp::PrecisionPolicy<archetype::gathered_in<fsdp::bfloat16, float>>);
static_assert(!fsdp::PrecisionPolicy<archetype::gathered_in<fsdp::bfloat16, fsdp::float16>>);
static_assert(!fsdp::PrecisionPolicy<archetype::gathered_in<float, double>>);
static_assert(fsdp::PrecisionPolicy<archetype::gathered_in<float, fsdp::float16>>);
static_assert(std::is_same_v<fsdp::precision::wire<fsdp::bfloat16>,
                             fsdp::precision::mixed<float, float, float, fsdp::bfloat16>>);
static_assert(fsdp::PrecisionPolicy<fsdp::precision::scaled<fsdp::float8_e4m3, 128>>);
static_assert(fsdp::facts_of_precision<fsdp::precision::scaled<fsdp::float8_e5m2, 32, float>>() ==
              fsdp::precision_facts{fsdp::dtype::f32, fsdp::dtype::f32, fsdp::dtype::f32, fsdp::dtype::f8e5m2, 32});
static_assert(fsdp::facts_of_precision<fsdp::precision::scaled<std::int8_t, 64>>() ==
              fsdp::precision_facts{fsdp::dtype::bf16, fsdp::dtype::f32, fsdp::dtype::f32, fsdp::dtype::i8, 64});
static_assert(fsdp::dtype_of_v<std::int8_t> == fsdp::dtype::i8 && !fsdp::ElementType<std::uint8_t>);
/// An fp8 gather without a block, and a block without an fp8 gather: both refused.
struct fp8_without_block {
  using precision_concept = fsdp::precision_tag;
  using compute_type = fsdp::bfloat16;
  using master_type = float;
  using reduce_type = float;
  using gather_type = fsdp::float8_e4m3;
};
struct block_without_fp8 {
  using precision_concept = fsdp::precision_tag;
  using compute_type = float;
  using master_type = float;
  using reduce_type = float;
  using gather_type = fsdp::bfloat16;
  static constexpr int gather_block = 16;
};
struct block_of_six : fp8_without_block {
  static constexpr int gather_block = 6;  // the scales would lose their 4-byte alignment
};
static_assert(!fsdp::PrecisionPolicy<fp8_without_block> && !fsdp::PrecisionPolicy<block_without_fp8> &&
              !fsdp::PrecisionPolicy<block_of_six>);
/// The same for the reduction: an 8-bit reduce type without its block, and a reduce block over a plain type.
struct int8_reduce_without_block : fp8_without_block {
  using reduce_type = std::int8_t;
  static constexpr int gather_block = 16;
};
struct reduce_block_without_int8 : fp8_without_block {
  static constexpr int gather_block = 16;
  static constexpr int reduce_block = 16;
};
struct int8_reduce_block_of_six : int8_reduce_without_block {
  static constexpr int reduce_block = 6;
};
static_assert(!fsdp::PrecisionPolicy<int8_reduce_without_block> && !fsdp::PrecisionPolicy<reduce_block_without_int8> &&
              !fsdp::PrecisionPolicy<int8_reduce_block_of_six>);
static_assert(fsdp::PrecisionPolicy<fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>>);
static_assert(fsdp::facts_of_precision<fsdp::precision::scaled<fsdp::float8_e4m3, 32, float, fsdp::float8_e5m2>>() ==
              fsdp::precision_facts{fsdp::dtype::f32, fsdp::dtype::f32, fsdp::dtype::f8e5m2, fsdp::dtype::f8e4m3, 32,
                                    32});
static_assert(fsdp::facts_of_precision<fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>>()
                  .quantizes_reduction() &&
              !fsdp::facts_of_precision<fsdp::precision::scaled<std::int8_t, 16>>().quantizes_reduction());
static_assert(fsdp::facts_of_precision<fsdp::precision::wire<fsdp::bfloat16>>() ==
              fsdp::precision_facts{fsdp::dtype::f32, fsdp::dtype::f32, fsdp::dtype::f32, fsdp::dtype::bf16});
static_assert(fsdp::facts_of_precision<fsdp::precision::wire<fsdp::bfloat16>>().widens() &&
              !fsdp::facts_of_precision<fsdp::precision::mixed<fsdp::bfloat16>>().widens());
static_assert(!fsdp::PrefetchPolicy<archetype::prefetch_without_timing>);
static_assert(fsdp::PrecisionPolicy<fsdp::precision::full> && !fsdp::PrecisionPolicy<float>);

// The strategies' facts, as the scheduler reads them.
static_assert(fsdp::facts_of<fsdp::sharding::full_shard>(8).shard_group == 8);
static_assert(fsdp::facts_of<fsdp::sharding::no_shard>(8).shard_group == 1);
static_assert(fsdp::facts_of<fsdp::sharding::no_shard>(8).replicate_group == 8);
static_assert(!fsdp::sharding::shard_grad_op::reshard_after_forward &&
              fsdp::sharding::full_shard::reshard_after_forward);

// Policy composition and defaults.
using P = fsdp::policy<fsdp::sharding::full_shard>;
static_assert(std::is_same_v<P::prefetch, fsdp::prefetch::next>);
static_assert(std::is_same_v<P::communicator, fsdp::comm::local_communicator>);
static_assert(std::is_same_v<P::backend_type, fsdp::backend::host>);
static_assert(std::is_same_v<fsdp::Model<P>::unit_type, fsdp::FsdpUnit<fsdp::backend::host>>);
using B = fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>>;
static_assert(std::is_same_v<fsdp::Model<B>::unit_type, fsdp::FsdpUnit<fsdp::backend::host, fsdp::bfloat16>>);
static_assert(fsdp::same_dtype<fsdp::bfloat16, B::precision::compute_type>() &&
              !fsdp::same_dtype<float, fsdp::bfloat16>());

// A Model<P> is its core's code (fsdp/model_core.hpp): every policy of one backend and communicator has the same
// model_core, whatever its strategy, prefetch, precision or offload; basic_model adds the compute dtype's views. The
// optimizers deduce to the core, so their code is shared too (compile time: docs/build.md).
using host_core = fsdp::model_core<fsdp::backend::host, fsdp::comm::local_communicator>;
using H = fsdp::policy<fsdp::sharding::hybrid_shard<2>, fsdp::prefetch::none, fsdp::precision::mixed<fsdp::bfloat16>,
                       fsdp::comm::local<>, fsdp::offload::cpu<fsdp::offload::params>>;
static_assert(std::is_same_v<fsdp::Model<P>::core_type, host_core>);
static_assert(std::is_same_v<fsdp::Model<B>::core_type, host_core>);
static_assert(std::is_same_v<fsdp::Model<H>::core_type, host_core>);
static_assert(std::is_base_of_v<host_core, fsdp::Model<P>> && std::is_base_of_v<host_core, fsdp::Model<H>>);
static_assert(std::is_base_of_v<fsdp::basic_model<fsdp::backend::host, fsdp::comm::local_communicator, fsdp::bfloat16>,
                                fsdp::Model<B>>);
static_assert(std::is_base_of_v<fsdp::basic_model<fsdp::backend::host, fsdp::comm::local_communicator, fsdp::bfloat16>,
                                fsdp::Model<H>>);
static_assert(std::is_same_v<decltype(fsdp::optim::adamw(std::declval<fsdp::Model<P>&>(),
                                                         fsdp::optim::adamw_options{})),
                             fsdp::optim::adamw<host_core>>);
static_assert(std::is_same_v<decltype(fsdp::optim::sgd(std::declval<fsdp::Model<H>&>(), fsdp::optim::sgd_options{})),
                             fsdp::optim::sgd<host_core>>);
static_assert(std::is_same_v<decltype(fsdp::optim::elementwise(std::declval<fsdp::Model<B>&>(), "rule",
                                                               std::vector<std::string>{})),
                             fsdp::optim::elementwise<host_core>>);
// An optimizer over the policy's own Model type, named so, is still one (and compiles for that policy alone).
static_assert(std::is_base_of_v<fsdp::optim::elementwise<fsdp::Model<P>>, fsdp::optim::adamw<fsdp::Model<P>>>);

// Host buffers and events are move-only / shared handles as the scheduler expects.
static_assert(std::is_nothrow_move_constructible_v<fsdp::backend::host::buffer>);
static_assert(!std::is_copy_constructible_v<fsdp::backend::host::buffer>);
static_assert(!std::is_copy_constructible_v<fsdp::Model<P>>);
// Nor movable: units, views and the streams' callbacks hold its address.
static_assert(!std::is_move_constructible_v<fsdp::Model<P>> && !std::is_move_constructible_v<fsdp::Model<H>>);

// A unit's fp32 shards are read-only to a trainer; the library writes them through model_access (the optimizers, a
// load, an import, a reshard). Before, FsdpUnit gave anyone a float*.
using trainer_unit = fsdp::FsdpUnit<fsdp::backend::host, float>;
static_assert(std::is_same_v<decltype(std::declval<const trainer_unit&>().master_shard()), const float*>);
static_assert(std::is_same_v<decltype(std::declval<const trainer_unit&>().grad_shard()), const float*>);
static_assert(std::is_same_v<decltype(fsdp::model_access::master_shard(std::declval<const trainer_unit&>())), float*>);
static_assert(std::is_same_v<decltype(fsdp::model_access::grad_shard(std::declval<const trainer_unit&>())), float*>);

// A model's plans are free functions beside the planners (fsdp/model_plans.hpp), not members: the model core does not
// read the timeline planner or the listing. Before, Model had plan_memory, plan_timeline and list_step.
template <class M>
concept plan_memory_member = requires(const M& m) { m.plan_memory(2); };
template <class M>
concept plan_timeline_member = requires(const M& m) { m.plan_timeline(fsdp::time_model{}, 2); };
template <class M>
concept list_step_member = requires(const M& m) { m.list_step(2); };
static_assert(!plan_memory_member<fsdp::Model<P>> && !plan_timeline_member<fsdp::Model<P>> &&
              !list_step_member<fsdp::Model<P>>);
static_assert(std::is_same_v<decltype(fsdp::plan_memory(std::declval<const fsdp::Model<P>&>(),
                                                        std::declval<const fsdp::optim::adamw<fsdp::Model<P>>&>())),
                             fsdp::memory_plan>);
static_assert(std::is_same_v<decltype(fsdp::list_step(std::declval<const fsdp::Model<P>&>(), 2)), fsdp::step_listing>);

/// A trainer's loop over basic_model, as a program of many policies writes it (examples/01_mlp_host): a Model<P>
/// argument deduces it, and its units are typed in the compute dtype.
template <class Backend, class C, class T>
std::vector<std::string> pass_order(fsdp::basic_model<Backend, C, T>& model) {
  std::vector<std::string> seen;
  for (auto& u : model.forward()) {
    static_assert(std::is_same_v<decltype(u.param("")), fsdp::tensor_view<T>>);
    seen.push_back("forward " + u.name() + " " + std::to_string(u.param(u.name() + ".w").numel()));
  }
  for (auto& u : model.backward())
    seen.push_back("backward " + u.name() + " " + std::to_string(u.grad(u.name() + ".w").numel()));
  return seen;
}

TEST_CASE("a communicator without an optional capability gets what the list gives in its place") {
  archetype::communicator c;
  fsdp::comm::label_next(c, "unit 0");  // no label(): nothing to do
  CHECK_FALSE(fsdp::comm::serial_collectives(c));
  CHECK(fsdp::comm::device_bytes(c) == 0);
  CHECK(fsdp::comm::connect_bytes(c) == 0);
  const archetype::measured_only m;
  CHECK(fsdp::comm::device_bytes(m) == (1 << 20));
  CHECK(fsdp::comm::connect_bytes(m) == 0);
  fsdp_test::run_ranks(1, [](fsdp::comm::local_communicator& l) {
    CHECK_FALSE(fsdp::comm::serial_collectives(l));  // its own answer: comm::local's collectives overlap
    CHECK(fsdp::comm::device_bytes(l) == 0);
  });
}

TEST_CASE("a loop over basic_model runs the passes of models of different policies") {
  fsdp::ModelSpec spec;
  spec.add("a.w", {5, 3}).add("b.w", {7});
  const fsdp::wrap::by_function by_letter{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
  const std::vector<std::string> expected{"forward a 15", "forward b 7", "backward b 7", "backward a 15"};
  fsdp_test::run_ranks(2, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<P> fp32(c, spec, by_letter);
    fsdp::Model<B> bf16(c, spec, by_letter);
    CHECK(pass_order(fp32) == expected);
    CHECK(pass_order(bf16) == expected);
  });
}

TEST_CASE(
    "a trainer's struct keeps a model chosen at run time: std::unique_ptr<basic_model<B, C, T>>, and its "
    "optimizer as adamw<model_core<B, C>>") {
  using host = fsdp::backend::host;
  using local = fsdp::comm::local_communicator;
  static_assert(std::has_virtual_destructor_v<fsdp::basic_model<host, local, float>>);
  struct trainer {  // as a C trainer's struct owns its parameters: the optimizer after the model, so it goes first
    std::unique_ptr<fsdp::basic_model<host, local, float>> model;
    std::optional<fsdp::optim::adamw<fsdp::model_core<host, local>>> opt;
  };
  fsdp::ModelSpec spec;
  spec.add("a.w", {5, 3}).add("b.w", {7});
  const fsdp::wrap::by_function by_letter{[](const fsdp::ParamSpec& p) { return p.name.substr(0, 1); }};
  fsdp_test::run_ranks(2, [&](local& c) {
    for (const char* name : {"full_shard", "shard_grad_op", "no_shard"}) {
      CAPTURE(name);
      trainer t;
      t.model = fsdp::select(
          "--strategy", name,
          [&](auto s) -> std::unique_ptr<fsdp::basic_model<host, local, float>> {
            return std::make_unique<fsdp::Model<fsdp::policy<typename decltype(s)::type>>>(c, spec, by_letter);
          },
          fsdp::by_name<fsdp::sharding::full_shard, fsdp::sharding::shard_grad_op, fsdp::sharding::no_shard>());
      t.opt.emplace(*t.model, fsdp::optim::adamw_options{.lr = 0.1f});
      c.reset_stats();
      for (auto& u : t.model->forward()) (void)u.param(u.name() + ".w");
      for (auto& u : t.model->backward()) u.grad(u.name() + ".w")[0] = 1.0f;
      t.opt->step();
      t.opt->zero_grad();
      t.model->synchronize();
      // the strategy named at run time is the one that ran: b gathered twice under full_shard (a, the first unit,
      // kept into its backward), each unit once under shard_grad_op, none under no_shard (all-reduced instead); and
      // the step's commit, one all-reduce over the world (model_options::commit_step)
      const std::string n = name;
      CHECK(c.stats()[fsdp::collective::all_gather] == (n == "full_shard" ? 3u : n == "shard_grad_op" ? 2u : 0u));
      CHECK(c.stats()[fsdp::collective::all_reduce] == (n == "no_shard" ? 2u : 0u) + 1u);
    }  // the trainer goes: its optimizer, then its model through the base pointer
  });
}

TEST_CASE("a user-defined strategy plugs into the scheduler through its facts alone") {
  fsdp::ModelSpec spec;
  spec.add("a.w", {5, 3}).add("b.w", {7});
  fsdp_test::run_ranks(2, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<fsdp::policy<archetype::strategy>> m(c, spec, fsdp::wrap::by_function{[](const fsdp::ParamSpec& p) {
                                                       return p.name.substr(0, 1);
                                                     }});
    for (auto& u : m.forward()) (void)u;
    for (auto& u : m.backward()) (void)u;
    m.synchronize();
    // the ranks' agreement at construction (fsdp/agree/agree.hpp), then b gathered twice (resharded after forward)
    // and a, the first unit of the forward pass, once (kept into its backward by default)
    CHECK(c.stats()[fsdp::collective::all_gather] == 1 + 3);
    CHECK(c.stats()[fsdp::collective::reduce_scatter] == 2);
  });
}

namespace archetype {
/// Shards over half the world: a hybrid strategy (2 replicas of a shard group of world / 2).
struct half_world {
  using sharding_concept = fsdp::sharding_tag;
  static constexpr std::string_view name = "half_world";
  static constexpr bool shards_params = true;
  static constexpr bool reshard_after_forward = true;
  static constexpr int shard_group_size(int w) { return w > 1 ? w / 2 : 1; }
  static constexpr int replicate_group_size(int w) { return w > 1 ? 2 : 1; }
};

/// A user's communicator over comm::local that has every collective but no split(color, key).
struct unsplittable {
  using backend_type = fsdp::backend::host;
  using stream = backend_type::stream;
  fsdp::comm::local_communicator* c;
  int rank() const { return c->rank(); }
  int size() const { return c->size(); }
  void all_gather(const void* s, void* r, std::int64_t n, fsdp::dtype t, stream& st) { c->all_gather(s, r, n, t, st); }
  void reduce_scatter(const void* s, void* r, std::int64_t n, fsdp::dtype t, fsdp::reduce_op op, stream& st) {
    c->reduce_scatter(s, r, n, t, op, st);
  }
  void all_reduce(const void* s, void* r, std::int64_t n, fsdp::dtype t, fsdp::reduce_op op, stream& st) {
    c->all_reduce(s, r, n, t, op, st);
  }
  void broadcast(const void* s, void* r, std::int64_t n, fsdp::dtype t, int root, stream& st) {
    c->broadcast(s, r, n, t, root, st);
  }
  void barrier() { c->barrier(); }
  fsdp::collective_stats stats() const { return c->stats(); }
};
struct unsplittable_comm {
  using backend_type = fsdp::backend::host;
  using communicator = unsplittable;
};
}  // namespace archetype

TEST_CASE("a strategy whose shard group is neither one rank nor the world: hybrid on a communicator that splits") {
  // Accepted by the concept (it cannot know the world size). Before hybrid sharding, the first forward at 4 ranks
  // all-gathered the whole world into a buffer laid out for 2 ranks (a heap-buffer-overflow), then the model
  // refused it; now comm::local splits into a 2 x 2 mesh, and a communicator without split is refused.
  fsdp::ModelSpec spec;
  spec.add("a.w", {5, 3}).add("b.w", {7});
  fsdp_test::run_ranks(4, [&](fsdp::comm::local_communicator& c) {
    fsdp::Model<fsdp::policy<archetype::half_world>> m(c, spec, fsdp::wrap::by_size{8});
    CHECK(m.mesh().replicas == 2);
    CHECK(m.mesh().shards == 2);
    CHECK(m.shard_comm().size() == 2);
    CHECK(m.shard_comm().rank() == c.rank() % 2);
    REQUIRE(m.replicate_comm() != nullptr);
    CHECK(m.replicate_comm()->size() == 2);
    CHECK(m.replicate_comm()->rank() == c.rank() / 2);
    archetype::unsplittable u{&c};
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<archetype::half_world, fsdp::prefetch::next, fsdp::precision::full,
                                     archetype::unsplittable_comm>>(u, spec, fsdp::wrap::by_size{8});
          }) == "fsdp: sharding strategy half_world shards over 2 of 4 ranks and replicates over 2 (hybrid sharding), "
                "which needs a communicator with split(color, key) to make the shard and replicate groups; this "
                "policy's communicator has none (comm::local on the host, comm::mpi and comm::nccl do)");
  });
  fsdp_test::run_ranks(1, [&](fsdp::comm::local_communicator& c) {  // at one rank it is full_shard
    fsdp::Model<fsdp::policy<archetype::half_world>> m(c, spec, fsdp::wrap::by_size{8});
    CHECK(m.mesh().shards == 1);
  });
  // tensor groups need split too, whatever the strategy
  fsdp_test::run_ranks(2, [&](fsdp::comm::local_communicator& c) {
    archetype::unsplittable u{&c};
    fsdp::model_options o;
    o.tensor_parallel = 2;
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::full,
                                     archetype::unsplittable_comm>>(u, spec, fsdp::wrap::by_size{8},
                                                                    fsdp::init::normal{}, o);
          }) ==
          "fsdp: model_options::tensor_parallel = 2 needs a communicator with split(color, key) to make the "
          "tensor and data-parallel groups; this policy's communicator has none (comm::local on the host, "
          "comm::mpi and comm::nccl do)");
  });
}

TEST_CASE("a quantized reduction on a communicator without all_to_all is refused, naming the ones that have it") {
  static_assert(!fsdp::AllToAllCollective<archetype::unsplittable>);
  fsdp::ModelSpec spec;
  spec.add("a.w", {5, 3}).add("b.w", {7});
  fsdp_test::run_ranks(2, [&](fsdp::comm::local_communicator& c) {
    archetype::unsplittable u{&c};
    CHECK(fsdp_test::error_of<fsdp::usage_error>([&] {
            fsdp::Model<fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next,
                                     fsdp::precision::scaled<std::int8_t, 16, fsdp::bfloat16, std::int8_t>,
                                     archetype::unsplittable_comm>>(u, spec, fsdp::wrap::by_size{8});
          }) == "fsdp: the precision reduces gradients quantized to i8 in blocks of 16 (all_to_all, then a sum in "
                "fp32), and this policy's communicator has no all_to_all (fsdp::AllToAllCollective: comm::local, "
                "comm::mpi and comm::nccl have it)");
  });
}
