"""Every page's browser asks for /favicon.ico: it is served (WhiteNoise's root files), so no
page load logs a 404 for it, with DEBUG on and off."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("debug", [True, False])
def test_the_favicon_is_served_at_the_root(client, settings, debug):
    settings.DEBUG = debug
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO file's header: one or more icons follow
    assert "max-age" in response.get("Cache-Control", "")
