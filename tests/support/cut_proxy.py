"""A loopback TCP relay in front of a real replica that can break a response
mid-body once the client has been sent exactly N tokens, so that "the
replica died after the client got N tokens" is deterministic however fast
the model decodes.

Why a relay and not only `kill`: the tiny test model decodes thousands of
tokens a second, so by the time a test has read one chunk and killed the
server, the whole stream may already sit in socket buffers (it happened in
CI). The relay forwards a completion response event by event while the
tokens it has forwarded (the `token_ids` of each event: the gateway asks for
them on every continuable stream) stay within N (`arm(n)`), then forwards
nothing more: it keeps reading and discards, as a dead process's unsent
output is lost. `held_tokens` says how many it forwarded: N, or fewer when
the event that would reach N also carries the tokens after it (vLLM merges
a request's deltas into one event when its API server falls behind the
engine -- `RequestOutputCollector` -- which a loaded machine makes
common; a test that needs the break at an exact token checks this). The
break then comes either at once (`arm(n)`: the connection ends mid-body) or
from the replica (`arm(n, cut=False)`, then kill it: the relay sees its
connection end and resets the gateway's). Other requests (health, metrics,
detokenize) pass untouched. Plain threads and sockets, no asyncio: the
gateway under test runs its own loop.
"""

from __future__ import annotations

import re
import socket
import struct
import threading

# One SSE event's generated token ids (`"prompt_token_ids"` does not match: the quote comes first).
TOKEN_IDS = re.compile(rb'"token_ids":\s*\[([^\]]*)\]')


def event_tokens(event: bytes) -> int:
    return sum(len(ids.split(b",")) for ids in TOKEN_IDS.findall(event) if ids.strip())


class CutProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.hold_after_tokens: int | None = None  # arm: break the next completion stream after this many tokens
        self.cut_at_hold = True
        self.holding = threading.Event()  # a stream is being held; its client got `held_tokens` tokens
        self.held_tokens: int | None = None
        self._held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, tokens: int, cut: bool = True) -> None:
        """Break the next completion stream once it has forwarded `tokens`
        tokens (at most; see `held_tokens`): at once (`cut`), or when the
        replica's side ends (kill it)."""
        self.holding.clear()
        self.held_tokens = None
        self.cut_at_hold = cut
        self.hold_after_tokens = tokens

    def cut(self) -> None:
        """Reset the held connection(s) towards the gateway."""
        for s in self._held:
            _reset(s)
        self._held.clear()

    def close(self) -> None:
        self._stop = True
        self._listener.close()
        self.cut()

    # -- relay ------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _reset(client)
                continue
            up.settimeout(None)
            state = {"completion": False}
            threading.Thread(target=self._pump_requests, args=(client, up, state), daemon=True).start()
            threading.Thread(target=self._pump_responses, args=(up, client, state), daemon=True).start()

    def _pump_requests(self, client: socket.socket, up: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                if data.startswith(b"POST /v1/"):
                    state["completion"] = True
                up.sendall(data)
        except OSError:
            pass
        _close(up)

    def _pump_responses(self, up: socket.socket, client: socket.socket, state: dict) -> None:
        sent = 0  # tokens forwarded
        pending = b""  # the part of an event not yet complete
        try:
            while data := up.recv(65536):
                limit = self.hold_after_tokens if state["completion"] else None
                if limit is None:
                    client.sendall(data)
                    continue
                pending += data
                forward = b""
                held = False
                while (end := pending.find(b"\n\n")) >= 0:
                    event, n = pending[: end + 2], event_tokens(pending[: end + 2])
                    if sent + n > limit:
                        held = True  # this event would pass the break point: it is lost with the replica
                        break
                    forward, pending, sent = forward + event, pending[end + 2:], sent + n
                    if sent == limit:
                        held = True
                        break
                client.sendall(forward)
                if held:
                    self._hold(up, client, sent)
                    return
                # (a partial event stays pending: it is forwarded once complete, or never)
        except OSError:
            pass
        # The replica's side ended (killed) or failed: the gateway's ends abruptly.
        _reset(client)
        _close(up)

    def _hold(self, up: socket.socket, client: socket.socket, sent: int) -> None:
        self.hold_after_tokens = None
        self.held_tokens = sent
        self.holding.set()
        if self.cut_at_hold:
            # The connection ends now, mid-body, not when the replica's keep-alive does;
            # with a FIN, not a reset: a reset would drop what the gateway has not read yet.
            for sock in (client, up):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                _close(sock)
            return
        self._held.append(client)
        try:
            while up.recv(65536):
                pass  # the dead replica's unsent output: lost
        except OSError:
            pass
        _reset(client)
        _close(up)


def _reset(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(s)


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass
