"""Metric names referenced by a PromQL expression.

PromQL's grammar is small enough that the names can be found without a full parser: drop
string literals, label matchers `{...}`, range/subquery selectors `[...]`, grouping clauses
(`by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left/right (...)`) and
`offset` durations; what remains that looks like an identifier and is not followed by `(`
(a function or aggregation) and is not a keyword is a metric name. Syntax itself is checked
by the real `promtool` in the tests; this only extracts names.
"""

from __future__ import annotations

import re

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan", "atan2", "start", "end"}
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h", "$tenant": ".*", "$replica": ".*"}

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NUMBER = re.compile(r"(?<![A-Za-z_:0-9])(0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(?![A-Za-z_:0-9])")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def substitute_grafana_vars(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set[str]:
    text = substitute_grafana_vars(expr)
    text = _STRING.sub('""', text)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if rest.startswith("("):
            continue  # function or aggregation operator
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names
