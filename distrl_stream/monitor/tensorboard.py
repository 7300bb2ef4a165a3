"""Optional TensorBoard scalars (``learner.tensorboard_dir``), for those who watch training there.

The ``tensorboard`` package is an optional extra (``pip install 'distrl-stream[tensorboard]'``): torch's
``SummaryWriter`` needs it, and nothing else does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from distrl_stream.errors import ConfigError


class ScalarWriter:
    """Writes a role's metric values as TensorBoard scalars (``<role>/<name>``) at a step.

    Args:
        writer: a ``torch.utils.tensorboard.SummaryWriter``.
        role: the tag prefix.
    """

    def __init__(self, writer: Any, role: str) -> None:
        self._writer = writer
        self.role = role

    def add_scalars(self, values: Mapping[str, float], step: int) -> None:
        """One scalar per value, at ``step``."""
        for name, value in values.items():
            self._writer.add_scalar(f"{self.role}/{name}", value, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


def scalar_writer(folder: Path, field: str, role: str = "learner") -> ScalarWriter:
    """A :class:`ScalarWriter` into ``folder`` (created).

    Raises:
        ConfigError: the tensorboard package is not installed (one line naming ``field``).
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            field, "needs the tensorboard package: pip install 'distrl-stream[tensorboard]' (or unset it)"
        ) from None
    return ScalarWriter(SummaryWriter(log_dir=str(folder)), role)
