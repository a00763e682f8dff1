"""Resolve the Apache Kafka broker jars through Maven, cached per version.

The jars come from the pom shipped as package data (``_data/kafka-pom.xml``). The first
resolution of a version runs Maven; later ones find the cache and never touch the network.
A file lock makes concurrent first uses (several test processes) wait for one download.

The completion marker lists every jar with its size and SHA-256; each use checks the
sizes (cheap) so a truncated or missing jar is noticed and resolved again, with a log line
naming the cache directory, instead of failing later inside the JVM with
``NoClassDefFoundError``. Staging directories of a resolution that was killed are removed
by the next resolver.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

_LOG = logging.getLogger("kresilient.testing")

KAFKA_VERSION = "4.1.1"
"""The Apache Kafka version :class:`kresilient.testing.KafkaCluster` runs by default."""

# Maven 3.8's implicit default for the dependency plugin is 2.8, which predates
# copy-dependencies' current behaviour: pin it.
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MARKER = ".complete"


class JarResolutionError(RuntimeError):
    """Maven could not resolve the broker jars (no Maven, no registry, unknown version)."""


def cache_root() -> Path:
    """Where resolved jars live: ``$KRESILIENT_CACHE_DIR`` or the user's cache dir."""
    explicit = os.environ.get("KRESILIENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kresilient"


def _manifest(libs: Path) -> dict[str, dict[str, int | str]]:
    out: dict[str, dict[str, int | str]] = {}
    for jar in sorted(libs.glob("*.jar")):
        digest = hashlib.sha256(jar.read_bytes()).hexdigest()
        out[jar.name] = {"size": jar.stat().st_size, "sha256": digest}
    return out


def _write_marker(libs: Path, version: str) -> None:
    marker = {"version": version, "jars": _manifest(libs)}
    tmp = libs / (_MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1))
    tmp.replace(libs / _MARKER)


def verify_libs(libs: Path, *, full: bool = False) -> str | None:
    """Why the cached jars in ``libs`` cannot be trusted, or None when they are complete.

    Checks every jar listed at completion is there with its size (``full``: its SHA-256).
    A marker from an older kresilient (no list) is checked by opening every jar as a zip,
    which finds truncation, and then upgraded to the list.
    """
    marker = libs / _MARKER
    if not marker.is_file():
        return "no completion marker"
    try:
        listed = json.loads(marker.read_text())["jars"]
    except (ValueError, KeyError, TypeError):
        for jar in libs.glob("*.jar"):
            try:
                with zipfile.ZipFile(jar) as z:
                    z.infolist()
            except (OSError, zipfile.BadZipFile) as exc:
                return f"{jar.name} is damaged ({exc})"
        if not any(j.name.startswith("kafka_") for j in libs.glob("*.jar")):
            return "the broker jar is missing"
        _write_marker(libs, marker.read_text().strip())
        return None
    if not listed:
        return "the completion marker lists no jar"
    for name, want in listed.items():
        jar = libs / name
        try:
            size = jar.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want["size"]:
            return f"{name} has {size} bytes, {want['size']} were resolved"
        if full and hashlib.sha256(jar.read_bytes()).hexdigest() != want["sha256"]:
            return f"{name} does not match its SHA-256"
    return None


def _remove_staging(version_dir: Path) -> None:
    # Only called while holding the lock: a staging dir now is one whose resolver died.
    for staging in version_dir.glob("libs-*"):
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """Return the directory holding every jar the broker needs, resolving it on first use."""
    target = cache_root() / "kafka" / version / "libs"
    problem = verify_libs(target) if target.exists() else "not resolved yet"
    if problem is None:
        _tidy(target.parent)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_staging(target.parent)
        problem = verify_libs(target) if target.exists() else "not resolved yet"
        if problem is None:  # another process resolved it while we waited
            return target
        if target.exists():
            _LOG.warning(
                "the cached Kafka %s jars in %s cannot be trusted (%s): resolving them again "
                "(delete that directory to force it)",
                version,
                target,
                problem,
            )
        _resolve(version, target)
    return target


def _tidy(version_dir: Path) -> None:
    """Remove staging dirs of a killed resolver, if no resolution runs now (non-blocking)."""
    if not any(version_dir.glob("libs-*")):
        return
    with open(version_dir / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # a resolver is at work; its staging dir is live
        _remove_staging(version_dir)


def _resolve(version: str, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarResolutionError(
            "Maven ('mvn') is not on PATH; it is needed once to fetch the Kafka broker jars "
            f"(version {version}). Install Maven, or point KRESILIENT_BOOTSTRAP_SERVERS at a "
            "running cluster."
        )
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=target.parent))
    try:
        pom = resources.files("kresilient").joinpath("_data/kafka-pom.xml")
        pom_path = staging / "pom.xml"
        pom_path.write_bytes(pom.read_bytes())
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom_path),
            f"-Dkafka.version={version}",
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'libs'}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        jars = list((staging / "libs").glob("*.jar"))
        if proc.returncode != 0 or not any(j.name.startswith("kafka_") for j in jars):
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise JarResolutionError(
                f"Maven failed to resolve org.apache.kafka:kafka_2.13:{version} "
                f"(exit {proc.returncode}):\n{tail}"
            )
        _write_marker(staging / "libs", version)
        if target.exists():
            shutil.rmtree(target)
        (staging / "libs").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":  # `python -m kresilient.testing._broker_jars [VERSION]`: prefetch for CI
    import sys

    print(kafka_libs(sys.argv[1] if len(sys.argv) > 1 else KAFKA_VERSION))
