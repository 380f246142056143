"""Approvals and imports racing one policy publish, and what the tables say afterwards.

Shared by tests/workflow/test_publish_policy.py (one round in ``make test``) and
tests/reliability/test_supersession.py (several rounds in ``make reliability``, with figures).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django.db import connections

from cases.models import Case, Policy
from cases.services import case_import
from core import identity
from core.errors import InvalidInput
from reviews.models import ReviewDecision
from workflow.decide import decision_record
from workflow.publishing import PublishResult, policy_publish


@dataclass
class Raced:
    approvals: dict[int, str] = field(default_factory=dict)  # case pk -> outcome or error class
    imports: dict[str, str] = field(default_factory=dict)  # case id -> "imported", "refused" or the message
    published: list[PublishResult] = field(default_factory=list)
    # Decisions on the raced operations decided once the publish had stamped itself, i.e.
    # after its commit point: what a publish promises is 0.
    after_publish: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(o == outcome for o in self.approvals.values())


def race(*, data: dict, publisher, reviewer, approve: list[tuple[Case, str]], imports: list[dict]) -> Raced:
    """Start every approval (case, operation), every import (a case file) and the publish of
    ``data`` at once. The first half of the approvals waits until the publish has prepared
    four cases again (so those are certainly late); the rest race it as it goes."""
    raced = Raced()
    barrier = threading.Barrier(len(approve) + len(imports) + 1)
    four_done = threading.Event()
    late = {case.pk for case, _ in approve[: len(approve) // 2]}
    new_label = data["label"]

    def approving(case, operation_id):
        try:
            barrier.wait(10)
            if case.pk in late:
                four_done.wait(30)
            raced.approvals[case.pk] = decision_record(
                case=Case.objects.get(pk=case.pk),
                operation_id=operation_id,
                approved=True,
                reviewer=reviewer,
                channel="test",
            ).outcome.value
        except Exception as exc:  # noqa: BLE001 - classified by the caller
            raced.approvals[case.pk] = type(exc).__name__
        finally:
            connections.close_all()

    def importing(file):
        try:
            barrier.wait(10)
            case_import(data=file)
            raced.imports[file["case_id"]] = "imported"
        except InvalidInput as exc:
            refused = f"{new_label} was published at" in exc.message
            raced.imports[file["case_id"]] = "refused" if refused else exc.message
        finally:
            connections.close_all()

    def progress(done, total):
        if done >= 4:
            four_done.set()

    def publishing():
        try:
            barrier.wait(10)
            raced.published.append(
                policy_publish(data=data, publisher=publisher, apply=True, progress=progress, batch=4)
            )
        finally:
            four_done.set()
            connections.close_all()

    threads = [threading.Thread(target=approving, args=pair) for pair in approve]
    threads += [threading.Thread(target=importing, args=(file,)) for file in imports]
    threads.append(threading.Thread(target=publishing))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    new = Policy.objects.get(policy_id=identity.policy_id(data["name"], data["parameters"]), label=new_label)
    late_decisions = ReviewDecision.objects.filter(
        operation_id__in=[op for _, op in approve], decided_at__gte=new.published_at
    )
    raced.after_publish = list(late_decisions.values_list("operation_id", flat=True))
    return raced
