"""Structured logs: one JSON object per line on stderr. Tokens never reach a log line."""
from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

from .redact import hide_known

_SECRET = re.compile(r"(token=|Bearer\s+)[^\s&\"']+", re.IGNORECASE)


def scrub(text: str) -> str:
    """Hide anything that looks like a token in a log line, and every secret the server knows (an MCP
    server's OAuth tokens, an API key) wherever a library's message quotes it."""
    return hide_known(_SECRET.sub(r"\1[redacted]", text))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                 "level": record.levelname.lower(), "logger": record.name, "msg": scrub(record.getMessage())}
        for key in ("world", "agent", "connection", "code"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
