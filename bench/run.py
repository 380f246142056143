"""`make bench`: run every benchmark and write docs/PERFORMANCE.md.

    .venv/bin/python -m bench.run [--scale full|smoke] [--out docs/PERFORMANCE.md]

It uses its own databases only: on PostgreSQL (BENCH_POSTGRES_URL, default
postgres://postgres@127.0.0.1:5432) it drops and recreates ``decisionflow_bench`` (the
review-core and workflow benchmarks, over 100,000 bulk-loaded cases),
``decisionflow_bench_side`` (our side of the side-by-side run with the LangGraph and DBOS
peers, which create and drop their own ``decisionflow_bench_peer`` and
``decisionflow_bench_dbos``; see bench/side_by_side.py) and
``decisionflow_bench_reconcile`` (1,000,000 operations; kept between runs when its contents
are exactly what this run would load, unless --fresh), ``decisionflow_bench_pages_10k`` and
``decisionflow_bench_pages_1m`` (the admin's pages at 10,000 and 1,000,000 cases; kept the
same way); on SQLite, a temporary file. ``--only pages`` runs one part and replaces only its
section of the report. All
are migrated with ``manage.py migrate``. Nothing here reads or writes a test database.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import report
from bench.cron_start import bench_cron_start
from bench.env import EVENT_LOG, PY, ROOT, env_for, static_collected

# The parts of a run, for --skip and --only.
PARTS = (
    "postgres",
    "side",
    "sqlite",
    "process",
    "reconcile",
    "pages",
    "retention",
    "cron_start",
    "delivery",
    "intake",
    "audit_export",
)

SIZES = {
    "full": {
        "runs": 5,
        "process_runs": 7,
        "reconcile_runs": 5,
        "reconcile_ops": 1_000_000,
        "audit_attempts": 1_000_000,
        "admin_cases": 100_000,
        "page_cases": (10_000, 1_000_000),
        "page_rounds": 6,
        "page_requests": 8,
        "deliveries": 500,
        "intake_cases": 200,
        "intake_rounds": 3,
    },
    "smoke": {
        "runs": 1,
        "process_runs": 1,
        "reconcile_runs": 1,
        "reconcile_ops": 300,
        "audit_attempts": 300,
        "admin_cases": 30,
        "page_cases": (30, 300),
        "page_rounds": 2,
        "page_requests": 1,
        "deliveries": 20,
        "intake_cases": 10,
        "intake_rounds": 1,
    },
}


def log(msg: str) -> None:
    print(f"[bench {datetime.now(UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


class PartClock:
    """The wall time of each part of a run (``start`` ends the part before), for the closing
    lines and the report; the run's own set-up and report writing are in the total only."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._part: str | None = None
        self._since = 0.0

    def start(self, part: str) -> None:
        self.stop()
        self._part, self._since = part, time.perf_counter()

    def stop(self) -> None:
        if self._part is not None:
            self.seconds[self._part] = self.seconds.get(self._part, 0.0) + time.perf_counter() - self._since
            self._part = None


def migrate(database_url: str) -> None:
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env_for(database_url), check=True)


def pg_url(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def pg_admin(base: str):
    import psycopg

    return psycopg.connect(pg_url(base, "postgres"), autocommit=True)


def pg_recreate(base: str, name: str) -> None:
    with pg_admin(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def pg_exists(base: str, name: str) -> bool:
    with pg_admin(base) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def inproc(database_url: str, scale: str, only: str | None = None, requests: int | None = None) -> list[dict]:
    """One benchmark process (interpreter start excluded from what it measures)."""
    static_collected()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    try:
        cmd = [PY, "-m", "bench.inproc", "--scale", scale, "--out", out]
        if only:
            cmd += ["--only", only]
        if requests:
            cmd += ["--requests", str(requests)]
        subprocess.run(cmd, cwd=ROOT, env=env_for(database_url), check=True)
        return json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)


# --- 11, 12, 18 and 19. side by side with the LangGraph and DBOS peers --------------------


def bench_side_by_side(
    base: str,
    scale: str,
    *,
    name: str,
    peer_db: str,
    dbos_db: str,
    n: int | None = None,
    rounds: int | None = None,
) -> list[dict]:
    """Our begin and resume against the LangGraph and DBOS peers', interleaved, on the same
    server: our side in one process on its own database ``name``; each peer (in .venv-peer,
    .venv-dbos) started by that process once per round, on ``peer_db`` and ``dbos_db``. See
    bench/side_by_side.py."""
    url = pg_url(base, name)
    log(f"side by side: recreating {name} and migrating; the LangGraph peer uses {peer_db}, DBOS {dbos_db}")
    pg_recreate(base, name)
    migrate(url)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [PY, "-m", "bench.side_by_side", "--scale", scale, "--out", out]
    cmd += ["--peer-url", pg_url(base, "postgres"), "--peer-db", peer_db, "--dbos-db", dbos_db]
    if n:
        cmd += ["--n", str(n)]
    if rounds:
        cmd += ["--rounds", str(rounds)]
    try:
        subprocess.run(cmd, cwd=ROOT, env=env_for(url), check=True)
        return json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)


# --- 9. the admin's pages at 10,000 and at 1,000,000 cases -------------------------------


def _size_label(n: int) -> str:
    return (
        f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)
    )


def _pages_db_ready(url: str, n: int) -> bool:
    """The kept database holds the n loaded cases (and at most the benchmark's own few
    besides), with their effects, on current migrations."""
    import psycopg

    from bench.bigdata import expected_states

    try:
        with psycopg.connect(url) as conn:
            loaded = conn.execute("SELECT count(*) FROM cases_case WHERE case_id LIKE 'L-%'").fetchone()[0]
            effects = conn.execute("SELECT count(*) FROM effects_effectrecord").fetchone()[0]
            # The pages' extra rows (bench.bigdata.load_page_extras): at least one attempt per case.
            attempts = conn.execute("SELECT count(*) FROM effects_commitattempt").fetchone()[0]
    except Exception:
        return False
    plan = subprocess.run(
        [PY, "manage.py", "showmigrations", "--plan"], cwd=ROOT, env=env_for(url), capture_output=True, text=True
    )
    return (
        plan.returncode == 0
        and "[ ]" not in plan.stdout
        and loaded == n
        and effects == expected_states(n)["Committed"]
        and attempts >= n
    )


def bench_pages(
    base: str, sizes: dict, *, fresh: bool, prefix: str, scale: str, rounds: int, requests: int
) -> list[dict]:
    """The same admin pages over two databases, one of each size (``page_cases``), loaded
    once and kept while intact (``--fresh`` reloads). The rounds alternate between the two
    sizes, so that a busy machine slows both alike; each round is one process per size."""
    import psycopg

    from bench.bigdata import load_operations, load_page_extras

    counts = sizes["page_cases"]
    urls = {}
    for n in counts:
        name = f"{prefix}_pages_{_size_label(n)}"
        urls[n] = url = pg_url(base, name)
        if fresh or not pg_exists(base, name) or not _pages_db_ready(url, n):
            log(f"pages: loading {n:,} cases into {name} ...")
            pg_recreate(base, name)
            migrate(url)
            t = time.perf_counter()
            with psycopg.connect(url) as conn:
                load_operations(conn, n, prefix="L")
                load_page_extras(conn, n)
            log(f"pages: loaded {n:,} cases in {time.perf_counter() - t:.0f} s")
        else:
            log(f"pages: reusing {name} ({n:,} cases, already loaded)")
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    for r in range(rounds):
        for n in counts if r % 2 == 0 else tuple(reversed(counts)):
            log(f"pages: round {r + 1}/{rounds}, {n:,} cases")
            (got,) = inproc(urls[n], scale, only="pages", requests=requests)
            if got.get("kind") != "pages":
                return [got]
            runs[n].append(got)
    return [pages_combine(runs, requests=requests)]


def pages_combine(runs: dict[int, list[dict]], *, requests: int, max_ratio: float = 1.5) -> dict:
    """Pool each page's times over the rounds, per size; the goal is the largest size's p50
    within ``max_ratio`` of the smallest's, with the same number of queries in every round."""
    from bench.stats import summary

    small, big = min(runs), max(runs)
    rows = []
    for i, first in enumerate(runs[small][0]["pages"]):
        # Not met until measured at both sizes: a page that fails to render fails the goal.
        row = {"key": first["key"], "label": first["label"], "by_size": {}, "met": False}
        for n, results in runs.items():
            pages = [res["pages"][i] for res in results]
            errors = [p["error"] for p in pages if "error" in p]
            if errors:
                row["by_size"][str(n)] = {"url": pages[0]["url"], "error": errors[0]}
                continue
            row["by_size"][str(n)] = {
                "url": pages[0]["url"],
                "queries": sorted({p["queries"] for p in pages}),
                "ms": summary([t for p in pages for t in p["times_ms"]]),
                "bytes": pages[-1]["bytes"],
            }
        a, b = row["by_size"][str(small)], row["by_size"][str(big)]
        if "error" not in a and "error" not in b:
            row["ratio"] = b["ms"]["median"] / a["ms"]["median"]
            row["same_queries"] = a["queries"] == b["queries"] and len(a["queries"]) == 1
            row["met"] = row["ratio"] <= max_ratio and row["same_queries"]
        rows.append(row)
    return {
        "key": "pages",
        "kind": "pages_scale",
        "sizes": sorted(runs),
        "cases": {str(n): runs[n][-1]["cases"] for n in runs},
        "rounds": len(runs[small]),
        "requests": requests,
        "max_ratio": max_ratio,
        "pages": rows,
    }


# --- 7. process start -------------------------------------------------------------------


def wall(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def bench_process_start(database_url: str, runs: int, *, warm: bool = True) -> dict:
    env = env_for(database_url)
    res = {
        "key": "process_start",
        "title": "7. process start: `manage.py resume --help` wall time",
        "subject": "`python manage.py resume --help`",
        "baseline": "`python -c pass`",
        "kind": "cost",
        "unit": "ms",
        "goal": None,
        "note": "report only",
        "subject_values": [],
        "baseline_values": [],
        "ratios": [],
        "vendor": "any",
    }
    if warm:
        wall([PY, "manage.py", "resume", "--help"], env)  # warm the page cache and .pyc files
    for i in range(runs):
        pair = [("b", [PY, "-c", "pass"]), ("s", [PY, "manage.py", "resume", "--help"])]
        if i % 2:
            pair.reverse()
        got = {k: wall(cmd, env) * 1000 for k, cmd in pair}
        res["subject_values"].append(got["s"])
        res["baseline_values"].append(got["b"])
        res["ratios"].append(got["s"] / got["b"])
    return res


# --- 8. reconcile over a million operations ---------------------------------------------


def _reconcile_db_ready(url: str, n: int) -> bool:
    """The kept database holds exactly what load_operations(n) makes, on current migrations."""
    import psycopg

    from bench.bigdata import expected_states

    try:
        with psycopg.connect(url) as conn:
            cases = conn.execute("SELECT count(*) FROM cases_case").fetchone()[0]
            effects = conn.execute("SELECT count(*) FROM effects_effectrecord").fetchone()[0]
            applied = conn.execute("SELECT count(*) FROM django_migrations").fetchone()[0]
    except Exception:
        return False
    exp = expected_states(n)
    plan = subprocess.run(
        [PY, "manage.py", "showmigrations", "--plan"],
        cwd=ROOT,
        env=env_for(url),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    unapplied = plan.count("[ ]")
    return cases == n and effects == exp["Committed"] and unapplied == 0 and applied > 0


def _rss_run(cmd: list[str], env: dict) -> tuple[float, int, int, str]:
    """Wall seconds, peak RSS (KiB) of exactly this child, its exit code, stderr tail."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return elapsed, usage.ru_maxrss, proc.returncode, err.read().decode(errors="replace")[-500:]


def bench_reconcile(base: str, sizes: dict, *, fresh: bool, name: str, scale: str) -> list[dict]:
    import psycopg

    from bench.bigdata import load_operations

    n = sizes["reconcile_ops"]
    url = pg_url(base, name)
    if fresh or not pg_exists(base, name) or not _reconcile_db_ready(url, n):
        log(f"reconcile: loading {n:,} operations into {name} ...")
        pg_recreate(base, name)
        migrate(url)
        t = time.perf_counter()
        with psycopg.connect(url) as conn:
            load_operations(conn, n)
        log(f"reconcile: loaded in {time.perf_counter() - t:.0f} s")
    else:
        log(f"reconcile: reusing {name} ({n:,} operations, already loaded)")
    out = [measure_reconcile(url, n, runs=sizes["reconcile_runs"])]
    # The service alone, in-process (no process start, no printing), on the same data.
    out += inproc(url, scale, only="reconcile_service")
    return out


def measure_reconcile(url: str, n: int, *, runs: int) -> dict:
    """The command vs the raw COPY of the same join, on a database load_operations(n) filled."""
    import psycopg

    from bench.bigdata import ANTI_JOIN_SQL, RECONCILE_SQL, expected_states

    exp = expected_states(n)
    sql = RECONCILE_SQL
    res = {
        "key": "reconcile_command",
        "title": f"8. reconcile: {n:,} operations, `reconcile --all --json > /dev/null`",
        "subject": "`python manage.py reconcile --all --json > /dev/null` (process start included)",
        "baseline": "the same query raw (its joins, rows and order; the columns the lines are made from), "
        "streamed to the client with COPY ... TO STDOUT (psycopg, the server's defaults)",
        "kind": "cost",
        "unit": "s",
        "goal": ("≤", 1.5),
        "note": "",
        "subject_values": [],
        "baseline_values": [],
        "ratios": [],
        "vendor": "postgresql",
        "operations": n,
        "rss_kib": [],
        "expected": exp,
        "anti_join_s": [],
    }
    env = env_for(url)
    cmd = [PY, "manage.py", "reconcile", "--all", "--json"]

    def baseline() -> float:
        t = time.perf_counter()
        with psycopg.connect(url) as conn, conn.cursor() as cur, cur.copy(f"COPY ({sql}) TO STDOUT") as copy:
            for _block in copy:
                pass
        return time.perf_counter() - t

    def anti_join() -> float:
        t = time.perf_counter()
        with psycopg.connect(url) as conn:
            rows = conn.execute(ANTI_JOIN_SQL).fetchall()
        if len(rows) != exp["NoLocalEffectRecorded"]:
            raise AssertionError(f"anti-join found {len(rows)} rows, expected {exp['NoLocalEffectRecorded']}")
        return time.perf_counter() - t

    for i in range(runs):
        order = ["b", "s"] if i % 2 == 0 else ["s", "b"]
        got = {}
        for which in order:
            if which == "b":
                got["b"] = baseline()
            else:
                elapsed, rss, code, err = _rss_run(cmd, env)
                # Exit 1 with this message is the documented answer when some operation is
                # NoLocalEffectRecorded (1% are, by design of the data).
                want = f"{exp['NoLocalEffectRecorded']} operation(s) approved with no local effect"
                if code not in (0, 1) or (exp["NoLocalEffectRecorded"] and want not in err):
                    raise RuntimeError(f"reconcile exited {code}: {err}")
                got["s"], res["rss_kib"] = elapsed, res["rss_kib"] + [rss]
        res["anti_join_s"].append(anti_join())
        res["subject_values"].append(got["s"])
        res["baseline_values"].append(got["b"])
        res["ratios"].append(got["s"] / got["b"])
    return res


# --- 20. the audit export of a million attempts ------------------------------------------


def bench_audit_export_part(base: str, sizes: dict, *, fresh: bool, name: str) -> list[dict]:
    """The attempts of bench/audit_export.py over 10,000 cases, kept between runs like 8's."""
    import psycopg

    from bench.audit_export import attempts_ready, load_attempts, measure_export
    from bench.bigdata import load_operations

    n = sizes["audit_attempts"]
    url = pg_url(base, name)
    if fresh or not pg_exists(base, name) or not attempts_ready(url, n):
        log(f"audit export: loading {n:,} commit attempts into {name} ...")
        pg_recreate(base, name)
        migrate(url)
        t = time.perf_counter()
        with psycopg.connect(url) as conn:
            load_operations(conn, min(10_000, n))
            load_attempts(conn, n)
        log(f"audit export: loaded in {time.perf_counter() - t:.0f} s")
    else:
        migrate(url)
        log(f"audit export: reusing {name} ({n:,} attempts, already loaded)")
    try:
        return [measure_export(url, n, runs=sizes["reconcile_runs"])]
    except Exception:
        import traceback

        return [
            {"key": "audit_export", "kind": "error", "bench": "audit_export", "error": traceback.format_exc(limit=6)}
        ]


# --- 13. checkpoint retention and 14. cron start ---------------------------------------


def bench_retention_part(base: str, scale: str, *, name: str, pg: bool) -> list[dict]:
    """Storage per case before and after pruning, on PostgreSQL (its own database) and SQLite."""
    out: list[dict] = []
    targets = []
    if pg:
        log(f"retention: recreating {name} and migrating")
        pg_recreate(base, name)
        targets.append(pg_url(base, name))
    with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp:
        targets.append(f"sqlite:///{tmp}/retention.sqlite3")
        for url in targets:
            migrate(url)
            out += inproc(url, scale, only="retention")
    return out


def bench_cron_start_part(base: str | None, runs: int, *, name: str) -> list[dict]:

    log(f"cron start: recreating {name} (empty, migrated); a bare Django project in a temporary directory")
    url = None
    if base is not None:
        pg_recreate(base, name)
        url = pg_url(base, name)
    with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp:
        url = url or f"sqlite:///{tmp}/cron.sqlite3"
        migrate(url)
        try:
            return [bench_cron_start(env_for(url), runs=runs)]
        except Exception:
            import traceback

            return [
                {"key": "cron_start", "kind": "error", "bench": "cron_start", "error": traceback.format_exc(limit=6)}
            ]


def bench_delivery_part(base: str | None, n: int, *, name: str) -> list[dict]:
    """15. deliveries/s by one worker against the reference helpdesk's raw accept rate."""
    from bench.delivery import bench_delivery

    url = None
    if base is not None:
        log(f"delivery: recreating {name}; the reference helpdesk in a temporary directory")
        pg_recreate(base, name)
        url = pg_url(base, name)
    with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp:
        try:
            return [bench_delivery(url or f"sqlite:///{tmp}/delivery.sqlite3", n)]
        except Exception:
            import traceback

            return [{"key": "delivery", "kind": "error", "bench": "delivery", "error": traceback.format_exc(limit=6)}]


def bench_intake_part(base: str, n: int, rounds: int, *, name: str) -> list[dict]:
    """16. The pipeline's intake through gunicorn against the services in-process."""
    from bench.intake import bench_intake

    log(f"intake: recreating {name}; gunicorn with the shipped config")
    pg_recreate(base, name)
    try:
        return [bench_intake(pg_url(base, name), n, rounds)]
    except Exception:
        import traceback

        return [{"key": "intake", "kind": "error", "bench": "intake", "error": traceback.format_exc(limit=6)}]


# --- machine ----------------------------------------------------------------------------


def machine(base: str) -> dict:
    import sqlite3

    import django
    import psycopg

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        m = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        mem = f"{int(m.group(1)) / 1024 / 1024:.1f} GiB"
    except (OSError, AttributeError):
        pass
    try:
        with pg_admin(base) as conn:
            pg = conn.execute("SHOW server_version").fetchone()[0]
            settings = {
                k: conn.execute(f"SHOW {k}").fetchone()[0]
                for k in ("shared_buffers", "work_mem", "synchronous_commit", "fsync")
            }
    except Exception as exc:
        pg, settings = f"unavailable ({exc})", {}
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "postgresql": pg,
        "pg_settings": settings,
        "sqlite": sqlite3.sqlite_version,
        "load_before": os.getloadavg(),
    }


# --- main -------------------------------------------------------------------------------


# Below this line the document is written by hand (before/after records of a change, figures
# from other commands) and a new run keeps it.
HAND_WRITTEN = "<!-- Written by hand below this line; `make bench` keeps it. -->"


def _write_report(path: Path, generated: str) -> None:
    kept = ""
    if path.exists() and HAND_WRITTEN in (old := path.read_text()):
        kept = "\n" + HAND_WRITTEN + old.split(HAND_WRITTEN, 1)[1]
    path.write_text(generated.rstrip("\n") + "\n" + kept)


def _write_sections(path: Path, sections: dict[str, str]) -> None:
    """Replace each named section of the generated part (between its ``<!-- section: NAME -->``
    markers, or else the old section with the same heading number) and keep all the rest."""
    generated, sep, hand = path.read_text().partition(HAND_WRITTEN)
    for name, text in sections.items():
        if name.startswith("line:"):  # a goal row or a finding, by its leading text
            line = re.compile(rf"^{re.escape(name[5:])}.*$", re.M)
            if line.search(generated):
                generated = line.sub(lambda _m, text=text: text, generated, count=1)
            elif text.startswith("| ") and (goals := re.search(r"^## Goals\n\n(?:\|.*\n)+", generated, re.M)):
                # a goal not in the table yet: after its last row
                generated = generated[: goals.end()] + text + "\n" + generated[goals.end() :]
            continue
        if name.startswith("row:"):  # a row of the summary table, by its number
            row = re.compile(rf"^\| {re.escape(name[4:])}\. .*$", re.M)
            if row.search(generated):
                generated = row.sub(lambda _m, text=text: text, generated, count=1)
            else:  # a measure not in the table yet: after the table's last numbered row
                rows = list(re.finditer(r"^\| \d+(?:\.| \().*$", generated, re.M))  # "| 9. …", "| 10 (context). …"
                at = rows[-1].end() if rows else len(generated)
                generated = generated[:at] + "\n" + text + generated[at:]
            continue
        begin, end = report.section_markers(name)
        if begin in generated and end in generated:
            head, rest = generated.split(begin, 1)
            generated = head + text.strip("\n") + rest.split(end, 1)[1]
            continue
        heading = text.strip("\n").split("\n")[1] if text.startswith(begin) else ""
        number = re.match(r"## (\d+)[.–]", heading)  # "## 9. …", "## 11–12. …"
        old = re.search(rf"^## {number.group(1)}[.–].*?(?=^## |\Z)", generated, re.M | re.S) if number else None
        if old:
            generated = generated[: old.start()] + text.strip("\n") + "\n\n" + generated[old.end() :]
        else:
            anchor = generated.find("## Findings and what remains")
            at = anchor if anchor >= 0 else len(generated)
            generated = generated[:at] + text.strip("\n") + "\n\n" + generated[at:]
    path.write_text(generated + sep + hand)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", default=str(ROOT / "docs" / "PERFORMANCE.md"))
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432"),
        help="server URL without a database name",
    )
    parser.add_argument("--db-prefix", default="decisionflow_bench")
    parser.add_argument("--fresh", action="store_true", help="reload the reconcile database even if it is intact")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {','.join(PARTS)}")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated parts to run, nothing else (e.g. pages or retention,cron_start); the report keeps the other sections",
    )
    parser.add_argument("--pages-rounds", type=int, help="pages: alternating rounds per size (default 6; smoke 2)")
    parser.add_argument("--pages-requests", type=int, help="pages: timed requests per page per round (default 8)")
    parser.add_argument("--side-n", type=int, help="side by side: cases per round (default 300; smoke 20)")
    parser.add_argument("--side-rounds", type=int, help="side by side: rounds per side (default 6; smoke 3)")
    parser.add_argument("--render", metavar="JSON", help="only re-render the report from a --json file")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        _write_report(Path(args.out), report.render(saved["machine"], saved["results"]))
        return 0
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    if only - set(PARTS) or skip - set(PARTS):
        parser.error(
            f"unknown part(s): {', '.join(sorted((only | skip) - set(PARTS)))}; the parts are {', '.join(PARTS)}"
        )
    if only:
        skip |= set(PARTS) - only
    sizes = SIZES[args.scale]
    EVENT_LOG.parent.mkdir(parents=True, exist_ok=True)
    EVENT_LOG.write_text("")  # this run's events only
    started = time.perf_counter()
    clock = PartClock()
    info = machine(args.postgres)
    results: list[dict] = []
    pg_ok = True
    if not skip >= {"postgres", "reconcile", "side", "pages", "retention", "cron_start"}:
        try:
            pg_admin(args.postgres).close()
        except Exception as exc:
            # Without a server the SQLite and process figures are still worth having.
            log(f"no PostgreSQL at {args.postgres} ({exc}); measuring without it")
            skip |= {"postgres", "reconcile", "side", "pages"}
            pg_ok = False
            results.append(
                {
                    "key": "postgres",
                    "kind": "missing",
                    "bench": "postgres",
                    "error": f"no PostgreSQL server answered at {args.postgres}: benchmarks 1-6, 8, 9, 11 and 12 not run",
                }
            )

    if "postgres" not in skip:
        clock.start("postgres")
        name = args.db_prefix
        url = pg_url(args.postgres, name)
        log(f"PostgreSQL: recreating {name}, migrating, loading {sizes['admin_cases']:,} cases")
        pg_recreate(args.postgres, name)
        migrate(url)
        import psycopg

        from bench.bigdata import load_operations

        with psycopg.connect(url) as conn:
            load_operations(conn, sizes["admin_cases"], prefix="L")
        results += inproc(url, args.scale)

    if "pages" not in skip:
        clock.start("pages")
        try:
            results += bench_pages(
                args.postgres,
                sizes,
                fresh=args.fresh,
                prefix=args.db_prefix,
                scale=args.scale,
                rounds=args.pages_rounds or sizes["page_rounds"],
                requests=args.pages_requests or sizes["page_requests"],
            )
        except Exception as exc:
            import traceback

            results.append({"key": "pages", "kind": "error", "bench": "pages", "error": traceback.format_exc(limit=6)})
            log(f"pages FAILED: {exc}")

    if "side" not in skip:
        clock.start("side")
        try:
            results += bench_side_by_side(
                args.postgres,
                args.scale,
                name=f"{args.db_prefix}_side",
                peer_db=f"{args.db_prefix}_peer",
                dbos_db=f"{args.db_prefix}_dbos",
                n=args.side_n,
                rounds=args.side_rounds,
            )
        except Exception as exc:
            import traceback

            results.append(
                {"key": "side_resume", "kind": "error", "bench": "side_by_side", "error": traceback.format_exc(limit=6)}
            )
            log(f"side by side FAILED: {exc}")

    if "sqlite" not in skip:
        clock.start("sqlite")
        with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp:
            url = f"sqlite:///{tmp}/bench.sqlite3"
            log("SQLite: migrating a temporary database")
            migrate(url)
            results += inproc(url, args.scale, only="commit,begin")

    if "process" not in skip:
        clock.start("process")
        log("process start")
        with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp:
            results.append(bench_process_start(f"sqlite:///{tmp}/unused.sqlite3", sizes["process_runs"]))

    if "retention" not in skip:
        clock.start("retention")
        results += bench_retention_part(args.postgres, args.scale, name=f"{args.db_prefix}_retention", pg=pg_ok)

    if "cron_start" not in skip:
        clock.start("cron_start")
        base = args.postgres if pg_ok else None
        results += bench_cron_start_part(base, sizes["process_runs"], name=f"{args.db_prefix}_cron")

    if "delivery" not in skip:
        clock.start("delivery")
        base = args.postgres if pg_ok else None
        results += bench_delivery_part(base, sizes["deliveries"], name=f"{args.db_prefix}_delivery")

    if "intake" not in skip and pg_ok:
        clock.start("intake")
        results += bench_intake_part(
            args.postgres, sizes["intake_cases"], sizes["intake_rounds"], name=f"{args.db_prefix}_intake"
        )

    if "reconcile" not in skip:
        clock.start("reconcile")
        try:
            results += bench_reconcile(
                args.postgres, sizes, fresh=args.fresh, name=f"{args.db_prefix}_reconcile", scale=args.scale
            )
        except Exception as exc:
            import traceback

            results.append(
                {
                    "key": "reconcile_command",
                    "kind": "error",
                    "bench": "reconcile",
                    "error": traceback.format_exc(limit=6),
                }
            )
            log(f"reconcile FAILED: {exc}")

    if "audit_export" not in skip and pg_ok:
        clock.start("audit_export")
        results += bench_audit_export_part(args.postgres, sizes, fresh=args.fresh, name=f"{args.db_prefix}_audit")

    clock.stop()
    info["load_after"] = os.getloadavg()
    info["duration_s"] = time.perf_counter() - started
    info["part_s"] = clock.seconds
    info["scale"] = args.scale
    info["command"] = "make bench" if args.scale == "full" else f"python -m bench.run --scale {args.scale}"
    if only:
        info["command"] += f' BENCH_ARGS="--only {args.only}"' if args.scale == "full" else f" --only {args.only}"
    info["date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if only and Path(args.out).exists():
        # A partial run replaces its own sections and keeps the rest of the document.
        _write_sections(Path(args.out), report.render_sections(info, results))
    else:
        _write_report(Path(args.out), report.render(info, results))
    log(f"wrote {args.out}")
    took = time.perf_counter() - started
    log(report.wall_time_line(took, clock.seconds))
    if not only and took > report.BUDGET_S:
        log(f"OVER BUDGET: the whole run took more than {report.BUDGET_S // 60} minutes")
    failed = [r for r in results if r.get("kind") == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
