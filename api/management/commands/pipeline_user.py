"""``manage.py pipeline_user NAME``: the pipeline's service user, and a token for it."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from api.services import TOKEN_NAME_MAX, token_create
from core import text
from core.commandline import WorkflowCommand
from reviews.groups import PIPELINE, ensure_pipeline_group


class Command(WorkflowCommand):
    help = (
        "Create the pipeline's service user NAME (group Pipeline: it may bring cases in and withdraw them, "
        "and read them back; it may not review) if it does not exist, and issue it an API token, printed once: "
        "`pipeline_user: user=NAME created=yes|no token=dft_…`. Running it again issues another token for the "
        "same user (revoke the old one in the admin, API tokens). The user has no password and cannot log in "
        "to the admin. Exit codes: 0 ok, 1 an existing user of that name who is not a pipeline service user. "
        "See docs/INTAKE.md."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", metavar="NAME", help="The service user's username, e.g. pipeline.")
        parser.add_argument(
            "--token-name",
            default="pipeline intake",
            help="What the token is for, shown in the admin (default: %(default)s).",
        )

    def handle(self, *args, name, token_name, **options):
        text.check_text(name, field="NAME", one_line=True, max_length=150)
        text.check_text(token_name, field="--token-name", one_line=True, max_length=TOKEN_NAME_MAX)
        group = ensure_pipeline_group(Group, Permission)  # the migration made it; deleted since, made again
        user, created = get_user_model().objects.get_or_create(username=name, defaults={"is_staff": False})
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
            user.groups.add(group)
        elif user.is_staff or user.is_superuser or not user.groups.filter(pk=group.pk).exists():
            self.fail(
                1,
                f"pipeline_user: {text.shown(name)} exists and is not a pipeline service user (staff, or not in "
                f"the {PIPELINE} group); choose another name; nothing was written",
            )
        _, plaintext = token_create(user=user, name=token_name)
        self.stdout.write(
            f"pipeline_user: user={text.shown(name)} created={'yes' if created else 'no'} token={plaintext}"
        )
