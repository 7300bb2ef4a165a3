"""Seeds derived from text, so that every environment, and the collector's task draws, are reproducible anywhere."""

from __future__ import annotations

import hashlib


def stable_int(text: str) -> int:
    """A 31-bit integer from text, the same on every machine and Python (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") & 0x7FFFFFFF
