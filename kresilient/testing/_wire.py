"""The little of the Kafka wire protocol the harness speaks itself.

- :func:`broker_metadata`: one Metadata (v4) request to ONE given broker. The admin client
  sends metadata requests to whichever broker it likes, so "every broker now shows leader
  X" (what a test's next read relies on) can only be checked by asking each broker.
- :func:`request_client_id`: the client id in a request header, which tells the fault
  proxies which node opened an inter-broker or controller connection.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

_METADATA = 3
_METADATA_VERSION = 4  # Kafka 4.x serves v4+ (KIP-896 removed v0-v3); v4 is not "flexible"


@dataclass(frozen=True)
class PartitionView:
    """One broker's view of a partition."""

    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        text = self.data[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def ints(self) -> tuple[int, ...]:
        return tuple(self.take(">i") for _ in range(self.take(">i")))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def broker_metadata(
    host: str, port: int, topic: str, *, timeout: float = 2.0
) -> dict[int, PartitionView] | None:
    """Partition id -> view of ``topic`` as the broker at ``host:port`` sees it.

    Returns None when that broker does not know the topic yet. Raises ``OSError`` when the
    broker cannot be reached or does not answer within ``timeout``.
    """
    client_id = b"kresilient-harness"
    name = topic.encode()
    body = struct.pack(">i", 1) + struct.pack(">h", len(name)) + name + b"\x00"
    header = struct.pack(">hhih", _METADATA, _METADATA_VERSION, 1, len(client_id)) + client_id
    request = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        r = _Reader(_recv_exact(sock, size))
    r.take(">i")  # correlation id
    r.take(">i")  # throttle time
    for _ in range(r.take(">i")):  # brokers
        r.take(">i")
        r.string()
        r.take(">i")
        r.string()
    r.string()  # cluster id
    r.take(">i")  # controller id
    out: dict[int, PartitionView] | None = None
    for _ in range(r.take(">i")):  # topics
        error = r.take(">h")
        r.string()
        r.take(">b")
        parts: dict[int, PartitionView] = {}
        for _ in range(r.take(">i")):
            r.take(">h")
            index = r.take(">i")
            leader = r.take(">i")
            parts[index] = PartitionView(leader, r.ints(), r.ints())
        if error == 0 and parts:
            out = parts
    return out


def request_client_id(frame: bytes) -> str | None:
    """The client id of one request frame (without its 4-byte length), or None.

    Every request header version (v1, v2) carries the client id as a legacy nullable
    string right after api key, api version and correlation id.
    """
    if len(frame) < 10:
        return None
    (n,) = struct.unpack_from(">h", frame, 8)
    if n < 0 or len(frame) < 10 + n:
        return None
    return frame[10 : 10 + n].decode("utf-8", errors="replace")
