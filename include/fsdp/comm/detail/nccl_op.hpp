#pragma once
// One NCCL collective as comm::nccl's messages name it (nccl_op: kind, count, dtype, sequence, unit) and the NCCL
// function behind each collective. Host-only.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "fsdp/comm/concept.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::comm::detail {

/// One collective as messages name it.
struct nccl_op {
  std::uint64_t seq = 0;
  collective kind = collective::all_gather;
  std::int64_t count = 0;
  dtype type = dtype::f32;
  std::string unit;
  std::chrono::steady_clock::time_point issued{};

  /// "all_gather(count=8, f32) #3 for unit 'h.1'"
  std::string str() const {
    return fsdp::detail::cat(name_of(kind), "(count=", count, ", ", name_of(type), ") #", seq, " for unit '", unit,
                             "'");
  }
};

/// The NCCL function behind a collective, for messages.
constexpr std::string_view nccl_function(collective c) noexcept {
  switch (c) {
    case collective::all_gather: return "ncclAllGather";
    case collective::reduce_scatter: return "ncclReduceScatter";
    case collective::all_reduce: return "ncclAllReduce";
    case collective::broadcast: return "ncclBroadcast";
    case collective::all_to_all:
    case collective::all_to_all_v: return "ncclSend/ncclRecv";  // grouped, one pair per rank
  }
  return "?";
}

}  // namespace fsdp::comm::detail
