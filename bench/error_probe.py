"""Error probe (issue 33): what a client sees against what the access log says.

Starts, as subprocesses on loopback, a private `redis-server` (persistence
off), two simulated replicas (`specgate sim-replica`) and one `specgate
gateway` with `access_log: true` (its JSON log lines go to its log file),
then sends one probe per case the issue names, as a client would: bad
sampling fields, a request the replica itself rejects, auth and budget
refusals, a wrong method, a slow body, an oversized header, headers never
finished, bytes that are not HTTP, a stream whose replica is SIGKILLed
mid-stream (continued on the other), and last a long stream cut by the
gateway's SIGTERM drain. Every error body must have OpenAI's shape
(`error.{message, type, param, code}`, `type` a string, `code` a string or
null); every access-log record must say what the client saw (status line,
the SSE error event that ended a stream, the replicas that served it).

    .venv/bin/python bench/error_probe.py            # ~30 s; prints the table
    .venv/bin/python bench/error_probe.py --json out.json

Exit status 0 when every row matches and every error has the one shape.
Logs and the gateway YAML go to .cache/specgate/error_probe/<time>/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import Proc, redis_ping, stop_everything  # noqa: E402  (the soak's process handling)
from testbed.procs import free_port, wait_http_ok  # noqa: E402

MODEL = "probe-model"
PROFILE = "dspark-b8"
KEYS = {"alpha": "sk-probe-alpha", "beta": "sk-probe-beta"}
# Short deadlines so the probe takes seconds; the behaviour is the defaults'.
TIMEOUTS = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "drain_pre_s": 0.5, "drain_deadline_s": 3.0}


def _tenants() -> list[dict]:
    return [
        {"id": "alpha", "api_key_sha256": hashlib.sha256(KEYS["alpha"].encode()).hexdigest()},
        {"id": "beta", "api_key_sha256": hashlib.sha256(KEYS["beta"].encode()).hexdigest(), "requests_per_minute": 1},
    ]


class Stack:
    def __init__(self, run_dir: Path) -> None:
        py = sys.executable
        self.run_dir = run_dir
        rport = free_port()
        self.redis = Proc("redis", ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--protected-mode", "no"], run_dir / "redis.log", rport)
        self.replicas = {}
        for i, name in enumerate(("a", "b")):
            port = free_port()
            argv = [py, "-m", "specgate.cli", "sim-replica", "--profile", PROFILE, "--host", "127.0.0.1", "--port", str(port),
                    "--name", name, "--served-model-name", MODEL, "--seed", str(i)]
            self.replicas[name] = Proc(name, argv, run_dir / f"{name}.log", port)
        config = {
            "replicas": [{"url": f"http://127.0.0.1:{p.port}", "name": n, "model": MODEL, "profile": PROFILE}
                         for n, p in self.replicas.items()],
            "tenants": _tenants(),
            "redis_url": f"redis://127.0.0.1:{self.redis.port}/0",
            "redis_prefix": "probe:",
            "log_level": "INFO",
            "gateway": {"access_log": True, "health_interval_s": 0.5, **TIMEOUTS},
        }
        path = run_dir / "gateway.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        self.gateway = Proc("gateway", [py, "-m", "specgate.cli", "gateway", "--config", str(path), "--port", str(port)],
                            run_dir / "gateway.log", port)
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        self.redis.start()
        _up(_redis_up(self.redis.port, 20), "redis", 20)
        for p in self.replicas.values():
            p.start()
        for p in self.replicas.values():
            _up(wait_http_ok(f"http://127.0.0.1:{p.port}/health", timeout_s=60), p.name, 60)
        self.gateway.start()
        _up(wait_http_ok(self.url + "/ready", timeout_s=60), "gateway", 60)

    def access_records(self) -> list[dict]:
        """The gateway's access-log records so far, in order."""
        out = []
        for line in self.gateway.log_path.read_text(errors="replace").splitlines():
            if '"specgate.gateway.access"' not in line:
                continue
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def _up(ok: bool, what: str, timeout_s: float) -> None:
    if not ok:
        raise SystemExit(f"[error_probe] {what} did not come up within {timeout_s:g} s")


def _redis_up(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not redis_ping(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# -- what the client saw ----------------------------------------------------------


def _body(kind: str = "chat", max_tokens: int = 8, stream: bool = False, **extra) -> dict:
    base = {"model": MODEL, "max_tokens": max_tokens, "stream": stream}
    if kind == "chat":
        base["messages"] = [{"role": "user", "content": "probe"}]
    else:
        base["prompt"] = "probe"
    return {**base, **extra}


def _path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def _shape(err) -> str | None:
    """Why `err` (a parsed body or event) is not OpenAI's error shape; None if it is."""
    if not isinstance(err, dict) or set(err) != {"error"} or not isinstance(err["error"], dict):
        return f"not {{'error': {{...}}}}: {str(err)[:80]}"
    e = err["error"]
    if set(e) != {"message", "type", "param", "code"}:
        return f"fields {sorted(e)}"
    if not isinstance(e["message"], str) or not isinstance(e["type"], str):
        return "message/type not strings"
    if not (e["code"] is None or isinstance(e["code"], str)) or not (e["param"] is None or isinstance(e["param"], str)):
        return f"code {e['code']!r} / param {e['param']!r} not string-or-null"
    return None


def seen_json(resp: httpx.Response) -> dict:
    row = {"status": resp.status_code, "id": resp.headers.get("x-request-id"), "served": resp.headers.get("x-specgate-replica"),
           "type": None, "code": None, "stream_error": None, "shape": None}
    if resp.status_code >= 400:
        try:
            err = resp.json()
        except ValueError:
            row["shape"] = f"not JSON: {resp.text[:60]!r}"
            return row
        row["shape"] = _shape(err)
        inner = err.get("error") if isinstance(err, dict) else None
        if isinstance(inner, dict):
            row["type"], row["code"] = inner.get("type"), inner.get("code")
    return row


def read_stream(url: str, body: dict, key: str = "alpha", on_first=None) -> dict:
    with httpx.stream("POST", url + _path("chat"), json=body, headers={"authorization": f"Bearer {KEYS[key]}"}, timeout=60) as r:
        row = {"status": r.status_code, "id": r.headers.get("x-request-id"), "served": r.headers.get("x-specgate-replica"),
               "type": None, "code": None, "stream_error": None, "shape": None, "done": False}
        first = True
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                row["done"] = True
                continue
            obj = json.loads(data)
            if "error" in obj:
                row["shape"] = _shape(obj)
                row["stream_error"] = row["code"] = obj["error"].get("code")
                row["type"] = obj["error"].get("type")
            elif first and on_first is not None:
                first = False
                on_first(row)
    return row


def raw(port: int, data: bytes, endpoint: str | None = None) -> dict:
    """A request on a raw socket; `endpoint` is the access log's for it
    (None: the server layer answers before the app sees it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        if data:
            sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None
    row = {"status": status, "id": None, "served": None, "type": None, "code": None, "stream_error": None, "shape": None,
           "endpoint": endpoint}
    try:
        err = json.loads(body)
        row["shape"] = _shape(err)
        row["type"], row["code"] = err["error"]["type"], err["error"]["code"]
    except (ValueError, KeyError, TypeError):
        row["shape"] = f"not JSON: {body[:60]!r}"
    return row


# -- the cases ----------------------------------------------------------------------


def run_cases(stack: Stack) -> list[dict]:
    url, port = stack.url, stack.gateway.port
    auth = {"authorization": f"Bearer {KEYS['alpha']}"}

    def post(kind="chat", key="alpha", **extra) -> dict:
        return seen_json(httpx.post(url + _path(kind), json=_body(kind, **extra), headers={"authorization": f"Bearer {KEYS.get(key, key)}"},
                                    timeout=60))

    rows: list[tuple[str, dict]] = [
        ("chat 200", post()),
        ("stream 200", read_stream(url, _body(stream=True))),
        ("max_tokens -1", post(max_tokens=-1)),
        ("max_tokens 'x'", post(max_tokens="x")),
        ("max_tokens 1e12", post(max_tokens=1e12)),
        ("max_tokens past the context", post(max_tokens=10_000_000)),
        ("n 1000", post(n=1000)),
        ("temperature 'hot'", post(temperature="hot")),
        ("top_p 2", post(top_p=2)),
        ("messages not a list", post(messages="x")),
        ("unknown model", post(model="no-such-model")),
        ("several prompts (the replica's 400)", post("completions", prompt=["a", "b"])),
        ("wrong key (401)", post(key="sk-wrong")),
    ]
    post(key="beta")
    rows.append(("over the budget (429)", post(key="beta")))
    rows.append(("GET on the endpoint (405)", {**seen_json(httpx.get(url + _path("chat"), headers=auth, timeout=30)), "endpoint": "chat"}))
    body = json.dumps(_body()).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['alpha']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    rows.append(("slow body (408)", raw(port, head + body[:10], endpoint="chat")))
    rows.append(("2 MiB header (431)", raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 << 20) + b"\r\n\r\n")))
    rows.append(("headers never finished (408)", raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n")))
    rows.append(("not HTTP (400)", raw(port, b"NOT HTTP AT ALL\r\n\r\n")))

    def kill_server(row: dict) -> None:  # the stream's replica dies after its first token
        stack.replicas[row["served"]].signal(signal.SIGKILL)

    rows.append(("stream, its replica SIGKILLed", read_stream(url, _body(stream=True, max_tokens=400, ignore_eos=True), on_first=kill_server)))
    rows.append(("stream, the gateway SIGTERMed (drain)", drained_stream(stack)))
    return [{"case": case, **row} for case, row in rows]


def drained_stream(stack: Stack) -> dict:
    """A long stream on the surviving replica, cut by the gateway's drain."""
    got: dict = {}

    def on_first(row: dict) -> None:
        got["t"] = time.monotonic()
        stack.gateway.signal(signal.SIGTERM)

    row = read_stream(stack.url, _body(stream=True, max_tokens=20000, ignore_eos=True), on_first=on_first)
    asyncio.run(stack.gateway.wait_exit(60))
    row["drain_s"] = round(time.monotonic() - got.get("t", time.monotonic()), 1)
    return row


# -- the comparison -------------------------------------------------------------------


def match(rows: list[dict], records: list[dict]) -> None:
    """Each row's access-log record (by request id; rejections before the
    request path by status and order) and whether it says what the client saw."""
    by_id = {r["request_id"]: r for r in records if r.get("request_id")}
    claimed = {row["id"] for row in rows if row["id"]}
    anonymous = [r for r in records if r.get("request_id") not in claimed]
    for row in rows:
        if row["id"]:
            rec = by_id.get(row["id"])
        else:  # no id reached the client: the first unclaimed record of its status and endpoint
            rec = next((a for a in anonymous if (a["status"], a["endpoint"]) == (row["status"], row.get("endpoint"))), None)
        if rec is not None and not row["id"]:
            anonymous.remove(rec)
        row["log"] = rec
        if rec is None:
            row["match"] = "no record"
            continue
        problems = []
        if rec["status"] != row["status"]:
            problems.append(f"status {rec['status']}")
        if rec.get("stream_error") != row["stream_error"]:
            problems.append(f"stream_error {rec.get('stream_error')}")
        if row["served"] and (not rec["replicas"] or rec["replicas"][0] != row["served"]):
            problems.append(f"replicas {rec['replicas']}")
        row["match"] = "yes" if not problems else "; ".join(problems)


def table(rows: list[dict]) -> str:
    cols = ["case", "client", "error type / code", "stream end", "log status", "log error", "log replicas", "shape", "match"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        rec = r.get("log") or {}
        end = (f"error event `{r['stream_error']}`" if r["stream_error"] else "") + (", [DONE]" if r.get("done") else "")
        err = f"{r['type']} / {r['code']}" if r["type"] else ""
        log_error = rec.get("stream_error") or rec.get("error") or ""
        conts = ", ".join(f"{c['replica']}: {c['outcome']}" for c in rec.get("continuations") or [])
        replicas = ",".join(rec.get("replicas") or []) + (f" (continuations: {conts})" if conts else "")
        lines.append("| " + " | ".join(str(x) for x in (r["case"], r["status"], err, end.strip(", "), rec.get("status", ""), log_error,
                                                          replicas, r["shape"] or "OpenAI", r["match"])) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the rows (client view and log record) here")
    a = ap.parse_args(argv)
    run_dir = REPO / ".cache" / "specgate" / "error_probe" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"[error_probe] logs in {run_dir}", file=sys.stderr)
    stack = Stack(run_dir)
    try:
        stack.start()
        rows = run_cases(stack)
    finally:
        stop_everything()
    match(rows, stack.access_records())
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if r["match"] != "yes" or r["shape"]]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} cases: one error shape, and the log says what the client saw")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
