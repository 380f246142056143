#!/usr/bin/env bash
# `make run`: the development server, the reference helpdesk (helpdesk/README.md) and one task
# worker (`manage.py db_worker`, docs/QUEUE.md), with DECISIONFLOW_DELIVERY_URL/TOKEN pointing
# at the helpdesk, so that an approval's reply is delivered as in production (docs/DELIVERY.md).
# Ctrl-C stops all three. Local use only: the helpdesk runs with its fault switches on.
#
# Environment: PY (the venv's python), SERVER_PORT (8000), HELPDESK_PORT (8025),
# HELPDESK_TOKEN (dev-helpdesk-token), RUN_DIR (var: the helpdesk's file and the logs).
set -euo pipefail

PY=${PY:-.venv/bin/python}
SERVER_PORT=${SERVER_PORT:-8000}
HELPDESK_PORT=${HELPDESK_PORT:-8025}
RUN_DIR=${RUN_DIR:-var}
export HELPDESK_TOKEN=${HELPDESK_TOKEN:-dev-helpdesk-token}
mkdir -p "$RUN_DIR"

pids=()
stop() {
    trap - INT TERM EXIT
    # The helpdesk and the worker ignore the terminal's Ctrl-C (background jobs of a script
    # do): TERM them, give the worker time to finish the task it runs, then KILL.
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    echo "make run: stopped the server, the task worker and the reference helpdesk"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$PY" -m helpdesk --port "$HELPDESK_PORT" --db "$RUN_DIR/helpdesk.sqlite3" --faults >>"$RUN_DIR/helpdesk.log" 2>&1 &
helpdesk_pid=$!
pids+=("$helpdesk_pid")
# At most 10 s for the helpdesk to answer, and it must be ours (not another on the port).
"$PY" - "$HELPDESK_PORT" "$helpdesk_pid" "$RUN_DIR/helpdesk.log" <<'PYEOF'
import os, sys, time, urllib.request
port, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
url = f"http://127.0.0.1:{port}/healthz"
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"make run: the reference helpdesk exited at start (is port {port} taken? "
                 f"HELPDESK_PORT=8026 make run); see {log}")
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"make run: the reference helpdesk did not answer {url} within 10 s; see {log}")
PYEOF

export DECISIONFLOW_DELIVERY_URL="http://127.0.0.1:$HELPDESK_PORT"
export DECISIONFLOW_DELIVERY_TOKEN="$HELPDESK_TOKEN"
"$PY" manage.py db_worker --no-reload >>"$RUN_DIR/worker.log" 2>&1 &
pids+=("$!")

echo "Reference helpdesk: $DECISIONFLOW_DELIVERY_URL (its own process and file $RUN_DIR/helpdesk.sqlite3, log $RUN_DIR/helpdesk.log; fault switches on)"
echo "  what it holds: curl -s -H 'Authorization: Bearer $HELPDESK_TOKEN' $DECISIONFLOW_DELIVERY_URL/_stats"
echo "Task worker: manage.py db_worker (log $RUN_DIR/worker.log): it delivers each approved reply to the helpdesk"
echo "Serving the admin at http://127.0.0.1:$SERVER_PORT/admin/ (Ctrl-C stops the server, the worker and the helpdesk)"
echo "API tokens: sign in as the demo reviewer, then http://127.0.0.1:$SERVER_PORT/admin/api/apitoken/mine/ (docs/API.md)"
echo "API docs (work offline): http://127.0.0.1:$SERVER_PORT/api/docs"
"$PY" manage.py runserver "127.0.0.1:$SERVER_PORT"
