#!/usr/bin/env bash
# What including the library costs a trainer's file: tests/consumer/host_trainer.cc (an 86-line host trainer that
# includes <fsdp/fsdp.hpp>) compiled at -O0 with g++ header-only and in separate-compilation mode
# (-DFSDP_SEPARATE_COMPILATION: the library's non-template code is a program's one other file, fsdp/src.hpp, not
# timed here), beside the baseline measured in the same run: a file that includes the same standard headers and
# nothing else. Prints each one's compile seconds (CPU: user + system, the best of ROUNDS) and preprocessed lines,
# then one JSON line.
#   bench/include_cost.sh [ROUNDS]        (default 3; about 2 minutes on this machine's 2 cores)
# Goal (issue 71): separate mode within 2 s of the standard headers alone, header-only under 10 s.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
rounds="${1:-3}"
cxx="${CXX:-g++}"
flags=(-std=c++20 -O0 -Iinclude -I.)
trainer=tests/consumer/host_trainer.cc
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# The standard headers the trainer's translation unit reads (g++ -H), as one file that includes them all.
"${cxx}" "${flags[@]}" -H -E "${trainer}" -o /dev/null 2>"${work}/headers"
grep -oE '/usr/include/c\+\+/[0-9]+/[a-z_]+$' "${work}/headers" | sed -E 's|.*/||' | sort -u |
  sed -E 's|(.*)|#include <\1>|' >"${work}/std_headers.cc"
echo "int main() { return 0; }" >>"${work}/std_headers.cc"

cpu_seconds() {  # cpu_seconds FILE EXTRA_FLAGS...: the best user + system seconds of `rounds` compiles
  local file="$1" best=""
  shift
  for ((i = 0; i < rounds; ++i)); do
    local t
    t=$({ /usr/bin/time -f '%U %S' "${cxx}" "${flags[@]}" "$@" -c "${file}" -o "${work}/out.o" >/dev/null; } 2>&1 |
      tail -1 | awk '{printf "%.2f", $1 + $2}')
    if [[ -z "${best}" ]] || awk -v a="${t}" -v b="${best}" 'BEGIN { exit !(a < b) }'; then best="${t}"; fi
  done
  echo "${best}"
}
lines() { "${cxx}" "${flags[@]}" "${@:2}" -E "$1" | wc -l; }

std_s=$(cpu_seconds "${work}/std_headers.cc")
std_l=$(lines "${work}/std_headers.cc")
ho_s=$(cpu_seconds "${trainer}")
ho_l=$(lines "${trainer}")
sep_s=$(cpu_seconds "${trainer}" -DFSDP_SEPARATE_COMPILATION)
sep_l=$(lines "${trainer}" -DFSDP_SEPARATE_COMPILATION)
echo "including the library: ${trainer} at -O0 with $("${cxx}" --version | head -1), CPU seconds (best of ${rounds})"
printf '%-44s %10s %14s\n' "translation unit" "seconds" "lines (-E)"
printf '%-44s %10s %14s\n' "the same standard headers alone (baseline)" "${std_s}" "${std_l}"
printf '%-44s %10s %14s\n' "the trainer, header-only" "${ho_s}" "${ho_l}"
printf '%-44s %10s %14s\n' "the trainer, separate mode" "${sep_s}" "${sep_l}"
printf '{"bench":"include","std_s":%s,"header_only_s":%s,"separate_s":%s,"std_lines":%s,"header_only_lines":%s,"separate_lines":%s}\n' \
  "${std_s}" "${ho_s}" "${sep_s}" "${std_l}" "${ho_l}" "${sep_l}"
