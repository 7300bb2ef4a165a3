"""Typed errors. Each carries the context a user needs to act on it; none is swallowed silently."""

from __future__ import annotations


class DistrlError(Exception):
    """Base of every error distrl-stream raises on purpose."""


class ConfigError(DistrlError):
    """A configuration value is invalid. The message is one line naming the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
