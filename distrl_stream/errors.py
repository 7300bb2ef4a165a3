"""Typed errors. Each carries the context a user needs to act on it; none is swallowed silently."""

from __future__ import annotations


class DistrlError(Exception):
    """Base of every error distrl-stream raises on purpose."""


class ConfigError(DistrlError):
    """A configuration value is invalid. The message is one line naming the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


# --- events and Kafka (issue 3) ---


class SchemaStoreError(DistrlError):
    """The Avro schema store is inconsistent: a missing or unparsable .avsc, or a schema that changed under its id."""


class ImpossibleEventError(DistrlError):
    """A decodable event that no reader can use (a negative version, a hash that is not one, a URI that names
    nothing). Its reader dead-letters it as ``impossible value: …`` and goes on (docs/design.md §3)."""


class WeightEventError(ImpossibleEventError):
    """A decodable ``WeightVersionEvent`` that names no usable adapter version (``artifacts/weights.py``)."""


class EventEncodeError(DistrlError):
    """An event could not be encoded: a field has the wrong type or a required value is missing."""


class EventDecodeError(DistrlError):
    """Bytes could not be decoded into an event. ``reason`` names the problem in a few words.

    Reasons: ``empty``, ``too short``, ``bad magic byte``, ``unknown schema id``, ``truncated``, ``trailing bytes``,
    ``malformed``, ``unexpected type``.
    """

    def __init__(self, reason: str, detail: str = "", schema_id: int | None = None) -> None:
        where = f" (schema id {schema_id})" if schema_id is not None else ""
        super().__init__(f"cannot decode event: {reason}{where}" + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail
        self.schema_id = schema_id


class RegistryError(DistrlError):
    """The Schema Registry (``kafka.schema_registry_url``) refused a request or answered nonsense."""


class RegistryUnavailableError(RegistryError):
    """The Schema Registry could not be reached within the client's timeout and retries."""


class IncompatibleSchemaError(RegistryError):
    """An event schema would break its subject's BACKWARD_TRANSITIVE compatibility; ``subject`` names it."""

    def __init__(self, subject: str, message: str) -> None:
        super().__init__(f"{subject}: {message}")
        self.subject = subject


class KafkaClientError(DistrlError):
    """A Kafka client failed: invalid client configuration, undeliverable messages, a failed admin operation."""


class KafkaAuthenticationError(KafkaClientError):
    """The cluster refused the client's credentials or TLS handshake (wrong password, untrusted certificate):
    retrying with the same settings cannot succeed. The message names the user and address, never the secret."""


class DeliveryError(KafkaClientError):
    """A producer's flush found messages unacknowledged: ``failed`` failed for good since the previous flush (they
    are lost), ``pending`` were still queued at its timeout (they may yet arrive, or fail by a later flush)."""

    def __init__(self, message: str, *, failed: int, pending: int) -> None:
        super().__init__(message)
        self.failed = failed
        self.pending = pending


class RecordRejectedError(KafkaClientError):
    """The producer refused to queue one record (too large, unknown topic or partition); the producer itself is
    fine, so the caller may go on with the next record."""


class BrokerError(DistrlError):
    """The embedded broker could not be found, started or stopped. Start failures end with the broker's log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- broker log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


class KafkaInstallError(DistrlError):
    """An Apache Kafka release could not be installed: download failed, checksum mismatch, or not a Kafka layout."""


# --- policy and inference (issue 5) ---


class ModelBuildError(DistrlError):
    """A local policy model could not be built (unknown size, target folder exists, ...)."""


class ArtifactError(DistrlError):
    """A policy artifact (adapter folder) is missing, malformed, or its URI cannot be resolved."""


class InferenceError(DistrlError):
    """Base of the inference service's errors: the server or a request to it failed."""


class ServerStartError(InferenceError):
    """The vLLM server did not become ready. The message ends with the tail of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(f"{message}\n--- server log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


class InferenceUnavailableError(InferenceError):
    """The server could not be reached or kept failing (connection refused, timeouts, 5xx) after all retries."""


class InferenceRequestError(InferenceError):
    """The server rejected a request (4xx): retrying the same request cannot succeed."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code


class ArtifactUploadError(ArtifactError):
    """The object store of ``artifacts.store`` refused an adapter's upload, retries included (an outage, a throttle,
    refused credentials): the version is lost, the adapter folder stays on the learner's disk."""


class ArtifactIntegrityError(ArtifactError):
    """A fetched artifact's bytes are not what was published: ``reason`` is ``chunk`` (a chunk's own sha256),
    ``hash`` (the whole folder's sha256 or size) or ``missing`` (records or files not there)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class AdapterVerificationError(InferenceError):
    """A weight version's adapter is not served: ``reason`` is ``chunk``, ``hash``, ``missing``, ``malformed`` (its URI
    cannot be fetched from) or ``base_model`` (its base model's fingerprint differs from the server's)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReplayBufferError(DistrlError):
    """The replay buffer refused an operation (an episode it cannot store, a bad priority, a bad snapshot)."""


class EnvError(DistrlError):
    """An environment failed (browser died, adb failed, a task it cannot run); the episode cannot go on."""


class EpisodeStateError(EnvError):
    """``step`` was called before ``reset`` or after the episode ended: a bug in the caller, not bad model output."""


class AdbError(EnvError):
    """An adb command failed or timed out. The message holds the command and adb's own error output."""


class JudgeError(DistrlError):
    """The task-completion judge could not give a verdict (unreachable, timed out, or answered nonsense)."""


class ScreenshotError(DistrlError):
    """A step's screenshot cannot be read back: missing, unreadable, or not the bytes its sha256 names."""


class ActionConstraintError(DistrlError):
    """An action's tokens are impossible under the choice constraint they were said to be sampled with."""


# --- learner role (issue 7) ---


class LearnerError(DistrlError):
    """The learner role cannot go on: bad warm-start adapter, unusable replay source, failed publish."""


class TrajectoryError(LearnerError, ImpossibleEventError):
    """A decodable trajectory event that is not a usable episode (no steps, no action tokens, a step marked done
    before the last, non-finite numbers). The learner dead-letters it and goes on."""


class CheckpointError(LearnerError):
    """A learner checkpoint is missing a part, is malformed, or belongs to another run or model shape."""


class EvaluationError(LearnerError):
    """A held-out evaluation could not measure what it was asked to (the expected version is not the one served)."""


class UpError(DistrlError):
    """`up` could not bring the run up, or a role died while it ran (the message names it and ends with its log)."""
