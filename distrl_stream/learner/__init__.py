"""The learner role (docs/learner.md).

- :mod:`.role`: :class:`~distrl_stream.learner.role.Learner`, the loop: ingest, updates, weight versions,
  checkpoints, metrics, round mode, warm start and offline pre-training;
- :mod:`.ingest`: the group consumer of ``{run}.trajectories`` in its own thread;
- :mod:`.records`: the data model: EpisodeRecord (from a TrajectoryEvent) and the padded batch (``collate``);
- :mod:`.trainer`: the policy (base + LoRA), critics, optimisers and one update of each algorithm;
- :mod:`.checkpoint`: atomic checkpoints and the ingest log;
- the algorithm: :mod:`.aride` (A-RIDE and the baselines), :mod:`.critics`, :mod:`.buffer` (replay + DPER).
"""
