"""The two pieces of RFC 6455 framing that both ends of a streaming pop write by hand: a frame's
head (FIN, opcode, mask bit, the payload length in its shortest form, 5.2) and the XOR of a
payload with its masking key (5.3). The broker's WebSocket (api/connections.py) writes unmasked
frames and unmasks what a client sends; the SDK's asyncio stream (client/stream.py) masks what
it sends. Everything else of the protocol stays wsproto's."""

from __future__ import annotations

_SHORT = [[bytes((b0, n)) for n in range(126)] for b0 in range(256)]


def head(b0: int, n: int, *, masked: bool) -> bytes:
    """The head of a frame whose first byte is ``b0`` (FIN, RSV bits, opcode) and whose payload
    is ``n`` bytes, without the masking key."""
    bit = 0x80 if masked else 0
    if n < 126:
        return bytes((b0, bit | n)) if masked else _SHORT[b0][n]
    if n < 65536:
        return bytes((b0, bit | 126)) + n.to_bytes(2, "big")
    return bytes((b0, bit | 127)) + n.to_bytes(8, "big")


def xor(payload: bytes, key: bytes) -> bytes:
    """``payload`` masked (or unmasked: the same operation) with the 4-byte ``key``, in one
    integer XOR rather than byte by byte."""
    n = len(payload)
    return (int.from_bytes(payload, "little")
            ^ int.from_bytes((key * ((n >> 2) + 1))[:n], "little")).to_bytes(n, "little")
