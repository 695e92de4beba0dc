#!/usr/bin/env bash
# The MPI example prints, step for step, the losses the thread-rank example prints at 4 ranks: full_shard in fp32
# and hybrid_shard on a 2 x 2 mesh with bf16 reduction (mpirun -np 4; 10 steps each). Nothing can hang: every
# launch runs under mpirun --timeout and an outer timeout -k.
# Usage: same_losses_test.sh HOST_EXAMPLE MPI_EXAMPLE
set -uo pipefail
host="$1"
mpi="$2"
failures=0
losses() { grep -E '^step +[0-9]+ +loss ' | sed -E 's/ +time .*$//'; }
compare() {  # compare NAME HOST_ARGS -- MPI_ARGS
  local name="$1"
  shift
  local host_args=()
  while [[ "$1" != "--" ]]; do host_args+=("$1"); shift; done
  shift
  local want got
  want=$(timeout -k 10 120 "${host}" --ranks 4 --steps 10 "${host_args[@]}" | losses)
  got=$(timeout -k 10 130 "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe --timeout 120 -np 4 "${mpi}" \
    --steps 10 "$@" | losses)
  if [[ -n "${want}" && "$(wc -l <<<"${want}")" -eq 10 && "${want}" == "${got}" ]]; then
    echo "${name}: the same 10 losses ($(tail -1 <<<"${got}"))"
  else
    echo "${name}: DIFFERENT"
    diff <(echo "${want}") <(echo "${got}")
    failures=$((failures + 1))
  fi
}
compare "full_shard, fp32" --
compare "hybrid_shard 2 x 2, bf16 reduction" --strategy hybrid_shard --shard-group 2 --precision bf16-reduce -- \
  --strategy hybrid_shard --precision bf16-reduce
exit "${failures}"
