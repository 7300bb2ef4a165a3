"""The run explorer (`distrl-stream replay explore`): a local, read-only web app over a run's topics.

- :mod:`.index`: the SQLite index of episode summaries, versions and dead letters (filters, sorting, counts).
- :mod:`.tailer`: fills it from Kafka without a consumer group, newest records first, then live and backwards.
- :mod:`.pages`: the HTML, everything from the log escaped.
- :mod:`.server`: :class:`Explorer`, the HTTP server on the standard library, with its token rule.
"""

from distrl_stream.explorer.server import Explorer

__all__ = ["Explorer"]
