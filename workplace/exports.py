"""The exports in the admin: an action on the changelists, "Export this history" on the
history page, and the list of signed exports with each one's ``.sig`` (docs/AUDIT.md).

Each download is a ``StreamingHttpResponse`` over ``audit.services.export_stream``: the
file is never built in memory, and its signature is ready once its last byte is sent. The
response names the signature's address in ``X-Audit-Signature``, and the list of signed
exports offers it as a second download.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from audit import exports
from audit.models import SignedExport
from audit.services import export_begin, export_stream
from cases.models import Case
from core.errors import DecisionflowError
from workplace.display import ViewOnlyAdmin, when_html

FORMAT_WORDS = {exports.Format.CSV: "CSV", exports.Format.JSONL: "JSON Lines"}


def download(
    request, *, export: exports.Export, fmt: str, filters: exports.Filters, selected=None
) -> HttpResponse | StreamingHttpResponse:
    """The streamed file; a refusal (no signing key) is answered with its own status and words."""
    try:
        record = export_begin(
            export=export, fmt=fmt, filters=filters, actor=request.user, channel=SignedExport.Channel.ADMIN
        )
    except DecisionflowError as exc:
        return HttpResponse(exc.message, status=exc.http_status, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(
        export_stream(record=record, export=export, fmt=fmt, filters=filters, selected=selected),
        content_type=exports.Format.CONTENT_TYPE[fmt],
    )
    response["Content-Disposition"] = f'attachment; filename="{record.file_name}"'
    response["X-Audit-Signature"] = request.build_absolute_uri(signature_url(record))
    response["Cache-Control"] = "no-store"
    return response


def signature_url(record: SignedExport) -> str:
    return reverse("admin:audit_signedexport_signature", args=[record.pk])


def _export_action(fmt: str):
    def action(model_admin, request, queryset):
        export = exports.export_for_model(model_admin.model)
        return download(request, export=export, fmt=fmt, filters=exports.Filters(), selected=queryset)

    action.__name__ = f"export_{fmt}"
    return admin.action(description=f"Export selected as {FORMAT_WORDS[fmt]} (signed)", permissions=["view"])(action)


# The actions a changelist lists (``actions = [*EXPORT_ACTIONS]``): view permission is enough,
# as it is for the page, so a support lead may export.
EXPORT_ACTIONS = [_export_action(exports.Format.CSV), _export_action(exports.Format.JSONL)]


def history_export_view(model_admin, request, object_id):
    """``…/history/export/?format=csv``: the case's history, as its page shows it."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    case = get_object_or_404(Case, pk=object_id)
    fmt = request.GET.get("format", exports.Format.CSV)
    if fmt not in exports.Format.ALL:
        raise Http404(f"no export format {fmt!r}")
    return download(request, export=exports.EXPORTS["history"], fmt=fmt, filters=exports.Filters(case=case))


def history_export_links(case_pk: int) -> list[tuple[str, str]]:
    """(label, url) of each "Export this history" download, for the history page."""
    base = reverse("admin:cases_case_history_export", args=[case_pk])
    return [(FORMAT_WORDS[fmt], f"{base}?format={fmt}") for fmt in exports.Format.ALL]


class SignedExportAdmin(ViewOnlyAdmin):
    """Who exported what and when, and each export's signature (the ``.sig`` download).

    Anyone who may read the cases may read this list: a signature is no secret, and an
    auditor asks who took what out.
    """

    list_display = ("exported", "kind", "format", "filters", "by", "rows_or_size", "sig")
    list_display_links = None
    list_filter = ("kind", "channel")
    search_fields = ("=file_name", "exported_by__username")
    list_select_related = ("exported_by",)
    list_per_page = 100
    ordering = ("-started_at",)

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.has_perm("cases.view_case")

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def changelist_view(self, request, extra_context=None):
        # The signature column names the file: it needs the width more than the nav does.
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<uuid:pk>/signature/", wrap(self.signature_view), name="audit_signedexport_signature"),
        ] + super().get_urls()

    def signature_view(self, request, pk):
        if not self.has_view_permission(request):
            raise PermissionDenied
        record = get_object_or_404(SignedExport, pk=pk)
        if not record.finished_at:
            self.message_user(request, f"{record.file_name} never finished: it has no signature.", messages.ERROR)
            raise Http404("this export never finished, so it has no signature")
        response = HttpResponse(record.signature, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{record.file_name}.sig"'
        return response

    @admin.display(description="exported", ordering="started_at")
    def exported(self, obj):
        return when_html(obj.started_at)

    @admin.display(description="by")
    def by(self, obj):
        who = obj.exported_by.get_username() if obj.exported_by else "(a command)"
        return format_html('{} <span class="df-muted">via {}</span>', who, obj.channel)

    @admin.display(description="size")
    def rows_or_size(self, obj):
        return f"{obj.size:,} bytes" if obj.size is not None else "-"

    @admin.display(description="signature")
    def sig(self, obj):
        if not obj.finished_at:
            return format_html('<span class="df-muted">{}</span>', "not finished: no signature")
        return format_html(
            '<a href="{}" class="df-sig-link" download>{}.sig</a> <span class="df-muted">key {}</span>',
            signature_url(obj),
            obj.file_name,
            obj.key_id,
        )
