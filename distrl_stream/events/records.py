"""Typed event records: frozen, slotted dataclasses that mirror the Avro schemas in ``schemas/`` field for field.

Conventions (the contract every role codes against):

- Timestamps are timezone-aware UTC ``datetime`` values with millisecond precision (Avro ``timestamp-millis``);
  :func:`utc_now` gives one. A value with microseconds comes back truncated to the millisecond.
- Avro arrays are lists, maps are dicts, optional values are ``None``; ``Tensor.shape`` is a tuple.
- Every record is keyword-only: ``Step(observation=..., action_text=..., ...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

import numpy as np

T = TypeVar("T")


def utc_now() -> datetime:
    """The current UTC time at millisecond precision: what an Avro ``timestamp-millis`` field holds exactly."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond - now.microsecond % 1000)


def epoch_ms(value: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime (Kafka's timestamp unit).

    Raises:
        ValueError: ``value`` is naive (its time zone would be a guess).
    """
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value}: give an aware one (e.g. datetime.now(UTC))")
    return (value - _EPOCH) // timedelta(milliseconds=1)


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC datetime of a Kafka timestamp (milliseconds since the Unix epoch)."""
    return _EPOCH + timedelta(milliseconds=ms)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _builder(cls: type[T]) -> Callable[[dict[str, Any]], T]:
    """A constructor from a dict holding every field, for decoding: a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``, which makes it twice as slow, and decoding trajectories is the learner's hot path.
    """
    setters = [(name, getattr(cls, name).__set__) for name in cls.__slots__]  # type: ignore[attr-defined]
    new = object.__new__

    def build(d: dict[str, Any]) -> T:
        obj = new(cls)
        for name, set_field in setters:
            set_field(obj, d[name])
        return obj

    return build


class Termination(StrEnum):
    """Why an episode ended (Avro enum ``distrl.Termination``)."""

    SUCCESS = "success"
    FAILURE = "failure"
    TRUNCATED = "truncated"  # hit the horizon
    ENV_ERROR = "env_error"
    INFERENCE_ERROR = "inference_error"
    ABANDONED = "abandoned"  # the collector stopped mid-episode (shutdown)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    """A dense array on the wire: little-endian bytes in C order, numpy dtype name, shape."""

    data: bytes
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        # Decoded Avro arrays are lists; a tuple keeps equality independent of how the record was built.
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(self.shape))

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> Tensor:
        """Wrap a numpy array (any layout or byte order; the wire form is C-order little-endian)."""
        array = np.asarray(array)
        little = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
        return cls(data=little.tobytes(order="C"), dtype=array.dtype.name, shape=tuple(array.shape))

    @classmethod
    def from_token_ids(cls, ids: Sequence[int]) -> Tensor:
        """Token ids in the narrowest integer type that holds them: uint16 for vocabularies under 65,536 tokens
        (SmolLM2, Llama 2, the local models), else int32. Two bytes a token halve a prompt's share of a step."""
        array = np.asarray(ids, dtype=np.int64)
        narrow = np.uint16 if array.size == 0 or (array.min() >= 0 and array.max() < 1 << 16) else np.int32
        return cls.from_numpy(array.astype(narrow))

    def to_numpy(self) -> np.ndarray:
        """A read-only numpy view of the bytes with the recorded dtype and shape."""
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(self.shape)

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        return {"data": self.data, "dtype": self.dtype, "shape": self.shape}

    @classmethod
    def from_avro(cls, d: dict[str, Any]) -> Tensor:
        """Build from the dict fastavro read with the current schema (takes ownership of ``d``)."""
        d["shape"] = tuple(d["shape"])
        return _build_tensor(d)


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One step of an episode (Avro ``distrl.Step``); field meanings are documented in ``schemas/Step.avsc``."""

    observation: str
    screenshot_uri: str | None = None
    screenshot_sha256: str | None = None
    candidates: list[str] = field(default_factory=list)
    action_text: str
    action: str
    valid: bool
    invalid_reason: str | None = None
    reward: float
    done: bool
    behaviour_logprob: float
    token_ids: Tensor
    token_logprobs: Tensor
    policy_version: int
    inference_latency_s: float
    env_latency_s: float
    server: str = ""
    adapter_sha256: str | None = None
    prompt_token_ids: Tensor | None = None
    mode: str | None = None

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        d = {name: getattr(self, name) for name in _STEP_FIELDS}
        d["token_ids"] = self.token_ids.to_avro()
        d["token_logprobs"] = self.token_logprobs.to_avro()
        if self.prompt_token_ids is not None:
            d["prompt_token_ids"] = self.prompt_token_ids.to_avro()
        return d

    @classmethod
    def from_avro(cls, d: dict[str, Any]) -> Step:
        """Build from the dict fastavro read with the current schema (takes ownership of ``d``)."""
        d["token_ids"] = Tensor.from_avro(d["token_ids"])
        d["token_logprobs"] = Tensor.from_avro(d["token_logprobs"])
        if d["prompt_token_ids"] is not None:
            d["prompt_token_ids"] = Tensor.from_avro(d["prompt_token_ids"])
        return _build_step(d)


_build_tensor = _builder(Tensor)
_build_step = _builder(Step)
_STEP_FIELDS = Step.__slots__


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryEvent:
    """One finished episode (Avro ``distrl.TrajectoryEvent`` v4), keyed by ``episode_id`` on ``{run}.trajectories``.

    ``final_observation`` / ``final_candidates`` (v2): what a truncated episode saw after its last step, s_L, so the
    learner can bootstrap V(s_L); None / empty for every other episode and for records written with v1.
    ``Step.prompt_token_ids`` (v3): the prompt as the server tokenised it; None in records written before.
    ``Step.mode`` (v4): how the step's action was asked, ``choice`` or ``free`` (a choice-mode screen without
    candidates is asked in free mode); None in records written before, where the episode's ``mode`` holds.
    ``base_fingerprint`` (v4): the acting base model's fingerprint (config and weight files), so a learner tells a
    different model in a folder of the same name apart; "" when unknown.
    """

    AVRO_NAME: ClassVar[str] = "distrl.TrajectoryEvent"

    run: str
    episode_id: str
    collector_id: str
    env_kind: str
    task_id: str
    task_template: str
    instruction: str
    split: str
    mode: str
    base_model: str
    started_at: datetime
    ended_at: datetime
    termination: Termination
    total_reward: float
    success: bool
    steps: list[Step]
    final_observation: str | None = None
    final_candidates: list[str] = field(default_factory=list)
    base_fingerprint: str = ""

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        d = {name: getattr(self, name) for name in _TRAJECTORY_FIELDS}
        d["steps"] = [step.to_avro() for step in self.steps]
        return d

    @classmethod
    def from_avro(cls, d: dict[str, Any]) -> TrajectoryEvent:
        """Build from the dict fastavro read with the current schema (takes ownership of ``d``)."""
        d["termination"] = Termination(d["termination"])
        d["steps"] = [Step.from_avro(step) for step in d["steps"]]
        return _build_trajectory(d)


_TRAJECTORY_FIELDS = TrajectoryEvent.__slots__
_build_trajectory = _builder(TrajectoryEvent)


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightVersionEvent:
    """A published policy version (Avro ``distrl.WeightVersionEvent`` v2), keyed by ``policy_id`` on ``{run}.weights``.

    ``base_fingerprint`` (v2) is the base model's :func:`~distrl_stream.artifacts.model_fingerprint`; "" in events
    written with v1.
    """

    AVRO_NAME: ClassVar[str] = "distrl.WeightVersionEvent"

    policy_id: str
    version: int
    base_model: str
    adapter_uri: str
    sha256: str
    size_bytes: int
    created_at: datetime
    learner_step: int
    trajectories_consumed: int
    metrics: dict[str, float] = field(default_factory=dict)
    base_fingerprint: str = ""

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        return {name: getattr(self, name) for name in _WEIGHT_FIELDS}

    @classmethod
    def from_avro(cls, d: dict[str, Any]) -> WeightVersionEvent:
        """Build from the dict fastavro read with the current schema (takes ownership of ``d``)."""
        return _build_weight(d)


_WEIGHT_FIELDS = WeightVersionEvent.__slots__
_build_weight = _builder(WeightVersionEvent)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricEvent:
    """Measurements of one role instance (Avro ``distrl.MetricEvent`` v2), on ``{run}.metrics``."""

    AVRO_NAME: ClassVar[str] = "distrl.MetricEvent"

    run: str
    role: str
    source_id: str
    timestamp: datetime
    values: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        return {name: getattr(self, name) for name in _METRIC_FIELDS}

    @classmethod
    def from_avro(cls, d: dict[str, Any]) -> MetricEvent:
        """Build from the dict fastavro read with the current schema (takes ownership of ``d``)."""
        return _build_metric(d)


_METRIC_FIELDS = MetricEvent.__slots__
_build_metric = _builder(MetricEvent)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """A record a consumer could not use (Avro ``distrl.DeadLetter``), on ``{run}.dlq``: where it was and why."""

    AVRO_NAME: ClassVar[str] = "distrl.DeadLetter"

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error_class: str
    error_message: str
    timestamp: datetime
    consumer: str
    original_timestamp: datetime | None = None

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        return {name: getattr(self, name) for name in _DEAD_LETTER_FIELDS}

    @classmethod
    def from_avro(cls, d: dict[str, Any]) -> DeadLetter:
        """Build from the dict fastavro read with the current schema (takes ownership of ``d``)."""
        return _build_dead_letter(d)


_DEAD_LETTER_FIELDS = DeadLetter.__slots__
_build_dead_letter = _builder(DeadLetter)

Event = TrajectoryEvent | WeightVersionEvent | MetricEvent | DeadLetter
EVENT_TYPES: tuple[type[Event], ...] = (TrajectoryEvent, WeightVersionEvent, MetricEvent, DeadLetter)


def event_key(event: Event) -> bytes:
    """The Kafka message key that gives an event its meaning: episode id, policy id, source, original position."""
    if isinstance(event, TrajectoryEvent):
        return event.episode_id.encode()
    if isinstance(event, WeightVersionEvent):
        return event.policy_id.encode()
    if isinstance(event, MetricEvent):
        return f"{event.role}/{event.source_id}".encode()
    return f"{event.topic}/{event.partition}/{event.offset}".encode()
