"""JSON logs. Records carry only whitelisted structured fields (tenant id,
replica, status, timings, error class); request bodies, prompts and API keys
are never passed to the logger, so they cannot leak through it."""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time (test capture, redirects)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(level: str = "INFO") -> None:
    """JSON lines on stderr for specgate's loggers and uvicorn's (the CLI
    starts uvicorn with log_config=None so it does not install its own)."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter())
    for name in ("specgate", "uvicorn"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            logger.addHandler(handler)
        logger.setLevel(level.upper())
        logger.propagate = False
