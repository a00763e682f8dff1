"""The fault proxy on a local echo server: each fault, and a negative control for each.

Pure loopback sockets, no Kafka: the proxy's byte handling is checked here, the Kafka-level
consequences in test_network_faults.py.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from kresilient.testing._network import NetworkFaults, _Proxy, _State


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _request(client_id: str, body: bytes = b"") -> bytes:
    cid = client_id.encode()
    return _frame(struct.pack(">hhih", 1, 0, 7, len(cid)) + cid + body)


class _Echo:
    """Echoes every byte back (a Kafka broker answers each request frame with one frame)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.received = 0
        #: every byte received (a client of another test of this process may reconnect to a
        #: port the OS gave this server: count-only checks can see its bytes)
        self.data = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self._lock:
                    self.received += len(data)
                    self.data += data
                conn.sendall(data)


@pytest.fixture(name="rig")
def _rig() -> Iterator[tuple[NetworkFaults, dict[str, int], _Echo]]:
    echo = _Echo()
    state = _State([1, 2, 3])
    proxies = []
    ports = {}
    for kind in ("client", "internal"):
        listener = socket.create_server(("127.0.0.1", 0))
        proxy = _Proxy(state, 1, kind, listener, echo.port)  # type: ignore[arg-type]
        proxies.append(proxy)
        ports[kind] = proxy.port
    network = NetworkFaults(state, proxies)
    yield network, ports, echo
    network.close()
    echo.sock.close()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _nothing_arrives(s: socket.socket, within: float = 1.0) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return True
    finally:
        s.settimeout(10)


def test_pass_through_forwards_every_byte_in_order(rig) -> None:  # type: ignore[no-untyped-def]
    _network, ports, _echo = rig
    payload = b"".join(_frame(bytes([i % 256]) * 100_000) for i in range(20))  # ~2 MB
    with _connect(ports["client"]) as s:
        threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
        assert _recv_exact(s, len(payload)) == payload


def test_isolate_clients_stalls_both_ways_and_heal_delivers(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, echo = rig
    with _connect(ports["client"]) as s:
        s.sendall(_frame(b"before"))
        assert _recv_exact(s, 10) == _frame(b"before")  # control: the path works
        network.isolate(1, peers=False)
        s.sendall(_frame(b"during"))
        assert _nothing_arrives(s)
        assert echo.received == 10, "an isolated node must not receive the request"
        network.heal(1)
        # TCP keeps the bytes of a partition that heals in time: they arrive late.
        assert _recv_exact(s, 10) == _frame(b"during")


def test_isolate_peers_cuts_only_connections_of_the_isolated_source(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, _echo = rig
    network.isolate(2, clients=False)  # node 2 is cut from its peers (node 1 included)
    with _connect(ports["internal"]) as from2, _connect(ports["internal"]) as from3:
        from2.sendall(_request("broker-2-fetcher-0"))
        from3.sendall(_request("raft-client-3"))
        # Control: node 3 still talks to node 1.
        assert _recv_exact(from3, len(_request("raft-client-3"))) == _request("raft-client-3")
        assert _nothing_arrives(from2)
        assert {src for _p, _cid, src in network.connections()} >= {2, 3}
        network.heal()
        assert _recv_exact(from2, len(_request("broker-2-fetcher-0"))) == _request(
            "broker-2-fetcher-0"
        )


def test_isolate_peers_of_the_target_node_cuts_every_peer(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, _echo = rig
    with _connect(ports["internal"]) as from2, _connect(ports["client"]) as client:
        network.isolate(1, clients=False)
        from2.sendall(_request("2"))  # heartbeats carry the bare node id
        assert _nothing_arrives(from2)
        client.sendall(_frame(b"ok"))
        assert _recv_exact(client, 6) == _frame(
            b"ok"
        )  # control: clients=False leaves clients alone


def test_drop_responses_discards_whole_frames_and_keeps_framing(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, echo = rig
    with _connect(ports["client"]) as s:
        s.sendall(_frame(b"first"))
        assert _recv_exact(s, 9) == _frame(b"first")  # control
        with network.drop_responses(1):
            big = _frame(b"x" * 300_000)  # spans many reads
            s.sendall(big + _frame(b"second"))
            deadline = time.monotonic() + 10
            while echo.received < 9 + len(big) + 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert echo.received == 9 + len(big) + 10, "requests must reach the server"
            assert _nothing_arrives(s)
            assert network.dropped_responses(1) == 2
        s.sendall(_frame(b"third"))
        assert _recv_exact(s, 9) == _frame(b"third"), "the stream must stay framed after heal"


def test_delay_holds_each_chunk_and_keeps_order_under_jitter(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, _echo = rig
    with _connect(ports["client"]) as s:
        network.delay(1, 300)
        began = time.monotonic()
        s.sendall(_frame(b"ping"))
        assert _recv_exact(s, 8) == _frame(b"ping")
        # Lower bound only (load can only add): request and response each held 300 ms.
        assert time.monotonic() - began >= 0.6
        network.delay(1, 20, jitter_ms=20)
        pieces = [_frame(f"{i:05d}".encode()) for i in range(200)]
        for p in pieces:
            s.sendall(p)
        assert _recv_exact(s, 9 * len(pieces)) == b"".join(pieces)


def test_loss_costs_a_retransmission_timeout_per_lost_segment(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, _echo = rig
    with _connect(ports["client"]) as s:
        network.loss(1, 100)
        began = time.monotonic()
        s.sendall(_frame(b"ping"))
        assert _recv_exact(s, 8) == _frame(b"ping")  # nothing corrupted or lost for good
        assert time.monotonic() - began >= 0.4  # each way held one 200 ms RTO


def test_hold_time_follows_the_fault_table() -> None:
    state = _State([1, 2])
    state.rng.seed(1)
    assert state.hold_seconds("client", 1, None) == 0  # control: no fault, no hold
    state.faults[1].delay_ms, state.faults[1].jitter_ms = 100, 50
    holds = [state.hold_seconds("client", 1, None) for _ in range(500)]
    assert 0.05 <= min(holds) < 0.07 and 0.13 < max(holds) <= 0.15
    state.faults[1].delay_kinds = frozenset({"internal"})  # delay(..., links=["replication"])
    assert state.hold_seconds("client", 1, None) == 0
    assert state.hold_seconds("internal", 1, None) >= 0.05
    state.faults[1].delay_ms = state.faults[1].jitter_ms = 0
    state.faults[2].loss_percent = 10
    lost = sum(state.hold_seconds("internal", 1, 2) >= 0.2 for _ in range(2000))
    assert 120 < lost < 280  # ~10% of segments lost on node 2's side of the link


def test_fault_arguments_are_checked(rig) -> None:  # type: ignore[no-untyped-def]
    network, _ports, _echo = rig
    with pytest.raises(ValueError, match="no node 9"):
        network.isolate(9)
    with pytest.raises(ValueError, match="clients=True and/or peers=True"):
        network.isolate(1, clients=False, peers=False)
    with pytest.raises(ValueError, match=r"0\.\.100"):
        network.loss(1, 150)
    with pytest.raises(ValueError, match="delay"):
        network.delay(1, -5)
    with pytest.raises(ValueError, match="links must be among"):
        network.delay(1, 5, links=["replicaton"])
    network.isolate(1)
    assert 1 in network.faulty()
    network.heal()
    assert network.faulty() == {}


def test_connection_accepted_while_the_proxy_closes_does_not_deadlock() -> None:
    """A connection accepted after close() began is closed by the accept thread without
    holding the proxy's lock (CI, 2026-11-26: closing it under the lock deadlocked the accept
    thread and then close() itself, and `kresilient demo --fault ack-loss` hung at teardown)."""
    target = socket.create_server(("127.0.0.1", 0))
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = _Proxy(_State([1]), 1, "client", listener, int(target.getsockname()[1]))
    (accept_thread,) = [t for t in threading.enumerate() if t.name == f"kr-proxy-{proxy}"]
    proxy.closed = True  # close() has begun; the accept thread is still in accept()
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    try:
        accept_thread.join(10)
        assert not accept_thread.is_alive(), "the accept thread deadlocked on its own lock"
        assert proxy._lock.acquire(timeout=5), "the proxy's lock was left held"
        proxy._lock.release()
        assert not proxy.connections
        proxy.close()  # and close() completes
    finally:
        client.close()
        target.close()


def test_freeze_connections_hangs_those_open_now_and_lets_new_ones_pass(rig) -> None:  # type: ignore[no-untyped-def]
    network, ports, echo = rig
    app, other = _request("app"), _request("other")
    with _connect(ports["client"]) as old, _connect(ports["client"]) as bystander:
        old.sendall(app)
        bystander.sendall(other)
        assert _recv_exact(old, len(app)) == app  # control: the path works
        assert _recv_exact(bystander, len(other)) == other
        assert network.freeze_connections(client_id="app") == 1
        hung = _frame(b"hung-" + uuid.uuid4().hex.encode())  # found by its content
        old.sendall(hung)
        assert _nothing_arrives(old), "a frozen connection must forward nothing"
        assert hung not in echo.data, "nor reach the server"
        bystander.sendall(_frame(b"fine"))  # control: another client's connection flows
        assert _recv_exact(bystander, 8) == _frame(b"fine")
        assert "frozen connections: 1" in network.faulty()[1]
        with _connect(ports["client"]) as new:  # a new connection of the same client passes
            new.sendall(app)
            assert _recv_exact(new, len(app)) == app
        network.heal()
        assert _recv_exact(old, len(hung)) == hung, "heal lets it flow again"
        assert hung in echo.data
        assert network.faulty() == {}
