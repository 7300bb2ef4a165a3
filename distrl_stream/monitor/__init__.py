"""The live monitor of a run: metric events → :class:`MonitorState` → rich dashboard or plain-text snapshot.

- :mod:`.state`: aggregation (rolling windows from cumulative counters, per-collector rows, versions, lag); pure.
- :mod:`.render`: the rich dashboard and the plain-text form.
- :mod:`.feed`: Kafka side: ``{run}.metrics`` history then live tail (no consumer group), learner group lag, DLQ.
- :mod:`.live`: :func:`snapshot_once` and :func:`watch`, what ``distrl-stream monitor`` (and ``up``) run.

Besides the dashboard, each role exports its own numbers: :mod:`.prometheus` (an HTTP endpoint per role) and
:mod:`.tensorboard` (the learner's optional scalars).
"""

from distrl_stream.monitor.state import MonitorState, Snapshot

__all__ = ["MonitorState", "Snapshot"]
