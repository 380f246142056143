"""One approval's route, from the admin's Approve and from the API's POST to the effect's INSERT.

The route is the chain of our functions that are running when the effect row is inserted:
what a reader follows from the button to the row. It is traced with ``sys.setprofile`` (and
``threading.setprofile`` for any thread the approval starts), keeping a call stack of our
functions per thread; the effect's INSERT (seen by a ``connection.execute_wrapper``) takes
a snapshot of the inserting thread's stack. docs/ARCHITECTURE.md lists the route.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.urls import reverse

from effects.models import EffectRecord

ROOT = Path(__file__).resolve().parents[2]
OURS = ("core", "cases", "reviews", "effects", "engine", "workflow", "workplace", "api", "decisionflow")
# At most 8 functions in 4 files, and a ratchet on today's route (admin: 5 functions in 4
# files, API: 4 in 4): it may shrink, never grow. docs/ARCHITECTURE.md lists it.
MAX_FUNCTIONS = 5
MAX_FILES = 4


def _ours(code) -> str | None:
    path = Path(code.co_filename)
    try:
        relative = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(relative) if relative.parts[0] in OURS else None


class RouteTracer:
    """Per thread, the stack of our functions running; at the effect's INSERT, a snapshot."""

    def __init__(self):
        self.stacks: dict[int, list[tuple[str, str]]] = {}
        self.route: list[tuple[str, str]] | None = None
        self.entered: set[tuple[str, str]] = set()

    def profile(self, frame, event, arg):
        if event not in ("call", "return"):
            return
        where = _ours(frame.f_code)
        if where is None:
            return
        stack = self.stacks.setdefault(threading.get_ident(), [])
        name = (where, frame.f_code.co_qualname)
        if event == "call":
            stack.append(name)
            self.entered.add(name)
        elif stack and stack[-1] == name:
            stack.pop()

    def execute(self, execute, sql, params, many, context):
        if self.route is None and "INSERT" in sql.upper() and EffectRecord._meta.db_table in sql:
            self.route = list(self.stacks.get(threading.get_ident(), []))
        return execute(sql, params, many, context)

    def __enter__(self):
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        self._wrapper = connection.execute_wrapper(self.execute)
        self._wrapper.__enter__()
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)
        self._wrapper.__exit__(*exc)


def _distinct(route):
    functions = list(dict.fromkeys(route))
    files = list(dict.fromkeys(where for where, _ in route))
    return functions, files


def _check(tracer: RouteTracer, channel: str, view: str):
    """The route from the channel's view (middleware and URL wrappers before it are not the route)."""
    assert tracer.route is not None, f"{channel}: the approval inserted no effect row"
    starts = [i for i, (_, name) in enumerate(tracer.route) if name.split(".")[-1] == view]
    assert starts, f"{channel}: the view {view} is not on the route: {tracer.route}"
    functions, files = _distinct(tracer.route[starts[0] :])
    listing = "\n".join(f"  {where}: {name}" for where, name in functions)
    print(f"{channel} route ({len(functions)} functions in {len(files)} files):\n{listing}")
    assert len(functions) <= MAX_FUNCTIONS and len(files) <= MAX_FILES, (
        f"{channel}: an approval's route is {len(functions)} functions of ours in {len(files)} files "
        f"(limit {MAX_FUNCTIONS} in {MAX_FILES}):\n{listing}"
    )


@pytest.fixture
def begun(case):
    from workflow.begin import review_begin

    review_begin(case=case, actor=None)
    case.refresh_from_db()
    return case


def test_the_admin_approve_route_fits_on_one_screen(client, reviewer, begun):
    client.force_login(reviewer)
    proposal = begun.current_proposal
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    with RouteTracer() as tracer:
        response = client.post(url, {"operation_id": proposal.operation_id, "decision": "approve"})
    assert response.status_code == 302
    assert EffectRecord.objects.filter(operation_id=proposal.operation_id).count() == 1
    _check(tracer, "admin", "decide_view")


def test_the_api_approve_route_fits_on_one_screen(client, reviewer, begun):
    from api.services import token_create

    token = token_create(user=reviewer, name="route")[1]
    operation_id = begun.current_proposal.operation_id
    with RouteTracer() as tracer:
        response = client.post(
            f"/api/cases/{begun.case_id}/decision",
            {"operation_id": operation_id, "approved": True},
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200, response.content
    assert EffectRecord.objects.filter(operation_id=operation_id).count() == 1
    _check(tracer, "api", "case_decision")
