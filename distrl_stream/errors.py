"""Typed errors. Each carries the context a user needs to act on it; none is swallowed silently."""

from __future__ import annotations


class DistrlError(Exception):
    """Base of every error distrl-stream raises on purpose."""


class ConfigError(DistrlError):
    """A configuration value is invalid. The message is one line naming the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


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


class AdapterVerificationError(InferenceError):
    """A weight version's adapter does not match its published sha256 (or is missing); it is never served."""


class ReplayBufferError(DistrlError):
    """The replay buffer refused an operation (an episode it cannot store, a bad priority, a bad snapshot)."""


class ActionConstraintError(DistrlError):
    """An action's tokens are impossible under the choice constraint they were said to be sampled with."""
