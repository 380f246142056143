from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from decisionflow import health

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
    # Also answered by health.OperationsMiddleware before host validation (see there).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
]
