"""What a reader of ``{run}.weights`` checks before it uses a version event: one place for inference servers and
collectors alike (docs/design.md §3).

- :func:`check_version_event`: does the record name an adapter version at all? A version below 1, a sha256 or
  fingerprint that is not one, a negative size or count, a URI that names nothing: no reader can use it, so the
  reader that meets it first dead-letters it (``impossible value: …``) and every reader skips it. It runs inside
  :class:`~distrl_stream.kafka.follower.TopicFollower` (``check=``), where undecodable records are dead-lettered.
- :func:`base_mismatch`: is it an adapter of this reader's base model? The event carries the fingerprint of the
  learner's base (config and weight files, :func:`~.store.model_fingerprint`), so a different model in a folder of
  the same name is told apart. That depends on the reader, not the record: a server refuses the version, a collector
  does not take it as the learner's newest, each with one line naming both models; the record stays.

Where an adapter may be fetched from (``artifacts.store``) is the fetch's own check
(:class:`~.transport.AdapterSource`).
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

from distrl_stream.artifacts.transport import KafkaLocation
from distrl_stream.errors import ArtifactError, WeightEventError
from distrl_stream.events import WeightVersionEvent

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def check_version_event(event: WeightVersionEvent) -> None:
    """Refuse a version event that names no usable adapter version, whoever reads it.

    Raises:
        WeightEventError: the reason, naming the policy, the version and the field.
    """
    name = f"{event.policy_id or '<no policy id>'} v{event.version}"
    problems = []
    if not event.policy_id:
        problems.append("no policy id")
    if event.version < 1:
        problems.append("version below 1 (0 is the base model)")
    if not _HEX64.match(event.sha256):
        problems.append(f"sha256 {event.sha256[:70]!r} is not 64 hex digits")
    if event.base_fingerprint and not _HEX64.match(event.base_fingerprint):
        problems.append(f"base fingerprint {event.base_fingerprint[:70]!r} is not 64 hex digits")
    if event.size_bytes < 1:
        problems.append(f"size {event.size_bytes} bytes (an adapter holds files)")
    if event.learner_step < 0 or event.trajectories_consumed < 0:
        problems.append("negative learner step or trajectory count")
    uri_problem = _uri_problem(event.adapter_uri)
    if uri_problem:
        problems.append(uri_problem)
    if problems:
        raise WeightEventError(f"weight version {name}: {'; '.join(problems)}")


def base_mismatch(event: WeightVersionEvent, fingerprint: str, reader: str) -> str | None:
    """One line saying that ``event``'s adapter is for another base model than the reader's, or None.

    Args:
        event: the version event.
        fingerprint: the reader's base model fingerprint; "" skips the check, as does an event without one (written
            with WeightVersionEvent v1).
        reader: the reader and its base model, as the line names them (``this server serves 'tiny'``).
    """
    if not fingerprint or not event.base_fingerprint or event.base_fingerprint == fingerprint:
        return None
    return (
        f"{event.policy_id} v{event.version}: adapter for base model {event.base_model!r} (fingerprint "
        f"{event.base_fingerprint[:16]}…) but {reader} (fingerprint {fingerprint[:16]}…)"
    )


def _uri_problem(uri: str) -> str | None:
    try:
        parsed = urlparse(uri)
    except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
        return f"adapter URI {uri[:200]!r}: {exc}"
    if not uri.strip():
        return "no adapter URI"
    if parsed.scheme == "kafka":
        try:
            KafkaLocation.parse(uri)
        except ArtifactError as exc:
            return str(exc)
    elif parsed.scheme in ("", "file") and not parsed.path.startswith("/"):
        return f"adapter URI {uri[:200]!r} is not an absolute path"
    return None
