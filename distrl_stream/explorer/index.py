"""The explorer's local index: one SQLite file of episode summaries, weight versions and dead letters, with the
offset range of each partition it holds, so that filters, counts and sorting never scan the topic.

The log stays the source of truth (docs/design.md §10, "The run explorer"): the index holds no step, no observation
and no screenshot, only what a table row and a filter need plus each episode's ``(partition, offset)``, from which the
episode page reads the record itself. It is rebuilt from Kafka whenever it is missing, written by another format, for
another run or cluster, or stale (a topic's id changed: it was deleted and created again).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# The CLI's time forms (ISO 8601 or an age), so that the page's filters read like replay's flags.
from distrl_stream.cli.common import parse_time
from distrl_stream.errors import ConfigError
from distrl_stream.events import DeadLetter, Termination, TrajectoryEvent, WeightVersionEvent, epoch_ms

# Bumped whenever the tables change: an index of another format is rebuilt, never migrated (Kafka has everything).
FORMAT = 1
PAGE_SIZE = 50

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS progress (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS episodes (
    partition INTEGER NOT NULL, "offset" INTEGER NOT NULL, published_ms INTEGER NOT NULL,
    episode_id TEXT NOT NULL, collector_id TEXT NOT NULL, env_kind TEXT NOT NULL, task_id TEXT NOT NULL,
    task_template TEXT NOT NULL, instruction TEXT NOT NULL, split TEXT NOT NULL, termination TEXT NOT NULL,
    success INTEGER NOT NULL, total_reward REAL NOT NULL, length INTEGER NOT NULL, invalid_steps INTEGER NOT NULL,
    min_version INTEGER NOT NULL, max_version INTEGER NOT NULL, lag INTEGER NOT NULL,
    started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL, duration_s REAL NOT NULL,
    PRIMARY KEY (partition, "offset"));
CREATE INDEX IF NOT EXISTS episodes_published ON episodes (published_ms);
CREATE INDEX IF NOT EXISTS episodes_ended ON episodes (ended_ms);
CREATE INDEX IF NOT EXISTS episodes_id ON episodes (episode_id);
CREATE INDEX IF NOT EXISTS episodes_template ON episodes (task_template, ended_ms);
CREATE TABLE IF NOT EXISTS versions (
    version INTEGER PRIMARY KEY, policy_id TEXT NOT NULL, created_ms INTEGER NOT NULL, learner_step INTEGER NOT NULL,
    trajectories_consumed INTEGER NOT NULL, sha256 TEXT NOT NULL, size_bytes INTEGER NOT NULL, metrics TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dead_letters (
    partition INTEGER NOT NULL, "offset" INTEGER NOT NULL, published_ms INTEGER NOT NULL, topic TEXT NOT NULL,
    source_partition INTEGER NOT NULL, source_offset INTEGER NOT NULL, error_class TEXT NOT NULL,
    error_message TEXT NOT NULL, consumer TEXT NOT NULL, PRIMARY KEY (partition, "offset"));
"""


@dataclass(frozen=True, slots=True)
class EpisodeRow:
    """One row of the episode table: an episode's summary and where it is in ``{run}.trajectories``."""

    partition: int
    offset: int
    published_ms: int
    episode_id: str
    collector_id: str
    env_kind: str
    task_id: str
    task_template: str
    instruction: str
    split: str
    termination: str
    success: bool
    total_reward: float
    length: int
    invalid_steps: int
    min_version: int
    max_version: int
    lag: int
    started_ms: int
    ended_ms: int
    duration_s: float

    @classmethod
    def of(cls, event: TrajectoryEvent, partition: int, offset: int, published_ms: int, newest: int) -> EpisodeRow:
        """Summarise ``event``; ``newest`` is the newest version that existed when it ended (for its lag)."""
        versions = [s.policy_version for s in event.steps] or [0]
        return cls(
            partition=partition,
            offset=offset,
            published_ms=published_ms,
            episode_id=event.episode_id,
            collector_id=event.collector_id,
            env_kind=event.env_kind,
            task_id=event.task_id,
            task_template=event.task_template or event.task_id,
            instruction=event.instruction,
            split=event.split,
            termination=str(event.termination),
            success=event.success,
            total_reward=event.total_reward,
            length=len(event.steps),
            invalid_steps=sum(not s.valid for s in event.steps),
            min_version=min(versions),
            max_version=max(versions),
            # The staleness of the episode's stalest step (replay stats' per-step lag, docs/replay.md).
            lag=max(0, max(newest, max(versions)) - min(versions)),
            started_ms=epoch_ms(event.started_at),
            ended_ms=epoch_ms(event.ended_at),
            duration_s=(event.ended_at - event.started_at).total_seconds(),
        )


_EPISODE_COLUMNS = tuple(f.name for f in fields(EpisodeRow))
# Sortable columns by their name in URLs (a fixed list: a column name never comes from a request into SQL).
SORTS = {
    "published": "published_ms",
    "ended": "ended_ms",
    "template": "task_template",
    "collector": "collector_id",
    "termination": "termination",
    "success": "success",
    "reward": "total_reward",
    "length": "length",
    "version": "max_version",
    "lag": "lag",
    "duration": "duration_s",
}
TERMINATIONS = tuple(str(t) for t in Termination)


@dataclass(frozen=True, slots=True)
class Filters:
    """The episode table's selection, sort and page, as carried by its URL's query string."""

    version: int | None = None
    template: str | None = None
    task: str | None = None
    success: bool | None = None
    termination: str | None = None
    collector: str | None = None
    min_lag: int | None = None
    max_lag: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    sort: str = "published"
    descending: bool = True
    page: int = 1

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Filters:
        """Read the query string (empty values mean "any").

        Raises:
            ConfigError: a value of the wrong form, naming the parameter and what it accepts.
        """
        q = {k: v.strip() for k, v in query.items() if v.strip()}
        success = q.get("success")
        if success not in (None, "yes", "no"):
            raise ConfigError("success", f"{success!r} is not yes or no")
        termination = q.get("termination")
        if termination is not None and termination not in TERMINATIONS:
            raise ConfigError("termination", f"{termination!r} is not one of {', '.join(TERMINATIONS)}")
        sort = q.get("sort", "published")
        if sort not in SORTS:
            raise ConfigError("sort", f"{sort!r} is not one of {', '.join(SORTS)}")
        order = q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ConfigError("order", f"{order!r} is not asc or desc")
        return cls(
            version=_int(q, "version"),
            template=q.get("template"),
            task=q.get("task"),
            success=None if success is None else success == "yes",
            termination=termination,
            collector=q.get("collector"),
            min_lag=_int(q, "min_lag"),
            max_lag=_int(q, "max_lag"),
            min_length=_int(q, "min_length"),
            max_length=_int(q, "max_length"),
            since_ms=_time_ms(q, "since"),
            until_ms=_time_ms(q, "until"),
            sort=sort,
            descending=order == "desc",
            page=max(1, _int(q, "page") or 1),
        )

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition and its parameters (values are always bound, never formatted into the text)."""
        terms: list[str] = []
        params: list[Any] = []

        def term(sql: str, value: Any) -> None:
            if value is not None:
                terms.append(sql)
                params.append(value)

        # An episode "of" a version is one whose steps acted with it (a version switch mid-episode counts for both).
        if self.version is not None:
            terms.append("min_version <= ? AND max_version >= ?")
            params += [self.version, self.version]
        term("task_template = ?", self.template)
        term("task_id LIKE ? ESCAPE '\\'", None if self.task is None else f"%{_like(self.task)}%")
        term("success = ?", None if self.success is None else int(self.success))
        term("termination = ?", self.termination)
        term("collector_id = ?", self.collector)
        term("lag >= ?", self.min_lag)
        term("lag <= ?", self.max_lag)
        term("length >= ?", self.min_length)
        term("length <= ?", self.max_length)
        term("published_ms >= ?", self.since_ms)
        term("published_ms < ?", self.until_ms)
        return (" AND ".join(terms) or "1"), params


def _int(q: Mapping[str, str], name: str) -> int | None:
    if name not in q:
        return None
    try:
        value = int(q[name])
    except ValueError:
        raise ConfigError(name, f"{q[name]!r} is not a whole number") from None
    if value < 0:
        raise ConfigError(name, f"{value} is negative")
    return value


def _time_ms(q: Mapping[str, str], name: str) -> int | None:
    if name not in q:
        return None
    parsed = parse_time(q[name], name)
    return None if parsed is None else epoch_ms(parsed)


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True, slots=True)
class VersionRow:
    """A weight version as published on ``{run}.weights``."""

    version: int
    policy_id: str
    created_ms: int
    learner_step: int
    trajectories_consumed: int
    sha256: str
    size_bytes: int
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A record some consumer of the run could not use, and where it came from."""

    partition: int
    offset: int
    published_ms: int
    topic: str
    source_partition: int
    source_offset: int
    error_class: str
    error_message: str
    consumer: str


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of ``{run}.trajectories`` the index holds: records indexed of those in the topic."""

    indexed: int
    total: int

    @property
    def complete(self) -> bool:
        """Whether every record of the topic (as of the last look at its watermarks) is indexed."""
        return self.indexed >= self.total


class Index:
    """The SQLite file. One writer (the tailer's thread) and any number of readers (request threads, each with a
    connection of its own: WAL lets them read while the tailer writes).

    Args:
        path: the file (its folder is created).
        identity: what the index is of (run, bootstrap servers, format); a file recorded for another is emptied.
    """

    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            recorded = dict(db.execute("SELECT key, value FROM meta").fetchall()) if _has_meta(db) else {}
            wanted = {**identity, "format": str(FORMAT)}
            if recorded and any(recorded.get(k) != v for k, v in wanted.items()):
                self._drop(db)
            db.executescript(_SCHEMA)
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", wanted.items())

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection for one unit of work, committed on success and closed after."""
        db = sqlite3.connect(self.path, timeout=30.0)
        try:
            with db:
                yield db
        finally:
            db.close()

    def reset(self) -> None:
        """Forget everything (the topic is read again from Kafka)."""
        with self.connect() as db:
            self._drop(db)
            db.executescript(_SCHEMA)

    @staticmethod
    def _drop(db: sqlite3.Connection) -> None:
        for table in ("progress", "episodes", "versions", "dead_letters"):
            db.execute(f"DROP TABLE IF EXISTS {table}")

    # --- written by the tailer ---

    def topic_ids(self) -> dict[str, str]:
        """Topic name -> the cluster's id of the topic the index was filled from ({} before the first fill)."""
        with self.connect() as db:
            found = db.execute("SELECT value FROM meta WHERE key = 'topic_ids'").fetchone()
        return {} if found is None else json.loads(found[0])

    def set_topic_ids(self, ids: Mapping[str, str]) -> None:
        """Record which topics (by the cluster's ids) the index is filled from."""
        with self.connect() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('topic_ids', ?)", (json.dumps(dict(ids), sort_keys=True),))

    def progress(self, topic: str) -> dict[int, tuple[int, int]]:
        """Partition -> (lo, hi): the offsets ``[lo, hi)`` of ``topic`` already indexed."""
        with self.connect() as db:
            rows = db.execute("SELECT partition, lo, hi FROM progress WHERE topic = ?", (topic,)).fetchall()
        return {p: (lo, hi) for p, lo, hi in rows}

    def write(
        self,
        progress: Mapping[tuple[str, int], tuple[int, int]],
        episodes: Iterable[EpisodeRow] = (),
        versions: Iterable[WeightVersionEvent] = (),
        dead_letters: Iterable[DeadLetterRow] = (),
    ) -> None:
        """Add rows and move the indexed ranges in one transaction, so a crash never leaves a range claiming rows
        it does not hold."""
        with self.connect() as db:
            db.executemany(
                f"INSERT OR REPLACE INTO episodes VALUES ({', '.join('?' * len(_EPISODE_COLUMNS))})",
                ([getattr(e, c) for c in _EPISODE_COLUMNS] for e in episodes),
            )
            db.executemany(
                "INSERT OR REPLACE INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (
                        v.version,
                        v.policy_id,
                        epoch_ms(v.created_at),
                        v.learner_step,
                        v.trajectories_consumed,
                        v.sha256,
                        v.size_bytes,
                        json.dumps(v.metrics),
                    )
                    for v in versions
                ),
            )
            db.executemany(
                f"INSERT OR REPLACE INTO dead_letters VALUES ({', '.join('?' * 9)})",
                ([getattr(d, f.name) for f in fields(DeadLetterRow)] for d in dead_letters),
            )
            db.executemany(
                "INSERT OR REPLACE INTO progress VALUES (?, ?, ?, ?)",
                ((topic, p, lo, hi) for (topic, p), (lo, hi) in progress.items()),
            )

    def forget_below(self, partition: int, low: int) -> None:
        """Drop episodes of ``partition`` that retention deleted from the topic (offsets below ``low``)."""
        with self.connect() as db:
            db.execute('DELETE FROM episodes WHERE partition = ? AND "offset" < ?', (partition, low))

    # --- read by the pages ---

    def episodes(self, filters: Filters, page_size: int = PAGE_SIZE) -> tuple[list[EpisodeRow], int]:
        """One page of the episodes that match, in the filters' order, and how many match in all."""
        where, params = filters.where()
        direction = "DESC" if filters.descending else "ASC"
        # Ties broken by position, so pages never repeat or skip a row.
        order = f'{SORTS[filters.sort]} {direction}, partition {direction}, "offset" {direction}'
        with self.connect() as db:
            total = db.execute(f"SELECT count(*) FROM episodes WHERE {where}", params).fetchone()[0]
            rows = db.execute(
                f"SELECT * FROM episodes WHERE {where} ORDER BY {order} LIMIT ? OFFSET ?",
                [*params, page_size, (filters.page - 1) * page_size],
            ).fetchall()
        return [_episode(r) for r in rows], total

    def episode(self, partition: int, offset: int) -> EpisodeRow | None:
        """The row of the episode at ``partition``/``offset``, if indexed."""
        with self.connect() as db:
            row = db.execute('SELECT * FROM episodes WHERE partition = ? AND "offset" = ?', (partition, offset))
            found = row.fetchone()
        return None if found is None else _episode(found)

    def find(self, episode_id: str) -> EpisodeRow | None:
        """The episode with this id (the last one recorded, should a collector have published it twice)."""
        with self.connect() as db:
            found = db.execute(
                "SELECT * FROM episodes WHERE episode_id = ? ORDER BY published_ms DESC LIMIT 1", (episode_id,)
            ).fetchone()
        return None if found is None else _episode(found)

    def choices(self) -> dict[str, list[str]]:
        """The values the filters' drop-downs offer: templates and collectors seen."""
        with self.connect() as db:
            return {
                column: [v for (v,) in db.execute(f"SELECT DISTINCT {column} FROM episodes ORDER BY {column}")]
                for column in ("task_template", "collector_id")
            }

    def versions(self) -> list[VersionRow]:
        """Every indexed weight version, newest first."""
        with self.connect() as db:
            rows = db.execute("SELECT * FROM versions ORDER BY version DESC").fetchall()
        return [VersionRow(*r[:7], metrics=json.loads(r[7])) for r in rows]

    def newest_version_at(self, ms: int) -> int:
        """The newest version published at or before ``ms`` (0: none was)."""
        with self.connect() as db:
            (found,) = db.execute("SELECT max(version) FROM versions WHERE created_ms <= ?", (ms,)).fetchone()
        return found or 0

    def dead_letters(self, page: int = 1, page_size: int = PAGE_SIZE) -> tuple[list[DeadLetterRow], int]:
        """One page of dead letters, newest first, and how many there are."""
        with self.connect() as db:
            total = db.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
            rows = db.execute(
                'SELECT * FROM dead_letters ORDER BY published_ms DESC, partition, "offset" LIMIT ? OFFSET ?',
                (page_size, (page - 1) * page_size),
            ).fetchall()
        return [DeadLetterRow(*r) for r in rows], total

    def success_by_version(self) -> list[tuple[str, int, int, int]]:
        """(template, version that acted last in the episode, episodes, successes), by template then version."""
        with self.connect() as db:
            return db.execute(
                "SELECT task_template, max_version, count(*), sum(success) FROM episodes "
                "GROUP BY task_template, max_version ORDER BY task_template, max_version"
            ).fetchall()

    def success_over_time(self, buckets: int = 8) -> tuple[list[int], list[tuple[str, int, int, int]]]:
        """The start (epoch ms) of up to ``buckets`` equal spans of episode end times, a minute at least, and per
        (template, span): (template, span index, episodes, successes)."""
        with self.connect() as db:
            first, last = db.execute("SELECT min(ended_ms), max(ended_ms) FROM episodes").fetchone()
            if first is None:
                return [], []
            width = max(60_000, -(-(last - first + 1) // buckets))
            rows = db.execute(
                "SELECT task_template, (ended_ms - ?) / ?, count(*), sum(success) FROM episodes "
                "GROUP BY 1, 2 ORDER BY 1, 2",
                (first, width),
            ).fetchall()
        return [first + i * width for i in range(-(-(last - first + 1) // width))], rows

    def coverage(self, topic: str, high: Mapping[int, int], low: Mapping[int, int]) -> Coverage:
        """Records of ``topic`` indexed, of those between its low and high watermarks."""
        ranges = self.progress(topic)
        indexed = sum(min(hi, high.get(p, hi)) - max(lo, low.get(p, lo)) for p, (lo, hi) in ranges.items())
        return Coverage(max(0, indexed), sum(high[p] - low.get(p, 0) for p in high))


def _has_meta(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is not None


def _episode(row: tuple[Any, ...]) -> EpisodeRow:
    values = dict(zip(_EPISODE_COLUMNS, row, strict=True))
    values["success"] = bool(values["success"])
    return EpisodeRow(**values)


def dead_letter_row(letter: DeadLetter, partition: int, offset: int, published_ms: int) -> DeadLetterRow:
    """The index row of a dead letter read at ``partition``/``offset`` of ``{run}.dlq``."""
    return DeadLetterRow(
        partition=partition,
        offset=offset,
        published_ms=published_ms,
        topic=letter.topic,
        source_partition=letter.partition,
        source_offset=letter.offset,
        error_class=letter.error_class,
        error_message=letter.error_message,
        consumer=letter.consumer,
    )
