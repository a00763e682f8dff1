"""Is the cluster reachable, and did it refuse this client? librdkafka's connection failures.

librdkafka reports connection failures only through ``error_cb`` and its log, and keeps
reconnecting. :class:`Reachability` summarises them ("cluster unreachable" warnings naming the
hosts and reasons) and recognises a refused SASL login or TLS handshake (:class:`AuthFailure`),
which no amount of retrying fixes; :class:`LogBridge` routes librdkafka's log lines into
structlog, redacted. Every client (producer, consumer, dead-letter writer, admin, Spark sink,
asyncio clients) uses these, so they live below all of them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from kresilient._ratelimit import RateLimiter
from kresilient.errors import Action, Classification, classify

__all__ = [
    "AuthFailure",
    "LogBridge",
    "Reachability",
    "auth_failure",
    "certificate_expiry",
    "client_certificate",
    "connect_failure",
]


#: librdkafka syslog levels as the binding maps them to ``logging`` levels -> structlog method.
_LEVEL_METHOD: Final = {
    logging.CRITICAL: "critical",
    logging.ERROR: "error",
    logging.WARNING: "warning",
    logging.INFO: "info",
    logging.DEBUG: "debug",
}


# "<host>:<port>/<id or bootstrap>: <reason text>" as librdkafka writes FAIL lines and
# _TRANSPORT / _RESOLVE error strings.
_BROKER_LINE: Final = re.compile(
    # A TLS or SASL listener's broker name carries its protocol: "ssl://h:9093/1: ...".
    r"^(?:\[thrd:[^\]]*\]: )?(?:[A-Za-z_]+://)?(?P<host>[^\s/]+:\d+)/(?:bootstrap|\d+): "
    r"(?P<text>.*)$",
    re.S,
)
_REASONS: Final = (
    ("DNS", re.compile(r"resolve|getaddrinfo|Name or service not known|nodename", re.I)),
    ("TLS", re.compile(r"SSL|TLS|certificate|handshake", re.I)),
    ("refused", re.compile(r"Connection refused|ECONNREFUSED", re.I)),
    ("timeout", re.compile(r"timed out|timeout", re.I)),
    ("auth", re.compile(r"SASL|authentication", re.I)),
    ("disconnected", re.compile(r"Disconnected|Receive failed|Send failed|reset", re.I)),
)


# The cluster refused this client's credentials or certificate: texts that never come from a
# network fault (checked in this order; the first match names the cause). Seen on a real
# SASL_SSL / mTLS cluster with librdkafka 2.x (tests/test_security*.py).
_REFUSALS: Final = (
    (
        "password",
        KafkaError._AUTHENTICATION,
        re.compile(
            r"SASL authentication error|Authentication failed|invalid credentials|"
            r"SASL_AUTHENTICATION_FAILED",
            re.I,
        ),
    ),
    ("expired", KafkaError._SSL, re.compile(r"certificate (?:has )?expired", re.I)),
    (
        "ca",
        KafkaError._SSL,
        re.compile(
            r"certificate verify failed|unable to get (?:local )?issuer certificate|"
            r"self[- ]signed certificate",
            re.I,
        ),
    ),
    (
        "certificate",
        KafkaError._SSL,
        re.compile(
            r"alert (?:bad certificate|certificate required|unknown ca|certificate unknown|"
            r"certificate revoked|unsupported certificate|handshake failure)|"
            r"peer did not return a certificate",
            re.I,
        ),
    ),
)
_REMEDIES: Final = {
    "password": (
        "the cluster refused the SASL login: check sasl.username, sasl.password (or the "
        "environment variable or file it is read from) and sasl.mechanism against the "
        "user on the cluster"
    ),
    "expired": (
        "a certificate is outside its validity period: renew the client certificate "
        "(ssl.certificate.location), or the brokers' if the client refused theirs; check "
        "the clocks"
    ),
    "ca": (
        "the brokers' certificate could not be verified: set ssl.ca.location to the CA "
        "file that signed the brokers' certificates and check that their names match "
        "bootstrap.servers"
    ),
    "certificate": (
        "the broker refused the client certificate: check ssl.certificate.location and "
        "ssl.key.location, that the certificate is signed by a CA the brokers trust and "
        "that it is still valid"
    ),
    "tls": "the TLS handshake failed: check security.protocol and the ssl.* settings",
    "auth": "authentication failed: check security.protocol and the sasl.* settings",
}
#: What waits while no broker can be reached, unless the client says (``waiting=``).
_WAITING: Final = "the client keeps reconnecting by itself"
#: What to check when no broker can be reached (every client's unreachable text ends so).
_CHECK: Final = (
    "Check bootstrap.servers, that the brokers run and listen on these addresses, DNS, "
    "firewalls, and security.protocol/TLS settings"
)
#: connect_failure() reasons in words, for texts a person reads.
_REASON_WORDS: Final = {
    "DNS": "name not resolved (DNS)",
    "TLS": "TLS handshake failed",
    "refused": "connection refused",
    "timeout": "connection timed out",
    "auth": "authentication failed",
    "disconnected": "disconnected",
    "other": "connection failed",
}
#: librdkafka's " (after 12ms in state AUTH_REQ, 3 identical error(s) suppressed)" suffix.
_AFTER: Final = re.compile(r"\s*\(after \d+ms in state [A-Z_]+[^)]*\)\s*$")
_THREAD: Final = re.compile(r"^\[thrd:[^\]]*\]: ")


@dataclasses.dataclass(frozen=True, slots=True)
class AuthFailure:
    """The cluster refused this client's credentials or certificate.

    librdkafka reports it only through ``error_cb`` and its log (it keeps reconnecting);
    messages and requests then just time out. A client keeps the last one seen
    (:attr:`Reachability.refused`) to name the cause in the errors it raises.

    ``cause``: ``password`` (SASL login refused), ``ca`` (the brokers' certificate not
    verified), ``expired`` (a certificate out of its validity), ``certificate`` (the broker
    refused the client certificate), or ``tls``/``auth`` when librdkafka said no more.
    ``detail`` is librdkafka's text, already redacted by the client.
    """

    code: int
    cause: str
    detail: str
    #: the broker that refused (``host:port``); ``None`` for a refusal librdkafka reported
    #: without one (a local failure such as an OAUTHBEARER token it could not acquire)
    host: str | None = None

    @property
    def remedy(self) -> str:
        """What to check (names settings, never their values)."""
        return _REMEDIES[self.cause]

    def log_fields(self) -> dict[str, str]:
        """The fields of the ``kafka_authentication_failed`` line every client logs."""
        return {"cause": self.cause, "detail": self.detail, "remedy": self.remedy}

    def describe(self) -> str:
        """``<librdkafka's reason>: <remedy>``."""
        return f"{self.detail} ({self.remedy})"

    def classification(self, *, possibly_persisted: bool = False, note: str = "") -> Classification:
        """AUTH (``_AUTHENTICATION`` or ``_SSL``), not retried, its remedy naming the cause."""
        base = classify(self.code)
        remedy = f"no broker accepted this client: {self.describe()}"
        return dataclasses.replace(
            base,
            possibly_persisted=possibly_persisted,
            remedy=remedy + (f". {note}" if note else ""),
        )


def purge_refused(
    client: Any,
    failure: AuthFailure,
    limiter: RateLimiter,
    log: Any,
    *,
    counted: str,
    count: Callable[[], int],
    note: str,
) -> bool:
    """Fail ``client``'s queued messages at once after a final refusal (the producer's and the
    dead-letter writer's fail-fast, one definition).

    Purges what is still in librdkafka's queue (never sent; nothing in flight is touched):
    each message gets a ``_PURGE_QUEUE`` report, which the client classifies as ``failure``.
    Logs ``kafka_authentication_failed`` (rate-limited under the key ``auth_purge``) with
    ``counted=count()``. Returns False if the purge raised (the client was closed or failed
    meanwhile: its timeout still reports the messages).
    """
    try:
        client.purge(in_queue=True, in_flight=False, blocking=False)
    except KafkaException:
        return False
    allowed, suppressed = limiter.check("auth_purge")
    if allowed:
        log.error(
            "kafka_authentication_failed",
            **failure.log_fields(),
            **{counted: count()},
            suppressed=suppressed,
            note=note,
        )
    return True


def auth_failure(text: str, code: int | None = None) -> AuthFailure | None:
    """The refusal ``text`` (an ``error_cb`` string or a log line) reports, else ``None``.

    ``code``: the ``error_cb`` code when there is one: ``_AUTHENTICATION``/``_SSL`` are a
    refusal even when the text is not recognised.
    """
    detail = _AFTER.sub("", _THREAD.sub("", text))
    broker = connect_failure(detail)
    host = broker[0] if broker is not None else None
    for cause, cause_code, pattern in _REFUSALS:
        if pattern.search(detail):
            return AuthFailure(cause_code, cause, detail, host)
    if code == KafkaError._AUTHENTICATION:
        return AuthFailure(code, "auth", detail, host)
    if code == KafkaError._SSL:
        return AuthFailure(code, "tls", detail, host)
    return None


def client_certificate(config: Mapping[str, Any]) -> str | None:
    """The client certificate a config names (``ssl.certificate.location`` or the inline
    ``ssl.certificate.pem``), for :func:`certificate_expiry`; never the key."""
    for key in ("ssl.certificate.location", "ssl.certificate.pem"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def certificate_expiry(source: str | None, now: datetime | None = None) -> str | None:
    """``"the client certificate (...) expired on <date>"`` if the certificate in ``source``
    (a PEM file path or PEM text) is outside its validity period, else ``None``.

    A JDK broker answers an expired client certificate with the TLS alert "certificate
    unknown", the same as for any certificate it does not trust: only the client can tell
    that it expired. Needs the ``cryptography`` package; without it (or for an unreadable
    file) nothing is said and the remedy stays generic.
    """
    if not source:
        return None
    try:
        from cryptography import x509
    except ImportError:
        return None
    inline = "-----BEGIN" in source
    try:
        data = source.encode() if inline else Path(source).read_bytes()
        cert = x509.load_pem_x509_certificate(data)
    except (OSError, ValueError):
        return None
    after = getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after.replace(tzinfo=UTC)
    before = getattr(cert, "not_valid_before_utc", None) or cert.not_valid_before.replace(
        tzinfo=UTC
    )
    now = now or datetime.now(UTC)
    where = "ssl.certificate.pem" if inline else f"ssl.certificate.location={source}"
    if now > after:
        return f"the client certificate ({where}) expired on {after:%Y-%m-%d %H:%M} UTC"
    if now < before:
        return f"the client certificate ({where}) is not valid before {before:%Y-%m-%d %H:%M} UTC"
    return None


def connect_failure(text: str) -> tuple[str, str] | None:
    """``(host:port, reason)`` of a librdkafka connection failure line, else ``None``.

    ``reason`` is one of DNS, TLS, refused, timeout, auth, disconnected, other.
    """
    m = _BROKER_LINE.match(text)
    if m is None:
        return None
    detail = m.group("text")
    for reason, pattern in _REASONS:
        if pattern.search(detail):
            return m.group("host"), reason
    return m.group("host"), "other"


class Reachability:
    """Turns librdkafka's stream of connection failures into a few warnings that name hosts.

    librdkafka reports every failed connection attempt (a FAIL log line, then a ``_TRANSPORT``
    error), several per second while a cluster is unreachable. Instead: when every broker is
    down, ONE warning ``kafka_unreachable`` naming each host and why (refused, DNS, TLS,
    timeout, auth), repeated at most once per ``interval`` seconds; a single broker failing
    while others work gives ``broker_unreachable`` for that host at the same slow rate.

    It also keeps the last refusal of this client's credentials or certificate
    (:attr:`refused`, an :class:`AuthFailure`) until a broker connection is up again: the
    producer and the consumer name it in the errors that would otherwise say only "timed
    out" or "no broker reachable".
    """

    def __init__(
        self,
        log: Any,
        *,
        interval: float = 60.0,
        certificate: str | None = None,
        waiting: str = _WAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        #: the client certificate (:func:`client_certificate`), checked once when the broker
        #: refuses it: an expired one is then named as the cause
        self._certificate = certificate
        self._expiry: str | None = None
        self._expiry_checked = False
        self._clock = clock
        self._limiter = RateLimiter(interval, clock=clock)
        #: what waits meanwhile, in the client's own words (a producer's messages, a
        #: consumer's polls), for the ``kafka_unreachable`` line's ``note``
        self._waiting = waiting
        self._lock = threading.Lock()
        self._hosts: dict[str, str] = {}
        #: when the ongoing "every broker is down" condition began (its first line was
        #: logged), ``None`` when there is none: ``connected()`` logs its one end line
        self.down_since: float | None = None
        #: True once any broker connection was up (statistics); never reset.
        self.ever_connected = False
        #: The last refusal of the credentials or certificate since no connection was up.
        self.refused: AuthFailure | None = None
        #: librdkafka said every broker it knows is down (``_ALL_BROKERS_DOWN``) since the
        #: last connection was up: no connection works right now.
        self.all_brokers_down = False

    def refusal(self, text: str, code: int | None = None) -> AuthFailure | None:
        """Record ``text`` (redacted) if it says the cluster refused this client; return it."""
        found = auth_failure(text, code)
        if found is None:
            return None
        if found.cause in ("certificate", "tls") and self._certificate is not None:
            if not self._expiry_checked:
                self._expiry_checked = True
                self._expiry = certificate_expiry(self._certificate)
            if self._expiry is not None:
                found = dataclasses.replace(
                    found, cause="expired", detail=f"{found.detail}; {self._expiry}"
                )
        self.refused = found
        return found

    def final_refusal(self, *, all_down: bool = False) -> AuthFailure | None:
        """The refusal to stop on, if this client never got a connection; else ``None``.

        librdkafka keeps reconnecting after a refused SASL login or TLS handshake, so the
        client would wait in vain until its timeout, saying only "timed out". Like the Java
        client, a refusal is then final: the first one a broker gives while no connection
        ever worked ends the operation, naming the cause. Not final:

        * a client that was connected before (a password rotated under it): it keeps
          reconnecting, the refusal is logged and named when its timeouts come;
        * a refusal without a broker (``host`` None: a local failure such as an OAUTHBEARER
          token not acquired while the identity provider is down), which librdkafka retries;
        * with ``all_down``: until librdkafka also said every broker it knows is down (the
          producer fails messages on it, so one refusing broker among working ones, before
          the first statistics say they work, never fails a message).
        """
        failure = self.refused
        if failure is None or failure.host is None or self.ever_connected:
            return None
        if all_down and not self.all_brokers_down:
            return None
        return failure

    def failed(self, text: str) -> bool:
        """Record one connection failure line; False if ``text`` is not one."""
        return self._record(text) is not None

    def _record(self, text: str) -> tuple[str, str] | None:
        """(host, reason) of a connection failure, recorded with any refusal it names."""
        parsed = connect_failure(text)
        if parsed is None:
            return None
        host, reason = parsed
        with self._lock:
            self._hosts[host] = reason
        self.refusal(text)
        return parsed

    def broker_failed(self, text: str) -> bool:
        """A ``_TRANSPORT``/``_RESOLVE`` error: record it; one warning per host per interval
        once a connection had worked (before that, ``all_down`` speaks for every host)."""
        parsed = self._record(text)
        if parsed is None:
            return False
        host, reason = parsed
        if not self.ever_connected:
            return True
        allowed, suppressed = self._limiter.check(host)
        if allowed:
            self._log.warning(
                "broker_unreachable",
                host=host,
                reason=reason,
                detail=text,
                suppressed=suppressed,
                note="the client reconnects by itself; other brokers take over its partitions",
            )
        return True

    def all_down(self, detail: str) -> None:
        """Every broker is down: a condition that lasts, so it is logged as one.

        ONE warning ``kafka_unreachable`` when it begins, naming each host and the reason;
        while it lasts, a reminder (the same event, ``reminder=True``) at most once per
        ``interval`` seconds carrying ``suppressed``, the reports held back since the last
        line, and ``down_for_s``; :meth:`connected` logs its end (``kafka_reachable``).
        """
        self.all_brokers_down = True
        allowed, suppressed = self._limiter.check("*")
        if not allowed:
            return
        now = self._clock()
        began = self.down_since
        if began is None:
            self.down_since = began = now
        with self._lock:
            hosts = dict(sorted(self._hosts.items()))
        refused = self.refused
        self._log.warning(
            "kafka_unreachable",
            hosts=hosts,
            detail=detail,
            refused=refused.describe() if refused is not None else None,
            reminder=now > began,
            down_for_s=round(now - began, 1),
            suppressed=suppressed,
            note=f"no broker can be reached; {self._waiting}. {_CHECK}",
        )

    def summary(self) -> str:
        """Each host that failed and why, in words (``"h:9092: connection refused"``), and a
        refusal of this client's credentials if one is known; for error texts."""
        with self._lock:
            hosts = sorted(self._hosts.items())
        parts = [f"{host}: {_REASON_WORDS.get(reason, reason)}" for host, reason in hosts]
        refused = self.refused
        if refused is not None:
            parts.append(f"refused: {refused.describe()}")
        if not parts:
            return "no connection attempt has been answered or refused yet (packets dropped?)"
        return "; ".join(parts)

    def unreachable_classification(
        self, base: Classification, *, servers: str, waited: float, outcome: str
    ) -> Classification:
        """``base`` (the error a client gave up on) with ONE text for "no broker was ever
        reached": the address, each host's cause, what happened (``outcome``, in the
        client's words) and what to check. Not retried by the client that gave up, never
        possibly persisted (nothing was sent)."""
        remedy = (
            f"no broker of bootstrap.servers={servers} was reached within {waited:g} s "
            f"({self.summary()}); {outcome}. {_CHECK}"
        )
        return dataclasses.replace(
            base,
            retriable=False,
            refresh_metadata=False,
            possibly_persisted=False,
            action=Action.FAIL,
            remedy=remedy,
        )

    def on_stats(self, doc: Mapping[str, Any]) -> None:
        """A parsed statistics document: any broker connected (``UP``) counts as
        :meth:`up`. Logical brokers (a consumer's ``GroupCoordinator``, which mirrors a real
        one) are not counted. Odd shapes are ignored (the leadership monitor counts those)."""
        try:
            brokers = (doc.get("brokers") or {}).values()
            self.up(
                sum(1 for b in brokers if b.get("state") == "UP" and b.get("source") != "logical")
            )
        except (AttributeError, TypeError):
            pass

    def up(self, up_brokers: int) -> None:
        """Statistics saw ``up_brokers`` connections up."""
        if up_brokers > 0:
            self.connected()

    def connected(self) -> None:
        """A broker connection works (statistics, or a group assignment): a refusal seen
        before is no longer the reason for anything, and an "every broker is down" condition
        that was logged ends with ONE ``kafka_reachable`` line (at the start line's level)."""
        self.ever_connected = True
        self.refused = None
        self.all_brokers_down = False
        with self._lock:
            self._hosts.clear()
        began, self.down_since = self.down_since, None
        suppressed = self._limiter.suppressed("*")
        self._limiter.reset("*")
        if began is not None:
            # at the start line's level: whoever filters at WARNING saw the start and must
            # see that it ended (else it reads as an outage still going on)
            self._log.warning(
                "kafka_reachable",
                unreachable_for_s=round(self._clock() - began, 1),
                suppressed=suppressed,
            )


#: librdkafka log lines that report a passing condition of a healthy cluster, by facility:
#: (pattern, what it means). The first is logged at INFO with that note, repeats at DEBUG; a
#: line still repeating after the reminder interval becomes a WARNING (at most once per
#: interval, with the count held back), since then it no longer passes by itself.
_TRANSIENT_LINES: Final = {
    # The broker hands out producer ids in blocks it asks the controller for; until the
    # first block arrives (a fresh cluster, a restarted broker) InitProducerId answers
    # COORDINATOR_LOAD_IN_PROGRESS and librdkafka retries (seen on every first run of a
    # fresh 3-node KRaft cluster: "Failed to acquire idempotence PID from broker ...: Broker:
    # Coordinator load in progress: retrying").
    "GETPID": (
        re.compile(r"Coordinator load in progress|COORDINATOR_LOAD_IN_PROGRESS", re.I),
        "the broker is still loading its producer-id state (the first idempotent producer "
        "of a fresh cluster, or a broker that just started); librdkafka retries and sends "
        "once it has a producer id: nothing to do unless it lasts (docs/producer.md)",
    ),
}
#: A passing condition still reported after this many seconds is a WARNING (once a minute).
_TRANSIENT_REMINDER: Final = 60.0


class TransientLines:
    """librdkafka log lines that report a passing condition (``_TRANSIENT_LINES``), logged as
    one: the first at INFO with its note, repeats at DEBUG, and a WARNING once a reminder
    interval if it still repeats after that. Shared by every kresilient client's log bridge
    (the dead-letter writer's too), so a condition is worded the same whoever logs it."""

    def __init__(self, log: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        # facility -> when its passing condition was first logged
        self._since: dict[str, float] = {}
        self._limiter = RateLimiter(_TRANSIENT_REMINDER, clock=clock)

    @staticmethod
    def known(facility: str) -> bool:
        """Whether ``facility`` has a known passing condition (a cheap check before redacting)."""
        return facility in _TRANSIENT_LINES

    def offer(self, facility: str, text: str) -> bool:
        """Log ``text`` if it is a known passing condition; False (nothing logged) if not."""
        known = _TRANSIENT_LINES.get(facility)
        if known is None or not known[0].search(text):
            return False
        now = self._clock()
        began = self._since.get(facility)
        if began is None:
            self._since[facility] = now
            self._limiter.check(facility)  # the reminder interval starts here
            self._log.info(
                "librdkafka_log", facility=facility, message=text, transient=True, note=known[1]
            )
            return True
        allowed, suppressed = self._limiter.check(facility)
        if allowed:
            self._log.warning(
                "librdkafka_log",
                facility=facility,
                message=text,
                transient=False,
                lasting_s=round(now - began, 1),
                suppressed=suppressed,
                note=f"still reported after {now - began:.0f} s: " + known[1],
            )
        else:
            self._log.debug("librdkafka_log", facility=facility, message=text, transient=True)
        return True


class LogBridge:
    """librdkafka log lines into the client's structlog logger (confluent-kafka ``logger``).

    The binding calls ``logger.log(level, "%s [%s] %s", facility, client_name, message)``
    from ``poll()``. Each line is also offered to the leadership monitor (it recognises
    leadership errors in log text) and to a user-supplied ``logger`` if there was one.
    """

    def __init__(
        self,
        log: Any,
        on_line: Callable[[str], None],
        scrub: Callable[[str], str],
        user_logger: Any = None,
        on_failure: Callable[[Exception], None] | None = None,
        reachability: Reachability | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._transients = TransientLines(log, clock=clock)
        self._on_line = on_line
        self._scrub = scrub
        self._user = user_logger
        self._on_failure = on_failure
        self._reach = reachability

    #: The last ``FATAL`` line librdkafka logged (``rd_kafka_set_fatal_error`` always logs
    #: one): the reason of a fatal error whose exception the binding lost.
    fatal_line: str | None = None

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """``logging.Logger.log``-compatible entry point used by confluent-kafka."""
        # Only plain subscripts, comparisons and stores before the try: while a fatal error's
        # exception is pending, the first C call in here fails (see fatal_cause).
        if args and args[0] == "FATAL" and args[2:3]:
            self.fatal_line = args[2]
        try:
            facility = str(args[0]) if args else ""
            text = self._scrub(str(args[2]) if len(args) > 2 else fmt % args)
            self._on_line(text)
            # Connection failures are summarised (Reachability), not logged line by line.
            if facility == "FAIL" and self._reach is not None and self._reach.failed(text):
                pass
            elif not self._transients.offer(facility, text):
                method = _LEVEL_METHOD.get(level, "info")
                getattr(self._log, method)("librdkafka_log", facility=facility, message=text)
            if self._user is not None:  # the application's logger gets the redacted line too
                self._user.log(
                    level, "%s [%s] %s", facility, args[1] if len(args) > 1 else "", text
                )
        except Exception as exc:  # logging must never break the client
            if self._on_failure is not None:
                self._on_failure(exc)
