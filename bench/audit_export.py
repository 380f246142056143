"""20. The audit export of a million commit attempts: peak memory, and rows per second
against a raw ``COPY … TO STDOUT`` of the same rows in the same run.

``load_attempts`` fills a migrated database with ``n`` attempt rows (raw psycopg, one
``INSERT … SELECT FROM generate_series``, over the cases ``load_operations`` made); the
subject is the command a support lead runs, ``manage.py export_audit attempts --output F``
(process start, the signature and the file write included), measured with ``os.wait4`` for
its own peak RSS; the baseline streams the same rows raw, ``COPY (SAME_ROWS_SQL) TO STDOUT
WITH (FORMAT csv)``, to the client and drops it: the attempts with the case ID and the
reviewer's name the export shows, in its order, each column as PostgreSQL writes it (no
rendering, no neutralisation, no signature, no file, no process). For context, the bare table
(``SELECT * FROM effects_commitattempt``) is streamed the same way. Runs alternate which goes
first.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.env import PY, ROOT, env_for
from bench.stats import summary

MEMORY_GOAL_MB = 150
RATIO_GOAL = 0.5

# One attempt in five a refusal with a message, one in a hundred a text a spreadsheet would
# run (neutralised on the way out), the rest committed or declined.
LOAD_SQL = """
    INSERT INTO effects_commitattempt (operation_id, case_id, approved, reviewer_id, outcome, channel, reason,
                                       detail, decline_reason, decline_note, attempted_at)
    SELECT 'op-v1-' || encode(sha256(convert_to('A' || g, 'UTF8')), 'hex'),
           (g %% %(cases)s) + 1, (g %% 3) <> 0, %(user)s,
           CASE WHEN g %% 5 = 0 THEN 'stale' WHEN g %% 3 = 0 THEN 'declined' ELSE 'committed' END,
           CASE WHEN g %% 2 = 0 THEN 'admin' ELSE 'api' END,
           CASE WHEN g %% 5 = 0 THEN 'stale' END,
           CASE WHEN g %% 100 = 0 THEN '=HYPERLINK("http://example.invalid/' || g || '")'
                WHEN g %% 5 = 0 THEN 'op-v1-… is not the current proposal of this case, "superseded"'
                ELSE '' END,
           NULL, NULL, now() - (g || ' milliseconds')::interval
    FROM generate_series(1, %(n)s) g
"""


# The export's rows, raw: the columns of audit/exports.py ATTEMPT_COLUMNS, spelled out.
SAME_ROWS_SQL = """
    SELECT a.id, a.attempted_at, c.case_id, a.operation_id, a.channel, u.username, a.approved, a.outcome,
           a.reason, a.detail, a.decline_reason, a.decline_note
    FROM effects_commitattempt a
    LEFT JOIN cases_case c ON c.id = a.case_id
    LEFT JOIN auth_user u ON u.id = a.reviewer_id
    ORDER BY a.id
"""
TABLE_SQL = "SELECT * FROM effects_commitattempt ORDER BY id"


def load_attempts(conn, n: int) -> None:
    """``n`` attempt rows over the cases already there (``load_operations``)."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT count(*), (SELECT id FROM auth_user ORDER BY id LIMIT 1) FROM cases_case")
        cases, user = cur.fetchone()
        if not cases or user is None:
            raise RuntimeError("load_attempts needs the cases and the user of load_operations first")
        cur.execute(LOAD_SQL, {"cases": cases, "user": user, "n": n})
    was = conn.autocommit
    conn.autocommit = True  # VACUUM cannot run inside a transaction
    try:
        conn.execute("VACUUM ANALYZE effects_commitattempt")
    finally:
        conn.autocommit = was


def attempts_ready(url: str, n: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM effects_commitattempt").fetchone()[0] == n
    except Exception:
        return False


def _rss_run(cmd: list[str], env: dict) -> tuple[float, int, int, str]:
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        err.seek(0)
        return elapsed, usage.ru_maxrss, os.waitstatus_to_exitcode(status), err.read().decode(errors="replace")[-500:]


def measure_export(url: str, n: int, *, runs: int) -> dict:
    import psycopg
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    res = {
        "key": "audit_export",
        "title": f"20. audit export: {n:,} commit attempts, `export_audit attempts --output F` (CSV, signed)",
        "subject": "`python manage.py export_audit attempts --output F` (process start, the .sig and the file write "
        "included), rows/s",
        "baseline": "the same rows raw (the attempts joined to their case ID and reviewer's name, unrendered): "
        "`COPY (…) TO STDOUT WITH (FORMAT csv)`, psycopg, rows/s",
        "kind": "speed",
        "unit": "rows/s",
        "goal": ("≥", RATIO_GOAL),
        "note": "",
        "subject_values": [],
        "baseline_values": [],
        "ratios": [],
        "vendor": "postgresql",
        "rows": n,
        "rss_kib": [],
        "bytes": 0,
        "verified": False,
        "table_values": [],
    }
    with tempfile.TemporaryDirectory(prefix="decisionflow-bench-export-") as tmp:
        key = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        env = dict(env_for(url), DECISIONFLOW_AUDIT_SIGNING_KEY=key.decode())
        out = Path(tmp) / "attempts.csv"
        cmd = [PY, "manage.py", "export_audit", "attempts", "--output", str(out), "--force"]

        def baseline(select: str = SAME_ROWS_SQL) -> float:
            t = time.perf_counter()
            with (
                psycopg.connect(url) as conn,
                conn.cursor() as cur,
                cur.copy(f"COPY ({select}) TO STDOUT WITH (FORMAT csv)") as copy,
            ):
                for _block in copy:
                    pass
            return time.perf_counter() - t

        for i in range(runs):
            got = {}
            for which in ("b", "s") if i % 2 == 0 else ("s", "b"):
                if which == "b":
                    got["b"] = baseline()
                    continue
                elapsed, rss, code, err = _rss_run(cmd, env)
                if code != 0:
                    raise RuntimeError(f"export_audit exited {code}: {err}")
                got["s"] = elapsed
                res["rss_kib"].append(rss)
            res["table_values"].append(n / baseline(TABLE_SQL))
            res["subject_values"].append(n / got["s"])
            res["baseline_values"].append(n / got["b"])
            res["ratios"].append(got["b"] / got["s"])
        with out.open("rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        res["bytes"] = out.stat().st_size
        # Every row is there (the header, and a line each: no value here spans lines), and the
        # signature verifies with the public key alone.
        if lines != n + 1:
            raise RuntimeError(f"the export has {lines - 1:,} rows, {n:,} were loaded")
        public = Path(tmp) / "public.pem"
        public.write_bytes(
            serialization.load_pem_private_key(key, None)
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        verify = subprocess.run(
            [PY, "manage.py", "audit_verify", str(out), "--public-key", str(public)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if verify.returncode != 0:
            raise RuntimeError(f"audit_verify exited {verify.returncode}: {verify.stderr[-300:]}")
        res["verified"] = True
    return res


def section(results: list[dict], info: dict) -> str | None:
    """Section 20 of docs/PERFORMANCE.md (bench/report.py places it)."""
    r = next((r for r in results if r.get("key") == "audit_export"), None)
    if r is None:
        return None
    # The markers of bench.report.section_markers, by which a partial run replaces this section.
    begin, end = "<!-- section: audit_export -->", "<!-- /section: audit_export -->"
    heading = "## 20. Audit export: a million commit attempts, streamed and signed"
    if not r.get("ratios"):
        error = (r.get("error") or "").strip().splitlines()[-1:] or [""]
        return "\n".join([begin, heading, "", f"Not measured: {error[0][:300]}", end])
    rss = summary([k / 1024 for k in r["rss_kib"]])
    ratio = summary(r["ratios"])
    sv, bv = summary(r["subject_values"]), summary(r["baseline_values"])
    tv = summary(r["table_values"])
    return "\n".join(
        [
            begin,
            heading,
            "",
            f"- Data: {r['rows']:,} commit attempts bulk-loaded (`bench/audit_export.py`: a fifth of them refusals "
            "with a message, one in a hundred a text a spreadsheet would run as a formula) over the cases of "
            "`load_operations`; the export is "
            f"{r['bytes'] / 1e6:,.0f} MB of CSV.",
            f"- `export_audit attempts --output F`: median **{sv['median']:,.0f} rows/s**, "
            f"{r['rows'] / sv['median']:.2f} s with the process start; **peak RSS {rss['median']:.0f} MB** "
            f"(max {rss['max']:.0f} MB over {rss['n']} runs; goal ≤ {MEMORY_GOAL_MB} MB: "
            f"{'**met**' if rss['max'] <= MEMORY_GOAL_MB else '**missed**'}), measured with `os.wait4` on the "
            "command's own process.",
            f"- Baseline, the same rows raw with `COPY … TO STDOUT` (the attempts joined to their case ID and "
            f"reviewer's name, each column as PostgreSQL writes it; psycopg, dropped on arrival): median "
            f"{bv['median']:,.0f} rows/s. For context, the bare table (`SELECT *`, no join): median "
            f"{tv['median']:,.0f} rows/s, so the command runs at {sv['median'] / tv['median']:.2f}× that.",
            f"- **{ratio['median']:.2f}×** the raw COPY's rows/s (runs {ratio['min']:.2f}–{ratio['max']:.2f}; goal "
            f"≥ {RATIO_GOAL}: {'**met**' if ratio['median'] >= RATIO_GOAL else '**missed**'}). Every row was "
            f"in the file, and `audit_verify` accepted it{' (checked after the runs)' if r['verified'] else ''}.",
            "- Why: the command sends one `COPY (SELECT …) TO STDOUT` of the export's own queryset, each "
            "column rendered and neutralised by the ORM's expressions (audit/store.py), and hashes and writes "
            "1,000 rows at a time; what it pays beyond the baseline is the rendering (times through `to_char`, "
            "the first character of each text through `ascii()`), the SHA-256, the file write and the signature, "
            "and the process start (Django and the migration check, about 0.5 s).",
            f"- Run: `{info.get('command')}`, {info.get('date')}.",
            end,
        ]
    )
