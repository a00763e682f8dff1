"""Internal helpers of :mod:`kresilient.telemetry`: error naming, provider checks, instruments,
and the guard that keeps a failing OpenTelemetry SDK away from the message path."""

from __future__ import annotations

import contextlib
import threading
import traceback
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from kresilient._ratelimit import DEFAULT_INTERVAL, RateLimiter
from kresilient.errors import ConfigError, classify, exception_type_name
from kresilient.redaction import redact_text
from kresilient.telemetry import names as N

Redact = Callable[[str], str]


def _error_name(err: object) -> str:
    """Low-cardinality ``error.type`` for a KafkaError / KafkaException / exception."""
    name = getattr(err, "name", None)
    if callable(name):  # confluent_kafka.KafkaError
        try:
            return str(name())
        except Exception:  # pragma: no cover - defensive
            return N.ERROR_TYPE_OTHER
    args = getattr(err, "args", ())
    if args and callable(getattr(args[0], "name", None)):  # KafkaException(KafkaError)
        return str(args[0].name())
    inner = getattr(err, "name", None)
    if isinstance(inner, str) and inner and type(err).__module__.startswith("kresilient"):
        return inner  # KafkaClientError carries the Kafka error name
    if isinstance(err, BaseException):
        cls = type(err)
        mod = cls.__module__
        return cls.__qualname__ if mod == "builtins" else f"{mod}.{cls.__qualname__}"
    return N.ERROR_TYPE_OTHER


def _category(classification: object, err: object = None) -> str | None:
    """``kresilient.error.category`` value (lower-case category name) if one is known."""
    if classification is None and err is not None:
        classification = getattr(err, "classification", None)
        if classification is None:
            classification = _classify(err)
    cat = getattr(classification, "category", None)
    name = getattr(cat, "name", None)
    return name.lower() if isinstance(name, str) else None


def _classify(err: object) -> object:
    """``kresilient.errors.classify(err)`` (failure paths only); ``None`` if it cannot."""
    try:
        return classify(err)
    except Exception:
        return None


def _key_text(key: object) -> str | None:
    """The key's canonical string form, or None (binary keys are omitted per the conventions)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _global_tracer_provider_is_set() -> bool:
    # Reading the API's module global costs ~20 ns; get_tracer_provider() would cost an
    # os.environ lookup per call. The attribute has existed since opentelemetry-api 1.0 and a
    # test asserts it, so an API change is caught rather than silently disabling tracing.
    return trace._TRACER_PROVIDER is not None


def _global_meter_provider_is_set() -> bool:
    return otel_metrics._internal._METER_PROVIDER is not None


def _is_proxy_tracer_provider(p: object) -> bool:
    return isinstance(p, trace.ProxyTracerProvider)


def _is_proxy_meter_provider(p: object) -> bool:
    return type(p).__name__ == "_ProxyMeterProvider"


def _is_noop_meter_provider(p: object) -> bool:
    return isinstance(p, otel_metrics.NoOpMeterProvider) or _is_proxy_meter_provider(p)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kresilient")
    except Exception:
        return "0"


class _LocalCounter:
    """A monotonic counter summed in-process and reported through an observable counter.

    The SDK's synchronous ``Counter.add`` costs several microseconds per call (attribute
    validation and hashing); per-message counts instead cost an increment under a lock
    (~0.2 us) and the SDK reads the totals at collection time. Shared by every client on the
    same meter provider. Series are keyed by attribute *content*, so the counter holds one cell
    per series, never per client: a client resolves its attribute sets to cells once
    (:meth:`cell`) and keeps them in its own cache, which dies with the client.
    """

    __slots__ = ("_lock", "_series")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[frozenset[tuple[str, Any]], list[Any]] = {}

    def cell(self, attrs: dict[str, Any]) -> list[Any]:
        """The shared ``[attrs, count]`` cell of the series *attrs* (created on first use)."""
        key = frozenset(attrs.items())
        with self._lock:
            rec = self._series.get(key)
            if rec is None:
                rec = self._series[key] = [attrs, 0]
            return rec

    def add_to(self, cell: list[Any], n: int = 1) -> None:
        """Count *n* (one) in a cell from :meth:`cell`."""
        with self._lock:
            cell[1] += n

    def add(self, attrs: dict[str, Any]) -> None:
        """Count one in the series *attrs* (resolves the cell each time: not per message)."""
        self.add_to(self.cell(attrs))

    def series_count(self) -> int:
        """Number of distinct series (attribute sets) counted so far."""
        with self._lock:
            return len(self._series)

    def observe(self, _options: otel_metrics.CallbackOptions) -> Iterable[otel_metrics.Observation]:
        with self._lock:
            snapshot = [(n, attrs) for attrs, n in self._series.values()]
        return [otel_metrics.Observation(n, attrs) for n, attrs in snapshot]


class _Instruments:
    __slots__ = (
        "consumed",
        "dead_letters",
        "leadership",
        "operation_duration",
        "process_duration",
        "retries",
        "sent",
    )

    def __init__(self, meter: otel_metrics.Meter) -> None:
        buckets = list(N.DURATION_BUCKETS)
        self.sent = _LocalCounter()
        meter.create_observable_counter(
            N.METRIC_SENT_MESSAGES,
            [self.sent.observe],
            "{message}",
            "Messages the producer attempted to send (counted at the delivery report).",
        )
        self.consumed = _LocalCounter()
        meter.create_observable_counter(
            N.METRIC_CONSUMED_MESSAGES,
            [self.consumed.observe],
            "{message}",
            "Messages delivered to the application.",
        )
        self.operation_duration = meter.create_histogram(
            N.METRIC_OPERATION_DURATION,
            "s",
            "Duration of a producer send (to the delivery report) or a consumer commit.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.process_duration = meter.create_histogram(
            N.METRIC_PROCESS_DURATION,
            "s",
            "Duration of processing one message.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.retries = meter.create_counter(
            N.METRIC_RETRIES, "{retry}", "Processing retries by error category."
        )
        self.dead_letters = meter.create_counter(
            N.METRIC_DEAD_LETTERS,
            "{message}",
            "Messages written (or attempted) to a dead-letter topic, by error category.",
        )
        self.leadership = meter.create_counter(
            N.METRIC_LEADERSHIP_STATE_CHANGES,
            "{change}",
            "Partition leadership state changes seen by the LeadershipMonitor, by new state.",
        )


def _make_tracer(provider: trace.TracerProvider) -> trace.Tracer | None:
    tracer = provider.get_tracer(N.INSTRUMENTATION_NAME, _version(), schema_url=N.SCHEMA_URL)
    return None if isinstance(tracer, trace.NoOpTracer) else tracer


# Per meter provider, weakly: a provider dropped by the application (a short-lived client with
# its own MeterProvider, shut down) is freed with its instruments. A provider that cannot be
# weakly referenced or hashed is kept by id, alive (so the id is never reused).
_INSTRUMENTS: weakref.WeakKeyDictionary[Any, _Instruments | None] = weakref.WeakKeyDictionary()
_INSTRUMENTS_BY_ID: dict[int, tuple[otel_metrics.MeterProvider, _Instruments | None]] = {}
_INSTRUMENTS_LOCK = threading.Lock()
_MISSING: Any = object()


def _make_instruments(provider: otel_metrics.MeterProvider) -> _Instruments | None:
    """The instruments on *provider*, created once per provider and shared by every client.

    Creating an instrument twice under one name makes the SDK warn and, for observable
    counters, keep only the first instrument's callback: so clients must share them.
    """
    if _is_noop_meter_provider(provider):
        return None
    with _INSTRUMENTS_LOCK:
        try:
            hit = _INSTRUMENTS.get(provider, _MISSING)
            weak = True
        except TypeError:  # not weakly referenceable, or not hashable
            by_id = _INSTRUMENTS_BY_ID.get(id(provider))
            hit = by_id[1] if by_id is not None and by_id[0] is provider else _MISSING
            weak = False
        if hit is not _MISSING:
            cached: _Instruments | None = hit
            return cached
        meter = provider.get_meter(N.INSTRUMENTATION_NAME, _version(), schema_url=N.SCHEMA_URL)
        instr = None if isinstance(meter, otel_metrics.NoOpMeter) else _Instruments(meter)
        if weak:
            _INSTRUMENTS[provider] = instr
        else:
            _INSTRUMENTS_BY_ID[id(provider)] = (provider, instr)
        return instr


def _mark_error(
    span: Span, err: object, error_type: str, category: str | None, redact: Redact = redact_text
) -> None:
    """``error.type``, the category and status ERROR whose description is redacted text."""
    span.set_attribute(N.ERROR_TYPE, error_type)
    if category:
        span.set_attribute(N.KRESILIENT_ERROR_CATEGORY, category)
    span.set_status(Status(StatusCode.ERROR, _short(redact(_describe(err)))))


def _record_exception(span: Span, exc: BaseException, redact: Redact = redact_text) -> None:
    """The SDK's ``Span.record_exception`` event, with the message and stack trace redacted.

    ``record_exception`` writes ``str(exc)`` and the formatted traceback (whose last line is
    the message again) as they are; an exception text may carry a secret librdkafka echoed.
    """
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    span.add_event(
        N.EVENT_EXCEPTION,
        {
            N.EXCEPTION_TYPE: exception_type_name(exc),
            N.EXCEPTION_MESSAGE: _short(redact(str(exc))),
            N.EXCEPTION_STACKTRACE: redact(stack),
        },
    )


def _describe(err: object) -> str:
    text = getattr(err, "str", None)
    if callable(text):  # KafkaError.str() is the human-readable reason
        try:
            return str(text())
        except Exception:  # pragma: no cover - defensive
            pass
    return str(err)


def _short(text: str, limit: int = 512) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_exception_type = exception_type_name  # the one definition lives in kresilient.errors


def _call(method: Callable[[], Any]) -> Any:
    return method()


def _safe_int(method: Callable[[], Any]) -> int | None:
    value = method()
    return value if isinstance(value, int) else None


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _offset_item(item: Any) -> tuple[str | None, int | None, int | None, Any]:
    if isinstance(item, tuple):
        topic, partition, offset = (*item, None, None, None)[:3]
        return topic, partition, offset, None
    err = getattr(item, "error", None)
    return (
        getattr(item, "topic", None),
        getattr(item, "partition", None),
        getattr(item, "offset", None),
        err if err else None,
    )


def _state_name(state: object) -> str | None:
    if state is None:
        return None
    name = getattr(state, "name", None)
    return (name if isinstance(name, str) else str(state)).lower()


def _config_error(message: str, key: str = "link_mode") -> Exception:
    return ConfigError(message, key=key)


class _Guard:
    """Where telemetry's own failures go: counted, logged rate-limited, never raised.

    Telemetry must never change what happens to a message: a span processor, exporter,
    propagator or meter that raises costs a span or a data point, never a message. Each
    failure is counted (:attr:`failures`) and logged as ``kafka_telemetry_failed`` (WARNING,
    one line per step every few seconds, with the number held back in between).
    """

    __slots__ = ("_limiter", "_log", "_redact", "failures")

    def __init__(self, log: Any, redact: Redact) -> None:
        self._log = log
        self._redact = redact
        self._limiter = RateLimiter(DEFAULT_INTERVAL)
        self.failures = 0

    def __call__(self, step: str, exc: BaseException) -> None:
        self.failures += 1
        # the logger may be what fails: nothing may escape from here
        with contextlib.suppress(Exception):
            allowed, suppressed = self._limiter.check(step)
            if allowed:
                self._log.warning(
                    N.LOG_TELEMETRY_FAILED,
                    step=step,
                    error_type=exception_type_name(exc),
                    error=_short(self._redact(str(exc))),
                    suppressed=suppressed,
                )
