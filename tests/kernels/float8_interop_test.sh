#!/usr/bin/env bash
# The library's fp8 conversions against the `ml_dtypes` Python package (PyPI; tools/with-deps installs it): every
# fp8 pattern to fp32 and every fp32 input to fp8, in both OCP formats (tests/kernels/float8_interop.cc).
set -euo pipefail
bin="$1"
script="$2"
if ! python3 -c "import numpy, ml_dtypes" 2>/dev/null; then
  echo "error: the numpy and ml_dtypes Python packages are missing: tools/with-deps installs them" \
    "(python3 -m pip install numpy ml_dtypes)" >&2
  exit 1
fi
ref="${TEST_TMPDIR:-$(mktemp -d)}/float8_reference.txt"
python3 "${script}" "${ref}"
"${bin}" "${ref}"
