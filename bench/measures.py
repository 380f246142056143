"""The in-process benchmarks. Each returns a result dict that bench.report renders.

Every measure is paired with its baseline in the same process, on the same database, and
the two are interleaved run by run (their order alternates), so a noisy neighbour slows
both. A run's ratio is computed from its own pair; the report shows the median ratio of
several runs and its spread. Absolute figures are only context.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
import timeit
from datetime import UTC, datetime

from bench.data import bench_reviewer, make_cases, raw_connect, run_token, template_case

# --- result shape -----------------------------------------------------------------------


def result(key, title, *, subject, baseline, kind, unit, goal=None, note="", **extra) -> dict:
    """``kind`` is "speed" (ratio = subject rate / baseline rate) or "cost" (ratio = subject
    time / baseline time); ``goal`` is ("≥", 0.5) or ("≤", 4.0) against that ratio."""
    return {
        "key": key,
        "title": title,
        "subject": subject,
        "baseline": baseline,
        "kind": kind,
        "unit": unit,
        "goal": goal,
        "note": note,
        "subject_values": [],
        "baseline_values": [],
        "ratios": [],
        **extra,
    }


def add_pair(res: dict, subject_value: float, baseline_value: float) -> None:
    res["subject_values"].append(subject_value)
    res["baseline_values"].append(baseline_value)
    # speed: subject rate / baseline rate; cost: subject time / baseline time. Both are
    # subject / baseline because the values are rates for one kind and times for the other.
    res["ratios"].append(subject_value / baseline_value)


def paired(runs: int, baseline, subject):
    """Yield (subject_value, baseline_value) per run, alternating which goes first."""
    for i in range(runs):
        if i % 2 == 0:
            b = baseline(i)
            s = subject(i)
        else:
            s = subject(i)
            b = baseline(i)
        yield s, b


# --- 1. identity ------------------------------------------------------------------------


def realistic_draft(target_bytes: int = 4096, *, polish: bool = False) -> str:
    """A support reply of ``target_bytes`` UTF-8 bytes with LF line endings: the demo draft
    (English, as the demo cases are) extended with more of the same; ``polish`` extends it
    with a Polish paragraph instead, so that a third of it is non-ASCII."""
    text = template_case().draft
    extra = (
        (
            "\n\nProszę zebrać eksport diagnostyczny z każdej bramy, która się restartuje: "
            "System > Wsparcie > Eksport diagnostyczny, zaznacz dzienniki awarii."
        )
        if polish
        else (
            "\n\nIf a gateway keeps rebooting before you can collect the export, note the time of each "
            "reboot and the number of VPN tunnels it carries, and attach that list to this case."
        )
    )
    while len(text.encode()) < target_bytes:
        text += extra
    return text.encode()[:target_bytes].decode("utf-8", "ignore")


def bench_identity(*, runs: int, number: int) -> list[dict]:
    """operation_id vs SHA-256 of the same framed bytes; also a draft with non-ASCII
    text, each against its own baseline in the same run."""
    from core import identity
    from reviews.services import prepared_content

    case = template_case()
    content = prepared_content(case)
    ev, pol = content["evidence_id"], content["policy_id"]
    entries = []
    variants = [
        ("identity", "1. identity: operation_id over a 4 KiB draft", identity.operation_id, False, ("≥", 0.8)),
        (
            "identity_nonascii",
            "1 (context). identity: a 4 KiB draft, one third Polish",
            identity.operation_id,
            True,
            None,
        ),
    ]
    for key, title, fn, polish, goal in variants:
        body = realistic_draft(polish=polish)
        args = (case.case_id, case.action, body, ev, pol)
        framed = identity.encode_fields((identity.OPERATION_TAG, *args))
        if fn(*args) != identity.operation_id(*args):
            raise AssertionError(f"{key}: the implementation disagrees with core.identity")
        res = result(
            key,
            title,
            subject=f"`{fn.__module__}.operation_id` (normalize, UTF-8, frame, SHA-256, hex)",
            baseline="`hashlib.sha256(framed).hexdigest()` over the same framed bytes",
            kind="speed",
            unit="µs/op",
            goal=goal,
            draft_bytes=len(body.encode()),
            framed_bytes=len(framed),
        )

        def baseline(_, framed=framed):
            return timeit.timeit(lambda: hashlib.sha256(framed).hexdigest(), number=number) / number

        def subject(_, fn=fn, args=args):
            return timeit.timeit(lambda: fn(*args), number=number) / number

        subject(0), baseline(0)  # warm-up
        entries.append((res, baseline, subject))
    # Every run measures all variants, each right next to its own baseline, so a burst of
    # noise lands on one run of each rather than on every run of one variant.
    for i in range(runs):
        for res, baseline, subject in entries:
            if i % 2 == 0:
                b_time, s_time = baseline(i), subject(i)
            else:
                s_time, b_time = subject(i), baseline(i)
            # speed ratio: subject rate / baseline rate = baseline time / subject time
            res["subject_values"].append(s_time * 1e6)
            res["baseline_values"].append(b_time * 1e6)
            res["ratios"].append(b_time / s_time)
    return [res for res, _, _ in entries]


# --- 1b. the text policy's markers ---------------------------------------------------------


def adversarial_text(target_bytes: int) -> str:
    """Soft hyphens (two bytes each), a line break after every 79: the text the API's
    request limit lets in with the most markers and lines."""
    line = "\u00ad" * 79
    return "\n".join([line] * max(1, target_bytes // (len(line.encode()) + 1)))


def bench_markers(*, runs: int, sizes: tuple[int, ...]) -> list[dict]:
    """``core.text.markers`` over adversarial text at each size vs ``str.count`` of the
    marked character over the same text, at each size (bytes of UTF-8): a constant ratio
    across the sizes is linear growth (docs/TEXT.md)."""
    from core import text

    entries = []
    for size in sizes:
        body = adversarial_text(size)
        found = text.markers(body)
        if len(found) != body.count("\u00ad"):
            raise AssertionError(f"markers: {len(found)} markers in a text with {body.count(chr(0xAD))}")
        res = result(
            f"markers_{size // 1000}k",
            f"1b. text policy: markers over {size // 1000} KB of soft hyphens",
            subject="`core.text.markers` (find, place by line and column, name)",
            baseline="`str.count` of the soft hyphen over the same text",
            kind="cost",
            unit="ms/op",
            text_bytes=len(body.encode()),
            markers=len(found),
        )

        def baseline(_, body=body):
            start = time.perf_counter()
            body.count("\u00ad")
            return time.perf_counter() - start

        def subject(_, body=body):
            start = time.perf_counter()
            text.markers(body)
            return time.perf_counter() - start

        for s_time, b_time in paired(runs, baseline, subject):
            add_pair(res, s_time * 1e3, b_time * 1e3)
        entries.append(res)
    return entries


# --- raw baselines ----------------------------------------------------------------------


def _raw_rows(cases, reviewer_id) -> list[tuple]:
    """Per operation: what the raw baseline inserts, prepared before the clock starts."""
    from reviews.models import Proposal

    proposals = Proposal.objects.filter(case__in=cases).order_by("id")
    rows = []
    for p in proposals:
        rows.append(
            (
                p.operation_id,
                p.pk,
                p.case_id,
                p.action,
                p.body,
                p.evidence_id,
                json.dumps({x["source_id"]: x["version"] for x in p.passages}),
                p.policy_id,
                json.dumps(p.policy_snapshot),
                reviewer_id,
            )
        )
    return rows


def _raw_sql(vendor: str) -> dict:
    """The two inserts commit makes, written by hand against the same tables.

    Fresh: decision then effect, one transaction. Replay: the same two inserts again; both
    hit the unique key on operation_id and are absorbed with ON CONFLICT DO NOTHING, the
    cheapest way a raw client can send a conflicting insert and keep its transaction.
    """
    from effects.models import EffectRecord
    from reviews.models import ReviewDecision

    d, e = ReviewDecision._meta.db_table, EffectRecord._meta.db_table
    ph = "%s" if vendor == "postgresql" else "?"
    js = "::jsonb" if vendor == "postgresql" else ""
    decision_cols = "operation_id, proposal_id, approved, reviewer_id, decided_at"
    effect_cols = (
        "operation_id, decision_id, case_id, proposal_id, action, body, evidence_id, source_versions, "
        "policy_id, policy_snapshot, reviewer_id, recorded_at"
    )
    effect_vals = f"{ph}, {{decision}}, {ph}, {ph}, {ph}, {ph}, {ph}, {ph}{js}, {ph}, {ph}{js}, {ph}, {ph}"
    return {
        "decision": f"INSERT INTO {d} ({decision_cols}) VALUES ({ph}, {ph}, TRUE, {ph}, {ph}) RETURNING id",
        "effect": f"INSERT INTO {e} ({effect_cols}) VALUES ({effect_vals.format(decision=ph)})",
        "decision_replay": f"INSERT INTO {d} ({decision_cols}) VALUES ({ph}, {ph}, TRUE, {ph}, {ph}) ON CONFLICT DO NOTHING",
        "effect_replay": (
            f"INSERT INTO {e} ({effect_cols}) VALUES ("
            + effect_vals.format(decision=f"(SELECT id FROM {d} WHERE operation_id = {ph})")
            + ") ON CONFLICT DO NOTHING"
        ),
    }


def _now(vendor):
    now = datetime.now(UTC)
    return now if vendor == "postgresql" else now.isoformat(sep=" ")


def raw_commit_loop(conn, vendor: str, rows: list[tuple], *, replay: bool) -> None:
    """The physical floor: one transaction per operation with the two inserts."""
    sql = _raw_sql(vendor)
    cur = conn.cursor()
    for op, proposal_id, case_id, action, body, ev, sv, pol, snap, reviewer_id in rows:
        now = _now(vendor)
        if vendor != "postgresql":
            cur.execute("BEGIN IMMEDIATE")
        if replay:
            cur.execute(sql["decision_replay"], (op, proposal_id, reviewer_id, now))
            cur.execute(
                sql["effect_replay"], (op, op, case_id, proposal_id, action, body, ev, sv, pol, snap, reviewer_id, now)
            )
        else:
            cur.execute(sql["decision"], (op, proposal_id, reviewer_id, now))
            decision_id = cur.fetchone()[0]
            cur.execute(
                sql["effect"],
                (op, decision_id, case_id, proposal_id, action, body, ev, sv, pol, snap, reviewer_id, now),
            )
        if vendor == "postgresql":
            conn.commit()
        else:
            cur.execute("COMMIT")


def _commit_loop(ops, reviewer, *, expect_replay: bool) -> None:
    from core.outcomes import ReceiptStatus
    from effects.services import effect_commit

    for op in ops:
        r = effect_commit(operation_id=op, approved=True, reviewer=reviewer, channel="bench")
        if r.replay is not expect_replay or r.status != ReceiptStatus.COMMITTED:
            raise AssertionError(f"unexpected commit result for {op}: {r}")


def _ops(cases) -> list[str]:
    return [c.current_proposal.operation_id for c in cases]


# --- 2 and 4: commit and replay, one connection -----------------------------------------


def bench_commit(*, runs: int, n: int, vendor: str) -> tuple[dict, dict, dict]:
    """Fresh approvals per second through effect_commit vs two raw inserts; then replays."""
    from django.db import connection

    reviewer = bench_reviewer()
    token = run_token()
    subject_sets = [make_cases(n, prefix=f"{token}-s{i}", proposals=True) for i in range(runs)]
    baseline_sets = [make_cases(n, prefix=f"{token}-b{i}", proposals=True) for i in range(runs)]
    warm = make_cases(min(5, n), prefix=f"{token}-w", proposals=True)
    _commit_loop(_ops(warm), reviewer, expect_replay=False)  # warm caches and statements

    db = "PostgreSQL" if vendor == "postgresql" else "SQLite"
    raw = "raw psycopg" if vendor == "postgresql" else "raw sqlite3"
    commit = result(
        f"commit_{vendor}",
        f"{'2' if vendor == 'postgresql' else '10'}. commit: fresh approvals/s, one connection, {db}",
        subject="`effect_commit` (decision + effect + attempt, one durable transaction)",
        baseline=f"{raw}: INSERT decision RETURNING id, INSERT effect, one transaction",
        kind="speed",
        unit="ops/s",
        goal=("≥", 0.5) if vendor == "postgresql" else None,
        n=n,
    )
    replay = result(
        f"replay_{vendor}",
        f"{'4' if vendor == 'postgresql' else '10'}. replays/s (the same approval again), {db}",
        subject="`effect_commit` of an approval already committed (reports replay, writes an attempt)",
        baseline=f"{raw}: the same two inserts, both conflicting (ON CONFLICT DO NOTHING), one transaction",
        kind="speed",
        unit="ops/s",
        goal=("≥", 0.5) if vendor == "postgresql" else None,
        n=n,
    )
    orm = result(
        f"orm_{vendor}",
        f"{'2' if vendor == 'postgresql' else '10'} (context). the Django ORM floor, {db}",
        subject="the same two rows with `objects.create` in one `transaction.atomic()` (no lookup, lock or attempt)",
        baseline=f"{raw}: INSERT decision RETURNING id, INSERT effect, one transaction",
        kind="speed",
        unit="ops/s",
        goal=None,
        n=n,
    )
    orm_sets = [make_cases(n, prefix=f"{token}-o{i}", proposals=True) for i in range(runs)]
    conn = raw_connect()
    try:
        baseline_rows = [_raw_rows(cases, reviewer.pk) for cases in baseline_sets]
        connection.close()  # SQLite: no Django write transaction or lock is held meanwhile

        def b(i):
            t = time.perf_counter()
            raw_commit_loop(conn, vendor, baseline_rows[i], replay=False)
            return n / (time.perf_counter() - t)

        def s(i):
            t = time.perf_counter()
            _commit_loop(_ops(subject_sets[i]), reviewer, expect_replay=False)
            return n / (time.perf_counter() - t)

        def o(i):
            t = time.perf_counter()
            _orm_two_inserts(orm_sets[i], reviewer)
            return n / (time.perf_counter() - t)

        for i in range(runs):
            # Three-way interleave: raw, ORM and effect_commit, rotating which goes first.
            fns = [("b", b), ("o", o), ("s", s)]
            fns = fns[i % 3 :] + fns[: i % 3]
            got = {k: fn(i) for k, fn in fns}
            add_pair(commit, got["s"], got["b"])
            add_pair(orm, got["o"], got["b"])

        def rb(i):
            t = time.perf_counter()
            raw_commit_loop(conn, vendor, baseline_rows[i], replay=True)
            return n / (time.perf_counter() - t)

        def rs(i):
            t = time.perf_counter()
            _commit_loop(_ops(subject_sets[i]), reviewer, expect_replay=True)
            return n / (time.perf_counter() - t)

        for sv, bv in paired(runs, rb, rs):
            add_pair(replay, sv, bv)
    finally:
        conn.close()
    _check_effects(baseline_sets + subject_sets + orm_sets)
    return commit, replay, orm


def _orm_two_inserts(cases, reviewer) -> None:
    """What the framework alone costs: the two rows through the ORM, nothing else."""
    from django.db import transaction

    from effects.models import EffectRecord
    from effects.services import _effect_fields
    from reviews.models import ReviewDecision

    for c in cases:
        p = c.current_proposal
        with transaction.atomic():
            d = ReviewDecision.objects.create(operation_id=p.operation_id, proposal=p, approved=True, reviewer=reviewer)
            EffectRecord.objects.create(**_effect_fields(p, d))


def _check_effects(case_sets) -> None:
    """Each benchmarked operation ended with exactly one decision and one effect."""
    from effects.models import EffectRecord
    from reviews.models import ReviewDecision

    ops = [op for cases in case_sets for op in _ops(cases)]
    for model in (ReviewDecision, EffectRecord):
        found = model.objects.filter(operation_id__in=ops).count()
        if found != len(ops):
            raise AssertionError(f"{model.__name__}: {found} rows for {len(ops)} operations")


# --- 3: eight workers -------------------------------------------------------------------


def _worker(kind, payload, reviewer_pk, vendor, barrier, queue):
    """One process, its own connection: wait for the others, then do its slice."""
    from django.db import connections

    try:
        if kind == "raw":
            conn = raw_connect()
            barrier.wait()
            t0 = time.perf_counter()
            raw_commit_loop(conn, vendor, payload, replay=False)
            t1 = time.perf_counter()
            conn.close()
        else:
            from django.contrib.auth import get_user_model

            reviewer = get_user_model().objects.get(pk=reviewer_pk)
            reviewer.has_perm("reviews.review_proposal")
            barrier.wait()
            t0 = time.perf_counter()
            _commit_loop(payload, reviewer, expect_replay=False)
            t1 = time.perf_counter()
        queue.put(("ok", t0, t1, len(payload)))
    except BaseException as exc:  # reported to the parent, which raises
        barrier.abort()
        queue.put(("error", repr(exc), 0, 0))
    finally:
        connections.close_all()


def _parallel(kind, slices, reviewer_pk, vendor) -> float:
    """Operations per second across all workers: total / (last finish - first start)."""
    from django.db import connections

    connections.close_all()  # children must not share the parent's socket
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(len(slices)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, s, reviewer_pk, vendor, barrier, queue)) for s in slices]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    errors = [r[1] for r in reports if r[0] != "ok"]
    if errors:
        raise RuntimeError(f"{kind} worker failed: {errors[0]}")
    start, end = min(r[1] for r in reports), max(r[2] for r in reports)
    return sum(r[3] for r in reports) / (end - start)


def bench_commit_concurrent(*, runs: int, n_per_worker: int, workers: int = 8) -> dict:
    reviewer = bench_reviewer()
    token = run_token()
    res = result(
        "commit_concurrent",
        f"3. commit with {workers} concurrent workers, each its own connection, PostgreSQL",
        subject=f"`effect_commit` in {workers} processes",
        baseline=f"raw psycopg two-insert transactions in {workers} processes",
        kind="speed",
        unit="ops/s",
        goal=("≥", 0.5),
        n=n_per_worker * workers,
        workers=workers,
    )
    total = n_per_worker * workers
    subject_sets = [make_cases(total, prefix=f"{token}-cs{i}", proposals=True) for i in range(runs)]
    baseline_sets = [make_cases(total, prefix=f"{token}-cb{i}", proposals=True) for i in range(runs)]
    warm = make_cases(min(5, n_per_worker), prefix=f"{token}-cw", proposals=True)
    _commit_loop(_ops(warm), reviewer, expect_replay=False)
    baseline_rows = [_raw_rows(cases, reviewer.pk) for cases in baseline_sets]

    def split(items):
        return [items[w::workers] for w in range(workers)]

    def b(i):
        return _parallel("raw", split(baseline_rows[i]), reviewer.pk, "postgresql")

    def s(i):
        return _parallel("django", split(_ops(subject_sets[i])), reviewer.pk, "postgresql")

    for sv, bv in paired(runs, b, s):
        add_pair(res, sv, bv)
    _check_effects(baseline_sets + subject_sets)
    return res


# --- 5 and 6: the workflow --------------------------------------------------------------


def bench_begin(*, runs: int, n: int, vendor: str) -> dict:
    """``review_begin`` (prepare, pause at the human step, checkpoint, pending review) vs
    ``proposal_create`` alone, both on fresh cases."""
    from reviews.services import proposal_create
    from workflow.begin import review_begin

    db = "PostgreSQL" if vendor == "postgresql" else "SQLite"
    token = run_token()
    res = result(
        f"begin_{vendor}",
        f"{'6' if vendor == 'postgresql' else '10'}. begin in-process, {db}",
        subject="`workflow.review_begin` (proposal, run to the human step, checkpoints, pending review)",
        baseline="`proposal_create` on a fresh case",
        kind="cost",
        unit="ms/op",
        goal=("≤", 4.0) if vendor == "postgresql" else None,
        n=n,
    )
    subject_sets = [make_cases(n, prefix=f"{token}-gs{i}", proposals=False) for i in range(runs)]
    baseline_sets = [make_cases(n, prefix=f"{token}-gb{i}", proposals=False) for i in range(runs)]
    for c in make_cases(min(3, n), prefix=f"{token}-gw", proposals=False):
        review_begin(case=c)
        proposal_create(case=c)

    def b(i):
        t = time.perf_counter()
        for c in baseline_sets[i]:
            proposal_create(case=c)
        return (time.perf_counter() - t) / n * 1000

    def s(i):
        t = time.perf_counter()
        for c in subject_sets[i]:
            review_begin(case=c)
        return (time.perf_counter() - t) / n * 1000

    for sv, bv in paired(runs, b, s):
        add_pair(res, sv, bv)
    return res


def _begin_result_op(begin_result, case) -> str:
    op = getattr(begin_result, "operation_id", None)
    if op:
        return op
    case.refresh_from_db()
    return case.current_proposal.operation_id


def _begun_cases(n: int, *, prefix: str) -> list[tuple]:
    """``n`` fresh cases, each begun with ``review_begin``: (case, operation_id) pairs."""
    from workflow.begin import review_begin

    return [(c, _begin_result_op(review_begin(case=c), c)) for c in make_cases(n, prefix=prefix, proposals=False)]


def _resume_loop(begun, reviewer) -> None:
    """Resume + approve + commit each begun case through the one decision service."""
    from workflow.decide import decision_record

    for c, op in begun:
        decision_record(case=c, operation_id=op, approved=True, reviewer=reviewer, channel="bench")


def bench_resume(*, runs: int, n: int, vendor: str) -> dict:
    """``decision_record`` (approve) from the recorded checkpoint vs the bare ``effect_commit``."""
    reviewer = bench_reviewer()
    token = run_token()
    db = "PostgreSQL" if vendor == "postgresql" else "SQLite"
    res = result(
        f"resume_{vendor}",
        f"5. workflow: resume + approve in-process, {db}",
        subject="`workflow.decision_record(approved=True)`: load checkpoint, re-emitted request, commit step",
        baseline="the bare `effect_commit` on a fresh approval",
        kind="cost",
        unit="ms/op",
        goal=("≤", 4.0),
        n=n,
    )
    subject_sets = [_begun_cases(n, prefix=f"{token}-rs{i}") for i in range(runs)]
    baseline_sets = [make_cases(n, prefix=f"{token}-rb{i}", proposals=True) for i in range(runs)]
    _resume_loop(_begun_cases(min(2, n), prefix=f"{token}-rw"), reviewer)
    _commit_loop(_ops(make_cases(min(2, n), prefix=f"{token}-rx", proposals=True)), reviewer, expect_replay=False)

    def b(i):
        ops = _ops(baseline_sets[i])
        t = time.perf_counter()
        _commit_loop(ops, reviewer, expect_replay=False)
        return (time.perf_counter() - t) / n * 1000

    def s(i):
        t = time.perf_counter()
        _resume_loop(subject_sets[i], reviewer)
        return (time.perf_counter() - t) / n * 1000

    for sv, bv in paired(runs, b, s):
        add_pair(res, sv, bv)
    _check_effects([[c for c, _ in cases] for cases in subject_sets])
    return res


# --- 16: resume against its raw floor ---------------------------------------------------


def _floor_sql(conn) -> tuple[str, str]:
    """The raw floor's two statements: the case row lock, and one statement that writes the
    decision and its effect (the effect takes the decision's id from the same statement)."""
    from psycopg import sql

    from cases.models import Case
    from effects.models import EffectRecord
    from reviews.models import ReviewDecision

    lock = sql.SQL("SELECT id FROM {case} WHERE id = %(case_id)s FOR NO KEY UPDATE").format(
        case=sql.Identifier(Case._meta.db_table)
    )
    write = sql.SQL(
        "WITH decision AS ("
        " INSERT INTO {decision} (operation_id, proposal_id, approved, reviewer_id, decided_at)"
        " VALUES (%(op)s, %(proposal)s, TRUE, %(reviewer)s, %(now)s) RETURNING id"
        ") INSERT INTO {effect} (operation_id, decision_id, case_id, proposal_id, action, body, evidence_id,"
        " source_versions, policy_id, policy_snapshot, reviewer_id, recorded_at)"
        " SELECT %(op)s, decision.id, %(case_id)s, %(proposal)s, %(action)s, %(body)s, %(evidence)s,"
        " %(sources)s::jsonb, %(policy)s, %(snapshot)s::jsonb, %(reviewer)s, %(now)s FROM decision"
    ).format(decision=sql.Identifier(ReviewDecision._meta.db_table), effect=sql.Identifier(EffectRecord._meta.db_table))
    return lock.as_string(conn), write.as_string(conn)


def _floor_rows(cases, reviewer_id) -> list[dict]:
    """Per operation: the raw floor's parameters, prepared before the clock starts."""
    names = ("op", "proposal", "case_id", "action", "body", "evidence", "sources", "policy", "snapshot", "reviewer")
    return [dict(zip(names, row, strict=True)) for row in _raw_rows(cases, reviewer_id)]


def raw_floor_loop(conn, rows: list[dict]) -> None:
    """What any resume must at least do, with bare psycopg: per operation BEGIN, the case
    row lock, one write statement, COMMIT (psycopg sends the BEGIN before the first
    statement of a transaction, so these are four round trips)."""
    lock, write = _floor_sql(conn)
    cur = conn.cursor()
    for params in rows:
        cur.execute(lock, params)
        if cur.fetchone() is None:
            raise AssertionError(f"the raw floor found no case row for {params['op']}")
        cur.execute(write, {**params, "now": datetime.now(UTC)})
        conn.commit()


def bench_resume_floor(*, runs: int, n: int) -> dict:
    """Resume + approve + commit of a begun case through ``decision_record`` vs the raw
    floor of the same approval: the lock and the decision and effect rows, in bare psycopg
    on its own connection. PostgreSQL only (the floor's lock is ``FOR NO KEY UPDATE``)."""
    reviewer = bench_reviewer()
    token = run_token()
    res = result(
        "resume_floor",
        "16. resume ÷ the raw floor, PostgreSQL",
        subject="`decision_record(approved=True)` on a begun case: pending review and checkpoint, bind, "
        "engine run, commit (lock; decision, effect, attempt, pending review completed)",
        baseline="raw psycopg (its defaults), own connection: BEGIN; `SELECT … FOR NO KEY UPDATE` of the case "
        "row; one `WITH … INSERT` of the decision and its effect; COMMIT",
        kind="cost",
        unit="ms/op",
        goal=("≤", 2.5),
        n=n,
    )
    subject_sets = [_begun_cases(n, prefix=f"{token}-fs{i}") for i in range(runs)]
    floor_sets = [make_cases(n, prefix=f"{token}-fb{i}", proposals=True) for i in range(runs)]
    floor_rows = [_floor_rows(cases, reviewer.pk) for cases in floor_sets]
    # Six of each before the clock: caches, and psycopg's automatic prepare of the floor's
    # statements (after five runs of a statement, its default, the sixth prepares it).
    warm_floor = make_cases(6, prefix=f"{token}-fx", proposals=True)
    _resume_loop(_begun_cases(6, prefix=f"{token}-fw"), reviewer)
    conn = raw_connect()
    try:
        raw_floor_loop(conn, _floor_rows(warm_floor, reviewer.pk))

        def b(i):
            t = time.perf_counter()
            raw_floor_loop(conn, floor_rows[i])
            return (time.perf_counter() - t) / n * 1000

        def s(i):
            t = time.perf_counter()
            _resume_loop(subject_sets[i], reviewer)
            return (time.perf_counter() - t) / n * 1000

        for sv, bv in paired(runs, b, s):
            add_pair(res, sv, bv)
    finally:
        conn.close()
    _check_effects([warm_floor, *floor_sets] + [[c for c, _ in cases] for cases in subject_sets])
    return res


# --- storage per case -------------------------------------------------------------------

STORAGE_TABLES = [
    ("cases", "case"),
    ("cases", "selectedpassage"),
    ("cases", "finding"),
    ("reviews", "proposal"),
    ("reviews", "reviewdecision"),
    ("reviews", "pendingreview"),
    ("reviews", "workflowcheckpoint"),
    ("effects", "effectrecord"),
    ("effects", "commitattempt"),
]


def _table_stats() -> dict:
    """Rows and bytes per table: row data (pg_column_size of each row, or the length of
    its columns on SQLite) and, on PostgreSQL, the table's on-disk size with indexes."""
    from django.apps import apps
    from django.db import connection

    stats = {}
    with connection.cursor() as cur:
        for app, model in STORAGE_TABLES:
            table = apps.get_model(app, model)._meta.db_table
            if connection.vendor == "postgresql":
                cur.execute(
                    f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0), "
                    f"pg_total_relation_size('{table}') FROM {table} t"
                )
                rows, data, disk = cur.fetchone()
            else:
                cols = [c.column for c in apps.get_model(app, model)._meta.concrete_fields]
                length = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in cols)
                cur.execute(f"SELECT count(*), coalesce(sum({length}), 0) FROM {table}")
                (rows, data), disk = cur.fetchone(), None
            stats[table] = {"rows": rows, "data": data, "disk": disk}
    return stats


def bench_storage(*, n: int, vendor: str) -> dict:
    """Checkpoint bytes per paused case; rows and bytes per finished case (begin + approve)."""
    from reviews.models import WorkflowCheckpoint
    from workflow.begin import review_begin
    from workflow.decide import decision_record

    reviewer = bench_reviewer()
    token = run_token()
    before = _table_stats()
    cases = make_cases(n, prefix=f"{token}-st", proposals=False)
    begun = [(c, _begin_result_op(review_begin(case=c), c)) for c in cases]
    paused = _table_stats()
    ck_table = WorkflowCheckpoint._meta.db_table
    ck_rows = paused[ck_table]["rows"] - before[ck_table]["rows"]
    ck_data = paused[ck_table]["data"] - before[ck_table]["data"]
    payload = sum(
        len(p.encode()) for p in WorkflowCheckpoint.objects.values_list("payload", flat=True).order_by("-id")[:ck_rows]
    )
    for c, op in begun:
        decision_record(case=c, operation_id=op, approved=True, reviewer=reviewer, channel="bench")
    after = _table_stats()
    per_table = {
        t: {
            k: ((after[t][k] - before[t][k]) / n if after[t][k] is not None else None) for k in ("rows", "data", "disk")
        }
        for t in after
    }
    return {
        "key": f"storage_{vendor}",
        "kind": "storage",
        "vendor": vendor,
        "n": n,
        "checkpoint_rows_per_paused_case": ck_rows / n,
        "checkpoint_row_bytes_per_paused_case": ck_data / n,
        "checkpoint_payload_bytes_per_paused_case": payload / n,
        "per_table": per_table,
        "rows_per_finished_case": sum(v["rows"] for v in per_table.values()),
        "data_bytes_per_finished_case": sum(v["data"] for v in per_table.values()),
        "disk_bytes_per_finished_case": (
            sum(v["disk"] for v in per_table.values()) if vendor == "postgresql" else None
        ),
    }


# --- 8, service level -------------------------------------------------------------------


def bench_reconcile_service(*, runs: int) -> dict:
    """``operations_reconcile()`` over every operation in this database, in-process (the
    service's own output, ReconcileRow objects, and nothing more); vs the same SQL through a
    raw psycopg server-side cursor. The command's serialisation is measured by benchmark 8."""
    from effects.services import operations_reconcile

    res = result(
        "reconcile_service",
        "8 (service level). operations_reconcile over all operations, in-process",
        subject="iterate `operations_reconcile()` (one ReconcileRow per operation)",
        baseline="raw psycopg, the same left/anti-join, server-side cursor, rows discarded",
        kind="cost",
        unit="s",
        goal=("≤", 1.5),
    )
    sql = reconcile_sql()
    conn = raw_connect()
    count = {"rows": 0}
    try:

        def b(_):
            t = time.perf_counter()
            # The raw floor gets the best plan too (see operations_reconcile).
            conn.execute("SET cursor_tuple_fraction = 1.0")
            with conn.cursor(name="bench_reconcile") as cur:
                cur.itersize = 2000
                cur.execute(sql)
                rows = 0
                for _row in cur:
                    rows += 1
            conn.commit()
            count["raw"] = rows
            return time.perf_counter() - t

        def s(_):
            t = time.perf_counter()
            rows = 0
            for _row in operations_reconcile():
                rows += 1
            count["rows"] = rows
            return time.perf_counter() - t

        for sv, bv in paired(runs, b, s):
            add_pair(res, sv, bv)
    finally:
        conn.close()
    if count["rows"] != count["raw"]:
        raise AssertionError(f"reconcile reported {count['rows']} operations, raw SQL {count['raw']}")
    res["operations"] = count["rows"]
    return res


def reconcile_sql() -> str:
    from bench.bigdata import RECONCILE_SQL

    return RECONCILE_SQL
