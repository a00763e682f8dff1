"""Internal helpers of :mod:`kresilient.telemetry`: error naming, provider checks, instruments."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from kresilient.telemetry import _names as N


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
    """Classify via :mod:`kresilient.errors` when it is importable (failure paths only)."""
    classify = _errors_attr("classify")
    if classify is None:
        return None
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
    validation and hashing); per-message counts instead cost one dict lookup and an increment
    under a lock (~0.2 us) and the SDK reads the totals at collection time. Series are keyed by
    attribute *content*; each attrs dict seen is also remembered by identity (and kept alive, so
    its id cannot be reused), which makes the per-message lookup an id() hit. Shared by every
    client on the same meter provider.
    """

    __slots__ = ("_by_id", "_lock", "_series")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[frozenset[tuple[str, Any]], list[Any]] = {}
        self._by_id: dict[int, tuple[dict[str, Any], list[Any]]] = {}

    def add(self, attrs: dict[str, Any]) -> None:
        with self._lock:
            hit = self._by_id.get(id(attrs))
            if hit is None:
                rec = self._series.setdefault(frozenset(attrs.items()), [attrs, 0])
                self._by_id[id(attrs)] = (attrs, rec)
            else:
                rec = hit[1]
            rec[1] += 1

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
            N.METRIC_SENT_MESSAGES, [self.sent.observe], "{message}",
            "Messages the producer attempted to send (counted at the delivery report).",
        )
        self.consumed = _LocalCounter()
        meter.create_observable_counter(
            N.METRIC_CONSUMED_MESSAGES, [self.consumed.observe], "{message}",
            "Messages delivered to the application.",
        )
        self.operation_duration = meter.create_histogram(
            N.METRIC_OPERATION_DURATION, "s", "Duration of a producer send (to the delivery "
            "report) or a consumer commit.", explicit_bucket_boundaries_advisory=buckets,
        )
        self.process_duration = meter.create_histogram(
            N.METRIC_PROCESS_DURATION, "s", "Duration of processing one message.",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.retries = meter.create_counter(
            N.METRIC_RETRIES, "{retry}", "Processing retries by error category."
        )
        self.dead_letters = meter.create_counter(
            N.METRIC_DEAD_LETTERS, "{message}", "Messages written (or attempted) to a dead-letter "
            "topic, by error category.",
        )
        self.leadership = meter.create_counter(
            N.METRIC_LEADERSHIP_STATE_CHANGES, "{change}",
            "Partition leadership state changes seen by the LeadershipMonitor, by new state.",
        )


def _make_tracer(provider: trace.TracerProvider) -> trace.Tracer | None:
    tracer = provider.get_tracer(N.INSTRUMENTATION_NAME, _version(), schema_url=N.SCHEMA_URL)
    return None if isinstance(tracer, trace.NoOpTracer) else tracer


_INSTRUMENTS: dict[int, tuple[otel_metrics.MeterProvider, _Instruments | None]] = {}
_INSTRUMENTS_LOCK = threading.Lock()


def _make_instruments(provider: otel_metrics.MeterProvider) -> _Instruments | None:
    """The instruments on *provider*, created once per provider and shared by every client.

    Creating an instrument twice under one name makes the SDK warn and, for observable
    counters, keep only the first instrument's callback: so clients must share them.
    """
    if _is_noop_meter_provider(provider):
        return None
    with _INSTRUMENTS_LOCK:
        hit = _INSTRUMENTS.get(id(provider))
        if hit is not None and hit[0] is provider:
            return hit[1]
        meter = provider.get_meter(N.INSTRUMENTATION_NAME, _version(), schema_url=N.SCHEMA_URL)
        instr = None if isinstance(meter, otel_metrics.NoOpMeter) else _Instruments(meter)
        _INSTRUMENTS[id(provider)] = (provider, instr)
        return instr


def _mark_error(span: Span, err: object, error_type: str, category: str | None) -> None:
    span.set_attribute(N.ERROR_TYPE, error_type)
    if category:
        span.set_attribute(N.KRESILIENT_ERROR_CATEGORY, category)
    span.set_status(Status(StatusCode.ERROR, _short(_describe(err))))


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


def _exception_type(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


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


def _config_error(message: str) -> Exception:
    config_error = _errors_attr("ConfigError")
    if config_error is None:
        return ValueError(message)
    exc: Exception = config_error(message, key="link_mode")
    return exc


def _errors_attr(name: str) -> Any:
    """*name* from :mod:`kresilient.errors` (imported lazily: failure paths only)."""
    try:
        module = importlib.import_module("kresilient.errors")
    except ImportError:
        return None
    return getattr(module, name, None)

