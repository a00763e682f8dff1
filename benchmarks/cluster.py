"""Measure the local cluster: start time (cached jars), failover after SIGKILL, RSS per node,
and the throughput cost of the network-fault proxies.

    python benchmarks/cluster.py --rounds 5               # lifecycle figures
    python benchmarks/cluster.py --proxy --rounds 5       # proxy pass-through vs direct
    python benchmarks/cluster.py --jit --rounds 4         # C1-only JIT vs the JVM default

Prints a markdown table with the median, min and max of each figure over the rounds. Each
lifecycle round starts a fresh 3-node cluster, creates an RF=3 topic, SIGKILLs its leader and
times until metadata shows a new leader, then restarts the node and times until the ISR is
full. The proxy rounds use ONE ``KafkaCluster(network_faults=True)`` and produce the same
load (idempotent, acks=all, 100-byte values) alternately through the fault proxies (no fault
set: pass-through) and directly to the brokers' ADMIN listener (same JVMs, no proxy), and
report the paired ratio proxy/direct. The ``--jit`` rounds start a 3-node cluster with the
JVM's default JIT and one with ``-XX:TieredStopAtLevel=1`` (C1 only, what ``.ci/test`` gives
the suite's brokers), alternating which goes first, and report the brokers' CPU-seconds
(from /proc) at readiness and for ``--messages`` produced right after, with the paired ratios
C1/default. Benchmarks otherwise connect directly (the default
``KafkaCluster()`` has no proxy). Figures are wall-clock on this machine and vary with load:
compare them across runs on the same machine, not as absolutes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from confluent_kafka import Producer

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


def _produce_rate(bootstrap: str, topic: str, messages: int) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 262144,
        }
    )
    value = b"x" * 100
    began = time.monotonic()
    for _ in range(messages):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("messages left unacknowledged")
    return messages / (time.monotonic() - began)


def proxy_rounds(rounds: int, messages: int) -> list[dict[str, float]]:
    rows = []
    with KafkaCluster(network_faults=True) as cluster:
        cluster.create_topic("bench-proxy", partitions=3, replication_factor=3)
        direct_bootstrap = cluster._harness_bootstrap()  # ADMIN listener: no proxy
        _produce_rate(cluster.bootstrap_servers, "bench-proxy", messages // 10)  # warm-up
        for r in range(rounds):
            # Alternate the order so drift in background load hits both arms alike.
            order = ["proxy", "direct"] if r % 2 == 0 else ["direct", "proxy"]
            rates = {}
            for arm in order:
                bootstrap = cluster.bootstrap_servers if arm == "proxy" else direct_bootstrap
                rates[arm] = _produce_rate(bootstrap, "bench-proxy", messages)
            rows.append(
                {
                    "direct_msgs_per_s": rates["direct"],
                    "proxy_msgs_per_s": rates["proxy"],
                    "ratio_proxy_over_direct": rates["proxy"] / rates["direct"],
                }
            )
    return rows


def _jvm_cpu_s(cluster: KafkaCluster) -> float:
    """User + system CPU-seconds of the cluster's running node JVMs (Linux /proc)."""
    total = 0
    for node in cluster.node_ids:
        process = cluster._nodes[node].process
        assert process is not None
        with open(f"/proc/{process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def _jit_arm(options: list[str], messages: int) -> dict[str, float]:
    began = time.monotonic()
    with KafkaCluster(jvm_options=options) as cluster:
        ready = time.monotonic() - began
        at_ready = _jvm_cpu_s(cluster)
        cluster.create_topic("bench-jit", partitions=3, replication_factor=3)
        before = _jvm_cpu_s(cluster)
        _produce_rate(cluster.bootstrap_servers, "bench-jit", messages)
        return {
            "ready_s": ready,
            "cpu_at_ready_s": at_ready,
            "cpu_messages_s": _jvm_cpu_s(cluster) - before,
        }


def jit_rounds(rounds: int, messages: int) -> list[dict[str, float]]:
    arms = {"default": [], "c1": ["-XX:TieredStopAtLevel=1"]}
    rows = []
    for r in range(rounds):
        order = ["default", "c1"] if r % 2 == 0 else ["c1", "default"]
        got = {arm: _jit_arm(arms[arm], messages) for arm in order}
        row = {f"{arm}_{k}": v for arm in arms for k, v in got[arm].items()}
        for k in got["c1"]:
            row[f"ratio_c1_over_default_{k}"] = got["c1"][k] / got["default"][k]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--proxy", action="store_true", help="measure the fault proxies")
    parser.add_argument("--jit", action="store_true", help="C1-only JIT vs the JVM default")
    parser.add_argument("--messages", type=int, default=200_000, help="per proxy or jit arm")
    args = parser.parse_args()
    if args.proxy:
        rows = proxy_rounds(args.rounds, args.messages)
    elif args.jit:
        rows = jit_rounds(args.rounds, args.messages)
    else:
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
