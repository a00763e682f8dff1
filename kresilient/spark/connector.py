"""Spark's built-in Kafka connector jars, resolved through Maven for the installed pyspark.

``engine="jvm"`` (:func:`kresilient.spark.write`) writes with Spark's own ``kafka`` sink, which
ships outside pyspark as ``spark-sql-kafka-0-10_2.13``. On a cluster, install it as usual
(``--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>`` or your platform's
library mechanism). For local sessions and tests, :func:`connector_jars` resolves it once with
Maven (``mvn`` on ``PATH``; ``kresilient/_data/spark-kafka-pom.xml``) into the user cache dir
and returns the jar paths to hand to ``spark.jars``::

    from kresilient.spark.connector import connector_jars

    spark = (SparkSession.builder.master("local[2]")
             .config("spark.jars", ",".join(connector_jars()))
             .getOrCreate())

The jars must be on the driver's classpath when its JVM starts (``spark.jars`` of the first
session of the process): a session created later in the same process cannot add them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

__all__ = ["connector_jars", "connector_version"]

_CONNECTOR_PREFIXES = (
    "spark-sql-kafka-0-10",
    "spark-token-provider-kafka-0-10",
    "kafka-clients",
    "commons-pool2",
)
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

#: Spark 4.0's parent pom lists a Google Cloud Storage mirror of Maven Central first; where
#: that host is unreachable Maven fails instead of falling back. Without settings of the
#: user's own, Maven gets these: the mirror's id is served from Maven Central.
_SETTINGS = """<settings><mirrors><mirror><id>kresilient-central-for-gcs</id>
<mirrorOf>gcs-maven-central-mirror</mirrorOf><url>https://repo.maven.apache.org/maven2</url>
</mirror></mirrors></settings>
"""


def _cache_root() -> Path:
    # Same place as kresilient.testing's broker jars (spark must not import testing).
    explicit = os.environ.get("KRESILIENT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kresilient"


def connector_version() -> str:
    """The connector version to use: ``$KRESILIENT_SPARK_CONNECTOR_VERSION`` if set (e.g. a
    patch release your Maven repository has when it lacks the exact one), else the installed
    pyspark's (``pyspark.__version__``)."""
    explicit = os.environ.get("KRESILIENT_SPARK_CONNECTOR_VERSION")
    if explicit:
        return explicit
    import pyspark

    return str(pyspark.__version__)


def connector_jars(spark_version: str | None = None) -> list[str]:
    """The built-in Kafka connector's jars for ``spark_version`` (default: the installed
    pyspark's), resolved once through Maven, then cached.

    Only jars Spark does not already ship are returned (the rest are ``provided``). Raises
    :class:`RuntimeError` when Maven is missing or cannot resolve the version.
    """
    version = spark_version or connector_version()
    target = _cache_root() / "spark-kafka" / version
    marker = target / ".complete"
    if not marker.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.exists():
                _resolve(version, target)
    return sorted(str(p) for p in target.glob("*.jar") if p.name.startswith(_CONNECTOR_PREFIXES))


def _resolve(version: str, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven ('mvn') is needed once to fetch spark-sql-kafka-0-10_2.13:" + version
        )
    staging = Path(tempfile.mkdtemp(prefix="spark-kafka-", dir=target.parent))
    try:
        pom = staging / "pom.xml"
        pom.write_bytes(
            resources.files("kresilient").joinpath("_data/spark-kafka-pom.xml").read_bytes()
        )
        cmd = [
            mvn, "-B", "-q", "-f", str(pom), f"-Dspark.version={version}",
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'jars'}",
        ]  # fmt: skip
        if not (Path.home() / ".m2" / "settings.xml").exists():
            settings = staging / "settings.xml"
            settings.write_text(_SETTINGS)
            cmd += ["-s", str(settings)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"Maven could not resolve spark-sql-kafka-0-10_2.13:{version} (a new Spark "
                "release's connector may not be published yet: set "
                "KRESILIENT_SPARK_CONNECTOR_VERSION to a version your repository has):\n"
                + (proc.stdout + proc.stderr)[-3000:]
            )
        (staging / "jars" / ".complete").write_text(version)
        if target.exists():
            shutil.rmtree(target)
        (staging / "jars").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
