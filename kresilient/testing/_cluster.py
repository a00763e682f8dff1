"""A real Apache Kafka cluster on loopback, for tests and demos.

:class:`KafkaCluster` starts N combined broker+controller KRaft nodes of real Apache Kafka
(default 3; version ``$KRESILIENT_KAFKA_VERSION``, else :data:`KAFKA_VERSION`) on 127.0.0.1
with free ports and fresh data directories. The broker jars are resolved by Maven on first
use and cached per version.
It has chaos controls (kill, graceful stop, restart, freeze/thaw, preferred election) so
tests can prove behaviour across real leader elections::

    from kresilient.testing._cluster import KafkaCluster

    with KafkaCluster() as cluster:
        cluster.create_topic("orders", partitions=3)
        leader = cluster.leader("orders", 0)
        cluster.kill(leader)               # SIGKILL: a crash
        cluster.start(leader)              # same data, rejoins the ISR
        cluster.wait_for_isr("orders", 0)

With ``KRESILIENT_BOOTSTRAP_SERVERS`` set, the cluster object wraps that existing cluster
instead; chaos operations then raise :class:`ChaosNotSupportedError`, a ``broker_config`` the
brokers do not have fails the start, and arguments that only shape a started cluster are
named in an :class:`ExternalClusterWarning`. Parallel workers may wrap one cluster at once.

Every process is started by the cluster and stopped by pid in :meth:`KafkaCluster.close`,
which also runs at interpreter exit, on SIGTERM (when no other SIGTERM handler is
installed) and when a cluster dropped without ``close()`` is garbage-collected (with a
``ResourceWarning``). Only the process that started a cluster closes it: a forked child
(multiprocessing's ``fork``) leaves its parent's nodes and data directory alone.

On Linux the brokers are forked from one long-lived launcher thread with
``PR_SET_PDEATHSIG``, so they die with the owning *process* (SIGKILL included) and never
because the thread that called :meth:`KafkaCluster.start` ended. Each cluster's data
directory carries an owner marker; directories of owners that died without cleaning up
(SIGKILL) are removed when the next cluster starts.

``KafkaCluster(network_faults=True)`` puts a fault-injecting proxy in front of every
listener; :attr:`KafkaCluster.network` then isolates, delays, drops responses (see
:mod:`kresilient.testing._network`).

``KafkaCluster(security="sasl_ssl")`` (SCRAM-SHA-512 over TLS) or ``security="ssl"`` (mutual
TLS) secures the client listener: a CA and certificates are generated per cluster, the
``StandardAuthorizer`` denies whatever no ACL allows, and :meth:`KafkaCluster.create_user`,
:meth:`~KafkaCluster.grant`, :meth:`~KafkaCluster.revoke` and
:meth:`~KafkaCluster.client_config` give each test a user holding only the ACLs it needs
(see docs/security.md).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from confluent_kafka.cimpl import NewTopic

from kresilient._ports import PortInUseError, PortReservation
from kresilient.errors import ChaosNotSupportedError, ClusterError
from kresilient.testing import _launcher
from kresilient.testing._broker_jars import KAFKA_VERSION, kafka_libs
from kresilient.testing._network import NetworkFaults, _Proxy, _State
from kresilient.testing._pki import CertificateAuthority, ClientCertificate, new_secret
from kresilient.testing._wire import PartitionView, broker_metadata

__all__ = [
    "BOOTSTRAP_ENV",
    "JVM_OPTIONS_ENV",
    "KAFKA_VERSION",
    "KAFKA_VERSION_ENV",
    "SUPER_USER",
    "CertificateAuthority",
    "ChaosNotSupportedError",
    "ClientCertificate",
    "ClusterError",
    "ExternalClusterWarning",
    "KafkaCluster",
    "NetworkFaults",
    "default_kafka_version",
    "remove_stale_dirs",
]

BOOTSTRAP_ENV = "KRESILIENT_BOOTSTRAP_SERVERS"
"""Environment variable naming an existing cluster to use instead of starting one."""

JVM_OPTIONS_ENV = "KRESILIENT_KAFKA_JVM_OPTS"
"""Environment variable with extra JVM options for every node (``jvm_options``' default)."""

KAFKA_VERSION_ENV = "KRESILIENT_KAFKA_VERSION"
"""Environment variable naming the Kafka release of every :class:`KafkaCluster` given no
``version`` (the pytest plugin's session clusters and a test's own alike)."""


def default_kafka_version() -> str:
    """The release a :class:`KafkaCluster` runs when no ``version`` is given:
    ``$KRESILIENT_KAFKA_VERSION`` (stripped), or :data:`KAFKA_VERSION` when it is unset or
    empty. Read at each construction, so one suite runs on another release with the variable
    set and no test edited."""
    return os.environ.get(KAFKA_VERSION_ENV, "").strip() or KAFKA_VERSION


_PROBE_TOPIC = "__kresilient_probe"
_PROPAGATION_S = 15.0
# how long a read-only metadata question is asked again while no broker answers it
_METADATA_RETRY_S = 60.0
_UNANSWERED = frozenset(
    {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
)
_DIR_PREFIX = "kresilient-kafka-"
_OWNER_FILE = "kresilient-owner"
_START_ATTEMPTS = 3
_T = TypeVar("_T")

Security = Literal["plaintext", "sasl_ssl", "ssl"]
SUPER_USER = "admin"
"""The harness's super user on a secured cluster (``client_config()`` without a user)."""
_SCRAM = "SCRAM-SHA-512"
_SECURITY_PROTOCOL = {"sasl_ssl": "SASL_SSL", "ssl": "SSL"}


class ExternalClusterWarning(UserWarning):
    """A :class:`KafkaCluster` argument that only shapes a cluster it starts (``nodes``,
    ``version``, ``heap``, ``first_port``, ``jvm_options``) is ignored because the object
    wraps an existing cluster (``$KRESILIENT_BOOTSTRAP_SERVERS``)."""


class _NotYet(ClusterError):
    """Metadata does not show the topic or partition yet (propagation); polled again."""


class _PortLost(ClusterError):
    """A node could not bind a port it was given: another process took it meanwhile."""


@dataclass
class _Node:
    node_id: int
    client_port: int
    """What clients connect to and the broker advertises (the proxy in fault mode)."""
    controller_port: int
    directory: Path
    direct_client_port: int = 0
    internal_port: int = 0
    internal_proxy_port: int = 0
    controller_proxy_port: int = 0
    admin_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_handle: Any = field(default=None, repr=False)
    log_offset: int = 0
    """Size of ``server.log`` when the current process was spawned (earlier runs precede it)."""
    expected_down: bool = False
    frozen: bool = False

    @property
    def harness_port(self) -> int:
        """The port the harness itself reads metadata from (never through a fault)."""
        return self.admin_port or self.client_port

    def bound_ports(self) -> list[int]:
        """Ports the broker process itself binds."""
        if self.admin_port:
            return [
                self.direct_client_port,
                self.internal_port,
                self.admin_port,
                self.controller_port,
            ]
        return [self.client_port, self.controller_port]

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"


def _process_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (None when it does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(marker: Path) -> bool:
    try:
        pid_text, started = marker.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # unreadable: not ours to judge, leave it alone
    if sys.platform != "linux":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return _process_start(pid) == started


def remove_stale_dirs(base: str | Path | None = None) -> list[Path]:
    """Remove data directories of clusters whose owning process died without cleaning up.

    Only directories this harness created are considered (``kresilient-kafka-*`` holding an
    owner marker with the owner's pid and start time); a live owner's directory, or one
    without a marker, is never touched. Runs at every cluster start; returns what it removed.
    """
    removed: list[Path] = []
    root = Path(base) if base is not None else Path(tempfile.gettempdir())
    for directory in root.glob(f"{_DIR_PREFIX}*"):
        marker = directory / _OWNER_FILE
        if not marker.is_file() or _owner_alive(marker):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    return removed


def _cluster_id() -> str:
    # Kafka's Uuid.toString(): URL-safe base64 of 16 bytes, no padding, never starting with '-'.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = INFO
"""

_QUIET = logging.getLogger("kresilient.testing.admin")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _ignore_error(err: KafkaError) -> None:
    _QUIET.debug("admin client error: %s", err)


# Errors after which an admin request may or may not have taken effect, and sending it again
# is the remedy: librdkafka (2.10+) decommissions a broker a metadata response leaves out,
# failing its queued and in-flight requests with _DESTROY_BROKER; a node that restarts or is
# fenced while the cluster settles drops the connection; and on a starved machine a request
# times out, locally or at the controller (REQUEST_TIMED_OUT), while a KRaft quorum re-elects.
_RESENDABLE = frozenset(
    {
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
    }
)

# One send waits at most this long for its answer before it is sent again, so a request lost
# with a stalled connection is retried within the caller's timeout rather than using it all.
_ATTEMPT_SECONDS = 20.0


def _admin_request(
    what: str,
    submit: Callable[[float], Iterable[Any]],
    timeout: float,
    *,
    done_after_resend: frozenset[int] = frozenset(),
    done: frozenset[int] = frozenset(),
) -> None:
    """Run an idempotent admin request until every future succeeds, resending it while it
    fails with an error from :data:`_RESENDABLE` and time is left.

    ``submit(seconds)`` sends the request once, with ``seconds`` as its request (and
    operation) timeout. ``done_after_resend``: broker codes that mean an earlier send took
    effect (a topic that exists after its creation was resent); they count as success only
    after a resend; ``done``: codes that count as success always (a topic another process
    created first). Raises :class:`ClusterError` naming ``what`` and the broker's reason.
    """
    deadline = time.monotonic() + timeout
    resent = False
    while True:
        attempt = max(0.1, min(_ATTEMPT_SECONDS, deadline - time.monotonic()))
        resend: KafkaError | None = None
        for future in list(submit(attempt)):
            try:
                # librdkafka fails the future at its request timeout; the margin only keeps
                # a future it never completes from blocking past the deadline.
                future.result(timeout=attempt + min(5.0, attempt))
            except KafkaException as exc:
                err = exc.args[0]
                code = err.code() if isinstance(err, KafkaError) else None
                if code in done or (resent and code in done_after_resend):
                    continue
                if code in _RESENDABLE and time.monotonic() < deadline:
                    resend = err
                    continue
                raise ClusterError(f"{what} failed: {err}") from None
            except TimeoutError:
                if time.monotonic() < deadline:
                    resend = KafkaError(KafkaError._TIMED_OUT)
                    continue
                raise ClusterError(f"{what} failed: no answer in {timeout:g} s") from None
        if resend is None:
            return
        resent = True
        time.sleep(0.2)


def _reap(node: _Node, timeout: float) -> None:
    if node.process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=timeout)
    if node.log_handle is not None:
        node.log_handle.close()
        node.log_handle = None


class _Owned:
    """What a started cluster must give back: node processes, fault proxies, held ports and
    the data directory, and the one process allowed to give them back.

    Kept apart from the :class:`KafkaCluster` object so that the cluster's finalizer, atexit
    and the SIGTERM handler can release it without keeping the cluster itself alive (a
    dropped cluster leaked its JVMs while the live set held clusters only weakly). A process
    forked from the owner inherits a copy of this object, whose ``Popen`` objects there say
    "exited" (the brokers are not the child's children): releasing it from the child deleted
    the data directory under the parent's running brokers. Only ``pid`` may release.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.nodes: dict[int, _Node] = {}
        self.root: Path | None = None
        self.network: NetworkFaults | None = None
        self.ports = PortReservation()
        self._lock = threading.RLock()
        self.closed = False

    @property
    def in_owner(self) -> bool:
        """True in the process that started the cluster (False in a forked child)."""
        return os.getpid() == self.pid

    def kill_all(self) -> None:
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.process.pid, signal.SIGCONT)  # a frozen JVM ignores TERM
                    node.process.kill()
        for node in self.nodes.values():
            _reap(node, timeout=30)

    def teardown(self) -> None:
        """Undo a launch: processes, proxies, ports, data directory (also before a retry)."""
        if not self.in_owner:
            return
        if self.network is not None:
            self.network.close()
            self.network = None
        self.kill_all()
        self.ports.release()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.nodes.clear()

    def release(self) -> bool:
        """Tear down once, and only in the owning process; True when this call did it.

        Safe from a signal handler: it never waits for an operation another thread runs.
        """
        if not self.in_owner:
            return False
        with self._lock:
            if self.closed:
                return False
            self.closed = True
        _LIVE.discard(self)
        self.teardown()
        return True


# Strong: what atexit and the SIGTERM handler must release, held even when the cluster object
# itself has been dropped (its finalizer removes the entry when it runs first).
_LIVE: set[_Owned] = set()


def _forget_inherited() -> None:
    # A forked child owns none of its parent's clusters: neither its atexit nor its SIGTERM
    # handler (both inherited) may release them.
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)


def _release_collected(owned: _Owned) -> None:
    """The finalizer of a :class:`KafkaCluster` dropped without :meth:`KafkaCluster.close`."""
    root = owned.root
    servers = ",".join(f"127.0.0.1:{n.client_port}" for n in owned.nodes.values())
    if owned.release():
        # After the release: under ``-W error`` the warning raises, and the cleanup is done.
        warnings.warn(
            f"KafkaCluster at {servers} was garbage-collected without close(): its nodes "
            f"were stopped and its data directory {root} removed now; close it (`with "
            "KafkaCluster() as cluster:` or close()) so that happens where you expect",
            ResourceWarning,
            stacklevel=2,
        )


@atexit.register
def _close_all() -> None:
    for owned in list(_LIVE):
        owned.release()


def _on_sigterm(signum: int, _frame: object) -> None:
    # Python's default SIGTERM ends the process without atexit: close every cluster (its
    # brokers and its ~100 MB data directory), then die of SIGTERM as before. In a forked
    # child _LIVE is empty: the parent's clusters are the parent's.
    _close_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm_cleanup() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)


class KafkaCluster:
    """N combined broker+controller KRaft nodes of real Apache Kafka on 127.0.0.1.

    Args:
        nodes: how many nodes (each is broker and controller).
        version: Apache Kafka version, resolved through Maven and cached. ``None`` (the
            default): :func:`default_kafka_version`, i.e. ``$KRESILIENT_KAFKA_VERSION`` when
            it is set and not empty, else :data:`KAFKA_VERSION` (4.1.1); a version given
            here wins over the variable::

                KRESILIENT_KAFKA_VERSION=4.4.0 pytest   # every cluster without version=
        broker_config: extra ``server.properties`` entries for every node (override the
            test-friendly defaults, e.g. ``{"broker.session.timeout.ms": 9000}``).
        heap: JVM ``-Xmx`` per node.
        start_timeout: seconds to wait for readiness before failing.
        bootstrap_servers: use this existing cluster instead of starting one (defaults to
            ``$KRESILIENT_BOOTSTRAP_SERVERS``); chaos operations are then refused. What a
            test's outcome depends on is checked: ``network_faults=True`` is refused at once
            (:class:`ChaosNotSupportedError` for the variable, ``ValueError`` for this
            argument), and each ``broker_config`` entry must be what every broker reports
            (DescribeConfigs), else the start fails naming it. ``nodes`` (unless equal to the
            broker count), ``version``, ``heap``, ``first_port`` and ``jvm_options`` given
            with other than their defaults are named in one :class:`ExternalClusterWarning`.
        first_port: fixed client ports instead of random ones: node 1 serves clients on
            ``first_port``, node 2 on ``first_port + 1``, ... (``9092`` gives the usual
            ``127.0.0.1:9092``). A taken port fails the start with a :class:`ClusterError`
            naming it. Controller and internal ports stay random.
        network_faults: route every client, inter-broker and controller connection through
            fault-injecting proxies so :attr:`network` can isolate, delay, lose and drop
            responses. Off by default: clients then connect to the brokers directly.
        security: ``"plaintext"`` (default, no cost), ``"sasl_ssl"`` (SCRAM-SHA-512 over
            TLS) or ``"ssl"`` (mutual TLS, the certificate's CN is the user). The client
            listener is secured, ACLs are enforced (``allow.everyone.if.no.acl.found=false``)
            and :data:`SUPER_USER` may do anything. Inter-broker, controller and the
            harness's own ADMIN listener stay PLAINTEXT on 127.0.0.1 (their ANONYMOUS
            principal is a super user): tests exercise the secured client path only. A secured
            cluster is always started, never taken from ``$KRESILIENT_BOOTSTRAP_SERVERS``.
        users: SCRAM users (name -> password) created when the storage is formatted
            (``sasl_ssl``); in ``ssl`` mode a client certificate is issued for each name.
        jvm_options: extra JVM options for every node, after kresilient's own (defaults to
            ``$KRESILIENT_KAFKA_JVM_OPTS``, split like a shell would). The test suite runs
            with ``-XX:TieredStopAtLevel=1``: a node then starts on about 40 % less CPU,
            which short-lived test clusters never earn back through C2-compiled code.
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        version: str | None = None,
        broker_config: Mapping[str, str | int | bool] | None = None,
        heap: str = "384m",
        start_timeout: float = 120.0,
        bootstrap_servers: str | None = None,
        first_port: int | None = None,
        network_faults: bool = False,
        security: Security = "plaintext",
        users: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if first_port is not None and not 1 <= first_port <= 65535 - nodes + 1:
            raise ValueError(f"first_port must leave room for {nodes} ports, got {first_port}")
        default_version = default_kafka_version()
        self.version: str = version if version is not None else default_version
        """The Apache Kafka release the nodes run."""
        self._n = nodes
        self._extra = dict(broker_config or {})
        self._heap = heap
        jvm_options_given = jvm_options is not None
        if jvm_options is None:
            jvm_options = shlex.split(os.environ.get(JVM_OPTIONS_ENV, ""))
        for option in jvm_options:
            if not option.startswith("-"):
                raise ValueError(
                    f"jvm_options (or ${JVM_OPTIONS_ENV}): {option!r} is not a JVM option"
                )
        self._jvm_options = list(jvm_options)
        self._start_timeout = start_timeout
        if security not in ("plaintext", "sasl_ssl", "ssl"):
            raise ValueError(f"security must be 'plaintext', 'sasl_ssl' or 'ssl', got {security!r}")
        if security != "plaintext" and bootstrap_servers:
            raise ValueError("a secured cluster is started by KafkaCluster, not an external one")
        self.security: Security = security
        """``"plaintext"``, ``"sasl_ssl"`` or ``"ssl"``."""
        # A secured cluster needs its own CA, users and authorizer: never the shared one.
        env = os.environ.get(BOOTSTRAP_ENV) if security == "plaintext" else None
        self._external = bootstrap_servers or env or None
        self._external_source = "bootstrap_servers" if bootstrap_servers else f"${BOOTSTRAP_ENV}"
        if self._external is not None and network_faults:
            # Without its proxies a test of network faults tests nothing: refused here, at
            # once, rather than by the first cluster.network call after a wasted start.
            if bootstrap_servers:
                raise ValueError("network_faults=True needs a cluster started by KafkaCluster")
            raise ChaosNotSupportedError(
                f"KafkaCluster(network_faults=True) needs a cluster started by KafkaCluster; "
                f"{BOOTSTRAP_ENV}={self._external} names an existing one (unset it for this "
                "test, or skip the test when it is set, as the kafka_network_cluster fixture "
                "does)"
            )
        # What only a started cluster could honour, for the warning an external one gives.
        self._shaping: dict[str, object] = {
            name: value
            for name, value, default in (
                ("version", self.version, default_version),
                ("heap", heap, "384m"),
                ("first_port", first_port, None),
                ("jvm_options", list(jvm_options) if jvm_options_given else None, None),
            )
            if value != default
        }
        self._users: dict[str, str] = {}
        if security != "plaintext":
            self._users[SUPER_USER] = new_secret("kresilient-admin")
            for name, password in (users or {}).items():
                self._check_user_name(name)
                self._users[name] = password
        elif users:
            raise ValueError("users need security='sasl_ssl' or 'ssl'")
        self._ca: CertificateAuthority | None = None
        self._certs: dict[str, ClientCertificate] = {}
        self._node_admins: dict[int, AdminClient] = {}
        self._first_port = first_port
        self._network_faults = network_faults
        self._owned = _Owned()
        self._nodes = self._owned.nodes  # the same dict: the finalizer reaches the nodes
        self._finalizer: weakref.finalize[Any, KafkaCluster] | None = None
        self._admin: AdminClient | None = None
        self._lock = threading.RLock()
        self._started = False
        self.start_seconds: float | None = None
        """How long :meth:`start_cluster` took until the cluster was ready."""
        self.start_attempts = 0
        """How many launches :meth:`start_cluster` needed (a lost port race retries)."""

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> KafkaCluster:
        self.start_cluster()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def external(self) -> bool:
        """True when this object wraps an existing cluster (no chaos operations)."""
        return self._external is not None

    @property
    def supports_chaos(self) -> bool:
        """True when kill/stop/start/freeze are available (a cluster this object started)."""
        return not self.external

    @property
    def network(self) -> NetworkFaults:
        """The network fault controls (needs ``KafkaCluster(network_faults=True)``)."""
        if self.external:
            raise ChaosNotSupportedError(
                f"network faults need a cluster started by KafkaCluster; this one wraps "
                f"{BOOTSTRAP_ENV}={self._external}"
            )
        if not self._network_faults:
            raise ChaosNotSupportedError(
                "network faults need KafkaCluster(network_faults=True): without it clients "
                "connect to the brokers directly and there is no proxy to inject faults in"
            )
        if self._owned.network is None:
            raise ClusterError("the cluster is not started")
        return self._owned.network

    @property
    def data_dir(self) -> Path | None:
        """The cluster's data directory (removed by :meth:`close`); None before start."""
        return self._owned.root

    @property
    def bootstrap_servers(self) -> str:
        """Comma-separated ``host:port`` list of every node's client listener."""
        if self._external is not None:
            return self._external
        return ",".join(f"127.0.0.1:{n.client_port}" for n in self._nodes.values())

    @property
    def node_ids(self) -> list[int]:
        """Node ids of this cluster (1..N), in order."""
        if self.external:
            return sorted(self._metadata_brokers())
        return sorted(self._nodes)

    def start_cluster(self) -> None:
        """Start every node (or connect to the external cluster) and wait until ready."""
        with self._lock:
            if self._started:
                return
            self._started = True
            began = time.monotonic()
            if self.external:
                self._wait_ready(expected=None)
                self._check_external_fits()
                self.start_seconds = time.monotonic() - began
                return
            # The owner is the process that starts the cluster (not the one that built the
            # object): only it may stop these nodes and remove this directory.
            self._owned.pid = os.getpid()
            _LIVE.add(self._owned)
            # A cluster dropped without close() is released when it is collected; at exit
            # _close_all releases what is left (silently: close() "also runs at exit").
            self._finalizer = weakref.finalize(self, _release_collected, self._owned)
            self._finalizer.atexit = False
            _install_sigterm_cleanup()
            remove_stale_dirs()
            try:
                for attempt in range(1, _START_ATTEMPTS + 1):
                    self.start_attempts = attempt
                    try:
                        self._launch_all()
                        self._wait_ready(expected=self._n)
                        break
                    except _PortLost:
                        # Another process bound one of our ports between our release and
                        # the broker's bind: start over on fresh ports.
                        if attempt == _START_ATTEMPTS:
                            raise
                        self._teardown()
            except BaseException:
                self.close()
                raise
            self.start_seconds = time.monotonic() - began

    def _check_external_fits(self) -> None:
        """Say which arguments the wrapped cluster cannot honour (a CI run that sets
        ``$KRESILIENT_BOOTSTRAP_SERVERS`` to save the cluster starts must not change what a
        test means without a word).

        ``broker_config`` is what a test's outcome depends on (a session timeout, a size
        limit): each entry is checked against every broker's DescribeConfigs, and one that
        differs, or that no broker reports, is a :class:`ClusterError` naming it. Arguments
        that only shape a started cluster are named in one :class:`ExternalClusterWarning`.
        """
        where = f"the external cluster at {self._external} ({self._external_source})"
        brokers = self._metadata_brokers()
        if self._extra:
            wanted = {k: _prop(v) for k, v in self._extra.items()}
            configs = self._poll_until(
                "the brokers' configuration", lambda: self._broker_configs(brokers), 30.0
            )
            unmet = [
                f"{key}={value!r} (broker {broker} has "
                + ("no such setting" if key not in config else repr(config[key]))
                + ")"
                for key, value in wanted.items()
                for broker, config in sorted(configs.items())
                if config.get(key) != value
            ]
            if unmet:
                raise ClusterError(
                    f"broker_config cannot be honoured by {where}: "
                    + "; ".join(unmet)
                    + ". Configure those brokers so, or run this test on a cluster "
                    f"KafkaCluster starts (without {BOOTSTRAP_ENV})"
                )
        ignored = dict(self._shaping)
        if self._n != 3 and self._n != len(brokers):  # 3: the default, never a request
            ignored["nodes"] = self._n
        if self._first_port is not None:
            port = self._first_port
            mine = {f"127.0.0.1:{port + i}" for i in range(self._n)}
            if mine <= set(brokers.values()):
                del ignored["first_port"]  # those are the very listeners
        if ignored:
            named = ", ".join(f"{k}={v!r}" for k, v in ignored.items())
            warnings.warn(
                f"KafkaCluster wraps {where} ({len(brokers)} brokers) and ignores {named}: "
                f"they shape a cluster KafkaCluster starts (unset {BOOTSTRAP_ENV} to get one)",
                ExternalClusterWarning,
                stacklevel=3,
            )

    def _broker_configs(self, brokers: Mapping[int, str]) -> dict[int, dict[str, str | None]]:
        """Broker id -> its configuration (name -> value; None for a sensitive value)."""
        configs: dict[int, dict[str, str | None]] = {}
        for broker in brokers:  # one BROKER resource per request (librdkafka's rule)
            resource = ConfigResource(ResourceType.BROKER, str(broker))
            (future,) = (
                self._admin_client().describe_configs([resource], request_timeout=10).values()
            )
            try:
                entries = future.result(timeout=15)
            except TimeoutError:
                raise _NotYet(f"broker {broker} did not describe its configuration") from None
            configs[broker] = {name: entry.value for name, entry in entries.items()}
        return configs

    def _reserve(self) -> None:
        n = self._n
        ports = self._owned.ports
        if self._first_port is not None:
            try:
                client = ports.take(range(self._first_port, self._first_port + n))
            except PortInUseError as exc:
                raise ClusterError(f"cannot use first_port={self._first_port}: {exc}") from exc
        else:
            client = ports.take_free(n)
        secured = self.security != "plaintext"
        per_node = 6 if self._network_faults else 3 if secured else 1
        rest = ports.take_free(per_node * n)
        assert self._owned.root is not None
        for i, node_id in enumerate(range(1, n + 1)):
            mine = rest[i * per_node : (i + 1) * per_node]
            directory = self._owned.root / f"node-{node_id}"
            (directory / "data").mkdir(parents=True)
            node = _Node(node_id, client[i], mine[0], directory)
            if self._network_faults:
                (
                    node.direct_client_port,
                    node.internal_port,
                    node.internal_proxy_port,
                    node.controller_proxy_port,
                    node.admin_port,
                ) = mine[1:]
            elif secured:
                # The secured CLIENT listener is what clients reach; INTERNAL (replication)
                # and ADMIN (the harness) stay plaintext on loopback.
                node.direct_client_port = node.client_port
                node.internal_port, node.admin_port = mine[1:]
            self._nodes[node_id] = node

    def _start_proxies(self) -> None:
        state = _State(sorted(self._nodes))
        proxies: list[_Proxy] = []
        for node in self._nodes.values():
            for kind, listen, target in (
                ("client", node.client_port, node.direct_client_port),
                ("internal", node.internal_proxy_port, node.internal_port),
                ("controller", node.controller_proxy_port, node.controller_port),
            ):
                proxies.append(
                    _Proxy(state, node.node_id, kind, self._owned.ports.adopt(listen), target)  # type: ignore[arg-type]
                )
        self._owned.network = NetworkFaults(state, proxies)

    def _launch_all(self) -> None:
        libs = kafka_libs(self.version)
        self._classpath = str(libs / "*")
        root = self._owned.root = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
        # The owner marker lets the next start remove this directory if we die uncleanly.
        (root / _OWNER_FILE).write_text(f"{os.getpid()} {_process_start(os.getpid())}\n")
        # lz4-java, zstd-jni and snappy extract native libraries to java.io.tmpdir and a
        # SIGKILLed JVM never deletes them: keep them inside the data directory.
        (root / "tmp").mkdir()
        self._reserve()
        if self._network_faults:
            self._start_proxies()
        if self.security != "plaintext":
            self._make_pki()
        (root / "log4j2.properties").write_text(_LOG4J2)
        if self._network_faults:
            voters = ",".join(
                f"{n.node_id}@127.0.0.1:{n.controller_proxy_port}" for n in self._nodes.values()
            )
        else:
            voters = ",".join(
                f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self._nodes.values()
            )
        for node in self._nodes.values():
            node.config_path.write_text(self._properties(node, voters))
        cluster_id = _cluster_id()
        # Format the storage of every node in parallel with the SAME cluster id; never on restart.
        formats = [
            (
                node,
                _launcher.popen(
                    [
                        *self._java(node, heap="128m"),
                        "kafka.tools.StorageTool",
                        "format",
                        "-t",
                        cluster_id,
                        "-c",
                        str(node.config_path),
                        *self._scram_format_args(),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                ),
            )
            for node in self._nodes.values()
        ]
        for node, proc in formats:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise ClusterError(
                    f"formatting the storage of node {node.node_id} failed "
                    f"(exit {proc.returncode}):\n"
                    f"{self._hide_passwords(out.decode(errors='replace')[-3000:])}"
                )
        for node in self._nodes.values():
            self._spawn(node)

    def _listeners(self, node: _Node) -> dict[str, str | int | bool]:
        if not node.admin_port:
            return {
                "listeners": (
                    f"PLAINTEXT://127.0.0.1:{node.client_port},"
                    f"CONTROLLER://127.0.0.1:{node.controller_port}"
                ),
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.client_port}",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            }
        # Clients reach CLIENT and peers reach INTERNAL only through the proxies (advertised);
        # the harness reads metadata on ADMIN, which no fault touches. A secured cluster
        # without faults has the same listeners, advertised directly.
        client_protocol = _SECURITY_PROTOCOL.get(self.security, "PLAINTEXT")
        internal = node.internal_proxy_port or node.internal_port
        # The KRaft leader tells its followers its own endpoints (Fetch/Vote/BeginQuorumEpoch
        # responses carry them, KIP-853); unadvertised, that is its real CONTROLLER port, and
        # a follower that reconnected after learning it fetched from the leader around the
        # proxy: an isolated controller kept one follower and no election happened.
        controller = (
            f",CONTROLLER://127.0.0.1:{node.controller_proxy_port}"
            if node.controller_proxy_port
            else ""
        )
        return {
            "listeners": (
                f"CLIENT://127.0.0.1:{node.direct_client_port},"
                f"INTERNAL://127.0.0.1:{node.internal_port},"
                f"ADMIN://127.0.0.1:{node.admin_port},"
                f"CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": (
                f"CLIENT://127.0.0.1:{node.client_port},"
                f"INTERNAL://127.0.0.1:{internal},"
                f"ADMIN://127.0.0.1:{node.admin_port}{controller}"
            ),
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": (
                f"CONTROLLER:PLAINTEXT,CLIENT:{client_protocol},INTERNAL:PLAINTEXT,ADMIN:PLAINTEXT"
            ),
        }

    def _properties(self, node: _Node, voters: str) -> str:
        settings: dict[str, str | int | bool] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            **self._listeners(node),
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(node.directory / "data"),
            "num.partitions": 1,
            "default.replication.factor": min(3, self._n),
            "min.insync.replicas": min(2, self._n),
            "offsets.topic.replication.factor": min(3, self._n),
            "offsets.topic.num.partitions": 6,
            "transaction.state.log.replication.factor": min(3, self._n),
            "transaction.state.log.min.isr": min(2, self._n),
            "transaction.state.log.num.partitions": 6,
            "share.coordinator.state.topic.replication.factor": min(3, self._n),
            "share.coordinator.state.topic.min.isr": min(2, self._n),
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false",
            "unclean.leader.election.enable": "false",
            # Otherwise leaders move behind a test's back every 300 s.
            "auto.leader.rebalance.enable": "false",
            "num.network.threads": 2,
            "num.io.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "background.threads": 2,
            # The 128 MiB default dedupe buffer does not fit a small heap.
            "log.cleaner.dedupe.buffer.size": 16777216,
            # A SIGKILLed broker is fenced (and its partitions move) after this. Through the
            # fault proxies (Python threads in the test process) twice as long: the heartbeat
            # RPC's request timeout is the interval, and at 500 ms a loaded CI machine kept a
            # broker's heartbeats timing out after an isolated controller was healed.
            "broker.heartbeat.interval.ms": 1000 if self._network_faults else 500,
            "broker.session.timeout.ms": 6000 if self._network_faults else 3000,
            "replica.lag.time.max.ms": 5000,
            # An idle local cluster spends its CPU on timers: followers re-fetching idle
            # partitions (every 500 ms by default) and the controller's no-op metadata record
            # (KIP-835, every 500 ms). A follower's fetch still returns as soon as the leader has
            # new data (acks=all waits no longer), and stays well inside the ISR lag above.
            # A 3-node cluster at rest: 6.4 -> 4.6 CPU-s per minute (2026-11-30, C1 JIT,
            # KafkaCluster(broker_config=...) side by side; the test suite runs several at once).
            "replica.fetch.wait.max.ms": 2500,
            "metadata.max.idle.interval.ms": 5000,
            # KIP-848 groups (group.protocol=consumer): the session timeout is the broker's
            # (45 s, and no lower than this minimum); a test may set a group's own
            # consumer.session.timeout.ms down to 6 s to see a dead member replaced quickly.
            "group.consumer.min.session.timeout.ms": 6000,
            "group.consumer.min.heartbeat.interval.ms": 500,
            "controlled.shutdown.enable": "true",
            "log.segment.bytes": 67108864,
            "log.retention.check.interval.ms": 60000,
        }
        settings.update(self._security_settings())
        settings.update(self._extra)
        # Java .properties have no inline comments: write plain key=value lines only.
        return "".join(f"{k}={_prop(v)}\n" for k, v in settings.items())

    def _java(self, node: _Node, *, heap: str | None = None) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ClusterError("'java' is not on PATH; Apache Kafka 4.x needs Java 17+")
        assert self._owned.root is not None
        return [
            java,
            "-Xms64m",
            f"-Xmx{heap or self._heap}",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:TieredStopAtLevel=1" if heap == "128m" else "-XX:+UseCompressedOops",
            *self._jvm_options,
            "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={self._owned.root / 'tmp'}",
            f"-Dlog4j2.configurationFile={self._owned.root / 'log4j2.properties'}",
            "-cp",
            self._classpath,
        ]

    def _spawn(self, node: _Node) -> None:
        node.log_handle = open(node.log_path, "ab")  # noqa: SIM115 - closed in _reap
        node.log_offset = node.log_handle.tell()
        # Released at the last moment: until now nobody else could have taken them.
        self._owned.ports.release(node.bound_ports())
        node.process = _launcher.popen(
            [*self._java(node), "kafka.Kafka", str(node.config_path)],
            stdout=node.log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Own session: a Ctrl-C in the terminal reaches pytest (which then closes the
            # cluster), not the brokers directly.
            start_new_session=True,
        )

    def _teardown(self) -> None:
        """Undo a launch (before a retry on fresh ports)."""
        self._admin = None
        self._node_admins.clear()
        self._owned.teardown()

    def close(self) -> None:
        """Stop every process this cluster started (by pid) and remove its directories.

        Safe to call more than once, from any thread, and from a signal handler (it does not
        wait for an operation another thread is running on the cluster). Only the process
        that started the cluster closes it: in a process forked from it (multiprocessing's
        ``fork``), ``close()`` leaves the parent's nodes and directory alone.
        """
        if not self._owned.in_owner:
            return
        if self._owned.release():
            self._admin = None
            self._node_admins.clear()
        if self._finalizer is not None:
            self._finalizer.detach()

    # ------------------------------------------------------------------ readiness
    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            conf: dict[str, Any] = {
                # Connection failures while nodes start or are killed are expected here.
                "logger": _QUIET,
                "error_cb": _ignore_error,
                "bootstrap.servers": self._harness_bootstrap(),
                "socket.timeout.ms": 5000,
                "socket.connection.setup.timeout.ms": 3000,
                "reconnect.backoff.max.ms": 500,
            }
            self._admin = AdminClient(conf)
        return self._admin

    def _harness_bootstrap(self) -> str:
        if self._external is not None:
            return self._external
        return ",".join(f"127.0.0.1:{n.harness_port}" for n in self._nodes.values())

    def _metadata_brokers(self, timeout: float = 5.0) -> dict[int, str]:
        md = self._admin_client().list_topics(timeout=timeout)
        return {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}

    def _check_alive(self) -> None:
        for node in self._nodes.values():
            proc = node.process
            if proc is not None and proc.poll() is not None and not node.expected_down:
                # The bind failure is logged before Kafka's shutdown dumps its whole config,
                # so it is looked for in everything this process wrote, not in the tail.
                bind_errors = [
                    line
                    for line in self._run_log(node).splitlines()
                    if "Address already in use" in line or "BindException" in line
                ]
                if bind_errors:
                    raise _PortLost(
                        f"Kafka node {node.node_id} could not bind one of its ports "
                        f"{node.bound_ports()} (taken by another process): "
                        + "\n".join(bind_errors[:3])
                    )
                errors = [
                    line
                    for line in self._run_log(node).splitlines()
                    if " ERROR " in line or " FATAL " in line or "Exception" in line
                ]
                raise ClusterError(
                    f"Kafka node {node.node_id} exited with code {proc.returncode}; "
                    f"errors it logged:\n"
                    + "\n".join(errors[:10] or ["(none)"])
                    + f"\nlast lines of {node.log_path}:\n{self._tail(node, 15)}"
                )

    def _run_log(self, node: _Node) -> str:
        """What the node's current process has written to its log so far."""
        try:
            with open(node.log_path, "rb") as log:
                log.seek(node.log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _tail(self, node: _Node, lines: int = 40) -> str:
        try:
            text = node.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _poll_until(
        self, what: str, check: Callable[[], _T | None], timeout: float, interval: float = 0.2
    ) -> _T:
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            self._check_alive()
            try:
                result = check()
            except (KafkaException, _NotYet) as exc:
                result, last_error = None, exc
            if result is not None and result is not False:
                return result
            if time.monotonic() >= deadline:
                detail = f" (last error: {last_error})" if last_error else ""
                logs = "".join(
                    f"\n--- node {n.node_id} log tail ---\n{self._tail(n, 15)}"
                    for n in self._nodes.values()
                )
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}{detail}{logs}"
                )
            time.sleep(interval)

    def _wait_ready(self, expected: int | None) -> None:
        timeout = self._start_timeout

        def brokers_registered() -> bool:
            brokers = self._metadata_brokers()
            return len(brokers) >= expected if expected else bool(brokers)

        self._poll_until("every broker to register", brokers_registered, timeout)
        rf = expected or min(3, len(self._metadata_brokers()))
        if _PROBE_TOPIC not in self._admin_client().list_topics(timeout=10).topics:
            # On a shared external cluster, parallel workers start at the same moment and
            # each may find the probe missing: whoever creates it first, it is there, and
            # every other CreateTopics answers TOPIC_ALREADY_EXISTS (3 of 4 starts failed
            # when that was an error). The ISR wait below gives its metadata a deadline.
            new = NewTopic(_PROBE_TOPIC, num_partitions=1, replication_factor=rf)
            _admin_request(
                f"creating the readiness topic {_PROBE_TOPIC!r}",
                lambda seconds: (
                    self._admin_client()
                    .create_topics([new], operation_timeout=seconds, request_timeout=seconds)
                    .values()
                ),
                timeout,
                done=frozenset({KafkaError.TOPIC_ALREADY_EXISTS}),
            )
        # Every replica it has: one created earlier (by a smaller cluster) may have fewer.
        self.wait_for_isr(_PROBE_TOPIC, 0, timeout=timeout)
        self._warm_up_idempotence(timeout)

    def _warm_up_idempotence(self, timeout: float) -> None:
        # A fresh cluster answers the first InitProducerId with COORDINATOR_LOAD_IN_PROGRESS
        # for a while; "ready" means an idempotent acks=all write is acknowledged.
        conf: dict[str, Any] = {
            # On a secured cluster: the super user over the secured listener, so a broken
            # TLS/SASL setup fails the start instead of the first test.
            **self.client_config(),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(timeout * 1000),
            "logger": _QUIET,
            "error_cb": _ignore_error,
        }
        producer = Producer(conf)
        outcome: list[KafkaError | None] = []
        producer.produce(_PROBE_TOPIC, b"ready", on_delivery=lambda err, _msg: outcome.append(err))
        self._poll_until(
            "an idempotent write to be acknowledged",
            lambda: bool(producer.poll(0.2) or outcome) or None,
            timeout,
        )
        producer.flush(timeout)
        if outcome and outcome[0] is not None:
            raise ClusterError(f"the readiness write to {_PROBE_TOPIC} failed: {outcome[0]}")

    # ------------------------------------------------------------------ security
    @staticmethod
    def _check_user_name(name: str) -> None:
        if not name or any(c in name for c in ",=[]\n\r ") or name.startswith("CN="):
            raise ValueError(f"user names are plain words without ',=[] ', got {name!r}")

    def _require_secured(self, what: str) -> None:
        if self.security == "plaintext":
            raise ClusterError(
                f"{what} needs a secured cluster: KafkaCluster(security='sasl_ssl') or "
                "KafkaCluster(security='ssl')"
            )

    def _make_pki(self) -> None:
        assert self._owned.root is not None
        self._ca = CertificateAuthority(self._owned.root / "pki")
        self._keystore_password = new_secret("kresilient-keystore")
        self._keystore = self._ca.broker_keystore(self._keystore_password)
        self._certs.clear()
        if self.security == "ssl":
            for name, password in self._users.items():
                self._certs[name] = self._ca.client_certificate(name, password)

    def _scram_format_args(self) -> list[str]:
        if self.security != "sasl_ssl":
            return []
        args: list[str] = []
        for name, password in self._users.items():
            args += ["--add-scram", f"{_SCRAM}=[name={name},password={password}]"]
        return args

    def _hide_passwords(self, text: str) -> str:
        for secret in (*self._users.values(), getattr(self, "_keystore_password", "")):
            if secret:
                text = text.replace(secret, "[REDACTED]")
        return text

    def _security_settings(self) -> dict[str, str | int | bool]:
        if self.security == "plaintext":
            return {}
        assert self._ca is not None
        prefix = "listener.name.client."
        settings: dict[str, str | int | bool] = {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            # ANONYMOUS is the principal of the plaintext INTERNAL, CONTROLLER and ADMIN
            # listeners (brokers, controllers, the harness): loopback only, never advertised
            # to a client that bootstraps from the secured CLIENT listener.
            "super.users": f"User:ANONYMOUS;User:{SUPER_USER}",
            # mTLS: principal "User:alice" for CN=alice, so ACLs read the same in both modes.
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            f"{prefix}ssl.keystore.type": "PKCS12",
            f"{prefix}ssl.keystore.location": str(self._keystore),
            f"{prefix}ssl.keystore.password": self._keystore_password,
            f"{prefix}ssl.key.password": self._keystore_password,
            f"{prefix}ssl.truststore.type": "PEM",
            f"{prefix}ssl.truststore.location": str(self._ca.ca_path),
        }
        if self.security == "ssl":
            settings[f"{prefix}ssl.client.auth"] = "required"
        else:
            settings[f"{prefix}sasl.enabled.mechanisms"] = _SCRAM
            settings[f"{prefix}scram-sha-512.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            )
        return settings

    @property
    def ca_path(self) -> Path:
        """The CA certificate (PEM) that signed the brokers' certificate."""
        self._require_secured("ca_path")
        assert self._ca is not None, "the cluster is not started"
        return self._ca.ca_path

    @property
    def users(self) -> list[str]:
        """Names of the users this cluster knows (secured clusters; the super user first)."""
        return list(self._users)

    def password(self, user: str) -> str:
        """The user's SCRAM password (``sasl_ssl``) or private-key password (``ssl``)."""
        self._require_secured("password()")
        try:
            return self._users[user]
        except KeyError:
            raise ClusterError(f"no user {user!r}; users are {self.users}") from None

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """Client settings that connect as ``user`` (default: the harness's super user).

        Plaintext cluster: just ``bootstrap.servers``. ``sasl_ssl``: security.protocol,
        SCRAM mechanism, username, password and ``ssl.ca.location``. ``ssl``: the CA and the
        user's certificate, encrypted key and key password. Hostname verification stays on.
        """
        config = {"bootstrap.servers": self.bootstrap_servers}
        if self.security == "plaintext":
            if user is not None:
                raise ClusterError("client_config(user) needs a secured cluster")
            return config
        name = user or SUPER_USER
        password = self.password(name)
        config["security.protocol"] = _SECURITY_PROTOCOL[self.security]
        config["ssl.ca.location"] = str(self.ca_path)
        if self.security == "sasl_ssl":
            config["sasl.mechanism"] = _SCRAM
            config["sasl.username"] = name
            config["sasl.password"] = password
        else:
            config.update(self._certs[name].client_settings())
        return config

    def issue_certificate(self, user: str, *, expired: bool = False) -> ClientCertificate:
        """A client certificate for ``user`` signed by this cluster's CA (``expired=True``:
        validity ended yesterday). Its key password is the user's password."""
        self._require_secured("issue_certificate()")
        assert self._ca is not None, "the cluster is not started"
        return self._ca.client_certificate(user, self.password(user), expired=expired)

    def create_user(self, name: str, password: str | None = None, *, timeout: float = 60.0) -> str:
        """Create a user with no ACLs; returns its password (random when not given).

        ``sasl_ssl``: a SCRAM-SHA-512 credential, returned once every node accepts a login
        with it. ``ssl``: a client certificate ``CN=<name>`` (password protects its key).
        """
        self._require_secured("create_user()")
        self._check_user_name(name)
        password = password or new_secret(f"kresilient-{name}")
        with self._lock:
            self._users[name] = password
            if self.security == "ssl":
                self._certs[name] = self.issue_certificate(name)
                return password
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        upsert: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(name, info, password.encode())
        ]
        _admin_request(
            f"creating user {name!r}",
            lambda seconds: (
                self._admin_client()
                .alter_user_scram_credentials(upsert, request_timeout=seconds)
                .values()
            ),
            timeout,
        )
        for node in self._nodes.values():
            self._poll_until(
                f"node {node.node_id} to accept a login as {name!r}",
                lambda node=node: self._login_works(node, name),  # type: ignore[misc]
                timeout,
            )
        return password

    def _login_works(self, node: _Node, user: str) -> bool:
        conf: dict[str, Any] = {
            **self.client_config(user),
            "bootstrap.servers": f"127.0.0.1:{node.client_port}",
            "logger": _QUIET,
            "error_cb": _ignore_error,
            "socket.timeout.ms": 3000,
        }
        admin = AdminClient(conf)
        try:
            admin.list_topics(timeout=3)
        except KafkaException:
            return False
        return True

    def _bindings(
        self,
        user: str,
        *,
        topic: str | None,
        group: str | None,
        transactional_id: str | None,
        cluster: bool,
        operations: Iterable[str],
        prefixed: bool,
    ) -> list[AclBinding]:
        resources: list[tuple[ResourceType, str]] = []
        if topic is not None:
            resources.append((ResourceType.TOPIC, topic))
        if group is not None:
            resources.append((ResourceType.GROUP, group))
        if transactional_id is not None:
            resources.append((ResourceType.TRANSACTIONAL_ID, transactional_id))
        if cluster:
            resources.append((ResourceType.BROKER, "kafka-cluster"))
        if not resources:
            raise ValueError("name a resource: topic=, group=, transactional_id= or cluster=True")
        ops = [operations] if isinstance(operations, str) else list(operations)
        if not ops:
            raise ValueError("operations must name at least one operation, e.g. ('WRITE',)")
        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings: list[AclBinding] = []
        for kind, name in resources:
            for op in ops:
                try:
                    operation = AclOperation[op.upper().replace("-", "_")]
                except KeyError:
                    known = [o.name for o in AclOperation if o.name not in ("UNKNOWN", "ANY")]
                    raise ValueError(f"unknown ACL operation {op!r}; known: {known}") from None
                bindings.append(
                    AclBinding(
                        kind,
                        name,
                        pattern,
                        f"User:{user}",
                        "*",
                        operation,
                        AclPermissionType.ALLOW,
                    )
                )
        return bindings

    def grant(
        self,
        user: str,
        *,
        topic: str | None = None,
        group: str | None = None,
        transactional_id: str | None = None,
        cluster: bool = False,
        operations: Iterable[str] = ("ALL",),
        prefixed: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """Allow ``user`` the ``operations`` (``"READ"``, ``"WRITE"``, ``"DESCRIBE"``, ...) on
        each named resource (``prefixed=True``: every resource starting with the name).

        Returns once every node answers DescribeAcls with the new bindings, so the next
        request a test makes is judged by them.
        """
        self._require_secured("grant()")
        bindings = self._bindings(
            user,
            topic=topic,
            group=group,
            transactional_id=transactional_id,
            cluster=cluster,
            operations=operations,
            prefixed=prefixed,
        )
        _admin_request(
            f"granting {', '.join(map(str, bindings))}",
            lambda seconds: (
                self._admin_client().create_acls(bindings, request_timeout=seconds).values()
            ),
            timeout,
        )
        self._wait_acls(bindings, present=True, timeout=timeout)

    def revoke(
        self,
        user: str,
        *,
        topic: str | None = None,
        group: str | None = None,
        transactional_id: str | None = None,
        cluster: bool = False,
        operations: Iterable[str] = ("ALL",),
        prefixed: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """Remove ALLOW bindings given by :meth:`grant` (same arguments); waits like it."""
        self._require_secured("revoke()")
        bindings = self._bindings(
            user,
            topic=topic,
            group=group,
            transactional_id=transactional_id,
            cluster=cluster,
            operations=operations,
            prefixed=prefixed,
        )
        filters = [
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            for b in bindings
        ]
        _admin_request(
            f"revoking {', '.join(map(str, bindings))}",
            lambda seconds: (
                self._admin_client().delete_acls(filters, request_timeout=seconds).values()
            ),
            timeout,
        )
        self._wait_acls(bindings, present=False, timeout=timeout)

    def _node_admin(self, node: _Node) -> AdminClient:
        admin = self._node_admins.get(node.node_id)
        if admin is None:
            conf: dict[str, Any] = {
                "bootstrap.servers": f"127.0.0.1:{node.harness_port}",
                "logger": _QUIET,
                "error_cb": _ignore_error,
                "socket.timeout.ms": 5000,
            }
            admin = AdminClient(conf)
            self._node_admins[node.node_id] = admin
        return admin

    def _wait_acls(self, bindings: list[AclBinding], *, present: bool, timeout: float) -> None:
        # Each broker applies ACL changes from the metadata log on its own schedule: ask each
        # node (a bootstrap of one node answers from that node) until all agree.
        wanted = {str(b) for b in bindings}

        def settled() -> bool:
            for node in self._nodes.values():
                if node.process is None or node.process.poll() is not None or node.frozen:
                    continue
                for b in bindings:
                    flt = AclBindingFilter(
                        b.restype,
                        b.name,
                        b.resource_pattern_type,
                        b.principal,
                        None,  # type: ignore[arg-type]  # None matches any host
                        AclOperation.ANY,
                        AclPermissionType.ANY,
                    )
                    found = (
                        self._node_admin(node)
                        .describe_acls(flt, request_timeout=5)
                        .result(timeout=10)
                    )
                    shown = {str(x) for x in found} & wanted
                    if (str(b) in shown) != present:
                        return False
            return True

        verb = "show" if present else "drop"
        self._poll_until(f"every node to {verb} the ACL change", settled, timeout, 0.1)

    # ------------------------------------------------------------------ topics
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: Mapping[str, str | int | bool] | None = None,
        *,
        timeout: float = 60.0,
    ) -> str:
        """Create a topic and wait until every partition has a leader and a full ISR.

        Returns the topic name. Raises :class:`ClusterError` if creation fails (the message
        names the topic and the broker's reason).
        """
        new = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config={k: _prop(v) for k, v in (config or {}).items()},
        )
        # request_timeout: the admin default (socket.timeout.ms, 5 s here) is too short
        # to find the controller right after a node restart on a loaded machine.
        _admin_request(
            f"creating topic {name!r}",
            lambda seconds: (
                self._admin_client()
                .create_topics([new], operation_timeout=seconds, request_timeout=seconds)
                .values()
            ),
            timeout,
            done_after_resend=frozenset({KafkaError.TOPIC_ALREADY_EXISTS}),
        )
        for p in range(partitions):
            self.wait_for_isr(name, p, size=replication_factor, timeout=timeout)
        return name

    def delete_topic(self, name: str, *, timeout: float = 30.0) -> None:
        """Delete a topic (waiting for the controller to accept the deletion).

        Raises :class:`ClusterError` naming the topic and the broker's reason.
        """
        _admin_request(
            f"deleting topic {name!r}",
            lambda seconds: (
                self._admin_client()
                .delete_topics([name], operation_timeout=seconds, request_timeout=seconds)
                .values()
            ),
            timeout,
            done_after_resend=frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART}),
        )

    def _partition(self, topic: str, partition: int) -> Any:
        """Metadata of one partition, read once (raises _NotYet while it is unknown)."""
        md = self._admin_client().list_topics(topic=topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            err = t.error if t is not None else "not found"
            raise _NotYet(f"topic {topic!r} is not available: {err}")
        p = t.partitions.get(partition)
        if p is None:
            raise _NotYet(f"topic {topic!r} has no partition {partition}")
        return p

    def _partition_settled(self, topic: str, partition: int) -> Any:
        # Each broker learns of a new topic from the metadata log on its own schedule, and
        # a metadata request may reach any of them: give propagation a few seconds.
        # A metadata request that timed out (it went to a node just killed, or the survivors
        # answered late on a loaded machine) is asked again: the question is read-only.
        deadline = time.monotonic() + _PROPAGATION_S
        unanswered_until = time.monotonic() + _METADATA_RETRY_S
        while True:
            try:
                return self._partition(topic, partition)
            except _NotYet as exc:
                if time.monotonic() >= deadline:
                    raise ClusterError(str(exc)) from None
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code not in _UNANSWERED or time.monotonic() >= unanswered_until:
                    raise
            time.sleep(0.1)

    def leader(self, topic: str, partition: int = 0) -> int:
        """Node id of the partition's current leader (-1 while there is none)."""
        return int(self._partition_settled(topic, partition).leader)

    def replicas(self, topic: str, partition: int = 0) -> list[int]:
        """Assigned replicas of the partition, preferred leader first."""
        return [int(r) for r in self._partition_settled(topic, partition).replicas]

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        """The partition's in-sync replicas."""
        return [int(r) for r in self._partition_settled(topic, partition).isrs]

    def _views(self, topic: str) -> list[dict[int, PartitionView]]:
        """Every reachable node's own view of ``topic`` (frozen or faulted nodes skipped).

        The admin client asks whichever broker it likes, so one answer says nothing about
        the next read; waits that a test builds on require every broker to agree.
        """
        if self.external:
            # No per-node access to an external cluster: the admin client's single view.
            t = self._admin_client().list_topics(topic=topic, timeout=10).topics.get(topic)
            if t is None or t.error is not None:
                raise _NotYet(f"topic {topic!r} is not available")
            return [
                {
                    p: PartitionView(int(v.leader), tuple(v.replicas), tuple(v.isrs))
                    for p, v in t.partitions.items()
                }
            ]
        # A node under a network fault may lag the metadata log for as long as the fault
        # lasts (its controller fetches time out): its view is not waited for.
        isolated = set(self._owned.network.faulty()) if self._owned.network is not None else set()
        views: list[dict[int, PartitionView]] = []
        for node in self._nodes.values():
            if node.frozen or node.node_id in isolated:
                continue
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                view = broker_metadata("127.0.0.1", node.harness_port, topic)
            except (OSError, ValueError, IndexError):
                continue  # starting, or not answering: not a view to wait for
            if view is None:
                raise _NotYet(f"node {node.node_id} does not know topic {topic!r} yet")
            views.append(view)
        if not views:
            raise _NotYet(f"no node answered a metadata request for {topic!r}")
        return views

    def _agreed(self, topic: str, partition: int) -> PartitionView | None:
        """The partition's state if every reachable node shows the same leader and ISR."""
        views = self._views(topic)
        states = {v.get(partition) for v in views}
        if len(states) != 1:
            return None
        state = states.pop()
        if state is None:
            raise _NotYet(f"topic {topic!r} has no partition {partition}")
        return state

    def wait_for_isr(
        self, topic: str, partition: int = 0, size: int | None = None, timeout: float = 60.0
    ) -> list[int]:
        """Wait until the partition has a leader and ``size`` in-sync replicas (default: all).

        Returns when every reachable node's metadata shows it, so the next read agrees.
        """

        def check() -> list[int] | None:
            p = self._agreed(topic, partition)
            if p is None:
                return None
            want = size if size is not None else len(p.replicas)
            if p.leader >= 0 and len(p.isr) >= want:
                return list(p.isr)
            return None

        what = f"ISR of {topic}[{partition}] to reach {size or 'all'}"
        return self._poll_until(what, check, timeout)

    def wait_for_isr_shrink(
        self, topic: str, partition: int = 0, *, without: int, timeout: float = 60.0
    ) -> list[int]:
        """Wait until ``without`` has left the partition's ISR (on every reachable node)."""

        def check() -> list[int] | None:
            p = self._agreed(topic, partition)
            if p is None or p.leader < 0 or without in p.isr:
                return None
            return list(p.isr)

        return self._poll_until(
            f"node {without} to leave the ISR of {topic}[{partition}]", check, timeout
        )

    def wait_for_leader(
        self,
        topic: str,
        partition: int = 0,
        *,
        not_on: int | None = None,
        timeout: float = 60.0,
    ) -> int:
        """Wait until the partition has a leader (other than ``not_on``); return its id.

        Returns when every reachable node's metadata names that leader.
        """

        def check() -> int | None:
            p = self._agreed(topic, partition)
            if p is None:
                return None
            return p.leader if p.leader >= 0 and p.leader != not_on else None

        return self._poll_until(f"a leader for {topic}[{partition}]", check, timeout, 0.05)

    def elect_preferred_leaders(self, topic: str, *, timeout: float = 60.0) -> None:
        """Run a preferred leader election on every partition of ``topic`` and wait for it.

        The election's result arrives before every broker has applied the new leadership
        from the metadata log; this returns only once EVERY reachable node's metadata shows
        each partition led by its preferred replica, so a following read cannot see the
        old leader.
        """
        from confluent_kafka import ElectionType

        md = self._admin_client().list_topics(topic=topic, timeout=10)
        parts = [TopicPartition(topic, p) for p in md.topics[topic].partitions]
        future = self._admin_client().elect_leaders(ElectionType.PREFERRED, parts)
        try:
            results = future.result(timeout=timeout)
        except KafkaException as exc:
            raise ClusterError(f"preferred election on {topic!r} failed: {exc}") from exc
        for tp, err in results.items():
            if err is not None and err.code() != KafkaError.ELECTION_NOT_NEEDED:
                raise ClusterError(
                    f"preferred election of {tp.topic}[{tp.partition}] failed: {err}"
                )

        def done() -> bool:
            for tp in parts:
                p = self._agreed(topic, tp.partition)
                if p is None or not p.replicas or p.leader != p.replicas[0]:
                    return False
            return True

        self._poll_until(f"preferred leaders of {topic} on every node", done, timeout)

    # ------------------------------------------------------------------ chaos
    def _node(self, node_id: int) -> _Node:
        if self.external:
            raise ChaosNotSupportedError(
                f"chaos operations need a cluster started by KafkaCluster; this one wraps "
                f"{BOOTSTRAP_ENV}={self._external}"
            )
        try:
            return self._nodes[node_id]
        except KeyError:
            raise ClusterError(f"no node {node_id}; nodes are {sorted(self._nodes)}") from None

    def direct_peer_connections(self) -> list[tuple[int, int, int]]:
        """Connections one node holds to another node's own ports, around the fault proxies.

        With ``network_faults=True`` every node-to-node byte must pass a proxy, or
        ``cluster.network.isolate`` is not a partition. Each entry is ``(from_node, to_node,
        port)``; an empty list is the expected answer. Linux only (reads ``/proc``).
        """
        if self._owned.network is None:
            return []
        real: dict[int, int] = {}
        for node in self._nodes.values():
            for port in (node.direct_client_port, node.internal_port, node.controller_port):
                real[port] = node.node_id
        owner: dict[str, int] = {}  # socket inode -> node id
        for node_id, pid in self.pids().items():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if link.startswith("socket:["):
                            owner[link[8:-1]] = node_id
        found: list[tuple[int, int, int]] = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) < 10 or cols[3] != "01":  # 01: ESTABLISHED
                        continue
                    port = int(cols[2].rsplit(":", 1)[1], 16)
                    source, target = owner.get(cols[9]), real.get(port)
                    if source is not None and target is not None and source != target:
                        found.append((source, target, port))
        return sorted(found)

    def pids(self) -> dict[int, int]:
        """Node id -> pid of every running node process."""
        if self.external:
            self._node(1)  # raises ChaosNotSupportedError
        return {
            n.node_id: n.process.pid
            for n in self._nodes.values()
            if n.process is not None and n.process.poll() is None
        }

    def logs(self, node_id: int) -> str:
        """The node's broker log so far."""
        return self._node(node_id).log_path.read_text(errors="replace")

    def kill(self, node_id: int) -> None:
        """SIGKILL the node: a crash, no controlled shutdown."""
        node = self._node(node_id)
        node.expected_down = True
        if node.process is not None and node.process.poll() is None:
            os.kill(node.process.pid, signal.SIGCONT)
            node.process.kill()
        _reap(node, timeout=30)
        node.frozen = False
        self._owned.ports.hold_again(node.bound_ports())  # keep its ports for the restart

    def stop(self, node_id: int, *, timeout: float = 60.0) -> None:
        """SIGTERM the node: controlled shutdown moves its leaderships before it exits.

        A controlled shutdown needs the controller quorum: when this node and the other live
        (not frozen) nodes are no majority of the voters (every node is one), the broker
        cannot finish it and would only wait out ``timeout`` before the SIGKILL. It is then
        SIGKILLed at once, as :meth:`kill` does (the same end: a broker that stopped without
        handing anything over).
        """
        node = self._node(node_id)
        node.expected_down = True
        live = [
            n
            for n in self._nodes.values()
            if n.process is not None and n.process.poll() is None and not n.frozen
        ]
        if node in live and len(live) <= len(self._nodes) // 2:
            self.kill(node_id)
            return
        if node.process is not None and node.process.poll() is None:
            node.process.terminate()
            try:
                node.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                node.process.kill()
        _reap(node, timeout=30)
        node.frozen = False
        self._owned.ports.hold_again(node.bound_ports())  # keep its ports for the restart

    def start(self, node_id: int, *, timeout: float = 90.0) -> None:
        """Restart a stopped or killed node with its data; wait until it is registered."""
        node = self._node(node_id)
        if node.process is not None and node.process.poll() is None:
            raise ClusterError(f"node {node_id} is already running (pid {node.process.pid})")
        # expected up only once the new process replaced the exited one: another thread's
        # liveness check (a wait of its own) meanwhile would take the old exit for a crash
        self._spawn(node)
        node.expected_down = False
        self._poll_until(
            f"node {node_id} to register", lambda: node_id in self._metadata_brokers(), timeout
        )

    def freeze(self, node_id: int, timeout: float = 30.0) -> None:
        """SIGSTOP the node: a hung broker or a long GC pause. Undo with :meth:`thaw`.

        Returns once every thread of the node is stopped (``/proc/<pid>/task/*/stat`` in
        state ``T``): the signal is asynchronous, and a JVM thread scheduled late could still
        answer a request right after the call (seen once under load by tests/test_stalls.py).
        """
        node = self._node(node_id)
        if node.process is None or node.process.poll() is not None:
            raise ClusterError(f"node {node_id} is not running")
        os.kill(node.process.pid, signal.SIGSTOP)
        node.frozen = True
        tasks = Path(f"/proc/{node.process.pid}/task")
        if not tasks.is_dir():
            return  # no procfs: the signal alone
        self._poll_until(
            f"node {node_id} to stop after SIGSTOP", lambda: _all_stopped(tasks), timeout
        )

    def thaw(self, node_id: int) -> None:
        """SIGCONT a frozen node."""
        node = self._node(node_id)
        if node.process is None or node.process.poll() is not None:
            raise ClusterError(f"node {node_id} is not running")
        os.kill(node.process.pid, signal.SIGCONT)
        node.frozen = False

    def running(self, node_id: int) -> bool:
        """True while the node's process is alive (frozen counts as alive)."""
        node = self._node(node_id)
        return node.process is not None and node.process.poll() is None

    def peak_rss_bytes(self) -> dict[int, int]:
        """Node id -> peak resident set size (VmHWM) of each running node, in bytes."""
        out: dict[int, int] = {}
        for node_id, pid in self.pids().items():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        out[node_id] = int(line.split()[1]) * 1024
        return out

    def heal(self, topics: Iterable[str] | None = None, *, timeout: float = 120.0) -> None:
        """Heal network faults, thaw and restart every node that is down, wait for full ISRs.

        ``topics`` limits the ISR wait to those topics; by default every topic is awaited.
        """
        if self._owned.network is not None:
            self._owned.network.heal()
        for node in self._nodes.values():
            if node.process is not None and node.process.poll() is None:
                os.kill(node.process.pid, signal.SIGCONT)
                node.frozen = False
        for node_id in list(self._nodes):
            if not self.running(node_id):
                self.start(node_id, timeout=timeout)
        md = self._admin_client().list_topics(timeout=10)
        names = list(md.topics) if topics is None else [*topics, _PROBE_TOPIC]
        for topic in names:
            for p in md.topics[topic].partitions:
                self.wait_for_isr(topic, p, timeout=timeout)

    def __repr__(self) -> str:
        kind = "external" if self.external else f"{self._n} nodes, Kafka {self.version}"
        return f"<KafkaCluster {kind} at {self.bootstrap_servers or '(not started)'}>"


def _prop(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


if __name__ == "__main__":  # pragma: no cover - manual smoke run
    with KafkaCluster() as c:
        print(c, f"ready in {c.start_seconds:.1f}s", file=sys.stderr)


def _all_stopped(tasks: Path) -> bool:
    """Every thread listed under ``/proc/<pid>/task`` is stopped (state ``T`` or ``t``)."""
    states = []
    for task in tasks.iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in "Tt" for state in states)
