"""A bare blocking HTTP client making the SDK's timer and push calls by hand: the floor any
client could reach (``bench.sched_path --client raw``, ``bench.sched_floor``)."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from typing import Any


class RawClient:
    """The ``single`` scenario's calls as a bare blocking socket makes them (``--client raw``):
    the SDK's requests, spelled by hand, each answer read by its Content-Length and parsed
    with ``json.loads``; what no client can go below."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host = host.encode()
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.spec: dict[str, Any] = {}

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def timer(self, queue: str) -> RawClient:
        self.spec = {"queue": queue}
        return self

    def key(self, key: str) -> RawClient:
        self.spec["key"] = key
        return self

    def delay(self, delay: str | int) -> RawClient:
        self.spec["delay_ms"] = 3_600_000 if delay == "1h" else int(delay)
        return self

    def payload(self, payload: Any) -> RawClient:
        self.spec["payload"] = payload
        return self

    def schedule(self) -> Any:
        s = self.spec
        return self._call("POST", "/api/v1/timers", {"operations": [{
            "op": "schedule", "queue": s["queue"], "timerKey": s["key"],
            "delayMs": s["delay_ms"], "txn": str(uuid.uuid4()),
            "payload": base64.b64encode(json.dumps(s["payload"]).encode()).decode()}]})

    def cancel(self) -> Any:
        return self._call("DELETE", f"/api/v1/timers/{self.spec['queue']}/{self.spec['key']}")

    def push(self, queue: str, payload: Any) -> Any:
        return self._call("POST", "/api/v1/push", {"items": [{"queue": queue,
                                                               "payload": payload}]})

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        typed = b"Content-Type: application/json\r\n" if data else b""
        self.sock.sendall(b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n%s" % (
            method.encode(), path.encode(), self.host, typed, len(data), data))
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.sock.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        if lines[0][9:12] not in (b"200", b"201"):
            raise RuntimeError(f"{method} {path}: {lines[0]!r}")
        size = next(int(line.split(b":")[1]) for line in lines
                    if line.lower().startswith(b"content-length:"))
        while len(rest) < size:
            rest += self.sock.recv(65536)
        return json.loads(rest)

