"""Measure the local cluster: start time (cached jars), failover after SIGKILL, RSS per node.

    python benchmarks/cluster.py --rounds 5

Prints a markdown table with the median, min and max of each figure over the rounds. Each
round starts a fresh 3-node cluster, creates an RF=3 topic, SIGKILLs its leader and times
until metadata shows a new leader, then restarts the node and times until the ISR is full.
Figures are wall-clock on this machine and vary with load: compare them across runs on the
same machine, not as absolutes.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kresilient.testing import KafkaCluster


def one_round() -> dict[str, float]:
    began = time.monotonic()
    with KafkaCluster() as cluster:
        ready = time.monotonic() - began
        cluster.create_topic("bench", replication_factor=3)
        leader = cluster.leader("bench")
        t0 = time.monotonic()
        cluster.kill(leader)
        cluster.wait_for_leader("bench", not_on=leader, timeout=60)
        failover = time.monotonic() - t0
        t1 = time.monotonic()
        cluster.start(leader)
        cluster.wait_for_isr("bench", size=3, timeout=120)
        rejoin = time.monotonic() - t1
        rss = cluster.peak_rss_bytes()
    return {
        "ready_s": ready,
        "new_leader_after_sigkill_s": failover,
        "restart_to_full_isr_s": rejoin,
        "peak_rss_mib_max_node": max(rss.values()) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = [one_round() for _ in range(args.rounds)]
    print(f"| figure ({args.rounds} rounds) | median | min | max |")
    print("|---|---|---|---|")
    for key in rows[0]:
        values = [r[key] for r in rows]
        print(
            f"| {key} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
        )


if __name__ == "__main__":
    main()
