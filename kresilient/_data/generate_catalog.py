"""Regenerate the configuration catalogs shipped in ``kresilient/_data/``.

Usage (from the repository root)::

    .venv/bin/python kresilient/_data/generate_catalog.py            # both catalogs
    .venv/bin/python kresilient/_data/generate_catalog.py --librdkafka-only

* ``librdkafka_properties.json`` comes from the installed librdkafka itself
  (``rd_kafka_conf_properties_show`` through ctypes, and ``is_secret`` from the properties
  librdkafka flags sensitive, probed by ``installed_sensitive_properties``), so it matches that
  exact version;
  ``tests/test_lint_catalog.py`` fails when the installed library drifts from it.
* ``kafka_configs.json`` comes from the Apache Kafka jars' ``ConfigDef`` objects (broker,
  topic, Java producer/consumer/admin) dumped by ``DumpKafkaConfigs.java`` (Java 17+ runs the
  single source file directly). The jars are the ones the test cluster resolves through Maven
  (``kafka-pom.xml``); pass ``--kafka-classpath`` to use others.
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import os
import re
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from kresilient._catalog import (  # noqa: E402  (path set up above)
    installed_properties_table,
    installed_sensitive_properties,
    is_secret_key,
    parse_properties_table,
)


def _first_sentences(doc: str | None, limit: int = 300) -> str:
    """Plain text of an HTML doc string, cut at a sentence end near ``limit`` characters."""
    text = html.unescape(re.sub(r"<[^>]+>", "", doc or ""))
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    return text[: cut + 1] if cut > 40 else text[:limit].rstrip() + "..."


def generate_librdkafka(out_dir: str) -> str:
    version, table = installed_properties_table()
    sensitive = installed_sensitive_properties()  # librdkafka's own "secret" flag
    data = {
        "librdkafka_version": version,
        "properties": parse_properties_table(table, sensitive),
    }
    path = os.path.join(out_dir, "librdkafka_properties.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return path


def default_kafka_classpath(version: str = "4.1.1") -> str:
    repo = os.path.expanduser("~/.m2/repository")
    jars = [
        j
        for j in glob.glob(os.path.join(repo, "**", "*.jar"), recursive=True)
        if "/org/apache/kafka/" not in j or f"/{version}/" in j
    ]
    return os.pathsep.join(sorted(jars))


def generate_kafka(out_dir: str, classpath: str) -> str:
    raw: dict[str, Any] = json.loads(
        subprocess.run(
            ["java", "-cp", classpath, os.path.join(HERE, "DumpKafkaConfigs.java")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    data: dict[str, Any] = {"kafka_version": raw["kafka_version"]}
    for kind in ("broker", "topic", "producer", "consumer", "admin"):
        data[kind] = [
            {
                "name": k["name"],
                "type": k["type"],
                "default": None
                if k["type"] == "password" or is_secret_key(k["name"])
                else k["default"],
                "valid": k["valid"],
                "importance": k["importance"],
                "internal": k["internal"],
                "synonym": k["extra"],
                "description": _first_sentences(k["doc"]),
            }
            for k in raw[kind]
        ]
    path = os.path.join(out_dir, "kafka_configs.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out-dir", default=HERE)
    parser.add_argument("--librdkafka-only", action="store_true")
    parser.add_argument("--kafka-classpath", default=None)
    args = parser.parse_args(argv)
    print(generate_librdkafka(args.out_dir))
    if not args.librdkafka_only:
        print(generate_kafka(args.out_dir, args.kafka_classpath or default_kafka_classpath()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
