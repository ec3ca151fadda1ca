# Helpers shared by the command-line test scripts (sourced; the script sets $bin to seqpar).
# Each check adds to $pass or $fail; the script ends with: echo "...: $pass passed, $fail failed".
pass=0; fail=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }

# json_get '<json>' key: prints the value of key (lists and objects as JSON).
json_get() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); v=d[sys.argv[2]]; print(json.dumps(v) if isinstance(v,(list,dict)) else v)' "$1" "$2"; }

expect_ok() {  # expect_ok <description> <command...>: exit 0 and "ok": true
  local desc=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ]; then bad "$desc: exit $rc: $(echo "$out" | tail -3)"; return; fi
  [ "$(json_get "$out" ok)" = "True" ] && ok || bad "$desc: not ok: $out"
}

expect_exit2() {  # expect_exit2 <text the error must hold> <seqpar args...>: exit 2, one line
  local text=$1; shift
  local err rc
  err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && ok || bad "$* exited $rc, want 2"
  [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && ok || bad "$*: error is not one line: $err"
  printf '%s' "$err" | grep -q -- "$text" && ok || bad "$*: error does not say '$text': $err"
}

# wait_for_line <file> <ERE> <pid>: waits until a line of the file matches (a run's progress on
# stderr) or process pid has ended (its own `timeout` ends a hung run); returns 1 if it ended
# without the line.
wait_for_line() {
  while kill -0 "$3" 2>/dev/null; do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  grep -qE "$2" "$1" 2>/dev/null
}

# mpi_rank_pid <launcher pid> <world rank>: the pid of the seqpar process of that world rank that
# descends from the launcher (other tests' ranks may run beside it), waiting up to 60 s for MPI's
# start-up on a loaded machine; prints nothing if there is none.
mpi_rank_pid() {
  local launcher=$1 rank=$2 p q
  for _ in $(seq 600); do
    for p in $(pgrep -x seqpar); do
      tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$rank" || continue
      q=$p
      while [ -n "$q" ] && [ "$q" -gt 1 ] && [ "$q" != "$launcher" ]; do
        q=$(ps -o ppid= -p "$q" 2>/dev/null | tr -d ' ')
      done
      [ "$q" = "$launcher" ] && { echo "$p"; return; }
    done
    sleep 0.1
  done
}
