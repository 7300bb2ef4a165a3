"""Run explorer: seconds from opening a run of 100,000 episodes (no index yet) to its first page of episodes.

A generated ``{run}.trajectories`` (the default 4 partitions) holds ``--episodes`` realistic trajectories (20 steps,
~500-character screen texts: ``distrl_stream.testing.samples``, ~20 KB of Avro each) of 4 templates and 8
collectors. Each round starts the explorer (``distrl_stream.explorer.Explorer``, as ``replay explore`` does) on an
index file that does not exist yet and polls its ``/episodes`` page over HTTP until the page holds a full page of
rows; the time counts from before the explorer is built, so it includes reading the topics' metadata, the newest
chunk of each partition and rendering the page. The median of the rounds counts.

Headline (issue 34): ``ratio`` = ``metrics.first_page_s`` ÷ the 2 s target (≤ 1 meets it). Also measured:

- ``reopen_first_page_s``: the same with the index left by the round before (partly filled);
- ``backfill_records_per_s``: how fast the history is indexed behind the first page (over ``backfill_window_s``);
- ``filter_page_s``: the slowest of a few filtered, sorted pages (with their counts) on an index holding every
  episode of the topic (written directly from the generated rows, so it does not wait for the backfill).

Usage: ``python bench/explorer.py [--quick] [--bootstrap HOST:PORT]`` writes ``bench/results/explorer.json``.
Without ``--bootstrap`` an embedded broker is started from ``$KAFKA_HOME`` in a temporary folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from distrl_stream.cli.bench import write_results
from distrl_stream.config import KafkaConfig, load_config
from distrl_stream.events import Termination, encode, event_key
from distrl_stream.explorer import Explorer
from distrl_stream.explorer.index import PAGE_SIZE, EpisodeRow, Filters, Index
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.install import find_kafka_home
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import ensure_run_topics
from distrl_stream.testing.samples import sample_trajectory

TARGET_S = 2.0
TEMPLATES = ("open_setting", "toggle_wifi", "set_alarm", "search_contact")
POOL = 200  # distinct trajectories, each published many times under fresh ids (generating 100,000 would take hours)
RUN = "explorer-bench"


def publish(kafka: KafkaConfig, episodes: int) -> tuple[list[EpisodeRow], int]:
    """Fill ``{RUN}.trajectories``; returns each episode's index row (for the full-index queries) and the bytes sent."""
    rng = random.Random(34)
    pool = [sample_trajectory(rng, run=RUN) for _ in range(POOL)]
    partitions = load_config(None).kafka.trajectory_partitions
    rows: list[EpisodeRow] = []
    sent = 0
    with Producer(kafka) as producer:
        for i in range(episodes):
            success = rng.random() < 0.4
            event = dataclasses.replace(
                pool[i % POOL],
                episode_id=str(uuid.UUID(int=rng.getrandbits(128))),
                task_template=rng.choice(TEMPLATES),
                collector_id=f"collector-{rng.randrange(8)}",
                success=success,
                termination=Termination.SUCCESS if success else Termination.TRUNCATED,
            )
            data = encode(event)
            sent += len(data)
            partition = i % partitions
            producer.produce(f"{RUN}.trajectories", data, event_key(event), partition=partition)
            rows.append(EpisodeRow.of(event, partition, i // partitions, i, newest=0))
            if i % 10_000 == 9_999:
                print(f"published {i + 1:,} of {episodes:,}", file=sys.stderr)
        producer.flush()
    return rows, sent


def first_page(kafka: KafkaConfig, index: Path, timeout_s: float = 120.0) -> tuple[float, Explorer]:
    """Seconds from building the explorer to a full first page of episodes; returns the explorer still running."""
    started = time.perf_counter()
    explorer = Explorer(kafka, RUN, index, port=0)
    explorer.start()
    with httpx.Client() as client:
        while client.get(explorer.url + "episodes").text.count('<tr><td><a href="/episode/') < PAGE_SIZE:
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"no full first page within {timeout_s:.0f} s")
            time.sleep(0.01)  # the next poll; the tailer fills the index meanwhile
    return time.perf_counter() - started, explorer


def filter_pages(rows: list[EpisodeRow], folder: Path) -> float:
    """The slowest of a few filtered, sorted pages (with counts) on an index of every row."""
    index = Index(folder / "full.sqlite", {"run": RUN, "bootstrap_servers": "-"})
    index.write({}, rows)
    queries = [
        {},
        {"template": "toggle_wifi", "success": "no"},
        {"collector": "collector-3", "sort": "length", "order": "asc", "page": "40"},
        {"min_length": "20", "sort": "reward"},
    ]
    times = []
    for query in queries:
        started = time.perf_counter()
        index.episodes(Filters.parse(query))
        times.append(time.perf_counter() - started)
    return max(times)


def run(kafka: KafkaConfig, episodes: int, rounds: int, backfill_window_s: float, quick: bool) -> dict[str, object]:
    ensure_run_topics(load_config(None, run=RUN, kafka={"bootstrap_servers": kafka.bootstrap_servers}))
    started = time.perf_counter()
    rows, sent = publish(kafka, episodes)
    publish_s = time.perf_counter() - started
    cold: list[float] = []
    reopen: list[float] = []
    with tempfile.TemporaryDirectory(prefix="distrl-explorer-") as tmp:
        folder = Path(tmp)
        backfill_rate = 0.0
        for r in range(rounds):
            index = folder / f"round{r}.sqlite"
            seconds, explorer = first_page(kafka, index)
            cold.append(seconds)
            if r == 0:
                # Let the history come in behind the first page, and measure how fast it does.
                before = explorer.tailer.coverage().indexed
                time.sleep(backfill_window_s)
                backfill_rate = (explorer.tailer.coverage().indexed - before) / backfill_window_s
            explorer.stop()
            seconds, explorer = first_page(kafka, index)
            reopen.append(seconds)
            explorer.stop()
            print(f"round {r + 1}/{rounds}: first page {cold[-1]:.2f} s, reopened {reopen[-1]:.2f} s", file=sys.stderr)
        filter_s = filter_pages(rows, folder)
    first_page_s = statistics.median(cold)
    return {
        "name": "explorer",
        "quick": quick,
        "ratio": round(first_page_s / TARGET_S, 3),
        "target": 1.0,
        "metrics": {
            "first_page_s": round(first_page_s, 3),
            "first_page_target_s": TARGET_S,
            "first_page_rounds_s": [round(x, 3) for x in cold],
            "reopen_first_page_s": round(statistics.median(reopen), 3),
            "backfill_records_per_s": round(backfill_rate, 1),
            "backfill_window_s": backfill_window_s,
            "filter_page_s": round(filter_s, 4),
            "topic_episodes": episodes,
            "topic_avro_bytes": sent,  # before the producer's lz4
            "message_bytes_mean": round(sent / episodes),
            "steps_per_trajectory": rows[0].length,
            "page_size": PAGE_SIZE,
            "publish_s": round(publish_s, 1),
            "rounds": rounds,
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: 5,000 episodes, 2 rounds")
    parser.add_argument("--bootstrap", help="use this cluster instead of starting an embedded broker")
    parser.add_argument("--episodes", type=int, help="episodes in the topic (default 5,000 quick, 100,000 full)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # librdkafka's start-up retries are not news here
    episodes = args.episodes or (5_000 if args.quick else 100_000)
    rounds = 2 if args.quick else 3
    window = 10.0 if args.quick else 30.0
    with tempfile.TemporaryDirectory(prefix="distrl-bench-") as tmp:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            home = Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None
            broker = EmbeddedBroker(Path(tmp) / "kafka", kafka_home=find_kafka_home(home), heap_mb=1024)
            bootstrap = broker.start()
        try:
            result = run(KafkaConfig(bootstrap_servers=bootstrap), episodes, rounds, window, args.quick)
        finally:
            if broker is not None:
                broker.stop()
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
