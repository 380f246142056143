"""Bulk-load many operations into a benchmark PostgreSQL database, set-based and fast.

One ``INSERT ... SELECT FROM generate_series`` per table, in one transaction, into the
migrated schema (constraints, unique indexes and append-only triggers in place; the other
indexes are built after the rows are in). The rows are made on the server, so there is
nothing to stream from the client (what COPY would save). The mix per
100 operations: 1 approved without effect (``NoLocalEffectRecorded``), 29 committed, 10
declined, 60 pending. Only raw psycopg here: no Django, so the orchestrator can use it.
"""

from __future__ import annotations

# g % 100 == 0: approved, effect missing; 1..29: approved with effect; 30..39: declined.
MIX = {"NoLocalEffectRecorded": 1, "Committed": 29, "Declined": 10, "Pending": 60}


def expected_states(n: int) -> dict:
    """How many operations of each state ``load_operations(n)`` creates (for checks)."""
    counts = dict.fromkeys(MIX, 0)
    for g in range(1, n + 1):
        r = g % 100
        state = "NoLocalEffectRecorded" if r == 0 else "Committed" if r < 30 else "Declined" if r < 40 else "Pending"
        counts[state] += 1
    return counts


def _rebuilt_indexes(cur, tables: tuple[str, ...]) -> list[str]:
    """Drop the indexes of ``tables`` that back no constraint; returns their definitions,
    to run once the rows are in (maintaining a GIN index row by row made the million-case
    load 5x slower)."""
    cur.execute(
        """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i
        WHERE i.indrelid = ANY(%s::regclass[])
          AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
        """,
        (list(tables),),
    )
    rebuild = cur.fetchall()
    for name, _ in rebuild:
        cur.execute(f"DROP INDEX {name}")
    return [definition for _, definition in rebuild]


def _vacuum_analyze(conn) -> None:
    was = conn.autocommit
    conn.autocommit = True  # VACUUM cannot run inside a transaction
    try:
        conn.execute("VACUUM ANALYZE")
    finally:
        conn.autocommit = was


def load_operations(conn, n: int, *, prefix: str = "L") -> None:
    """``n`` cases, each with one current prepared proposal, decisions and effects per MIX.

    Expects empty case, proposal, decision and effect tables (explicit ids 1..n); moves
    the id sequences past them so later ORM inserts do not collide.
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM cases_case")
        if cur.fetchone()[0]:
            raise RuntimeError("load_operations needs an empty, freshly migrated database")
        cur.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff, "
            "is_active, date_joined) VALUES ('!', false, 'bench-loader', '', '', '', true, true, now()) RETURNING id"
        )
        user_id = cur.fetchone()[0]
        cur.execute(
            "INSERT INTO cases_policy (name, label, parameters, policy_id) VALUES "
            "('support-reply', 'v3', '{\"allowance_units\": 9}', %s) RETURNING id",
            ("pol-v1-" + "0" * 64,),
        )
        policy_id = cur.fetchone()[0]
        # The rows are consistent by construction, so the per-row foreign-key triggers are
        # switched off for this transaction (superuser only; the benchmark database is ours):
        # checking 3 million references one by one would dominate the load time.
        cur.execute("SET LOCAL session_replication_role = replica")
        # Indexes that back no constraint (the case list's order and trigram indexes, the
        # foreign-key indexes) are dropped for the load and built once after it, in this
        # transaction.
        tables = ("cases_case", "reviews_proposal", "reviews_reviewdecision", "effects_effectrecord")
        rebuild = _rebuilt_indexes(cur, tables)
        cur.execute(
            """
            INSERT INTO cases_case (id, case_id, subject, customer_message, action, policy_id, draft,
                                    import_digest, current_proposal_id, created_at, evidence_hold)
            SELECT g, %(prefix)s || '-' || lpad(g::text, 7, '0'), 'Gateway reboots after firmware 4.2.0 (bulk ' || g || ')',
                   'Two of our gateways reboot every few minutes.', 'record_support_review', %(policy)s,
                   'Hello, please collect a diagnostic export.', '', g, now() - (g || ' seconds')::interval, ''
            FROM generate_series(1, %(n)s) g
            """,
            {"prefix": prefix, "policy": policy_id, "n": n},
        )
        cur.execute(
            """
            INSERT INTO reviews_proposal (id, case_id, action, body, passages, findings, policy_snapshot,
                                          evidence_id, policy_id, operation_id, origin, parent_id, author_id,
                                          unchecked_sentences, created_at)
            SELECT g, g, 'record_support_review', 'Hello, please collect a diagnostic export.',
                   '[{"source_id": "KB-311", "version": 3, "quotation": "open System > Support"}]',
                   '[]', '{"name": "support-reply", "label": "v3", "parameters": {"allowance_units": 9}}',
                   'ev-v1-' || repeat('1', 64), 'pol-v1-' || repeat('0', 64),
                   'op-v1-' || encode(sha256(convert_to(%(prefix)s || g, 'UTF8')), 'hex'),
                   'prepared', NULL, NULL, '[]', now() - (g || ' seconds')::interval
            FROM generate_series(1, %(n)s) g
            """,
            {"prefix": prefix, "n": n},
        )
        cur.execute(
            """
            INSERT INTO reviews_reviewdecision (id, operation_id, proposal_id, approved, reviewer_id, decided_at)
            SELECT p.id, p.operation_id, p.id, (p.id %% 100) < 30, %(user)s, now()
            FROM reviews_proposal p WHERE p.id <= %(n)s AND (p.id %% 100) < 40
            """,
            {"user": user_id, "n": n},
        )
        cur.execute(
            """
            INSERT INTO effects_effectrecord (id, operation_id, decision_id, case_id, proposal_id, action, body,
                                              evidence_id, source_versions, policy_id, policy_snapshot,
                                              reviewer_id, recorded_at)
            SELECT d.id, d.operation_id, d.id, p.case_id, p.id, p.action, p.body, p.evidence_id,
                   '{"KB-311": 3}', p.policy_id, p.policy_snapshot, d.reviewer_id, now()
            FROM reviews_reviewdecision d JOIN reviews_proposal p ON p.id = d.proposal_id
            WHERE d.approved AND (d.id % 100) <> 0
            """
        )
        cur.execute("SET LOCAL maintenance_work_mem = '256MB'")
        for definition in rebuild:
            cur.execute(definition)
        for table in tables:
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    _vacuum_analyze(conn)


# The pages' extra rows, per 100 cases: one commit attempt per operation (the approvals and
# declines as committed and declined, the undecided ones refused as stale), a delivery per
# effect (Delivered), and 10 pending reviews (g % 100 in 40..49), in the queue's order.
PENDING_PER_100 = 10


def load_page_extras(conn, n: int) -> None:
    """The rows the admin's other lists read, over what ``load_operations(n)`` made: ``n``
    commit attempts, a delivery per effect and ``n // 10`` pending reviews. Same method:
    set-based inserts, the non-constraint indexes rebuilt after."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM effects_commitattempt")
        if cur.fetchone()[0]:
            raise RuntimeError("load_page_extras needs the attempt table empty")
        cur.execute("SELECT id FROM auth_user WHERE username = 'bench-loader'")
        user_id = cur.fetchone()[0]
        cur.execute("SET LOCAL session_replication_role = replica")
        rebuild = _rebuilt_indexes(cur, ("effects_commitattempt", "effects_delivery", "reviews_pendingreview"))
        cur.execute(
            """
            INSERT INTO effects_commitattempt (operation_id, case_id, approved, reviewer_id, outcome, channel,
                                               reason, detail, attempted_at)
            SELECT p.operation_id, p.case_id, d.approved, %(user)s,
                   CASE WHEN d.id IS NULL THEN 'stale' WHEN d.approved THEN 'committed' ELSE 'declined' END,
                   'admin', CASE WHEN d.id IS NULL THEN 'stale' END, '', p.created_at + interval '1 minute'
            FROM reviews_proposal p LEFT JOIN reviews_reviewdecision d ON d.proposal_id = p.id
            WHERE p.id <= %(n)s
            ORDER BY p.id
            """,
            {"user": user_id, "n": n},
        )
        cur.execute(
            """
            INSERT INTO effects_delivery (operation_id, state, tries, next_try_at, lease_owner, reference, reason,
                                          created_at, updated_at, settled_at, case_id, decision_id, effect_id)
            SELECT e.operation_id, 'delivered', 1, e.recorded_at, '', 'HD-' || e.id, '', e.recorded_at,
                   e.recorded_at, e.recorded_at, e.case_id, e.decision_id, e.id
            FROM effects_effectrecord e ORDER BY e.id
            """
        )
        cur.execute(
            """
            INSERT INTO reviews_pendingreview (operation_id, workflow_session_id, checkpoint_id, workflow_version,
                                               status, created_at, updated_at, case_id, proposal_id, begun_by_id,
                                               begun_channel, graph_fingerprint)
            SELECT p.operation_id, 'bench-' || p.id, 'bench-checkpoint-' || p.id, 'bench', 'pending',
                   p.created_at, p.created_at, p.case_id, p.id, %(user)s, 'admin', ''
            FROM reviews_proposal p
            WHERE p.id <= %(n)s AND (p.id %% 100) >= 40 AND (p.id %% 100) < 40 + %(pending)s
            ORDER BY p.id
            """,
            {"user": user_id, "n": n, "pending": PENDING_PER_100},
        )
        cur.execute("SET LOCAL maintenance_work_mem = '256MB'")
        for definition in rebuild:
            cur.execute(definition)
    _vacuum_analyze(conn)


# The narrow anti-join: only the operations that need attention (approved, no effect).
ANTI_JOIN_SQL = """
    SELECT c.case_id, d.operation_id
    FROM reviews_reviewdecision d
    JOIN reviews_proposal p ON p.id = d.proposal_id
    JOIN cases_case c ON c.id = p.case_id
    WHERE d.approved AND NOT EXISTS (SELECT 1 FROM effects_effectrecord e WHERE e.operation_id = d.operation_id)
"""


# The reconcile query of effects.services (``_reconcile_query``) with every filter off,
# spelled out for the raw baselines: the same joins, rows and order, and the columns that
# ``reconcile --json`` makes each line from (the case, the operation, the decision, whether the
# effect exists, the decline reason, the delivery's state and reference). A test holds the
# text to the service's (tests/bench/test_bench_smoke.py).
RECONCILE_COLUMNS = "c.case_id, p.operation_id, d.approved, e.id, d.decline_reason, dl.state, dl.reference"
RECONCILE_SQL = f"""
    SELECT {RECONCILE_COLUMNS}
    FROM reviews_proposal p
    JOIN cases_case c ON c.id = p.case_id
    LEFT JOIN reviews_reviewdecision d ON d.operation_id = p.operation_id
    LEFT JOIN effects_effectrecord e ON e.operation_id = p.operation_id
    LEFT JOIN effects_delivery dl ON dl.operation_id = p.operation_id
    WHERE (d.id IS NOT NULL OR c.current_proposal_id = p.id)
    ORDER BY c.case_id, p.id
"""
