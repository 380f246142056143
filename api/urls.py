from functools import wraps

from django.http import JsonResponse
from django.urls import include, path, re_path

from api.api import api, error_body, not_found


def _json_method_not_allowed(view):
    """ninja answers a wrong method with a plain-text 405; give it the API's JSON error shape."""

    @wraps(view)  # keeps csrf_exempt: ninja does its own CSRF check for session auth
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith("application/json"):
            allowed = response.get("Allow", "")
            json_response = JsonResponse(
                error_body("method_not_allowed", f"{request.method[:20]} is not allowed here; allowed: {allowed}"),
                status=405,
            )
            json_response["Allow"] = allowed
            return json_response
        return response

    return wrapped


# (Not named app_name/namespace: include("api.urls") would read those as this module's own.)
_patterns, _app, _namespace = api.urls
for _pattern in _patterns:
    _pattern.callback = _json_method_not_allowed(_pattern.callback)

urlpatterns = [
    path("", include((_patterns, _app), namespace=_namespace)),
    # Anything else under /api/ answers in the API's own JSON error shape, not an HTML page.
    re_path(r"^.*$", not_found),
]
