"""Logging set-up for the daemon: readable text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_audit(destination: str | None) -> None:
    """Audit lines are JSON already: write them bare, to stderr, a file, or nowhere.

    None (RATEWARDEN_AUDIT_LOG unset) is stderr, except in a terminal: there someone
    reads the log, and a JSON line per refusal would bury it; the log says how to ask.
    """
    audit = logging.getLogger("ratewarden.audit")
    audit.propagate = False
    audit.setLevel(logging.INFO)
    for old in audit.handlers:
        old.close()
    if destination is None:
        destination = "off" if sys.stderr is not None and sys.stderr.isatty() else "-"
        if destination == "off":
            logging.getLogger("ratewarden").info(
                "audit lines are not printed in a terminal: set RATEWARDEN_AUDIT_LOG=- "
                "(stderr) or a file path to see them; GET /v1/denials lists recent ones"
            )
    handler: logging.Handler
    if destination == "off":
        handler = logging.NullHandler()
    elif destination == "-":
        handler = logging.StreamHandler(sys.stderr)
    else:  # UTF-8 whatever the locale: a line must never be lost to an encoding error
        handler = logging.FileHandler(destination, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    audit.handlers[:] = [handler]


def configure_logging(log_format: str, level: str) -> None:
    """Send every logger (ours and uvicorn's) to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
