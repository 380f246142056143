from pathlib import Path

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import CommandError
from django.db import transaction

from cases.services import case_import, parse_case_file
from core.commandline import ProjectCommand
from core.errors import DecisionflowError
from core.text import shown
from reviews.groups import BILLING_REVIEWERS, REVIEWERS, SUPPORT_LEADS, ensure_review_groups
from reviews.models import Channel
from workflow.begin import review_begin

# The demo case files ship with the cases app, which owns the case format.
DEMO_DIR = Path(apps.get_app_config("cases").path) / "demo"

# Local demo logins only; `make run` prints them. Never use these on a shared server.
DEMO_USERS = [
    # Also a billing reviewer: billing-reply (T-1077) is decided by that group's members only.
    ("reviewer", "review-T1042", (REVIEWERS, BILLING_REVIEWERS), "Demo reviewer (approve, decline, edit; billing too)"),
    # Four eyes: whoever edits a proposal cannot approve it, so the demo needs a second reviewer.
    (
        "reviewer2",
        "review2-T1042",
        (REVIEWERS,),
        "Second demo reviewer (approves what the first one edited; not a billing reviewer)",
    ),
    ("lead", "lead-T1042", (SUPPORT_LEADS,), "Demo support lead (history, view only)"),
]


class Command(ProjectCommand):
    help = (
        "Load the demo cases (T-1042 and three more), two demo reviewers and a support lead, and begin "
        "each case's review as `manage.py begin` does, so the review queue shows them pending: "
        "`python manage.py load_demo`. Running it again changes nothing. --no-begin loads them without "
        "beginning (`manage.py demo` does, to show begin's first run)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-begin",
            action="store_true",
            help="Load the cases and logins only; each case's first decision, or `manage.py begin`, begins it.",
        )

    def handle(self, *args, no_begin=False, **options):
        try:
            with transaction.atomic():
                cases = []
                for path in sorted(DEMO_DIR.glob("*.json")):
                    result = case_import(data=parse_case_file(path.read_bytes()))
                    verb = "imported" if result.created else "unchanged"
                    self.stdout.write(f"load_demo: case={result.case.case_id} {verb}")
                    cases.append(result.case)
                ensure_review_groups(Group, Permission)
                Group.objects.get_or_create(name=BILLING_REVIEWERS)
                User = get_user_model()
                for username, password, groups, _ in DEMO_USERS:
                    user, created = User.objects.get_or_create(username=username, defaults={"is_staff": True})
                    if created:
                        user.set_password(password)
                        user.save()
                    user.groups.add(*Group.objects.filter(name__in=groups))
            # After the import commits: begin has transactions of its own, and a review begun
            # or found is reported the way `begin` reports it (a decided case stays decided).
            for case in [] if no_begin else cases:
                begun = review_begin(case=case, channel=Channel.COMMAND)
                verb = "begun" if begun.created else "unchanged"
                self.stdout.write(
                    f"load_demo: case={case.case_id} review {verb} status={shown(begun.status)} "
                    f"op={shown(begun.operation_id)}"
                )
        except DecisionflowError as exc:
            raise CommandError(f"load_demo: {exc.message}") from None
        self.stdout.write("Demo logins for http://127.0.0.1:8000/admin/ :")
        for username, password, _, what in DEMO_USERS:
            self.stdout.write(f"  {what}: username={username} password={password}")
