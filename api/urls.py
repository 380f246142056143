from django.urls import path, re_path

from .api import api, not_found

urlpatterns = [
    path("", api.urls),
    # Anything else under /api/ answers in the API's own JSON error shape, not an HTML page.
    re_path(r"^.*$", not_found),
]
