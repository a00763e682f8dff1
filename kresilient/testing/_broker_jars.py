"""Resolve the Apache Kafka broker jars through Maven, cached per version.

The jars come from the pom shipped as package data (``_data/kafka-pom.xml``). The first
resolution of a version runs Maven; later ones find the cache and never touch the network.
A file lock makes concurrent first uses (several test processes) wait for one download.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

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


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """Return the directory holding every jar the broker needs, resolving it on first use."""
    target = cache_root() / "kafka" / version / "libs"
    if (target / _MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).exists():  # another process resolved it while we waited
            return target
        _resolve(version, target)
    return target


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
        (staging / "libs" / _MARKER).write_text(version)
        if target.exists():
            shutil.rmtree(target)
        (staging / "libs").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":  # `python -m kresilient.testing._broker_jars [VERSION]`: prefetch for CI
    import sys

    print(kafka_libs(sys.argv[1] if len(sys.argv) > 1 else KAFKA_VERSION))
