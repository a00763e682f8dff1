"""Create a service's topics, and their dead-letter topics, from Python before it starts.

Brokers on a well-run cluster do not create topics on first use, so a deployment step (or the
service itself) creates them. ``if_not_exists=True`` makes the step safe to run on every
deploy::

    python examples/create_topics.py --bootstrap-servers 127.0.0.1:9092

The same as ``kresilient topic create orders --partitions 3 --dlq --if-not-exists`` per topic.
"""

from __future__ import annotations

import argparse
import sys

from kresilient.admin import create_topic
from kresilient.errors import ConfigError, KafkaClientError

TOPICS = {
    # name: (partitions, topic settings)
    "orders": (3, {"retention.ms": 7 * 24 * 3600 * 1000}),
    "payments": (3, {"max.message.bytes": 2 * 1024 * 1024}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--prefix", default="", help="prepended to every topic name")
    args = parser.parse_args()
    for name, (partitions, settings) in TOPICS.items():
        try:
            results = create_topic(
                args.bootstrap_servers,
                args.prefix + name,
                partitions=partitions,
                replication_factor=args.replication_factor,
                config=settings,
                dead_letter=True,  # also NAME.dlq, with room for any dead letter of NAME
                if_not_exists=True,
            )
        except (ConfigError, KafkaClientError) as exc:
            # One line: the cluster is unreachable (host and reason) or refused the request.
            print(f"{args.prefix + name}: {exc.message}", file=sys.stderr)
            return 2
        for result in results:
            state = "exists" if result.existed else "created"
            print(f"{state} {result.name} ({result.partitions} partitions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
