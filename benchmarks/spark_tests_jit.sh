#!/usr/bin/env bash
# The suite's Spark test files with Spark's JVMs on C1-only JIT against the JVM default:
# CPU-seconds of every process each run starts (Spark drivers, executors, the standalone
# master and workers, brokers, Python workers, JVMs left to exit after pytest) from a cpuacct
# cgroup of its own, arms interleaved (the order alternates each round). The brokers run
# C1-only in both arms, as in .ci/test. Needs root and cgroup v1's cpuacct controller.
#
#   bash benchmarks/spark_tests_jit.sh [ROUNDS] [TEST FILE ...]
#
# Default files: the four local-mode Spark files; pass tests/test_spark_standalone.py
# tests/test_example_spark_job.py for the standalone cluster's.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
shift || true
files=("$@")
if [ "${#files[@]}" -eq 0 ]; then
  files=(tests/test_spark_integration.py tests/test_spark_failures.py tests/test_spark_jvm.py
         tests/test_spark_task_paths.py)
fi
root=/sys/fs/cgroup/cpuacct
if [ ! -w "$root" ]; then
  echo "needs a writable cgroup v1 cpuacct hierarchy at $root (root)" >&2
  exit 2
fi
export KRESILIENT_SPARK_CONNECTOR_VERSION="${KRESILIENT_SPARK_CONNECTOR_VERSION:-4.2.0}"
export KRESILIENT_NO_SKIPS=1 KRESILIENT_KAFKA_JVM_OPTS=-XX:TieredStopAtLevel=1
out="$(mktemp -d)"
declare -A cpu_of
for ((r = 1; r <= rounds; r++)); do
  arms=(c1 default)
  if ((r % 2 == 0)); then arms=(default c1); fi
  for arm in "${arms[@]}"; do
    cg="$root/kresilient-jit-$$-$arm-$r"
    mkdir "$cg"
    (
      if [ "$arm" = c1 ]; then
        export SPARK_CONF_DIR="$PWD/.ci/spark-conf" SPARK_DAEMON_JAVA_OPTS=-XX:TieredStopAtLevel=1
      else
        unset SPARK_CONF_DIR SPARK_DAEMON_JAVA_OPTS
      fi
      echo "$BASHPID" > "$cg/tasks"
      exec .venv/bin/python -m pytest -q -p no:cacheprovider "${files[@]}" > "$out/$arm-$r.log" 2>&1
    ) || { echo "$arm round $r: tests failed, see $out/$arm-$r.log" >&2; exit 1; }
    # JVMs the tests stopped may still be exiting: wait until the group holds no process
    for _ in $(seq 1 300); do [ -n "$(cat "$cg/tasks")" ] || break; sleep 0.1; done  # (its size reads 0)
    cpu=$(($(cat "$cg/cpuacct.usage") / 1000000))
    rmdir "$cg" 2>/dev/null || echo "($cg still holds a process; left in place)" >&2
    cpu_of[$arm-$r]=$cpu
    echo "round $r $arm cpu_ms=$cpu $(tail -1 "$out/$arm-$r.log")"
  done
  awk -v c="${cpu_of[c1-$r]}" -v d="${cpu_of[default-$r]}" -v r="$r" \
    'BEGIN { printf "round %d: CPU-seconds C1 / default = %.2f (%.0f / %.0f)\n", r, c / d, c / 1000, d / 1000 }'
done
