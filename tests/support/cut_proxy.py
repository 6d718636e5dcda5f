"""A loopback TCP relay in front of a real replica that can break a response
mid-body at a chosen SSE event, so that "the replica died after the client
got exactly N events" is deterministic however fast the model decodes.

Why a relay and not only `kill`: the tiny test model decodes thousands of
tokens a second, so by the time a test has read one chunk and killed the
server, the whole stream may already sit in socket buffers (it happened in
CI). The relay forwards a completion response up to and including its N-th
event (`hold_after_events`), then forwards nothing more: it keeps reading
and discards, as a dead process's unsent output is lost. The break then
comes either at once (`arm(n)`: a connection reset, as a network failure or
a crashed host gives) or from the replica (`arm(n, cut=False)`, then kill
it: the relay sees its connection end and resets the gateway's). Other requests (health, metrics) pass
untouched. Plain threads and sockets, no asyncio: the gateway under test
runs its own loop.
"""

from __future__ import annotations

import socket
import struct
import threading


class CutProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.hold_after_events: int | None = None  # arm: break the next completion stream after this many events
        self.cut_at_hold = True
        self.holding = threading.Event()  # a stream is being held (its client got exactly N events)
        self._held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, events: int, cut: bool = True) -> None:
        """Break the next completion stream after `events` events: at once
        (`cut`, a connection reset), or when the replica's side ends (kill it)."""
        self.holding.clear()
        self.cut_at_hold = cut
        self.hold_after_events = events

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
        seen = 0
        held = False
        try:
            while data := up.recv(65536):
                if held:
                    continue  # the dead replica's unsent output: lost
                limit = self.hold_after_events if state["completion"] else None
                if limit is not None:
                    # Count SSE event ends; forward through the N-th one.
                    i = 0
                    while seen < limit:
                        j = data.find(b"\n\n", i)
                        if j < 0:
                            break
                        seen += 1
                        i = j + 2
                    if seen >= limit:
                        client.sendall(data[:i] if i else b"")
                        held = True
                        self.hold_after_events = None
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
                        continue
                client.sendall(data)
        except OSError:
            pass
        # Cut, or the replica's side ended (killed): the gateway's ends abruptly.
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
