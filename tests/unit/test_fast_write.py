"""An answer given on the connection's task (queen_trio/api/fast.py) is written to the socket
at once when hypercorn's send lock is free, and left to hypercorn's own write otherwise."""

from __future__ import annotations

import types
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer

from queen_trio.api import fast


def _server(stream: trio.SocketStream) -> TCPServer:
    return TCPServer(app=None, config=Config(), context=None, state=None,  # type: ignore[arg-type]
                     stream=stream)  # type: ignore[arg-type]


async def test_an_answer_goes_out_at_once_while_the_send_lock_is_free() -> None:
    ours, peer = trio.socket.socketpair()
    server = _server(trio.SocketStream(ours))
    protocol: Any = types.SimpleNamespace(send=server.protocol_send)
    assert fast._write_at_once(protocol, b"HTTP/1.1 200 \r\n\r\n") == b""
    assert await peer.recv(100) == b"HTTP/1.1 200 \r\n\r\n"
    async with server.send_lock:  # another write in progress: hypercorn's write, after it
        assert fast._write_at_once(protocol, b"next") == b"next"
    with trio.move_on_after(0.05) as waited:  # nothing else was written
        await peer.recv(100)
    assert waited.cancelled_caught
    ours.close()
    peer.close()


async def test_what_the_socket_does_not_take_is_left_to_hypercorn() -> None:
    ours, peer = trio.socket.socketpair()
    server = _server(trio.SocketStream(ours))
    protocol: Any = types.SimpleNamespace(send=server.protocol_send)
    big = b"x" * (16 * 1024 * 1024)  # more than any socket buffer takes at once
    rest = fast._write_at_once(protocol, big)
    assert 0 < len(rest) < len(big)
    ours.close()
    assert fast._write_at_once(protocol, b"after close") == b"after close"
    peer.close()


async def test_a_connection_that_is_not_hypercorns_plain_tcp_is_left_alone() -> None:
    protocol: Any = types.SimpleNamespace(send=lambda event: None)
    assert fast._write_at_once(protocol, b"answer") == b"answer"
