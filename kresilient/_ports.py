"""Port reservation for a local cluster: every port distinct, held until just before use.

The old picker bound port 0, closed the socket and handed the number out; the next pick
could receive the very same number (~0.13% of 3-node clusters drew a duplicate) and any
other process could take it before the broker bound it. Here every port of a cluster is a
*listening* socket held open until the moment the process that needs it is started, so the
kernel can neither hand it out twice nor give it to anyone else meanwhile.

The free ports are picked BELOW the kernel's ephemeral range (``ip_local_port_range``,
32768-60999 by default) where it leaves room: the kernel takes the local port of every
outgoing connection from that range, so a port of a node that is down (stopped, killed,
waiting for its restart) could be taken by any client's connection meanwhile, and the
restarted broker then failed to bind it (seen in CI: "Socket server failed to bind to
127.0.0.1:32901: Address already in use", a node restarted after a minute down). Below the
range only an explicit bind can take a port, and every bind here is checked.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

#: the lowest port picked below the ephemeral range (above the usual fixed services' ports)
_LOW: int = 10000
#: the ephemeral range's file (Linux); elsewhere the kernel picks (port 0)
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _below_ephemeral() -> range | None:
    """The ports to pick from: from :data:`_LOW` to the ephemeral range's start, or ``None``
    (the range cannot be read, or leaves fewer than 2,000 ports below it)."""
    try:
        with open(_RANGE_FILE, encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(_LOW, low) if low - _LOW >= 2000 else None


class PortInUseError(OSError):
    """A fixed port asked for is already taken by another process."""


def _listening(port: int, *, listen: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Rebinding a port a killed broker just left (TIME_WAIT) must work; listening keeps
        # everyone else (SO_REUSEADDR or not) from binding it while we hold it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        if listen:
            s.listen(64)
    except OSError:
        s.close()
        raise
    return s


class PortReservation:
    """A set of loopback ports held as listening sockets until :meth:`release`."""

    def __init__(self) -> None:
        self._held: dict[int, socket.socket] = {}

    def take_free(self, count: int) -> list[int]:
        """Reserve ``count`` free ports, distinct from each other and from held ones: picked
        at random below the ephemeral range (see the module's docstring), else chosen by the
        kernel."""
        out: list[int] = []
        pool = _below_ephemeral()
        pick = random.SystemRandom()
        for _ in range(count):
            s = None
            if pool is not None:
                for _try in range(200):
                    port = pick.randrange(pool.start, pool.stop)
                    if port in self._held:
                        continue
                    try:
                        s = _listening(port)
                    except OSError:  # taken by another process: another one
                        continue
                    break
            if s is None:
                s = _listening(0)
            port = int(s.getsockname()[1])
            self._held[port] = s
            out.append(port)
        return out

    def take(self, ports: Iterable[int]) -> list[int]:
        """Reserve these exact ports; raises :class:`PortInUseError` naming a taken one."""
        out: list[int] = []
        for port in ports:
            if port in self._held:
                raise PortInUseError(f"port {port} was asked for twice")
            try:
                self._held[port] = _listening(port)
            except OSError as exc:
                raise PortInUseError(
                    f"127.0.0.1:{port} is already in use by another process ({exc.strerror})"
                ) from exc
            out.append(port)
        return out

    def hold_again(self, ports: Iterable[int]) -> None:
        """Best effort: re-reserve ports of a node that is down (kept for its restart).

        Bound but NOT listening: a client connecting to a crashed broker must still be
        refused at once, not left hanging in a backlog; a bound port is still never chosen
        as the local port of an outgoing connection, the usual thief.
        """
        for port in ports:
            if port not in self._held:
                try:
                    self._held[port] = _listening(port, listen=False)
                except OSError:
                    continue

    def adopt(self, port: int) -> socket.socket:
        """Hand over the held listening socket itself (a proxy serves on it: no gap at all)."""
        return self._held.pop(port)

    def release(self, ports: Iterable[int] | None = None) -> None:
        """Close the sockets of ``ports`` (default: all) right before a process binds them."""
        for port in list(self._held) if ports is None else list(ports):
            s = self._held.pop(port, None)
            if s is not None:
                s.close()

    @property
    def held(self) -> list[int]:
        return sorted(self._held)
