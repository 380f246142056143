"""Forms of the review workplace. They parse input; the services decide."""

from __future__ import annotations

from django import forms
from django.core.validators import ProhibitNullCharactersValidator

from cases.models import SourceVersion
from core import text
from core.errors import InvalidInput
from reviews.models import HUMAN_DECLINE_REASONS, DeclineReason

APPROVE = "approve"
DECLINE = "decline"


# The reasons a reviewer may give a decline, in the enum's order (the system actors' are theirs).
DECLINE_REASON_CHOICES = [(r.value, r.label) for r in DeclineReason if r.value in HUMAN_DECLINE_REASONS]


class DecisionForm(forms.Form):
    """Approve or Decline, naming the operation identity the reviewer saw."""

    operation_id = forms.CharField(max_length=80)
    # No default and no "empty" choice: an omitted decision is not consent.
    decision = forms.ChoiceField(
        choices=[(APPROVE, "Approve"), (DECLINE, "Decline")],
        error_messages={"required": "choose Approve or Decline: an omitted decision is not consent"},
    )

    # With Decline: why (docs/QUEUE.md). Optional; the system actors' reasons are never offered.
    reason = forms.ChoiceField(required=False, choices=[("", "(no reason given)"), *DECLINE_REASON_CHOICES])
    note = forms.CharField(required=False, max_length=2000, strip=False)

    @property
    def approved(self) -> bool:
        return self.cleaned_data["decision"] == APPROVE

    def decline(self) -> dict:
        """The reason and note for the decision service: none with an approval."""
        if self.approved:
            return {}
        return {
            "decline_reason": self.cleaned_data.get("reason") or None,
            "decline_note": self.cleaned_data.get("note") or None,
        }


class PolicyTextField(forms.CharField):
    """Text that passes the text policy (docs/TEXT.md), refused with the policy's own message.

    Django's CharField refuses NUL with a message of its own that names no position; the
    policy refuses NUL among the other controls and says where it stands, so its validator
    replaces Django's.
    """

    def __init__(self, *, policy_field: str, **kwargs):
        super().__init__(**kwargs)
        self.policy_field = policy_field
        self.validators = [v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)]

    def validate(self, value):
        super().validate(value)
        try:
            text.check_text(value, field=self.policy_field)
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message, code="text_policy") from None


class ProposalEditForm(forms.Form):
    """A new body and/or other versions of the selected sources, from the proposal shown.

    ``expected_operation_id`` is the identity of the proposal the editor started from; if
    the case has moved on, the edit is refused as stale.
    """

    expected_operation_id = forms.CharField(max_length=80, widget=forms.HiddenInput)
    # strip=False: the body is hashed exactly as written; trimming would change it silently.
    body = PolicyTextField(
        policy_field="body",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 18, "cols": 100, "class": "vLargeTextField", "spellcheck": "true"}),
    )

    def __init__(self, *args, proposal, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposal = proposal
        self.source_fields: dict[str, str] = {}
        source_ids = [p["source_id"] for p in proposal.passages]
        versions: dict[str, list[SourceVersion]] = {s: [] for s in source_ids}
        for sv in (
            SourceVersion.objects.filter(source__source_id__in=source_ids)
            .select_related("source")
            .order_by("source__source_id", "version")
        ):
            versions[sv.source.source_id].append(sv)
        for index, passage in enumerate(proposal.passages):
            name = f"source_{index}"
            choices = []
            for sv in versions[passage["source_id"]]:
                label = f"version {sv.version}"
                if sv.version == passage["version"]:
                    label += " (in this proposal)"
                elif passage["quotation"] not in sv.text:
                    label += " (quotation not in this version)"
                choices.append((str(sv.version), label))
            self.fields[name] = forms.TypedChoiceField(
                label=f"{passage['source_id']}",
                choices=choices,
                coerce=int,
                initial=str(passage["version"]),
            )
            self.source_fields[passage["source_id"]] = name

    def clean_body(self):
        body = self.cleaned_data["body"]
        # Django decodes a form body that is not valid UTF-8 (broken bytes, an encoded lone
        # surrogate) with U+FFFD instead of failing; hashing that would approve text nobody
        # wrote. A replacement character the proposal did not already have means exactly that.
        if body.count("\ufffd") > self.proposal.body.count("\ufffd"):
            raise forms.ValidationError(
                "the body arrived with invalid UTF-8 (broken bytes or a lone surrogate, shown as \ufffd); "
                "nothing was written"
            )
        return body

    def source_version_fields(self):
        return [self[name] for name in self.source_fields.values()]

    def source_versions(self) -> dict[str, int]:
        return {source_id: self.cleaned_data[name] for source_id, name in self.source_fields.items()}
