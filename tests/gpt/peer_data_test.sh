#!/usr/bin/env bash
# The PyTorch peer trains on the same batches with the same schedule only while its Python copies of the data
# generator and the learning-rate schedule equal gpt_model.hpp's: compares their outputs line by line.
set -euo pipefail
cpp="$1" py="$2" peer="$3"
diff <("${cpp}") <(python3 "${py}" "${peer}") && echo "the peer's data and schedule equal the example's"
