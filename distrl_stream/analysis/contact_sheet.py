"""Contact sheets: an episode's screenshots side by side, each captioned with its step, action and reward.

Screenshots are read through their claim checks (:func:`~distrl_stream.events.screenshots.read_screenshot`, which
checks each against its step's sha256). One that cannot be read (missing, unreadable, altered, or not an image)
becomes a grey placeholder captioned with the reason: a sheet is always drawn, and shows where a record is damaged.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Final

from PIL import Image, ImageDraw

from distrl_stream.envs.sim.render import MORE, default_font, draw_text, fit_text
from distrl_stream.errors import ScreenshotError
from distrl_stream.events import Step, TrajectoryEvent
from distrl_stream.events.screenshots import read_screenshot
from distrl_stream.policy.vision import decode_png

TILE_HEIGHT: Final = 192
"""Height every screenshot is scaled to, keeping its proportions (a placeholder is a square of this side)."""
TILE_MIN_WIDTH: Final = 128
"""Narrowest tile: a caption needs that much room even under a narrow (portrait phone) screenshot."""
LINE_HEIGHT: Final = 14
GAP: Final = 6
CAPTION_LINES: Final = 2

_BACKGROUND: Final = (255, 255, 255)
_INK: Final = (33, 33, 33)
_MUTED: Final = (117, 117, 117)
_PLACEHOLDER: Final = (200, 200, 200)


@dataclass(frozen=True)
class ContactSheet:
    """One episode's contact sheet.

    Attributes:
        image: the sheet (RGB): a header line (task, termination, instruction), then one tile per screenshot.
        steps: tiles drawn: the steps that carry a screenshot claim check.
        unreadable: tiles that are placeholders because their screenshot could not be read.
    """

    image: Image.Image
    steps: int
    unreadable: int

    def png(self) -> bytes:
        """The sheet as PNG bytes."""
        out = io.BytesIO()
        self.image.save(out, format="PNG")
        return out.getvalue()


def contact_sheet(event: TrajectoryEvent, *, height: int = TILE_HEIGHT) -> ContactSheet | None:
    """Draw ``event``'s screenshots left to right, or None when none of its steps has one.

    Each tile is the screenshot scaled to ``height`` pixels high, captioned with the step index (0-based, as in a
    per-step export), the reward, ``invalid`` for an invalid action, and the action text, shortened to the tile.
    Steps without a screenshot claim check get no tile.

    Args:
        event: the recorded episode.
        height: the tiles' picture height in pixels.
    """
    shots = [(i, step) for i, step in enumerate(event.steps) if step.screenshot_uri is not None]
    if not shots:
        return None
    pictures = [_picture(step, height) for _, step in shots]
    widths = [
        max(TILE_MIN_WIDTH, picture.width if isinstance(picture, Image.Image) else height) for picture in pictures
    ]
    top = GAP + LINE_HEIGHT + GAP
    size = (GAP + sum(width + GAP for width in widths), top + height + CAPTION_LINES * LINE_HEIGHT + GAP)
    sheet = Image.new("RGB", size, _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    header = f"{event.task_id} · {event.termination} · {event.instruction}"
    draw_text(draw, (GAP, GAP, size[0] - GAP, GAP + LINE_HEIGHT), header, _INK)
    left = GAP
    for (index, step), picture, width in zip(shots, pictures, widths, strict=True):
        if isinstance(picture, Image.Image):
            sheet.paste(picture, (left + (width - picture.width) // 2, top))
        else:
            _placeholder(draw, (left + (width - height) // 2, top, left + (width + height) // 2, top + height), picture)
        caption = f"step {index}  reward {step.reward:g}" + ("" if step.valid else "  invalid")
        lines = (caption, step.action_text)
        for row, line in enumerate(lines):
            y = top + height + row * LINE_HEIGHT
            draw_text(draw, (left, y, left + width, y + LINE_HEIGHT), line, _INK if row == 0 else _MUTED)
        left += width + GAP
    unreadable = sum(not isinstance(picture, Image.Image) for picture in pictures)
    return ContactSheet(sheet, len(shots), unreadable)


def _picture(step: Step, height: int) -> Image.Image | str:
    """The step's screenshot scaled to ``height``, or why it cannot be shown."""
    assert step.screenshot_uri is not None  # contact_sheet draws only the steps that have one
    try:
        image = decode_png(read_screenshot(step.screenshot_uri, step.screenshot_sha256 or ""))
        width = max(1, round(image.width * height / image.height))
        return image.resize((width, height), Image.Resampling.LANCZOS)
    except ScreenshotError as exc:
        return str(exc)
    # The digest matched, so these are the bytes the collector stored; they just do not decode as an image.
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        return f"screenshot {step.screenshot_uri} is not an image: {exc}"


def _placeholder(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], reason: str) -> None:
    left, top, right, bottom = box
    draw.rectangle(box, fill=_PLACEHOLDER, outline=_MUTED)
    lines = _wrap(reason, right - left - 2 * GAP)
    fit = (bottom - top - 2 * GAP) // LINE_HEIGHT
    if len(lines) > fit:
        lines = [*lines[: fit - 1], MORE]
    for row, line in enumerate(lines):
        y = top + GAP + row * LINE_HEIGHT
        draw_text(draw, (left + GAP, y, right - GAP, y + LINE_HEIGHT), line, _INK)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` pixels, broken at spaces, and inside a word (a URI) too long for one."""
    font = default_font()
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
            continue
        while font.getlength(word) > width:
            cut = len(fit_text(word, width).removesuffix(MORE)) or 1
            lines.append(word[:cut])
            word = word[cut:]
        lines.append(word)
    return lines
