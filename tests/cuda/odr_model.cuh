#pragma once
// The model part of the ODR check, instantiated in both CUDA translation units (odr_a.cu, odr_b.cu): the model,
// its executor, scheduler, optimizer and kernels on the CUDA backend with both communicators, so that every
// template the library has is emitted twice and the link proves the copies merge. comm::local runs it (with a
// GPU: the test compares the two translation units' results); comm::nccl's instantiation is only compiled.
#include <fsdp/fsdp.cuh>

#include <string>

static_assert(fsdp::CollectivePolicy<fsdp::comm::nccl_communicator>);
static_assert(fsdp::CollectivePolicy<fsdp::comm::local_cuda_communicator>);

template <class CommTag>
using odr_policy =
    fsdp::policy<fsdp::sharding::full_shard, fsdp::prefetch::next, fsdp::precision::mixed<fsdp::bfloat16>, CommTag>;

/// Hybrid sharding over comm::nccl (its split groups, ncclCommSplit): compiled only.
using odr_hybrid_nccl_policy = fsdp::policy<fsdp::sharding::hybrid_shard<2>, fsdp::prefetch::next,
                                            fsdp::precision::mixed<fsdp::bfloat16>, fsdp::comm::nccl>;

/// One AdamW step of a two-unit model under policy P; returns one weight afterwards.
template <class P>
float odr_train_with(typename P::communicator& comm) {
  fsdp::ModelSpec spec;
  spec.add("l0.w", {4, 3}).add("l1.w", {5});
  fsdp::Model<P> m(comm, spec, fsdp::wrap::by_prefix{"l"}, fsdp::init::normal{0.5f, 1});
  fsdp::optim::adamw opt(m, {.lr = 0.1f, .grad = {.max_norm = 1.0f}});
  for (auto& u : m.forward()) (void)u;
  for (auto& u : m.backward()) (void)u;  // zero gradients: AdamW's decay alone moves the weights
  opt.step();
  return fsdp::weights::gather_full_params(m).at("l1.w")[0];
}
template <class CommTag>
float odr_train(typename odr_policy<CommTag>::communicator& comm) {
  return odr_train_with<odr_policy<CommTag>>(comm);
}

/// odr_train on comm::local with one GPU rank, or the "skipped: ..." line without a GPU.
template <class = void>
std::string odr_train_local(float* out) {
  const fsdp::cuda::device_probe p = fsdp::cuda::device_status();
  if (p.count == 0) return "skipped: no CUDA device (" + p.reason + ")";
  fsdp::comm::run_local_cuda(1, [&](fsdp::comm::local_cuda_communicator& c) {
    *out = odr_train<fsdp::comm::local<fsdp::backend::cuda>>(c);
  });
  return {};
}
