"""Logging filters: one log line per event."""

from __future__ import annotations

import logging


class ClientErrorsOnOneLine(logging.Filter):
    """A 4xx is the client's event, not a fault of ours: log its line, without the traceback.

    Django logs every PermissionDenied, 404 or bad request with the exception attached, so
    each support lead opening an edit URL printed a full traceback. 5xx keep theirs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
        return True
