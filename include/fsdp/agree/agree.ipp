#pragma once
// The agreement's definitions (fsdp/agree/agree.hpp): included by that header, or compiled once by fsdp/src.hpp
// under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <algorithm>

#include "fsdp/agree/agree.hpp"

namespace fsdp::agree {

FSDP_DECL std::string failure_text(const std::vector<std::pair<int, std::string>>& failed) {
  std::vector<std::pair<std::string, std::vector<int>>> by_message;
  for (const auto& f : failed) {  // not a structured binding: clang 14 cannot capture one in a lambda
    auto it = std::find_if(by_message.begin(), by_message.end(), [&](const auto& m) { return m.first == f.second; });
    if (it == by_message.end()) by_message.push_back({f.second, {f.first}});
    else it->second.push_back(f.first);
  }
  std::string out;
  for (const auto& [message, ranks] : by_message) {
    if (!out.empty()) out += "; ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    out += ": " + message;
  }
  return out;
}

}  // namespace fsdp::agree
