"""The broker-jar cache: damaged or half-written caches are noticed (issue 23, defect 12).

Maven is replaced by a fake resolver writing small zip files: what is checked here is the
cache's bookkeeping, not Maven.
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import pytest

from kresilient.testing import _broker_jars as jars


def _jar(path: Path, entries: int = 50) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for i in range(entries):
            z.writestr(f"org/example/C{i}.class", b"\xca\xfe\xba\xbe" * 200)


@pytest.fixture(name="cache")
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("KRESILIENT_CACHE_DIR", str(tmp_path))
    calls: list[str] = []

    def fake_resolve(version: str, target: Path) -> None:
        calls.append(version)
        staging = target.parent / "libs-fake"
        (staging).mkdir()
        for name in ("kafka_2.13-9.9.jar", "kafka-clients-9.9.jar"):
            _jar(staging / name)
        jars._write_marker(staging, version)
        if target.exists():
            import shutil

            shutil.rmtree(target)
        staging.rename(target)

    monkeypatch.setattr(jars, "_resolve", fake_resolve)
    return calls


def test_truncated_jar_is_resolved_again_naming_the_cache(
    cache: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    libs = jars.kafka_libs("9.9")
    assert cache == ["9.9"]
    assert jars.kafka_libs("9.9") == libs and cache == ["9.9"]  # control: a good cache is used
    jar = libs / "kafka_2.13-9.9.jar"
    jar.write_bytes(jar.read_bytes()[:1000])  # a download cut short
    with caplog.at_level(logging.WARNING, logger="kresilient.testing"):
        assert jars.kafka_libs("9.9") == libs
    assert cache == ["9.9", "9.9"], "a truncated jar must not be trusted"
    assert str(libs) in caplog.text and "kafka_2.13-9.9.jar has 1000 bytes" in caplog.text
    assert jars.verify_libs(libs, full=True) is None


def test_missing_jar_and_bad_checksum_are_found(cache: list[str]) -> None:
    libs = jars.kafka_libs("9.9")
    (libs / "kafka-clients-9.9.jar").unlink()
    assert jars.verify_libs(libs) == "kafka-clients-9.9.jar is missing"
    jars.kafka_libs("9.9")
    jar = libs / "kafka-clients-9.9.jar"
    data = bytearray(jar.read_bytes())
    data[100] ^= 0xFF  # same size, different content
    jar.write_bytes(bytes(data))
    assert jars.verify_libs(libs) is None  # the cheap check only looks at sizes
    assert jars.verify_libs(libs, full=True) == "kafka-clients-9.9.jar does not match its SHA-256"


def test_marker_of_an_older_version_is_checked_as_zips_and_upgraded(
    cache: list[str], tmp_path: Path
) -> None:
    libs = tmp_path / "kafka" / "9.8" / "libs"
    libs.mkdir(parents=True)
    _jar(libs / "kafka_2.13-9.8.jar")
    (libs / ".complete").write_text("9.8")  # what kresilient 0.1 wrote
    assert jars.kafka_libs("9.8") == libs and cache == []
    assert json.loads((libs / ".complete").read_text())["jars"]["kafka_2.13-9.8.jar"]["size"] > 0
    (libs / ".complete").write_text("9.8")
    jar = libs / "kafka_2.13-9.8.jar"
    jar.write_bytes(jar.read_bytes()[:-300])  # truncated: the zip directory is gone
    assert jars.kafka_libs("9.8") == libs
    assert cache == ["9.8"]


def test_staging_dir_of_a_killed_resolution_is_removed(cache: list[str], tmp_path: Path) -> None:
    libs = jars.kafka_libs("9.9")
    leftover = libs.parent / "libs-k1ll3d"
    (leftover / "libs").mkdir(parents=True)
    (leftover / "libs" / "half.jar").write_bytes(b"x" * 1000)
    assert jars.kafka_libs("9.9") == libs
    assert not leftover.exists(), "a killed resolver's staging dir stays forever"
    assert cache == ["9.9"]
