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
