#!/usr/bin/env bash
# `make test`: the suite on SQLite and on PostgreSQL at the same time, each through its own
# make target (`make test-sqlite`, `make test-postgres`, which also work alone).
#
# Why at once: each suite spends much of its time in child processes, the PostgreSQL server
# and waits, so one after the other left a core idle; on 2 cores the pair takes about as long
# as the slower suite (CONTRIBUTING.md has the figures). They share nothing: SQLite's test
# file is named by the pytest process id, PostgreSQL's test database by the server URL, and
# every port, helpdesk and screenshot folder is a fresh one per test.
#
# Output: each suite writes to its own log, printed whole when that suite ends (first done,
# first shown), so the two never interleave; follow them live with `tail -f` on the paths
# printed at the start. Then one line per suite and a total; the exit status is non-zero when
# either suite failed.
set -uo pipefail
cd "$(dirname "$0")/.."

MAKE_CMD=${MAKE:-make}
logs=$(mktemp -d "${TMPDIR:-/tmp}/decisionflow-test.XXXXXX")
suites=(sqlite postgres)
declare -A title=([sqlite]=SQLite [postgres]=PostgreSQL) pid=() code=()

# Job control: each suite in its own process group, so an interrupt can stop it with every
# child it started. It also keeps SIGINT as it is for the suites: without it, bash starts
# background jobs with SIGINT ignored, and the children inherit that (the test that stops
# `make run` with Ctrl-C then fails).
set -m
for s in "${suites[@]}"; do
  "$MAKE_CMD" --no-print-directory "test-$s" >"$logs/$s.log" 2>&1 </dev/null &
  pid[$s]=$!
done
echo "== make test: SQLite and PostgreSQL suites running at once; each is shown when it ends =="
echo "   follow them live: tail -f $logs/sqlite.log $logs/postgres.log"

# Stop both suites (make, pytest and their children) if we are interrupted.
stop() {
  # SIGINT, as Ctrl-C would: pytest still drops its test database on the way out.
  for s in "${suites[@]}"; do kill -INT -- "-${pid[$s]}" 2>/dev/null; done
  wait
  exit 130
}
trap stop INT TERM

running=("${suites[@]}")
while ((${#running[@]} > 0)); do
  waiting=()
  for s in "${running[@]}"; do waiting+=("${pid[$s]}"); done
  wait -n -p done_pid "${waiting[@]}"
  rc=$?
  still=()
  for s in "${running[@]}"; do
    if [[ ${pid[$s]} == "$done_pid" ]]; then
      code[$s]=$rc
      echo
      echo "==================== ${title[$s]} suite (exit $rc; log $logs/$s.log) ===================="
      cat "$logs/$s.log"
    else
      still+=("$s")
    fi
  done
  running=("${still[@]}")
done

# pytest's closing line, e.g. "==== 939 passed, 41 skipped, 1 warning in 431.20s ====" (with -q
# without the rules).
count() { grep -oE "[0-9]+ $1" <<<"$2" | tail -n 1 | cut -d' ' -f1; }
status=0 total_passed=0 total_failed=0 total_skipped=0
echo
echo "== make test: summary =="
for s in "${suites[@]}"; do
  last=$(grep -E "^(=+ )?([0-9]+ [a-z]+(, )?)+ in [0-9.]+s|no tests ran in" "$logs/$s.log" | tail -n 1)
  if [[ -n $last ]]; then
    passed=$(count passed "$last") failed=$(count failed "$last") errors=$(count 'errors?' "$last")
    skipped=$(count skipped "$last")
    # Errors (a fixture or collection that broke) count as failures.
    failed=$((${failed:-0} + ${errors:-0}))
    echo "${s}: ${passed:-0} passed, ${failed} failed, ${skipped:-0} skipped (exit ${code[$s]})"
    total_passed=$((total_passed + ${passed:-0}))
    total_failed=$((total_failed + failed))
    total_skipped=$((total_skipped + ${skipped:-0}))
  else
    # No pytest summary: the run was skipped (no PostgreSQL, not required) or never started.
    why=$(grep -E "^(SKIPPED|FAILED): " "$logs/$s.log" | tail -n 1)
    echo "${s}: ${why:-$(tail -n 1 "$logs/$s.log")} (exit ${code[$s]})"
  fi
  if ((code[$s] != 0)); then status=1; fi
done
echo "make test: both suites took $((SECONDS / 60)) min $((SECONDS % 60)) s (wall), load average now $(cut -d' ' -f1-3 /proc/loadavg)"
if ((status != 0)); then echo "make test: FAILED (see the suite above whose exit is not 0)"; fi
# Last, in the plain form CI reads ("N passed, N failed, N skipped").
echo "total: ${total_passed} passed, ${total_failed} failed, ${total_skipped} skipped"
exit "$status"
