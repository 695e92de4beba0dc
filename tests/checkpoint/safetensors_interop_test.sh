#!/usr/bin/env bash
# The library's safetensors files against the `safetensors` Python package (from PyPI; tools/with-deps installs it):
# the package reads what the library exports, bit for bit, and the library imports what the package writes.
set -euo pipefail
bin="$1"
script="$2"
if ! python3 -c "import numpy, safetensors" 2>/dev/null; then
  echo "error: the numpy and safetensors Python packages are missing: tools/with-deps installs them" \
    "(python3 -m pip install numpy safetensors)" >&2
  exit 1
fi
dir="${TEST_TMPDIR:-$(mktemp -d)}/interop"
rm -rf "${dir}"
mkdir -p "${dir}"
"${bin}" export "${dir}/ours.safetensors" "${dir}/ours-f16.safetensors" "${dir}/ours-ref"
python3 "${script}" "${dir}/ours.safetensors" "${dir}/ours-f16.safetensors" "${dir}/ours-ref" \
  "${dir}/theirs.safetensors" "${dir}/theirs-ref"
"${bin}" import "${dir}/theirs.safetensors" "${dir}/theirs-ref"
