#!/usr/bin/env bash
# make sanitize / scripts/sanitize.sh: the test suite under sanitizers, one summary line each.
#   address,undefined  every test (MPI ones under mpiexec, the options passed to the ranks with
#                      -x), built in build-asan/; LeakSanitizer suppresses only Open MPI's own
#                      leaks (tests/sanitize/lsan.supp).
#   thread             the threads-backend suites (ctest -L threads), built in build-tsan/.
# The sanitizer runtime options come from the tests' ctest ENVIRONMENT (tests/CMakeLists.txt);
# under TSan test_parallel runs one case in eight (GoogleTest sharding). Exits non-zero if any
# test fails.
# Environment: JOBS (default 2), SANITIZE_ONLY=asan|tsan (one half), CXX (compiler).
# Every test runs with SEQPAR_POISON_UNINITIALIZED=1: storage a tensor gets without its zero fill
# (Tensor::uninitialized) is filled with NaN instead, so an output element left unwritten fails
# the test that reads it.
set -uo pipefail
export SEQPAR_POISON_UNINITIALIZED=1
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
ONLY=${SANITIZE_ONLY:-}
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

summaries=()
status=0

# run_half NAME BUILD_DIR SANITIZERS "TARGETS" "CTEST_ARGS" CMAKE_ARGS...
run_half() {
  local name=$1 build=$2 sanitizers=$3 targets=$4 ctest_args=$5
  shift 5
  local start=$SECONDS
  mkdir -p "$build"
  if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEQPAR_SANITIZE="$sanitizers" \
    -DSEQPAR_BUILD_BENCH=OFF "${LAUNCHER[@]}" "$@" >"$build/configure.log" 2>&1; then
    cat "$build/configure.log"
    summaries+=("sanitize $name: configure FAILED (log: $build/configure.log)")
    status=1
    return
  fi
  local build_args=()
  for t in $targets; do build_args+=(--target "$t"); done
  if ! cmake --build "$build" -j"$JOBS" "${build_args[@]}" >"$build/build.log" 2>&1; then
    tail -n 40 "$build/build.log"
    summaries+=("sanitize $name: build FAILED (log: $build/build.log)")
    status=1
    return
  fi
  local built=$((SECONDS - start))
  # shellcheck disable=SC2086
  ctest --test-dir "$build" --output-on-failure -j"$JOBS" --timeout 900 $ctest_args \
    2>&1 | tee "$build/ctest.log"
  local rc=${PIPESTATUS[0]}
  local tally
  tally=$(grep -E '^[0-9]+% tests passed' "$build/ctest.log" | tail -n 1)
  if [ "$rc" -eq 0 ]; then
    summaries+=("sanitize $name: ok, ${tally:-no tests}; build ${built} s, total $((SECONDS - start)) s")
  else
    local failed
    failed=$(sed -n '/The following tests FAILED/,$p' "$build/ctest.log" | grep -E '^\s+[0-9]+ - ' |
      sed -E 's/^\s+[0-9]+ - //' | tr '\n' ' ')
    summaries+=("sanitize $name: FAILED, ${tally:-?}: ${failed}(log: $build/ctest.log); total $((SECONDS - start)) s")
    status=1
  fi
}

if [ -z "$ONLY" ] || [ "$ONLY" = asan ]; then
  # The Python tests (label python) compare against references, the docs tests (label docs)
  # replay the documented command lines the CLI suites cover: they run in make test only.
  run_half "address,undefined" build-asan address,undefined "all" "-LE python|docs"
fi
if [ -z "$ONLY" ] || [ "$ONLY" = tsan ]; then
  # MPI is not run under TSan: the threads suites link the MPI-free communicator stub.
  run_half "thread" build-tsan thread "test_team test_comm_threads test_parallel" "-L threads" \
    -DSEQPAR_WITH_MPI=OFF
fi

for s in "${summaries[@]}"; do echo "$s"; done
exit $status
