"""The screenshot claim check: PNG bytes live in a store, a step carries their URI and sha256.

Collectors write (:class:`ScreenshotStore`); the learner and the replay tools read (:func:`read_screenshot`), and a
reader always checks the digest, so an image replaced or damaged after its step was recorded is refused, never used
(docs/design.md §6.1).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from urllib.parse import unquote, urlparse

from distrl_stream.errors import ScreenshotError


class ScreenshotStore:
    """Claim check for screenshots: PNG bytes go to ``folder/<sha256>.png``; steps carry the URI and the digest.

    Args:
        folder: where the files go (created on first use). Identical screens are stored once.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def put(self, png: bytes) -> tuple[str, str]:
        """Store ``png`` (off the event loop) and return ``(file URI, hex sha256)``."""
        digest = hashlib.sha256(png).hexdigest()
        path = self.folder / f"{digest}.png"
        if not path.exists():
            await asyncio.to_thread(self._write, path, png)
        return path.resolve().as_uri(), digest

    def _write(self, path: Path, png: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(png)}.tmp")
        tmp.write_bytes(png)
        tmp.replace(path)  # readers never see half a file


def read_screenshot(uri: str, sha256: str) -> bytes:
    """The PNG bytes a step's claim check names, verified against its digest.

    Args:
        uri: the step's ``screenshot_uri`` (``file://`` URIs; the store is a folder every role can read, a shared
            volume across hosts).
        sha256: the step's ``screenshot_sha256``.

    Raises:
        ScreenshotError: an unsupported URI, a missing or unreadable file, or bytes whose sha256 differs; the
            message says which.
    """
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise ScreenshotError(f"screenshot URI {uri!r}: only file:// URIs are readable")
    path = Path(unquote(parsed.path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScreenshotError(f"screenshot {uri} unreadable: {exc.strerror or exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ScreenshotError(f"screenshot {uri} altered: sha256 {digest[:12]}… is not the step's {sha256[:12]}…")
    return data
