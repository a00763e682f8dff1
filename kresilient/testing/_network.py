"""Network faults for :class:`~kresilient.testing.KafkaCluster`: fault-injecting TCP proxies.

With ``KafkaCluster(network_faults=True)`` every byte between clients and a node, between
two nodes (replication, the inter-broker listener) and to a node's KRaft controller passes
through a proxy thread pair on loopback. The brokers *advertise* the proxy ports, so a
client that bootstraps from ``cluster.bootstrap_servers`` never bypasses them. Each node has
three proxies: client, inter-broker and controller. The last two learn which node opened a
connection from the client id in its first request (``broker-2-fetcher-0``,
``raft-client-3``, or the bare node id), so a node can be cut from its peers in both
directions. No root, no Docker, no iptables. The client proxy assumes Kafka's framing
(a 4-byte length before each request and response).

What each fault does on the wire (TCP semantics are kept: bytes are never corrupted):

- ``isolate``: forwarding stops in both directions; data waits in the socket buffers, as in
  a partition, and flows again on heal unless an end gave up and closed the connection
  (client request timeouts, broker session timeouts). New connections are accepted and
  stall too.
- ``delay``/jitter: each chunk is forwarded ``ms`` (+- jitter) after it was read; order kept.
- ``loss``: a lost segment costs TCP a retransmission, so each chunk is, with the given
  probability, held for a retransmission timeout (200 ms, Linux's minimum RTO) instead.
- ``drop_responses``: requests reach the broker and are processed; every response frame on
  the node's client connections is discarded whole: the lost acknowledgement.
- ``freeze_connections``: the client connections open now (of one node or all, of one client
  id or all) stop forwarding in both directions, for good; connections opened later pass.
  The client sees a hung connection (librdkafka #5153: a request that is never answered on
  a socket that stays up), which only a new connection, e.g. a recreated client, gets past.
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from kresilient.testing._wire import request_client_id

Kind = Literal["client", "internal", "controller"]
# Client ids Kafka 4.x nodes use towards each other: "broker-2-fetcher-0" (replication),
# "raft-client-3" (the KRaft quorum), and the bare node id "2" (heartbeats, forwarding).
_SOURCE = re.compile(r"^(\d+)$|^(?:broker|raft-client|controller|node)-(\d+)")
_RTO_S = 0.2
_CHUNK = 65536


_LINKS: dict[str, Kind] = {
    "clients": "client",
    "replication": "internal",
    "controller": "controller",
}
_ALL_KINDS: frozenset[Kind] = frozenset(_LINKS.values())


@dataclass
class _NodeFaults:
    isolate_clients: bool = False
    isolate_peers: bool = False
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    delay_kinds: frozenset[Kind] = _ALL_KINDS
    loss_percent: float = 0.0
    drop_responses: bool = False

    def active(self) -> bool:
        return self != _NodeFaults()


class _State:
    """The fault table shared by every proxy of one cluster."""

    def __init__(self, node_ids: list[int]) -> None:
        self.cond = threading.Condition()
        self.faults = {n: _NodeFaults() for n in node_ids}
        self.dropped_responses = dict.fromkeys(node_ids, 0)
        self.accepted: dict[tuple[int, str], int] = {}
        self.lost_segments = 0
        self.delayed_chunks = 0
        #: connections frozen by freeze_connections(), per node (until heal)
        self.frozen: dict[int, set[_Connection]] = {n: set() for n in node_ids}
        self.closed = False
        self.rng = random.Random()

    def blocked(self, kind: Kind, node: int, source: int | None) -> bool:
        f = self.faults[node]
        if kind == "client":
            return f.isolate_clients
        if f.isolate_peers:
            return True
        return source is not None and source in self.faults and self.faults[source].isolate_peers

    def hold_seconds(self, kind: Kind, node: int, source: int | None) -> float:
        links = [self.faults[node]]
        if kind != "client" and source is not None and source in self.faults:
            links.append(self.faults[source])
        hold = 0.0
        for f in links:
            if (f.delay_ms or f.jitter_ms) and kind in f.delay_kinds:
                hold += max(0.0, f.delay_ms + self.rng.uniform(-f.jitter_ms, f.jitter_ms)) / 1e3
                self.delayed_chunks += 1
            if f.loss_percent and self.rng.random() * 100 < f.loss_percent:
                hold += _RTO_S
                self.lost_segments += 1
        return hold


class _Pipe:
    """One direction of one proxied connection."""

    def __init__(self, conn: _Connection, src: socket.socket, dst: socket.socket, up: bool):
        self.conn, self.src, self.dst, self.up = conn, src, dst, up
        self.queue: deque[tuple[float, bytes]] = deque()
        self.qcond = threading.Condition()
        self.writer: threading.Thread | None = None
        self.sending = False
        # Response framing (down direction of client proxies): whole frames are dropped.
        self.header = b""
        self.remaining = 0
        self.dropping = False

    def run(self) -> None:
        try:
            # learn who opened it from the first request's client id (a node id for the
            # peer proxies; the client id for freeze_connections(client_id=...))
            first = self.up
            pending = b""
            while True:
                data = self.src.recv(_CHUNK)
                if not data:
                    break
                if first:  # learn the source node from the first request's client id
                    pending += data
                    if len(pending) < 4:
                        continue
                    (size,) = struct.unpack_from(">i", pending)
                    if len(pending) < 4 + size and size < 1 << 20:
                        continue
                    self.conn.identify(request_client_id(pending[4 : 4 + size]))
                    data, pending, first = pending, b"", False
                self._wait_unblocked()
                if not self.up and self.conn.proxy.kind == "client":
                    data = self._drop_responses(data)
                    if not data:
                        continue
                self._forward(data)
        except OSError:
            pass
        finally:
            self.conn.close()

    def _wait_unblocked(self) -> None:
        state, proxy = self.conn.proxy.state, self.conn.proxy
        with state.cond:
            while (
                not state.closed
                and not self.conn.closed
                and (
                    state.blocked(proxy.kind, proxy.node, self.conn.source)
                    or self.conn in state.frozen[proxy.node]
                )
            ):
                state.cond.wait(0.5)
        if self.conn.closed:
            raise OSError("closed")

    def _drop_responses(self, data: bytes) -> bytes:
        state, node = self.conn.proxy.state, self.conn.proxy.node
        out = bytearray()
        i = 0
        while i < len(data):
            if self.remaining == 0:
                take = data[i : i + 4 - len(self.header)]
                self.header += take
                i += len(take)
                if len(self.header) < 4:
                    break
                (self.remaining,) = struct.unpack(">i", self.header)
                with state.cond:
                    self.dropping = state.faults[node].drop_responses
                    if self.dropping:
                        state.dropped_responses[node] += 1
                if not self.dropping:
                    out += self.header
                self.header = b""
            else:
                take = data[i : i + self.remaining]
                i += len(take)
                self.remaining -= len(take)
                if not self.dropping:
                    out += take
        return bytes(out)

    def _forward(self, data: bytes) -> None:
        proxy = self.conn.proxy
        with proxy.state.cond:
            hold = proxy.state.hold_seconds(proxy.kind, proxy.node, self.conn.source)
        with self.qcond:
            if hold == 0 and not self.queue and not self.sending:
                direct = True
            else:
                direct = False
                due = time.monotonic() + hold
                if self.queue:  # TCP delivers in order: never overtake an earlier chunk
                    due = max(due, self.queue[-1][0])
                self.queue.append((due, data))
                if self.writer is None:
                    self.writer = threading.Thread(target=self._write_loop, daemon=True)
                    self.writer.start()
                self.qcond.notify()
        if direct:
            self.dst.sendall(data)

    def _write_loop(self) -> None:
        try:
            while not self.conn.closed:
                with self.qcond:
                    while not self.queue and not self.conn.closed:
                        self.qcond.wait(0.5)
                    if self.conn.closed:
                        return
                    due, _ = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, 0.5))  # holding a chunk IS the fault being injected
                    continue
                self._wait_unblocked()
                with self.qcond:
                    _, data = self.queue.popleft()
                    self.sending = True  # the reader must not overtake this chunk
                try:
                    self.dst.sendall(data)
                finally:
                    with self.qcond:
                        self.sending = False
        except OSError:
            self.conn.close()


class _Connection:
    def __init__(self, proxy: _Proxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.source: int | None = None
        self.client_id: str | None = None
        self.closed = False

    def identify(self, client_id: str | None) -> None:
        self.client_id = client_id
        m = _SOURCE.search(client_id or "")
        with self.proxy.state.cond:
            self.source = int(m.group(1) or m.group(2)) if m else None
            self.proxy.state.cond.notify_all()

    def start(self) -> None:
        for src, dst, up in ((self.client, self.server, True), (self.server, self.client, False)):
            pipe = _Pipe(self, src, dst, up)
            threading.Thread(target=pipe.run, daemon=True, name=f"kr-proxy-{self.proxy}").start()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.proxy.forget(self)


class _Proxy:
    """Accepts on ``listener`` (loopback) and forwards each connection to ``target_port``."""

    def __init__(
        self, state: _State, node: int, kind: Kind, listener: socket.socket, target_port: int
    ) -> None:
        self.state, self.node, self.kind = state, node, kind
        self.listener, self.target_port = listener, target_port
        self.port = int(listener.getsockname()[1])
        self.connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept_loop, daemon=True, name=f"kr-proxy-{self}").start()

    def __str__(self) -> str:
        return f"{self.kind}-{self.node}:{self.port}->{self.target_port}"

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()  # the node is down: the client sees a refused/reset connection
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, server)
            with self.state.cond:
                key = (self.node, self.kind)
                self.state.accepted[key] = self.state.accepted.get(key, 0) + 1
            with self._lock:
                closing = self.closed
                if not closing:
                    self.connections.add(conn)
            if closing:
                # closed outside the lock: _Connection.close() calls forget(), which takes it
                # (closing under it deadlocked this thread and then close(): a hung teardown)
                conn.close()
                return
            conn.start()

    def forget(self, conn: _Connection) -> None:
        with self._lock:
            self.connections.discard(conn)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            conns = list(self.connections)
        for conn in conns:
            conn.close()


class _Fault:
    """A fault just applied; as a context manager it heals that node on exit."""

    def __init__(self, network: NetworkFaults, node: int) -> None:
        self._network, self._node = network, node

    def __enter__(self) -> _Fault:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._network.heal(self._node)


class NetworkFaults:
    """Network faults between clients and nodes, and between nodes (``cluster.network``).

    Every method applies at once and returns a handle usable as a context manager that
    heals the node on exit::

        with cluster.network.drop_responses(leader):
            ...  # produce: requests are processed, acknowledgements never arrive
        # healed here

    Faults on one node combine (a delayed node can also be isolated); :meth:`heal` clears
    them. ``KafkaCluster.close()`` heals everything first.
    """

    def __init__(self, state: _State, proxies: list[_Proxy]) -> None:
        self._state = state
        self._proxies = proxies

    def _set(self, node: int, **changes: object) -> _Fault:
        with self._state.cond:
            if node not in self._state.faults:
                raise ValueError(f"no node {node}; nodes are {sorted(self._state.faults)}")
            for key, value in changes.items():
                setattr(self._state.faults[node], key, value)
            self._state.cond.notify_all()
        return _Fault(self, node)

    def isolate(self, node: int, *, clients: bool = True, peers: bool = True) -> _Fault:
        """Cut ``node`` from clients and/or from the other nodes, both directions.

        ``peers`` covers replication (fetches either way) and the KRaft controller quorum
        (votes, metadata fetches, broker heartbeats).
        """
        if not clients and not peers:
            raise ValueError("isolate() needs clients=True and/or peers=True")
        return self._set(node, isolate_clients=clients, isolate_peers=peers)

    def delay(
        self,
        node: int,
        ms: float,
        *,
        jitter_ms: float = 0.0,
        links: Iterable[str] = ("clients", "replication", "controller"),
    ) -> _Fault:
        """Delay every chunk on the node's links by ``ms`` +- jitter.

        ``links`` narrows it to some of ``"clients"``, ``"replication"`` (the inter-broker
        listener: fetches either way) and ``"controller"`` (the KRaft quorum, heartbeats).
        Slowing only replication keeps the controller quorum healthy, e.g. to make followers
        fall out of the ISR without losing the quorum that shrinks it.
        """
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay needs ms >= 0 and jitter_ms >= 0, got {ms}, {jitter_ms}")
        wanted = list(links)
        unknown = sorted(set(wanted) - set(_LINKS))
        if unknown or not wanted:
            raise ValueError(f"links must be among {sorted(_LINKS)}, got {wanted}")
        kinds = frozenset(_LINKS[x] for x in wanted)
        return self._set(node, delay_ms=float(ms), jitter_ms=float(jitter_ms), delay_kinds=kinds)

    def loss(self, node: int, percent: float) -> _Fault:
        """Lose ``percent`` % of segments on the node's links (each loss costs a 200 ms RTO)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"loss percent must be within 0..100, got {percent}")
        return self._set(node, loss_percent=float(percent))

    def drop_responses(self, node: int) -> _Fault:
        """Requests reach ``node`` and are processed; its responses to clients are lost."""
        return self._set(node, drop_responses=True)

    def freeze_connections(self, node: int | None = None, *, client_id: str | None = None) -> int:
        """Freeze the client connections open now: no byte forwarded either way, the sockets
        stay up (a hung connection, librdkafka #5153); connections opened later pass.

        ``node``: only that node's (default: every node's); ``client_id``: only connections
        whose first request carried it (a connection that sent nothing yet is frozen too).
        Returns how many were frozen; :meth:`heal` lets them flow again.
        """
        frozen = 0
        with self._state.cond:
            if node is not None and node not in self._state.faults:
                raise ValueError(f"no node {node}; nodes are {sorted(self._state.faults)}")
            for proxy in self._proxies:
                if proxy.kind != "client" or (node is not None and proxy.node != node):
                    continue
                for conn in list(proxy.connections):
                    if client_id is None or conn.client_id in (None, client_id):
                        self._state.frozen[proxy.node].add(conn)
                        frozen += 1
            self._state.cond.notify_all()
        return frozen

    def heal(self, node: int | None = None) -> None:
        """Clear every fault of ``node`` (default: of all nodes)."""
        with self._state.cond:
            for n in [node] if node is not None else list(self._state.faults):
                if n not in self._state.faults:
                    raise ValueError(f"no node {n}; nodes are {sorted(self._state.faults)}")
                self._state.faults[n] = _NodeFaults()
                self._state.frozen[n].clear()
            self._state.cond.notify_all()

    def peer_isolated(self) -> list[int]:
        """Nodes currently cut from their peers (their metadata may be stale)."""
        with self._state.cond:
            return [n for n, f in self._state.faults.items() if f.isolate_peers]

    def dropped_responses(self, node: int) -> int:
        """How many response frames of ``node`` were discarded so far (proof of the fault)."""
        with self._state.cond:
            return self._state.dropped_responses[node]

    def connections_accepted(self, node: int, kind: Kind = "client") -> int:
        """How many connections ``node``'s ``kind`` proxy accepted so far.

        A client that gave up on a request (timeout) reconnects: a rise here while a fault
        is on proves the client noticed it.
        """
        with self._state.cond:
            return self._state.accepted.get((node, kind), 0)

    def counters(self) -> dict[str, int]:
        """Totals since start: ``lost_segments`` (RTO holds), ``delayed_chunks``."""
        with self._state.cond:
            return {
                "lost_segments": self._state.lost_segments,
                "delayed_chunks": self._state.delayed_chunks,
            }

    def faulty(self) -> dict[int, str]:
        """Node id -> description of its active faults (nodes without faults omitted)."""
        with self._state.cond:
            out = {n: repr(f) for n, f in self._state.faults.items() if f.active()}
            for n, conns in self._state.frozen.items():
                if conns:
                    out[n] = f"{out.get(n, '')} frozen connections: {len(conns)}".strip()
            return out

    def connections(self) -> Iterator[tuple[str, str | None, int | None]]:
        """(proxy, client id, source node) of every open proxied connection (diagnostics)."""
        for proxy in self._proxies:
            for conn in list(proxy.connections):
                yield str(proxy), conn.client_id, conn.source

    def close(self) -> None:
        self.heal()
        with self._state.cond:
            self._state.closed = True
            self._state.cond.notify_all()
        for proxy in self._proxies:
            proxy.close()
