"""Wire-level counting of what a client sends to PostgreSQL, from libpq's trace (psycopg 3).

Standard library + psycopg only, so that both the DBOS peer (its venv) and decisionflow (the
project's venv) count the same way:

    t = Tracer(dirpath)
    t.attach(conn, "label")            # a psycopg.Connection: libpq trace into dirpath
    mark = t.mark()                    # per-connection message counts so far
    ... run the operations ...
    t.tally(mark)                      # statements, round trips, transactions, writing commits

What is counted, frontend messages only, per connection, after the mark:
  round_trips   each simple-protocol Query message and each extended-protocol Sync (one wait
                for the server each)
  statements    each SQL statement: every ';'-separated statement of a Query message (BEGIN,
                COMMIT, SAVEPOINT included) and each extended-protocol Execute
  commits       transactions that ended with COMMIT, plus statements sent outside a
                transaction block (autocommit: each its own transaction)
  writing_commits  of those, the ones that wrote or locked a row (INSERT/UPDATE/DELETE/MERGE,
                a data-modifying WITH, SELECT ... FOR UPDATE/NO KEY UPDATE/SHARE, or EXECUTE of a
                prepared statement, counted as a write) -- the commits that wait for a WAL flush
  background    transactions classified as a library's periodic housekeeping (DBOS: scheduler,
                queue and delayed-workflow polls, advisory leader lock), reported apart and not
                included in the figures above
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_MSG = re.compile(r"^(F|B)\t(\d+)\t(\w+)\t?(.*)$")
_WRITE = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE|MERGE|EXECUTE)\b|FOR\s+(NO\s+KEY\s+)?UPDATE|FOR\s+(KEY\s+)?SHARE|"
    r"^\s*WITH\b.*\b(INSERT|UPDATE|DELETE)\b",
    re.I | re.S,
)
BACKGROUND = (
    "workflow_schedules",
    "pg_try_advisory_xact_lock",
    "'DELAYED'",
    "queue_name IN",
    "dbos.queues",
    "application_versions",
)


def _parse_sql(kind: str, text: str) -> str:
    text = text.strip()
    if kind == "Query":
        return text[1:-1] if text.startswith('"') and text.endswith('"') else text
    m = re.match(r'"[^"]*"\s+"(.*)"(\s+\d+.*)?$', text, re.S)  # Parse "stmt" "sql" nparams oids...
    return m.group(1) if m else text


def _split(sql: str) -> list[str]:
    return [p.strip() for p in sql.split(";") if p.strip()]


@dataclass
class Tracer:
    dirpath: str
    files: list[tuple[str, object]] = field(default_factory=list)

    def attach(self, conn, label: str) -> None:
        from psycopg import pq

        path = os.path.join(self.dirpath, f"{label}-{len(self.files):03d}.trace")
        fh = open(path, "w")  # noqa: SIM115 - kept open while the connection lives
        conn.pgconn.trace(fh.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self.files.append((path, fh))

    def messages(self, all_names: bool = True) -> list[list[tuple[str, str]]]:
        out = []
        for path, fh in self.files:
            fh.flush()
            msgs: list[list[str]] = []
            cur = None
            with open(path, errors="replace") as f:
                for line in f:
                    m = _MSG.match(line.rstrip("\n"))
                    if m:
                        cur = [m.group(1), m.group(3), m.group(4)]
                        msgs.append(cur)
                    elif cur is not None:
                        cur[2] += "\n" + line.rstrip("\n")
            out.append([(k, t) for d, k, t in msgs if d == "F"])
        return out

    def mark(self) -> list[int]:
        return [len(m) for m in self.messages()]

    def tally(self, mark: list[int]) -> dict:
        tot = {
            "round_trips": 0,
            "statements": 0,
            "commits": 0,
            "writing_commits": 0,
            "rollbacks": 0,
            "background_transactions": 0,
            "background_round_trips": 0,
        }
        for i, allmsgs in enumerate(self.messages()):
            named: dict[str, str] = {}  # named (prepared) statements, parsed maybe before the mark
            for kind, text in allmsgs:
                m = re.match(r'"([^"]+)"', text.strip()) if kind == "Parse" else None
                if m:
                    named[m.group(1)] = _parse_sql(kind, text)
            msgs = allmsgs[mark[i] if i < len(mark) else 0 :]
            txn: dict | None = None  # {"trips","stmts","wrote","sql"}

            def close(t: dict, committed: bool) -> None:
                if any(b in t["sql"] for b in BACKGROUND):
                    tot["background_transactions"] += 1
                    tot["background_round_trips"] += t["trips"]
                    return
                tot["round_trips"] += t["trips"]
                tot["statements"] += t["stmts"]
                if committed:
                    tot["commits"] += 1
                    tot["writing_commits"] += t["wrote"]
                else:
                    tot["rollbacks"] += 1

            pending_parse = ""
            for kind, text in msgs:
                if kind == "Parse":
                    pending_parse = _parse_sql(kind, text)
                    continue
                if kind == "Execute":
                    sql = pending_parse or "EXECUTE <prepared>"
                    t = txn if txn is not None else {"trips": 0, "stmts": 0, "wrote": False, "sql": ""}
                    t["stmts"] += 1
                    t["sql"] += sql + ";"
                    t["wrote"] = t["wrote"] or bool(_WRITE.search(sql))
                    if txn is None:
                        t["_auto"] = True
                        txn = t
                    continue
                if kind == "Bind":
                    # a Bind to a named statement with no fresh Parse re-runs that statement
                    m = re.match(r'"[^"]*"\s+"([^"]+)"', text.strip())
                    if m:
                        pending_parse = named.get(m.group(1), f"EXECUTE <prepared {m.group(1)}>")
                    continue
                if kind == "Sync":
                    if txn is not None:
                        txn["trips"] += 1
                        if txn.pop("_auto", False):  # an autocommit statement ends at its Sync
                            close(txn, True)
                            txn = None
                    else:
                        tot["round_trips"] += 1
                    pending_parse = ""
                    continue
                if kind != "Query":
                    continue
                sql = _parse_sql(kind, text)
                parts = _split(sql) or [";"]
                if txn is not None:
                    txn["trips"] += 1
                for p in parts:
                    head = p.split(None, 1)[0].upper() if p != ";" else ";"
                    if head in ("BEGIN", "START"):
                        txn = {"trips": 1 if p is parts[0] else 0, "stmts": 1, "wrote": False, "sql": ""}
                    elif head in ("COMMIT", "END", "ROLLBACK", "ABORT"):
                        if txn is None:
                            txn = {"trips": 1, "stmts": 0, "wrote": False, "sql": ""}
                        txn["stmts"] += 1
                        close(txn, head in ("COMMIT", "END"))
                        txn = None
                    elif txn is not None:
                        txn["stmts"] += p != ";"
                        txn["sql"] += p + ";"
                        txn["wrote"] = txn["wrote"] or bool(_WRITE.search(p))
                    else:  # autocommit statement (or the empty query ';', a pool ping)
                        t = {"trips": 1, "stmts": int(p != ";"), "wrote": bool(_WRITE.search(p)), "sql": p}
                        if p == ";":
                            tot["round_trips"] += 1
                            tot.setdefault("pings", 0)
                            tot["pings"] += 1
                        elif any(b in p for b in BACKGROUND):
                            close(t, True)
                        else:
                            close(t, True)
        return tot
