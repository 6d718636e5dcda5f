"""Checks on a `specgate load` HTML report, shared by the pure report test and the end-to-end one."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

from specgate.report import CHARTS


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.charts: dict[str, str] = {}  # data-chart key -> the figure's image src
        self._chart: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.refs.extend(v for k, v in attrs if k in ("src", "href", "srcset", "data", "poster", "action") and v)
        if tag == "figure" and "data-chart" in a:
            self._chart = a["data-chart"]
        if tag == "img" and self._chart is not None:
            self.charts[self._chart] = a.get("src", "")
            self._chart = None


def chart_svgs(html: str) -> dict[str, str]:
    """Assert the report fetches nothing and return each chart's SVG text by key."""
    parser = _Refs()
    parser.feed(html)
    remote = [r for r in parser.refs if not r.startswith("data:")]
    assert remote == [], f"the report refers to something outside itself: {remote}"
    assert not re.search(r"(?i)url\(\s*['\"]?(https?:)?//|@import|<script|<link\b", html)
    assert list(parser.charts) == [key for key, _ in CHARTS]
    svgs = {}
    for key, src in parser.charts.items():
        assert src.startswith("data:image/svg+xml;base64,")
        svg = base64.b64decode(src.split(",", 1)[1]).decode()
        assert "<svg" in svg and "http://www.w3.org/2000/svg" in svg  # the namespace, not a fetch
        assert not re.search(r"(?i)(xlink:)?href=\"(https?:)?//", svg)
        svgs[key] = svg
    return svgs
