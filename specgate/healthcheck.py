"""Container health probe: `python -m specgate.healthcheck [URL]`.

The slim runtime image carries no curl/wget, so Docker's HEALTHCHECK runs this
instead. It exits 0 only when the URL (argument, else ``SPECGATE_HEALTH_URL``)
answers 2xx within the timeout -- exactly what a HEALTHCHECK needs -- and never
prints a traceback.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/health"


def probe(url: str, timeout_s: float = 2.5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (fixed local URL)
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    url = args[0] if args else os.environ.get("SPECGATE_HEALTH_URL", DEFAULT_URL)
    ok = probe(url)
    if not ok:
        print(f"unhealthy: {url}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
