"""A small standalone Spark cluster on 127.0.0.1, for your own Spark tests.

Local mode (``local[N]``) runs every task in the driver's JVM; a real cluster runs executors in
their own JVMs (and Python workers) that can die on their own. :class:`SparkStandaloneCluster`
starts a master and workers from pyspark's own launcher (``bin/spark-class`` with Spark's
``Master``/``Worker`` classes), each a process of its own, bound to 127.0.0.1, stopped by pid::

    from kresilient.spark.testing import SparkStandaloneCluster

    with SparkStandaloneCluster(workers=2) as cluster:
        spark = cluster.session("my-test")          # a SparkSession on the cluster
        ...
        cluster.kill_executor()                     # SIGKILL one executor JVM
        spark.stop()

Needs Java and pyspark (``pip install 'kresilient[spark]'``). ``jars``: extra jars for the
driver and executors (e.g. :func:`kresilient.spark.connector.connector_jars`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from kresilient._ports import PortReservation

__all__ = ["SparkStandaloneCluster", "local_session"]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def local_session(
    app: str = "kresilient-tests",
    *,
    master: str = "local[2]",
    jars: Iterable[str] = (),
    conf: dict[str, str] | None = None,
) -> Any:
    """A ``SparkSession`` bound to 127.0.0.1 with the UI off (``jars`` go to ``spark.jars``:
    they reach the driver's classpath only if this is the process's first session)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
    )
    jar_list = list(jars)
    if jar_list:
        b = b.config("spark.jars", ",".join(jar_list))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class SparkStandaloneCluster:
    """A Spark standalone master and ``workers`` workers (``cores`` and ``memory`` each).

    :meth:`start` returns once every worker registered with the master; :meth:`close` stops
    the processes it started (SIGTERM, then SIGKILL after ``stop_timeout`` s) and removes
    their work directory.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        start_timeout: float = 120.0,
        stop_timeout: float = 20.0,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.master_url = ""
        self._web_port = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> SparkStandaloneCluster:
        """Start the master and the workers; wait until every worker is registered."""
        self._dir = tempfile.TemporaryDirectory(prefix="kresilient-spark-cluster-")
        base = Path(self._dir.name)
        # Every port distinct and held (a listening socket, below the kernel's ephemeral
        # range) until just before its process starts: a port picked by binding port 0 and
        # closing could be drawn twice, or taken meanwhile by any outgoing connection; the
        # master's web UI then fell back to another port and the one polled answered
        # something else (seen in CI: an empty answer where the master's JSON was expected).
        ports = PortReservation()
        port, self._web_port, *worker_ports = ports.take_free(2 + 2 * self.workers)
        self.master_url = f"spark://127.0.0.1:{port}"
        try:
            ports.release([port, self._web_port])
            self._launch(base / "master.log", "org.apache.spark.deploy.master.Master",
                         "--host", "127.0.0.1", "--port", str(port),
                         "--webui-port", str(self._web_port))  # fmt: skip
            for i in range(self.workers):
                work = base / f"worker-{i}"
                work.mkdir()
                rpc, web = worker_ports[2 * i], worker_ports[2 * i + 1]
                ports.release([rpc, web])
                self._launch(base / f"worker-{i}.log", "org.apache.spark.deploy.worker.Worker",
                             "--host", "127.0.0.1", "--port", str(rpc),
                             "--webui-port", str(web), "--cores", str(self.cores),
                             "--memory", self.memory, "--work-dir", str(work),
                             self.master_url)  # fmt: skip
            self._wait_for_workers()
        except BaseException:
            self.close()
            raise
        finally:
            ports.release()
        return self

    def _launch(self, log: Path, cls: str, *args: str) -> None:
        env = dict(os.environ)
        env["SPARK_HOME"] = str(_spark_home())
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["SPARK_NO_DAEMONIZE"] = "1"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(_spark_home() / "bin" / "spark-class"), cls, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stopped as one, by pid
            )
        self._procs.append(proc)

    def _wait_for_workers(self) -> None:
        import json
        import urllib.request

        deadline = time.monotonic() + self.start_timeout
        alive = 0
        last = "no answer yet"
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(
                        f"a Spark process exited with {p.returncode} while starting: "
                        f"{self._log_tail()}"
                    )
            try:
                url = f"http://127.0.0.1:{self._web_port}/json/"
                with urllib.request.urlopen(url, timeout=5) as r:
                    state = json.load(r)
                alive = sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")
                if alive >= self.workers:
                    return
                last = f"{alive} ALIVE"
            except OSError as exc:  # not listening yet (or an HTTP error status)
                last = f"{type(exc).__name__}: {exc}"
            except ValueError as exc:  # an answer that is not the master's JSON (yet)
                last = f"not JSON ({exc})"
            time.sleep(0.5)  # polling for a condition with a deadline
        raise RuntimeError(
            f"{alive}/{self.workers} Spark workers registered after {self.start_timeout} s "
            f"(the master's web UI on port {self._web_port}, last: {last}): {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        tails = []
        for log in sorted(Path(self._dir.name).glob("*.log")):
            tails.append(f"{log.name}: {log.read_text(errors='replace')[-800:]}")
        return "\n".join(tails)

    def close(self) -> None:
        """Stop every process this cluster started (idempotent)."""
        for p in reversed(self._procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self._procs):
            try:
                p.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self._procs.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ use
    def session(
        self,
        app: str = "kresilient-tests",
        *,
        jars: Iterable[str] = (),
        conf: dict[str, str] | None = None,
    ) -> Any:
        """A ``SparkSession`` on this cluster (one executor per worker)."""
        settings = {
            "spark.executor.memory": "512m",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            "spark.task.maxFailures": "4",
        }
        settings.update(conf or {})
        return local_session(app, master=self.master_url, jars=jars, conf=settings)

    def executor_pids(self) -> list[int]:
        """Pids of the executor JVMs running now (children of the worker processes)."""
        pids: list[int] = []
        for worker in self._procs[1:]:
            for child in _children(worker.pid):
                if "CoarseGrainedExecutorBackend" in _cmdline(child):
                    pids.append(child)
        return pids

    def wait_for_executors(self, count: int, timeout: float = 120.0) -> list[int]:
        """Wait until ``count`` executor JVMs run; return their pids."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.executor_pids()
            if len(pids) >= count:
                return pids
            time.sleep(0.2)  # polling for a condition with a deadline
        raise RuntimeError(f"fewer than {count} executors after {timeout} s")

    def kill_executor(self) -> int:
        """SIGKILL one running executor JVM (with its Python workers' parent gone, they
        exit too); return its pid. The worker then starts a replacement."""
        pids = self.executor_pids()
        if not pids:
            raise RuntimeError("no executor is running")
        os.kill(pids[0], signal.SIGKILL)
        return pids[0]

    def __repr__(self) -> str:
        return f"SparkStandaloneCluster({self.master_url!r}, workers={self.workers})"
