"""Event pipeline throughput: Avro trajectory events end to end, against raw bytes of the same sizes.

Each round sends N realistic trajectories (20 steps, ~500-character screen texts; ``distrl_stream.testing.samples``)
through the real broker twice, side by side:

- **avro**: encode (Confluent wire format) + produce (the ``Producer`` wrapper: idempotent, acks=all, lz4), then
  consume (the ``Consumer`` wrapper, batch ``consume``) + decode back to typed records;
- **raw**: the same payload bytes, already encoded, through the same produce and consume calls (no serde).

Both run in one thread of one process, pinned to one CPU (librdkafka's threads included): the "one core" of the
target. The broker (a JVM) runs outside it. Rates are trajectories per second over the whole produce-then-consume
path; the median of the rounds counts.

Headline (issue 3): ``ratio`` = Avro events/s ÷ raw messages/s end to end (target ≥ 0.5; the median over rounds
of the two paths' ratio within a round);
``metrics.trajectories_per_s`` (target ≥ 2,000), plus serde-only encode/decode rates.

Usage: ``python bench/pipeline.py [--quick] [--bootstrap HOST:PORT]`` writes ``bench/results/pipeline.json``.
Without ``--bootstrap`` an embedded broker is started from ``$KAFKA_HOME`` in a temporary folder.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from distrl_stream.cli.bench import write_results
from distrl_stream.config import KafkaConfig
from distrl_stream.events import TrajectoryEvent, decode, encode
from distrl_stream.kafka import Admin, Consumer, Producer, TopicSpec
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.install import find_kafka_home
from distrl_stream.testing.samples import sample_trajectory

TARGET_RATIO = 0.5
TARGET_TRAJECTORIES_PER_S = 2000.0
PARTITIONS = 4  # the default of {run}.trajectories


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def cpu_timed(fn: Callable[[], tuple[float, float]]) -> tuple[float, float, float]:
    """(produce wall s, consume wall s, CPU s of this process, librdkafka's threads included) of one round."""
    started = time.process_time()
    produce_s, consume_s = fn()
    return produce_s, consume_s, time.process_time() - started


def consume_all(kafka: KafkaConfig, topic: str, count: int, handle: Callable[[bytes], object]) -> None:
    """Read ``count`` records of ``topic`` from the start (no group), passing each value to ``handle``."""
    with Consumer(kafka) as consumer:
        consumer.assign_from_start(topic, range(PARTITIONS))
        got = 0
        deadline = time.monotonic() + 300
        while got < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {count} records of {topic}")
            for msg in consumer.consume(500, 1.0):
                handle(msg.value())
                got += 1


def avro_round(kafka: KafkaConfig, admin: Admin, events: list[TrajectoryEvent], topic: str) -> tuple[float, float]:
    """Encode + produce, then consume + decode; returns (produce seconds, consume seconds)."""
    admin.create_topics([TopicSpec(topic, PARTITIONS)])
    first: list[object] = []

    def handle(value: bytes) -> None:
        event = decode(value)
        if not first:
            first.append(event)

    def produce() -> None:
        with Producer(kafka, client_id="bench-avro") as producer:
            for event in events:
                producer.produce_event(topic, event)
            producer.flush(120)

    t_produce = timed(produce)
    t_consume = timed(lambda: consume_all(kafka, topic, len(events), handle))
    if first[0] not in events:  # a cheap check that the path really round-trips
        raise RuntimeError("decoded event does not match any sent one")
    admin.delete_topics([topic])
    return t_produce, t_consume


def raw_round(kafka: KafkaConfig, admin: Admin, payloads: list[tuple[bytes, bytes]], topic: str) -> tuple[float, float]:
    """Produce pre-encoded bytes, then consume them untouched; returns (produce seconds, consume seconds)."""
    admin.create_topics([TopicSpec(topic, PARTITIONS)])
    sink: list[bytes] = []

    def produce() -> None:
        with Producer(kafka, client_id="bench-raw") as producer:
            for key, value in payloads:
                producer.produce(topic, value, key)
            producer.flush(120)

    t_produce = timed(produce)
    t_consume = timed(lambda: consume_all(kafka, topic, len(payloads), sink.append))
    admin.delete_topics([topic])
    return t_produce, t_consume


def run(kafka: KafkaConfig, n: int, rounds: int, quick: bool) -> dict[str, object]:
    rng = random.Random(0)
    events = [sample_trajectory(rng, run="bench") for _ in range(n)]
    payloads = [(e.episode_id.encode(), encode(e)) for e in events]
    sizes = [len(v) for _, v in payloads]
    # The inputs live for the whole run: keep them out of the garbage collector's scans, which would otherwise
    # grow with N and charge the Avro path (the one that allocates) for the benchmark's own data.
    gc.freeze()

    # deque(maxlen=0) runs an iterator to the end, dropping the results (as a consumer drops what it has handled).
    t_encode = timed(lambda: deque((encode(e) for e in events), maxlen=0))
    t_decode = timed(lambda: deque((decode(v) for _, v in payloads), maxlen=0))
    cpu_started = time.process_time()
    for event in events:
        decode(encode(event))
    serde_cpu = time.process_time() - cpu_started

    admin = Admin(kafka)
    avro_rates, raw_rates, avro_phases, raw_phases = [], [], [], []
    avro_cpu, raw_cpu = [], []
    for r in range(rounds):
        # Alternate which path goes first so drift in the machine's load does not favour one.
        order = ("raw", "avro") if r % 2 == 0 else ("avro", "raw")
        for path in order:
            topic = f"bench-{path}-{r}-{os.getpid()}"
            if path == "avro":
                p, c, cpu = cpu_timed(lambda t=topic: avro_round(kafka, admin, events, t))
                avro_rates.append(n / (p + c))
                avro_phases.append((n / p, n / c))
                avro_cpu.append(n / cpu)
            else:
                p, c, cpu = cpu_timed(lambda t=topic: raw_round(kafka, admin, payloads, t))
                raw_rates.append(n / (p + c))
                raw_phases.append((n / p, n / c))
                raw_cpu.append(n / cpu)
        print(f"round {r + 1}/{rounds}: avro {avro_rates[-1]:,.0f}/s  raw {raw_rates[-1]:,.0f}/s", file=sys.stderr)

    avro = statistics.median(avro_rates)
    raw = statistics.median(raw_rates)
    # Each round's two paths ran back to back: their ratio cancels the shared machine's load drift best.
    ratios = [a / r for a, r in zip(avro_rates, raw_rates, strict=True)]
    return {
        "name": "pipeline",
        "quick": quick,
        "ratio": round(statistics.median(ratios), 3),
        "target": TARGET_RATIO,
        "metrics": {
            "trajectories_per_s": round(avro, 1),
            "trajectories_per_s_target": TARGET_TRAJECTORIES_PER_S,
            "raw_messages_per_s": round(raw, 1),
            "encode_per_s": round(n / t_encode, 1),
            "decode_per_s": round(n / t_decode, 1),
            "serde_round_trips_per_cpu_s": round(n / serde_cpu, 1),
            "avro_produce_per_s": round(statistics.median(p for p, _ in avro_phases), 1),
            "avro_consume_per_s": round(statistics.median(c for _, c in avro_phases), 1),
            "raw_produce_per_s": round(statistics.median(p for p, _ in raw_phases), 1),
            "raw_consume_per_s": round(statistics.median(c for _, c in raw_phases), 1),
            # Per CPU-second of the client process: what the load of other processes on a shared machine cannot skew.
            "avro_trajectories_per_cpu_s": round(statistics.median(avro_cpu), 1),
            "raw_messages_per_cpu_s": round(statistics.median(raw_cpu), 1),
            "ratio_cpu": round(statistics.median(avro_cpu) / statistics.median(raw_cpu), 3),
            "ratio_rounds": [round(x, 3) for x in ratios],
            "avro_e2e_rounds": [round(x, 1) for x in avro_rates],
            "raw_e2e_rounds": [round(x, 1) for x in raw_rates],
            "trajectories": n,
            "rounds": rounds,
            "steps_per_trajectory": len(events[0].steps),
            "message_bytes_mean": round(statistics.mean(sizes)),
            "partitions": PARTITIONS,
            "compression": kafka.compression,
            "pinned_cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: fewer trajectories and rounds")
    parser.add_argument("--bootstrap", help="use this cluster instead of starting an embedded broker")
    parser.add_argument("--trajectories", type=int, help="trajectories per round (default 1500 quick, 6000 full)")
    parser.add_argument("--rounds", type=int, help="rounds per path (default 3 quick, 5 full)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the benchmark process to one CPU")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # librdkafka's start-up retries are not news here
    n = args.trajectories or (1500 if args.quick else 6000)
    rounds = args.rounds or (3 if args.quick else 5)
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        # Before any client exists, so librdkafka's threads inherit the single CPU too.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    with tempfile.TemporaryDirectory(prefix="distrl-bench-") as tmp:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            home = Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None
            broker = EmbeddedBroker(Path(tmp) / "kafka", kafka_home=find_kafka_home(home), heap_mb=1024)
            bootstrap = broker.start()
        try:
            result = run(KafkaConfig(bootstrap_servers=bootstrap), n, rounds, args.quick)
        finally:
            if broker is not None:
                broker.stop()
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
