"""A learner member's Prometheus metrics, scraped over HTTP."""

from __future__ import annotations

from distrl_stream.learner.metrics import Counters, LearnerMetrics
from distrl_stream.monitor.prometheus import RoleMetrics
from tests.monitor.scrape import scrape, serve, value


def test_learner_splits_update_statistics_into_losses_rho_and_the_rest(served: list[RoleMetrics]) -> None:
    counters = Counters(ingested=5, stale=1, dead=2, published=3)
    metrics = LearnerMetrics(
        "r1",
        "0",
        lambda: counters,
        version=lambda: 3,
        updates=lambda: 40,
        buffer=lambda: (5, 20, 0.002),
        consumer_lag=lambda: 7,
        ingest_queue=lambda: None,
        prompt_ids=lambda: (12, 3),
    )
    metrics.update(
        {
            "loss_policy": 0.5,
            "loss_critic": 0.25,
            "rho_mean": 1.1,
            "entropy": 0.9,
            "bad": float("nan"),
            "logp_mismatch_mean": 0.07,
            "logp_mismatch_max": 0.4,
            "logp_mismatch_steps": 5,
        }
    )
    metrics.policy_lag.observe(0)
    metrics.policy_lag.observe(4)
    samples = scrape(serve(metrics, served))

    learner = {"run": "r1", "role": "learner", "source": "0"}
    assert value(samples, "distrl_learner_trajectories_total", status="ingested", **learner) == 5
    assert value(samples, "distrl_learner_trajectories_total", status="stale") == 1
    assert value(samples, "distrl_learner_dlq_records_total") == 2
    assert value(samples, "distrl_learner_versions_published_total") == 3
    assert value(samples, "distrl_learner_updates_total") == 40
    assert value(samples, "distrl_learner_version") == 3
    assert value(samples, "distrl_learner_buffer_steps") == 20
    assert value(samples, "distrl_learner_consumer_lag_records") == 7
    assert value(samples, "distrl_learner_ingest_queue_records") is None
    assert value(samples, "distrl_learner_loss", term="policy") == 0.5
    assert value(samples, "distrl_learner_loss", term="critic") == 0.25
    assert value(samples, "distrl_learner_rho", stat="mean") == 1.1
    assert value(samples, "distrl_learner_update_stat", stat="entropy") == 0.9
    assert value(samples, "distrl_learner_update_stat", stat="loss_policy") is None
    assert value(samples, "distrl_learner_update_stat", stat="bad") is None  # NaN is left out
    assert value(samples, "distrl_learner_logp_mismatch_nats", stat="mean") == 0.07
    assert value(samples, "distrl_learner_logp_mismatch_nats", stat="max") == 0.4
    assert value(samples, "distrl_learner_update_stat", stat="logp_mismatch_mean") is None
    assert value(samples, "distrl_learner_update_stat", stat="logp_mismatch_steps") == 5
    assert value(samples, "distrl_learner_prompt_ids_total", status="checked") == 12
    assert value(samples, "distrl_learner_prompt_ids_total", status="mismatched") == 3
    assert value(samples, "distrl_learner_policy_lag_versions_bucket", le="1.0") == 1
    counters.ingested += 1
    assert value(scrape(f"127.0.0.1:{metrics.port}"), "distrl_learner_trajectories_total", status="ingested") == 6
