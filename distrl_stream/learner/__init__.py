"""The learner role: replay buffer + DPER (``buffer``), A-RIDE and the baselines (``aride``), critics (``critics``)."""
