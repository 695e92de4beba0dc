#pragma once
// The checkpoint load's definitions (fsdp/checkpoint/detail/load.hpp): included by that header, or compiled once by
// fsdp/checkpoint/src.hpp under FSDP_SEPARATE_COMPILATION (fsdp/core/config.hpp).
#include <string>
#include <vector>

#include "fsdp/checkpoint/detail/load.hpp"
#include "fsdp/checkpoint/directory.hpp"
#include "fsdp/checkpoint/io.hpp"

namespace fsdp::checkpoint::detail {

FSDP_DECL std::vector<io::file> open_files(const std::string& dir, const manifest& man,
                                           const std::vector<std::vector<read_op>>& per_file) {
  std::vector<io::file> files(man.files.size());
  for (std::size_t f = 0; f < man.files.size(); ++f) {
    if (per_file[f].empty()) continue;
    files[f] = io::open_read(dir + "/" + man.files[f].name);
    check_size(files[f], man.files[f]);
  }
  return files;
}

FSDP_DECL std::string names_text(const std::vector<std::string>& names) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "]";
}

}  // namespace fsdp::checkpoint::detail
