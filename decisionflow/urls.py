import re

from django.contrib import admin
from django.template.response import TemplateResponse
from django.urls import include, path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.generic import RedirectView

from decisionflow import health

# Every admin page (workplace/admin.py), loaded with the URLs rather than at django.setup():
# see SimpleAdminConfig in settings.
admin.autodiscover()

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
    # Also answered by health.OperationsMiddleware before host validation (see there).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
]

# An Approve, Decline or Edit URL of a proposal leads back to that proposal's review page.
_PROPOSAL_ACTION = re.compile(r"^/admin/reviews/proposal/(\d+)/(?:edit|decide)/")


def _way_back(request) -> tuple[str | None, str]:
    match = _PROPOSAL_ACTION.match(request.path)
    if match:
        return reverse("admin:reviews_proposal_review", args=[match.group(1)]), "the review page"
    referer = request.headers.get("Referer", "")
    if (
        referer
        and referer != request.build_absolute_uri()
        and url_has_allowed_host_and_scheme(
            referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        )
    ):
        return referer, "the previous page"
    return None, ""


def permission_denied(request, exception=None):
    """Every 403 in the admin's look, saying what was refused, with a way back (not a bare "403 Forbidden")."""
    back_url, back_label = _way_back(request)
    context = {
        **admin.site.each_context(request),
        "title": "Permission denied",
        "exception": str(exception or ""),
        "back_url": back_url,
        "back_label": back_label,
        "is_nav_sidebar_enabled": False,
    }
    return TemplateResponse(request, "403.html", context, status=403).render()


handler403 = permission_denied
