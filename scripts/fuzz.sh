#!/usr/bin/env bash
# make fuzz / scripts/fuzz.sh [SECONDS]: builds the libFuzzer targets of fuzz/ with clang++
# (ASan + UBSan, in build-fuzz/), replays each target's seed corpus (fuzz/corpus/<target>/, the
# regression inputs), then fuzzes each target for SECONDS (default 60). New inputs go to
# build-fuzz/corpus/<target>/, crashing inputs to build-fuzz/crashes/. Prints one line per target
# (time, executions, crashes) and exits non-zero if any target crashed.
# Environment: JOBS (build parallelism, default 2), CXX (default clang++), FUZZ_TARGETS (a subset),
# FUZZ_MAX_LEN (longest generated input, default 16384; seeds replay at full size).
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
JOBS=${JOBS:-2}
BUILD=${FUZZ_BUILD:-build-fuzz}
TARGETS=${FUZZ_TARGETS:-$(ls fuzz/fuzz_*.cc | xargs -n1 basename | sed 's/\.cc$//' | tr '\n' ' ')}
MAX_LEN=${FUZZ_MAX_LEN:-16384}
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

mkdir -p "$BUILD"
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="${CXX:-clang++}" \
  -DSEQPAR_FUZZ=ON -DSEQPAR_SANITIZE=address,undefined -DSEQPAR_BUILD_TESTS=OFF \
  -DSEQPAR_BUILD_BENCH=OFF "${LAUNCHER[@]}" >"$BUILD/configure.log" 2>&1; then
  cat "$BUILD/configure.log"
  echo "fuzz: configure failed" >&2
  exit 2
fi
# Each target on its own, so that one that does not build does not stop the others.
status=0
built=()
for t in $TARGETS; do
  if cmake --build "$BUILD" -j"$JOBS" --target "$t" >"$BUILD/build-$t.log" 2>&1; then
    built+=("$t")
  else
    echo "$t: build FAILED: $(grep -m1 -E 'error' "$BUILD/build-$t.log") (log: $BUILD/build-$t.log)"
    status=2
  fi
done

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for t in "${built[@]}"; do
  bin="$BUILD/fuzz/$t"
  seeds="fuzz/corpus/$t"
  work="$BUILD/corpus/$t"
  crashes="$BUILD/crashes"
  log="$BUILD/$t.log"
  mkdir -p "$work" "$crashes"
  start=$(date +%s)
  # Replay the seeds at full size (a regression run), then fuzz from them for the time given.
  if ! "$bin" -runs=0 -timeout=25 -rss_limit_mb=2048 -artifact_prefix="$crashes/$t-" \
    "$seeds" >"$log" 2>&1; then
    echo "$t: a seed input fails (log: $log)"
    status=1
    continue
  fi
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -timeout=25 -rss_limit_mb=2048 \
    -max_len="$MAX_LEN" -print_final_stats=1 -artifact_prefix="$crashes/$t-" \
    "$work" "$seeds" >>"$log" 2>&1
  rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "$t: ${elapsed} s, ${execs:-?} executions, 1 crash (rc $rc):" \
      "$(grep -m1 -E 'ERROR|SUMMARY' "$log")"
    grep -o "Test unit written to .*" "$log" | sed "s/^/  $t: /"
  else
    echo "$t: ${elapsed} s, ${execs:-?} executions, 0 crashes"
  fi
done
exit $status
