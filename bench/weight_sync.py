"""Weight sync: seconds from the learner's publish to every policy server serving the version, kafka:// vs file://.

Headline (issue 13): ``ratio`` = p50 of file:// ÷ p50 of kafka:// for the small LoRA (target ≥ 0.5: the transport
that works across hosts costs at most twice the local copy). Two real vLLM servers (CPU recipe, the tiny model) each
run the real weight watcher, as ``serve`` does, with a staging folder of its own; the learner side is
:func:`distrl_stream.artifacts.publish` + the weight-version event, as ``Learner.publish`` does after it has written
the adapter folder. A sample is the time from the start of the publish until BOTH watchers report the version loaded
(vLLM answered its ``load_lora_adapter``); versions are published one after the other.

Four series, each over ``--versions`` versions (default 20): {small, large} LoRA × {kafka, file}. The small LoRA is
the policy's own shape (rank 8 on all seven Qwen2 projections); the large one is rank 512 on the same modules (64x
the bytes), the most vLLM's ``--max-lora-rank`` allows, so both servers are started with --max-lora-rank 512.
Targets for the small LoRA: p50 < 1 s, p95 < 3 s (publish to all servers).

Usage: ``python bench/weight_sync.py [--quick] [--versions N]`` writes ``bench/results/weight_sync.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from distrl_stream.artifacts import adapter_dir, base_fingerprint, dir_size, publish, version_event
from distrl_stream.cli.bench import write_results
from distrl_stream.config import Config, InferenceConfig, ModelConfig, load_config
from distrl_stream.inference.server import InferenceServer, unload_all_adapters
from distrl_stream.inference.versions import WeightWatcher
from distrl_stream.kafka.broker import EmbeddedBroker
from distrl_stream.kafka.install import find_kafka_home
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, ensure_run_topics
from distrl_stream.policy.model import build_model
from distrl_stream.testing.instant_learner import write_noop_adapter

TARGET_RATIO = 0.5
SMALL_RANK, LARGE_RANK = 8, 512
SERVERS = 2


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def series(
    base: Config, store: str, adapter: Path, servers: list[InferenceServer], model_dir: Path, versions: int
) -> list[float]:
    """Publish ``versions`` versions of ``adapter`` through ``store``; seconds until both servers serve each."""
    run = f"sync-{store}-{adapter.name}"
    cfg = base.model_copy(update={"run": run, "artifacts": base.artifacts.model_copy(update={"store": store})})
    ensure_run_topics(cfg)
    fingerprint = base_fingerprint(cfg, model_dir)
    watchers = [
        WeightWatcher(
            cfg,
            server.url,
            source_id=f"server{i}",
            staging_dir=cfg.data_dir / f"server{i}" / run,  # each server's own data dir
            model_dir=model_dir,
        )
        for i, server in enumerate(servers)
    ]
    for watcher in watchers:
        watcher.start()
    samples: list[float] = []
    try:
        for watcher in watchers:
            if not watcher.caught_up.wait(120):
                raise SystemExit(f"watcher {watcher.source_id} did not catch up")
        with Producer(cfg.kafka, client_id="bench-learner") as producer:
            for version in range(1, versions + 1):
                folder = adapter_dir(cfg, version)  # the learner has written the version's folder (not timed)
                shutil.copytree(adapter, folder)
                started = time.monotonic()
                uri = publish(cfg, version, folder, producer)
                event = version_event(
                    cfg.model,
                    version,
                    folder,
                    adapter_uri=uri,
                    base_fingerprint=fingerprint,
                    learner_step=version,
                    trajectories_consumed=0,
                )
                producer.produce_event(TopicNames(cfg.run).weights, event)
                producer.flush()
                deadline = started + 120
                while not all(w.newest_version >= version for w in watchers):
                    failed = [w.failed or w.refused[-1:] for w in watchers if w.failed or w.refused]
                    if failed or time.monotonic() > deadline:
                        raise SystemExit(f"{run} v{version} not served by every server: {failed}")
                    time.sleep(0.002)
                samples.append(time.monotonic() - started)
    finally:
        for watcher in watchers:
            watcher.stop()
        for server in servers:
            unload_all_adapters(server.url)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 versions per series (a few minutes)")
    parser.add_argument("--versions", type=int, default=20, help="versions per series (at least 20 for p95)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    versions = 5 if args.quick else args.versions
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "tiny", "tiny", seed=0)
        home = Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None
        broker = EmbeddedBroker(root / "kafka", kafka_home=find_kafka_home(home), heap_mb=1024)
        bootstrap = broker.start()
        servers = [
            InferenceServer(
                model_dir,
                InferenceConfig(port=0, device="cpu", startup_timeout_s=600.0),
                ModelConfig(lora_rank=LARGE_RANK),
                root / f"vllm{i}.log",
            )
            for i in range(SERVERS)
        ]
        try:
            for server in servers:
                server.start()
            adapters = {
                "small": write_noop_adapter(model_dir, root / "adapters" / "small", ModelConfig(lora_rank=SMALL_RANK)),
                "large": write_noop_adapter(model_dir, root / "adapters" / "large", ModelConfig(lora_rank=LARGE_RANK)),
            }
            base = load_config(None, data_dir=root / "data", kafka={"bootstrap_servers": bootstrap})
            samples: dict[str, list[float]] = {}
            for size, adapter in adapters.items():
                for store in ("kafka", "file"):
                    samples[f"{size}_{store}"] = series(base, store, adapter, servers, model_dir, versions)
            sizes = {size: dir_size(adapter) for size, adapter in adapters.items()}
        finally:
            for server in servers:
                server.stop()
            broker.stop()
    metrics: dict[str, Any] = {}
    for name, values in samples.items():
        metrics[f"{name}_p50_s"] = percentile(values, 0.5)
        metrics[f"{name}_p95_s"] = percentile(values, 0.95)
        metrics[f"{name}_mean_s"] = statistics.fmean(values)
    metrics.update(
        {
            "small_adapter_bytes": sizes["small"],
            "large_adapter_bytes": sizes["large"],
            "size_factor": sizes["large"] / sizes["small"],
            "large_ratio": metrics["large_file_p50_s"] / metrics["large_kafka_p50_s"],
            "small_p50_target_s": 1.0,
            "small_p95_target_s": 3.0,
            "versions_per_series": versions,
            "servers": SERVERS,
            "lora_ranks": [SMALL_RANK, LARGE_RANK],
            "chunk_bytes": load_config(None).artifacts.chunk_bytes,
            "cpu_count": os.cpu_count(),
            "loadavg_start": list(load_start),
            "loadavg_end": list(os.getloadavg()),
            "samples_s": samples,
        }
    )
    ratio = metrics["small_file_p50_s"] / metrics["small_kafka_p50_s"]
    result = {"name": "weight_sync", "quick": args.quick, "ratio": ratio, "target": TARGET_RATIO, "metrics": metrics}
    write_results(__file__, result, quick=args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
