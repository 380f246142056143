"""The admin's publish page for a policy version: paste or upload, see the plan, confirm.

A dangerous action in the ``delete_selected`` manner: the first POST shows exactly what
would be superseded and writes nothing; only the confirming POST calls the publishing
service (workflow/publishing.py), the same one as the command and the API.
Only users with the "publish policy" permission see the button or reach the page.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from cases.services import can_publish, parse_policy_file
from core import identity
from core.errors import DecisionflowError
from reviews.models import Channel
from workflow.publishing import policy_publish, publish_plan
from workplace.display import ViewOnlyAdmin
from workplace.listing import COUNT_AT_LEAST

MAX_UPLOAD = 64 * 1024  # a policy is a few parameters


class PolicyAdmin(ViewOnlyAdmin):
    list_display: tuple[str, ...] = ("name", "label", "parameters", "policy", "published_at", "published_by")
    list_select_related = ("published_by",)
    list_per_page = 100
    change_list_template = "admin/cases/policy/change_list.html"

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("publish/", wrap(self.publish_view), name="cases_policy_publish"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        extra = {"can_publish": can_publish(request.user), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def _context(self, request, **extra):
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Publish a policy version",
            **extra,
        }

    def _submitted(self, request) -> bytes:
        upload = request.FILES.get("file")
        if upload is not None:
            if upload.size > MAX_UPLOAD:
                raise PermissionDenied  # not a policy file; the page refuses it whole
            return upload.read()
        return request.POST.get("policy", "").encode("utf-8")

    def publish_view(self, request):
        # Permission first: a support lead may, a reviewer may not (docs/ADMIN.md).
        if not can_publish(request.user):
            raise PermissionDenied
        if request.method != "POST":
            return TemplateResponse(request, "admin/cases/policy/publish.html", self._context(request))
        raw = self._submitted(request)
        try:
            data = parse_policy_file(raw)
            if request.POST.get("confirm") != "yes":
                # Counted at most as far as the large lists count: at 600,000 undecided cases
                # the exact counts took 3.6 s (docs/PERFORMANCE.md, 9); publishing does them all.
                plan = publish_plan(data=data, count_limit=COUNT_AT_LEAST)
                context = self._context(
                    request,
                    plan=plan,
                    policy_json=json.dumps(data, ensure_ascii=False, sort_keys=True),
                    more=max(0, plan.total - len(plan.sample)),
                    count_limit=COUNT_AT_LEAST,
                )
                return TemplateResponse(request, "admin/cases/policy/publish_confirm.html", context)
            result = policy_publish(data=data, publisher=request.user, channel=Channel.ADMIN, apply=True)
        except DecisionflowError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            context = self._context(request, submitted=raw.decode("utf-8", "replace"))
            return TemplateResponse(request, "admin/cases/policy/publish.html", context)
        s = result.summary()
        level = messages.WARNING if result.failed else messages.SUCCESS
        text = (
            f"published {data['name']} {data['label']}: {s['superseded']} proposal(s) superseded, "
            f"{s['moved']} case(s) without a proposal moved"
        )
        if result.failed:
            text += f"; {len(result.failed)} case(s) were busy or failed and were left as they were: publish again"
        elif s["superseded"] == 0 and s["moved"] == 0:
            text = f"{data['name']} {data['label']}: nothing to do (already published); nothing was written"
        self.message_user(request, text, level)
        return HttpResponseRedirect(reverse("admin:cases_policy_changelist"))

    @admin.display(description="policy identity")
    def policy(self, obj):
        return format_html('<code title="{}">{}</code>', obj.policy_id, identity.short(obj.policy_id))
