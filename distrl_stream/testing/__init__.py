"""Test doubles and benchmark helpers: stand-ins for a role or for real data, never used by the roles in production.

- :mod:`distrl_stream.testing.instant_learner`: a learner that "trains" in zero time (publishes version v+1 once a
  round of trajectories acted by v is in) and a no-op LoRA adapter of the learner's shape;
- :mod:`distrl_stream.testing.scripted`: the simulator's oracle with a share of random actions, answering like the
  inference client (warm-start demonstrations, random-play data);
- :mod:`distrl_stream.testing.samples`: synthetic events of realistic shape and size, deterministic per seed;
- :mod:`distrl_stream.testing.parity`: how far the learner's log π is from the log μ a server reported.

They live in the package (not under ``tests/``) because ``bench/`` uses them too. Held-out evaluation is a real
feature and lives with the collector (:mod:`distrl_stream.collector.evaluation`).
"""
