"""Share-consumer configs: the runtime and ``kresilient lint`` refuse the same keys (issue 43).

``kresilient.config.SHARE_CONSUMER_REFUSED`` is the one table. Its ``"librdkafka"`` keys are
checked against the installed client (a ShareConsumer built with each fails to start), so a
librdkafka upgrade that changes the set fails here instead of drifting; its ``"kresilient"``
keys are ones librdkafka takes (the control) and ResilientShareConsumer refuses.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, ShareConsumer

from kresilient import _catalog as catalog
from kresilient.config import SHARE_CONSUMER_REFUSED
from kresilient.errors import ConfigError, UnsafeConfigError
from kresilient.lint.engine import lint_paths
from kresilient.share import configure_share_group, share_consumer_config

_QUIET = logging.getLogger("kresilient.test.share")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
_VALUES = {"group.instance.id": "i-1", "group.remote.assignor": "uniform", "topic.blacklist": "x"}


def _value(key: str) -> str:
    if key in _VALUES:
        return _VALUES[key]
    prop = catalog.lookup(key)
    assert prop is not None and prop.default not in (None, ""), key
    return str(prop.default)


def _starts(key: str) -> bool:
    conf = {"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "logger": _QUIET, key: _value(key)}
    try:
        ShareConsumer(conf).close()
    except (KafkaException, ValueError) as exc:  # librdkafka 2.16 raises ValueError
        assert "share consumer" in str(exc), exc
        return False
    return True


@pytest.mark.parametrize("key", sorted(SHARE_CONSUMER_REFUSED))
def test_table_matches_the_installed_librdkafka(key: str) -> None:
    assert _starts(key) is (SHARE_CONSUMER_REFUSED[key] == "kresilient")


@pytest.mark.parametrize("key", sorted(SHARE_CONSUMER_REFUSED))
def test_runtime_refuses_each_key_naming_it(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        share_consumer_config({"bootstrap.servers": "a:1", "group.id": "g", key: _value(key)})
    assert info.value.key == key and key in str(info.value)


def test_runtime_refuses_implicit_acknowledgement() -> None:
    with pytest.raises(UnsafeConfigError):
        share_consumer_config(
            {"bootstrap.servers": "a:1", "group.id": "g", "share.acknowledgement.mode": "implicit"}
        )


def test_lint_reports_what_the_runtime_refuses(tmp_path: Path) -> None:
    """Each refused key is a lint error on ResilientShareConsumer, the librdkafka ones on a
    raw ShareConsumer too; the consumer rules say nothing of keys a share consumer does not
    take; AsyncResilientConsumer is judged as the runtime judges it (it was not read)."""
    keys = sorted(SHARE_CONSUMER_REFUSED)
    entries = ", ".join(f"{k!r}: {_value(k)!r}" for k in keys)
    (tmp_path / "app.py").write_text(
        "from confluent_kafka import ShareConsumer\n"
        "from kresilient import AsyncResilientConsumer\n"
        "from kresilient.share import ResilientShareConsumer\n"
        f"R = ResilientShareConsumer({{'bootstrap.servers': 'a:1,b:1', {entries}}}, ['t'], print)\n"
        f"S = ShareConsumer({{'bootstrap.servers': 'a:1,b:1', 'error_cb': print, {entries}}})\n"
        "A = AsyncResilientConsumer({'bootstrap.servers': 'a:1,b:1', 'group.id': 'g',\n"
        "    'enable.auto.offset.store': True}, ['t'], print)\n"
    )
    findings = lint_paths([str(tmp_path / "app.py")])
    by_line: dict[int, list[tuple[str, str | None, str]]] = {}
    for f in findings:
        by_line.setdefault(f.line, []).append((f.rule, f.key, f.severity.name.lower()))
    resilient = {k for r, k, s in by_line[4] if r == "KR071" and s == "error"}
    raw = {k for r, k, s in by_line[5] if r == "KR071" and s == "error"}
    assert resilient == set(keys)
    assert raw == {k for k in keys if SHARE_CONSUMER_REFUSED[k] == "librdkafka"}
    others = [(r, k) for line in (4, 5) for r, k, _ in by_line[line] if r not in ("KR071", "KR072")]
    assert not [(r, k) for r, k in others if k in SHARE_CONSUMER_REFUSED], others
    assert ("KR054", "group.id", "error") in by_line[4]  # required, as the runtime says
    assert ("KR054", "enable.auto.offset.store", "error") in by_line[7]


def test_configure_share_group_without_a_broker_answering_raises_config_error() -> None:
    """Review 5 D11 (no broker: port 9 refuses connections): the alter's wait ran out with a
    bare TimeoutError; it is the ConfigError the function promises, naming the group."""
    with pytest.raises(ConfigError, match=r"share group g-none: setting .* no answer within 1 s"):
        configure_share_group(
            {"bootstrap.servers": "127.0.0.1:9", "logger": _QUIET},
            "g-none",
            {"share.auto.offset.reset": "earliest"},
            timeout=1,
        )


class _AdminTimingOutFake:
    """librdkafka's own request timeout (_TIMED_OUT) firing before the caller's wait."""

    def __init__(self, _config: dict[str, object]) -> None:
        pass

    def incremental_alter_configs(self, resources: list[object], **_kw: object) -> dict:
        class _Future:
            def result(self, _timeout: float) -> None:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller")
                )

        return {r: _Future() for r in resources}


def test_configure_share_group_librdkafka_timeout_reads_as_no_answer_fake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI of b783a3f: without a broker, librdkafka's request timeout can fire before our wait
    runs out; the error then said only ``_TIMED_OUT``. Both read "no answer within 1 s" now,
    the client's own words kept beside."""
    monkeypatch.setattr("kresilient.share._consumer.AdminClient", _AdminTimingOutFake)
    with pytest.raises(
        ConfigError, match=r"g-none: setting .* no answer within 1 s \(.*controller"
    ):
        configure_share_group(
            {"bootstrap.servers": "127.0.0.1:9"},
            "g-none",
            {"share.auto.offset.reset": "x"},
            timeout=1,
        )


def test_an_unreachable_cluster_at_construction_is_one_clear_error_and_no_raw_librdkafka_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Against a cluster nobody answers, the constructor's admin calls (the group's settings,
    the dead-letter topics' check) end in one error naming the way out, and every librdkafka
    line goes through structlog and the Redactor: none reaches stderr raw (review14 F7: ~400
    ``%3|...|FAIL|`` lines in 20 s, before the clients were given the consumer's log bridge).
    The password is in no output."""
    from structlog.testing import capture_logs

    from kresilient.errors import ConsumeError
    from kresilient.share import ResilientShareConsumer

    secret = "sh4re-Secret-771"
    config = {
        "bootstrap.servers": "127.0.0.1:9",  # discard: nothing listens there
        "group.id": "unreachable-share",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "worker",
        "sasl.password": secret,
    }
    with (
        capture_logs() as logs,
        pytest.raises(ConsumeError, match=r"require_topic=False") as raised,
    ):
        ResilientShareConsumer(config, ["jobs"], lambda _m: None)
    out, err = capfd.readouterr()
    # no raw librdkafka line about this cluster (one about another cluster can come from a
    # client another test of this worker left behind: it writes to the same stderr)
    raw = [line for line in err.splitlines() if re.search(r"127\.0\.0\.1:9\b", line)]
    assert not raw, raw[:5]
    assert secret not in out + err + repr(logs) + str(raised.value)
    # what the user reads instead: the group's settings not read (their defaults used), then
    # the one error, which says no broker answered
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "share_group_config_unread"
    ], logs
    assert "no broker reachable within" in str(raised.value)
