"""What a ``kresilient`` Spark write did, handed from Spark's commit step to the driver program.

Spark runs a Python data source's ``commit()`` in a separate Python process on the driver host,
so the summary cannot live in the driver program's memory: ``commit()`` writes it as JSON into a
directory that :func:`kresilient.spark.register` created for this driver program, and
:func:`kresilient.spark.last_write_summary` reads the newest one back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "WriteSummary",
    "all_summaries",
    "latest_summary",
    "store_summary",
    "summarize",
    "summary_of",
]

_KEEP = 200


@dataclass(frozen=True, kw_only=True)
class WriteSummary:
    """Counts of one committed write (a batch job, or one streaming micro-batch).

    ``rows`` = ``written`` + ``dead_lettered``; only tasks whose attempt succeeded count (a
    failed attempt's rows are re-sent by its retry, so Kafka may hold duplicates of them:
    the sink is at-least-once).
    """

    mode: str
    batch_id: int | None
    topic: str | None
    guarantee: str
    tasks: int
    rows: int
    written: int
    dead_lettered: int
    dead_letter_reasons: Mapping[str, int] = field(default_factory=dict)
    dead_letter_topics: tuple[str, ...] = ()
    retried_tasks: int = 0
    skipped_tasks: int = 0  #: exactly-once: partitions found already committed (replays)
    committed_at: float = 0.0
    #: ``"python"`` (the data source) or ``"jvm"`` (:func:`kresilient.spark.write` with
    #: ``engine="jvm"``: counts from observed metrics; ``tasks`` is not counted, 0).
    engine: str = "python"
    #: The ``writeId`` option of the write (:func:`kresilient.spark.write` sets one per call).
    write_id: str | None = None

    def to_json(self) -> str:
        """Serialise (JSON object)."""
        data = asdict(self)
        data["dead_letter_topics"] = list(self.dead_letter_topics)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WriteSummary:
        """Inverse of :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        data["dead_letter_topics"] = tuple(data.get("dead_letter_topics", ()))
        return cls(**data)


def summarize(
    reports: Iterable[Any],
    *,
    mode: str,
    batch_id: int | None,
    topic: str | None,
    guarantee: str,
    write_id: str | None = None,
) -> WriteSummary:
    """Add up the tasks' commit messages (``TaskReport``; ``None`` entries are skipped)."""
    tasks = rows = written = dead = retried = skipped = 0
    reasons: dict[str, int] = {}
    topics: set[str] = set()
    for r in reports:
        if r is None:
            continue
        tasks += 1
        rows += r.rows
        written += r.written
        dead += r.dead_lettered
        retried += 1 if r.attempt > 0 else 0
        skipped += 1 if getattr(r, "skipped", False) else 0
        for name, n in r.dead_letter_reasons.items():
            reasons[name] = reasons.get(name, 0) + n
        topics.update(r.dead_letter_topics)
    return WriteSummary(
        mode=mode,
        batch_id=batch_id,
        topic=topic,
        guarantee=guarantee,
        tasks=tasks,
        rows=rows,
        written=written,
        dead_lettered=dead,
        dead_letter_reasons=reasons,
        dead_letter_topics=tuple(sorted(topics)),
        retried_tasks=retried,
        skipped_tasks=skipped,
        committed_at=time.time(),
        write_id=write_id,
    )


def store_summary(directory: str | None, summary: WriteSummary) -> None:
    """Write ``summary`` into ``directory`` (atomically; keeps the newest few hundred)."""
    if not directory or not os.path.isdir(directory):
        return
    # The write id in the name: summary_of() finds a write's own summary without reading
    # the others (a streaming query or another thread may commit right after it).
    name = f"{time.time_ns():020d}-{os.getpid()}-{summary.write_id or ''}.json"
    tmp = Path(directory) / f".{name}.tmp"
    tmp.write_text(summary.to_json())
    tmp.rename(Path(directory) / name)
    names = sorted(p for p in os.listdir(directory) if p.endswith(".json"))
    for old in names[:-_KEEP]:
        (Path(directory) / old).unlink(missing_ok=True)


def latest_summary(directory: str | None) -> WriteSummary | None:
    """The newest summary stored in ``directory`` (``None`` when there is none)."""
    if not directory or not os.path.isdir(directory):
        return None
    names = sorted(p for p in os.listdir(directory) if p.endswith(".json"))
    if not names:
        return None
    return WriteSummary.from_json((Path(directory) / names[-1]).read_text())


def summary_of(directory: str | None, write_id: str) -> WriteSummary | None:
    """The summary of the write whose ``writeId`` is ``write_id`` (``None``: not stored)."""
    if not directory or not os.path.isdir(directory):
        return None
    names = sorted(p for p in os.listdir(directory) if p.endswith(f"-{write_id}.json"))
    if not names:
        return None
    return WriteSummary.from_json((Path(directory) / names[-1]).read_text())


def all_summaries(directory: str | None) -> list[WriteSummary]:
    """Every summary kept in ``directory``, oldest first."""
    if not directory or not os.path.isdir(directory):
        return []
    names = sorted(p for p in os.listdir(directory) if p.endswith(".json"))
    return [WriteSummary.from_json((Path(directory) / n).read_text()) for n in names]
