"""The groups: two of staff, and the pipeline's. Used by data migrations and by
``load_demo`` (tests flush data)."""

REVIEWERS = "Reviewers"
SUPPORT_LEADS = "Support leads"
PIPELINE = "Pipeline"
# The demo's reviewer group (cases/demo/t1077.json's billing-reply names it). A group a
# policy names only routes: its members still need the review permission (Reviewers).
BILLING_REVIEWERS = "Billing reviewers"
INTAKE_PERMISSION = "cases.intake_case"
WITHDRAW_PERMISSION = "cases.withdraw_case"

_VIEW = [
    ("cases", "case"),
    ("cases", "source"),
    ("cases", "sourceversion"),
    ("cases", "policy"),
    ("reviews", "proposal"),
    ("reviews", "reviewdecision"),
    ("reviews", "pendingreview"),
    ("reviews", "workflowcheckpoint"),
    ("effects", "effectrecord"),
    ("effects", "commitattempt"),
    ("effects", "delivery"),
    ("effects", "deliverytry"),
]


def ensure_review_groups(Group, Permission):
    """Create or complete the groups; takes model classes so a migration can pass its own."""
    view = [Permission.objects.get(content_type__app_label=app, codename=f"view_{model}") for app, model in _VIEW]
    review = Permission.objects.get(content_type__app_label="reviews", codename="review_proposal")
    reviewers, _ = Group.objects.get_or_create(name=REVIEWERS)
    reviewers.permissions.add(*view, review)
    # Support leads own the team's rules: they publish policy versions; reviewers do not.
    publish = Permission.objects.get(content_type__app_label="cases", codename="publish_policy")
    # And they assign reviews to a person or a group (workflow/assignment.py).
    assign = Permission.objects.get(content_type__app_label="reviews", codename="assign_review")
    leads, _ = Group.objects.get_or_create(name=SUPPORT_LEADS)
    leads.permissions.add(*view, publish, assign)
    ensure_pipeline_group(Group, Permission)
    return reviewers, leads


def ensure_pipeline_group(Group, Permission):
    """The pipeline's service users: they bring cases in, re-draft and withdraw them, and
    read them back; they never review (no ``review_proposal``)."""
    acts = Permission.objects.filter(content_type__app_label="cases", codename__in=["intake_case", "withdraw_case"])
    view = Permission.objects.get(content_type__app_label="cases", codename="view_case")
    pipeline, _ = Group.objects.get_or_create(name=PIPELINE)
    pipeline.permissions.add(*acts, view)
    return pipeline


def can_intake(user) -> bool:
    """Whether ``user`` may act for the pipeline: bring cases in and re-draft them."""
    return bool(getattr(user, "is_active", False) and user.has_perm(INTAKE_PERMISSION))
