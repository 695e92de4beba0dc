#!/usr/bin/env bash
# Runs tests/mpi/mpi_test.cc's program under mpirun at 4 processes, three times:
#   1. every test case outside the "failure" suite; mpirun's exit status must be 0 and every rank must report its
#      test cases, none failed;
#   2. "a rank that returns without issuing a collective": ranks 0-2 must print the timeout of all_gather #1 and of
#      the set-up of a stream's communicator, and every rank (3 too) must report its test case passed;
#   3. "a rank killed in the middle of training": rank 3 raises SIGKILL; ranks 0-2 must print the timeout of step 3's
#      first all-gather and report their test case passed; rank 3 reports nothing; then the same with rank 3 killed
#      after entering the forward's second unit, the backward's second unit, and right before the step;
#      then hybrid sharding at 2 x 4 and 4 x 2 at 8 processes against comm::run_local;
#   4. once without mpirun, with torchrun's RANK / WORLD_SIZE: comm::mpi must refuse, naming mpirun;
#   5. once more with srun's SLURM_* variables (srun without PMI support): refused, naming srun --mpi=pmix.
# mpirun kills the whole job when a process dies or exits non-zero, before the others have said anything; with
# --enable-recovery it lets them run on (and then always exits 0, so runs 2 and 3 are judged by the printed lines
# alone). Every launch runs under mpirun --timeout and an outer `timeout -k`, so nothing can hang.
# (Run 1's test cases run at 4 processes; CHECKs inside the failure cases compare the whole messages too.)
# Usage: run_mpi_test.sh PROGRAM  (CTest and the sh_test pass the built program; MPIRUN overrides `mpirun`)
set -uo pipefail
prog="$1"
limit=150  # seconds for the first launch (about 5 s on 2 cores), then 60 s for each failure case (about 3 s)
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}"
failures=0

# launch NAME [mpirun options] -- [program options]: output in $out/NAME.log, mpirun's status in $rc
launch() {
  local name="$1"
  shift
  local opts=()
  while [[ "$1" != "--" ]]; do opts+=("$1"); shift; done
  shift
  local start=${SECONDS}
  timeout -k 10 $((limit + 20)) "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe --timeout "${limit}" -np "${np:-4}" "${opts[@]}" \
    "${prog}" --no-colors=true "$@" >"${out}/${name}.log" 2>&1
  rc=$?
  echo "${name}: mpirun exited ${rc} after $((SECONDS - start)) s"
}

# expect NAME LINE: LINE (exactly, after the elapsed time "after 2.0 s" is written "after T s") is in NAME's log
expect() {
  if sed -E 's/ caught after [0-9.]+ s: / caught after T s: /' "${out}/$1.log" | grep -Fxq -- "$2"; then
    echo "  ok: $2"
  else
    echo "  MISSING: $2"
    failures=$((failures + 1))
  fi
}
# expect_count NAME REGEX N: N lines of NAME's log match REGEX
expect_count() {
  local n
  n=$(grep -cE -- "$2" "${out}/$1.log")
  if [[ "${n}" -eq "$3" ]]; then echo "  ok: $3 line(s) match '$2'"; else
    echo "  WRONG: ${n} line(s) match '$2', expected $3"
    failures=$((failures + 1))
  fi
}
show_on_failure() {
  if [[ ${failures} -ne $1 ]]; then echo "---- $2.log ----"; cat "${out}/$2.log"; echo "---- end of $2.log ----"; fi
}

why=": the other ranks did not complete it (a peer process died, or does not issue the same collectives in the same order; raise mpi_options::timeout if a peer is only slow)"

# 1. collectives and Model parity
before=${failures}
launch collectives -- --test-suite-exclude=failure,world8
if [[ ${rc} -ne 0 ]]; then echo "  WRONG: mpirun exited ${rc}"; failures=$((failures + 1)); fi
# As many as the program has outside those suites (the checkpoint case is compiled only where nlohmann-json is).
cases=$("${prog}" --no-colors=true --list-test-cases --test-suite-exclude=failure,world8 2>/dev/null |
  sed -nE 's/^\[doctest\] unskipped test cases passing the current filters: ([0-9]+)$/\1/p')
[[ -n "${cases}" ]] || { echo "  WRONG: ${prog} did not list its test cases"; failures=$((failures + 1)); cases=0; }
for r in 0 1 2 3; do expect_count collectives "^rank ${r} of 4: ${cases} test cases, 0 failed, [0-9]+ assertions, 0 failed$" 1; done
show_on_failure "${before}" collectives

# 2. a rank returns without issuing
limit=60
before=${failures}
launch returns --enable-recovery -- "--test-case=*returns without issuing*" --no-skip=true
for r in 0 1 2; do
  expect returns "rank ${r} caught after T s: fsdp: mpi all_gather(count=8, f32) #1 for unit 'probe' on rank ${r} of 4 timed out after 2000 ms${why}"
  expect returns "rank ${r} caught after T s: fsdp: mpi all_reduce(count=8, f32, avg) #0 on rank ${r} of 4 timed out after 2000 ms while setting up this stream's communicator (MPI_Comm_idup)${why}"
done
for r in 0 1 2 3; do expect_count returns "^rank ${r} of 4: 1 test cases, 0 failed, [0-9]+ assertions, 0 failed$" 1; done
expect_count returns "^rank 3 caught" 0
show_on_failure "${before}" returns

# 3. a rank killed in the middle of training
before=${failures}
launch killed --enable-recovery -- "--test-case=*killed in the middle of training*" --no-skip=true
for r in 0 1 2; do
  expect killed "rank ${r} caught after T s: fsdp: mpi all_gather(count=48, f32) #31 for unit 'root' on rank ${r} of 4 timed out after 2000 ms${why}"
  expect_count killed "^rank ${r} of 4: 1 test cases, 0 failed, [0-9]+ assertions, 0 failed$" 1
done
expect_count killed "^rank 3 " 0
show_on_failure "${before}" killed

# 3b. a rank killed in the forward, the backward or right before the step (FSDP_KILL_AT): the others time out
# within the bound, each printing one error that names an mpi collective (the test case checks which kind)
for at in forward backward step; do
  before=${failures}
  launch "killed_${at}" --enable-recovery -x "FSDP_KILL_AT=${at}" -- "--test-case=*killed in the forward*" \
    --no-skip=true
  for r in 0 1 2; do
    expect_count "killed_${at}" "^rank ${r} caught after [0-9.]+ s: fsdp: .*mpi .* of 4 timed out after 2000 ms" 1
    expect_count "killed_${at}" "^rank ${r} of 4: 1 test cases, 0 failed, [0-9]+ assertions, 0 failed$" 1
  done
  expect_count "killed_${at}" "^rank 3 " 0
  show_on_failure "${before}" "killed_${at}"
done

# 3c. hybrid sharding at 2 x 4 (and 4 x 2) on 8 processes, bit for bit against comm::run_local at world 8
limit=150
before=${failures}
np=8 launch world8 -- --test-suite=world8
if [[ ${rc} -ne 0 ]]; then echo "  WRONG: mpirun exited ${rc}"; failures=$((failures + 1)); fi
for r in 0 1 2 3 4 5 6 7; do expect_count world8 "^rank ${r} of 8: 1 test cases, 0 failed, [0-9]+ assertions, 0 failed$" 1; done
show_on_failure "${before}" world8

# 4 and 5. without mpirun, as another launcher would start it: refused (Open MPI initialises the process alone, as
# a world of 1). refused NAME CASE VAR=VALUE...: runs the test case CASE once, alone, with the launcher's variables.
refused() {
  local name=$1 case=$2
  shift 2
  before=${failures}
  local start=${SECONDS}
  env -u OMPI_COMM_WORLD_SIZE "$@" timeout -k 10 60 "${prog}" --no-colors=true "--test-case=${case}" --no-skip=true \
    >"${out}/${name}.log" 2>&1
  rc=$?
  echo "${name}: exited ${rc} after $((SECONDS - start)) s"
  if [[ ${rc} -ne 0 ]]; then echo "  WRONG: exited ${rc}"; failures=$((failures + 1)); fi
  expect_count "${name}" "^rank 0 of 1: 1 test cases, 0 failed, [0-9]+ assertions, 0 failed$" 1
  show_on_failure "${before}" "${name}"
}
refused torchrun "*started by torchrun*" WORLD_SIZE=2 RANK=0 LOCAL_RANK=0
refused srun "*started by srun*" SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0  # srun without PMI support

if [[ ${failures} -ne 0 ]]; then
  echo "run_mpi_test: ${failures} check(s) failed (logs in ${out})"
  exit 1
fi
echo "run_mpi_test: all checks passed"
if [[ -z "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]]; then rm -rf "${out}"; fi  # CTest: no logs left behind when all passed
