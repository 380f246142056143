"""docs/intake_client.py, the reference client a pipeline team copies: its identity agrees
with ours byte for byte, and it brings a case in against a real server, once, however often
it is run with the same key."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from cases.models import Case
from core import identity
from reviews.models import PendingReview, Proposal
from reviews.services import file_operation_id
from tests.conftest import DEMO, ROOT, load_fixture

spec = importlib.util.spec_from_file_location("intake_client", ROOT / "docs" / "intake_client.py")
client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client)


def test_the_clients_identities_are_the_protocols_vectors():
    case = load_fixture("t1042.json")
    assert client.operation_id(case) == "op-v1-e3976ac9e004f816de8a7695aa8b5bf99b16b3f893063045153b2a114922fbfc"
    assert client.evidence_id(case["selected_evidence"]) == identity.evidence_id(case["selected_evidence"])
    # The seed's hard case: HOLD-7 v2 -> v4 with the same quotation is another operation.
    moved = {
        **case,
        "selected_evidence": [
            {**p, "version": 4} if p["source_id"] == "HOLD-7" else p for p in case["selected_evidence"]
        ],
    }
    assert client.operation_id(moved) != client.operation_id(case)
    assert client.operation_id(moved) == file_operation_id(moved)


@pytest.mark.django_db(transaction=True)
def test_the_client_brings_a_case_in_once_against_a_live_server(live_server, make_user, tmp_path):
    from api.services import token_create

    token = token_create(user=make_user("pipeline", group="pipeline"), name="intake")[1]
    path = tmp_path / "case.json"
    path.write_text(json.dumps({**load_fixture("t1042.json"), "case_id": "T-3001"}))
    argv = [sys.executable, str(ROOT / "docs" / "intake_client.py"), "--url", live_server.url, "--token", token]
    first = subprocess.run([*argv, "--key", "k-live", str(path)], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("intake: T-3001 op=op-v1-") and "created=True" in first.stdout
    again = subprocess.run([*argv, "--key", "k-live", str(path)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "a replay of the first answer" in again.stdout
    assert Case.objects.filter(case_id="T-3001").count() == 1 and Proposal.objects.count() == 1
    refused = subprocess.run(
        [*argv, "--key", "k-live", str(DEMO / "t1042.json")], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "idempotency_mismatch" in refused.stderr


@pytest.mark.django_db(transaction=True)
def test_the_demo_redraft_in_intake_md_runs_as_written(live_server):
    """docs/INTAKE.md's shell lines for the demo, run by bash against a live server holding the
    demo's T-1042 imported and begun (the state ``make run`` leaves: load_demo begins it): 201,
    and a replay with the key."""
    import os
    import re

    from cases.services import case_import
    from tests.conftest import database_url
    from workflow.begin import review_begin

    review_begin(case=case_import(data=load_fixture("t1042.json")).case)
    text = (ROOT / "docs" / "INTAKE.md").read_text()
    block = re.search(r"```sh\n(export DEBUG=1.*?)```", text, re.S).group(1)
    script = block.replace("http://127.0.0.1:8000", live_server.url).replace(". .venv/bin/activate", "")
    script = script.replace(
        'curl -s -H "Authorization: Bearer $TOKEN" -H "Idempotency-Key',
        'curl -s -w "\\n%{http_code}\\n" -H "Authorization: Bearer $TOKEN" -H "Idempotency-Key',
    )
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
    }
    runs = [
        subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        for _ in range(2)
    ]
    assert runs[0].returncode == 0, runs[0].stderr
    answer, status = runs[0].stdout.strip().rsplit("\n", 1)
    assert status == "201", runs[0].stdout
    assert json.loads(answer)["case"]["proposal"]["origin"] == "pipeline_redraft"
    # Run again: the current operation is the re-draft's, so the key is new and the same
    # draft is no change.
    again, status = runs[1].stdout.strip().rsplit("\n", 1)
    assert (status, json.loads(again)["changed"]) == ("200", False), runs[1].stdout
    assert Proposal.objects.filter(origin="pipeline_redraft").count() == 1
    # The begun prepared proposal is superseded by the re-draft, whose review is pending.
    statuses = dict(PendingReview.objects.values_list("proposal__origin", "status"))
    assert statuses == {"prepared": PendingReview.Status.SUPERSEDED, "pipeline_redraft": PendingReview.Status.PENDING}
