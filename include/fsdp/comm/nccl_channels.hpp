#pragma once
// comm::nccl's channel choice (nccl_options::channels, fsdp/comm/nccl.cuh), public and host-compilable: the
// decisions over it are made in fsdp/comm/detail/nccl_logic.hpp and the timeline planner models it
// (time_model::serial_collectives).

namespace fsdp::comm {

/// Which NCCL communicators a comm::nccl group issues its collectives on (nccl_options::channels).
///
///   one          every collective on the group's one communicator (the default). NCCL runs a communicator's
///                collectives in the order they were issued, whatever the stream, and every rank issues in program
///                order: one order on every rank, by construction. The gather and reduce streams' collectives then
///                run one after the other (each still overlaps compute), as PyTorch FSDP2's do on its one process
///                group. No communicator is made after construction.
///   per_stream   one communicator per stream name, split from the group's on the stream's first collective, so that
///                a prefetched all-gather never queues behind a reduce-scatter. NCCL's guide ("Using multiple NCCL
///                communicators concurrently") requires operations on different communicators to be ordered the
///                same on every rank, and each rank's GPU order here depends on its own event waits: safe only where
///                NCCL orders the launches of one device's communicators by their host order, which NCCL 2.26 and
///                later do with NCCL_LAUNCH_ORDER_IMPLICIT=1 (NCCL 2.28.9's environment variables,
///                NCCL_LAUNCH_ORDER_IMPLICIT; off by default). comm::nccl refuses it otherwise (per_stream_refusal).
///                Its communicators are split during the first step, outside the memory plan.
enum class nccl_channels { one, per_stream };

}  // namespace fsdp::comm
