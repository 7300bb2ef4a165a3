"""The simulated phone's screens as pictures: one deterministic PNG per screen, for vision policies.

A screen is drawn plainly, the way a phone lays it out: a title bar, then one row per element in index order, each
drawn by its kind and numbered like the screen text's ``[i]``, so picture and text name the same elements. The same
screen gives the same bytes every time (for one Pillow build): nothing reads a clock, the PNG carries no metadata
chunks, and the font is Pillow's built-in one, so nothing depends on the fonts installed on the machine.
"""

from __future__ import annotations

import functools
import io
from typing import Final, Literal

from PIL import Image, ImageDraw, ImageFont

from distrl_stream.envs.base import UIElement

SIZE: Final = 256
"""Width and height of every screenshot, in pixels.

Square, because a vision tower resizes a screenshot to its square input without tiling (``policy/vision.py``), so a
square picture keeps its proportions. 256 pixels fit every line the simulator shows unabridged in the default font
(the longest, the home screen's status row, takes 217 of the 228 a row has; 224 would cut it), and keep a screen at a
few KB of PNG.
"""
TITLE_HEIGHT: Final = 24
ROW_HEIGHT: Final = 22
"""Height of a row while the screen's rows fit; more rows shrink it, down to :data:`MIN_ROW_HEIGHT`."""
MIN_ROW_HEIGHT: Final = 14
"""The default font's line height plus one pixel: lower rows would draw their text over each other."""
MORE: Final = "…"
"""Drawn in the last row when a screen has more rows than fit at :data:`MIN_ROW_HEIGHT`."""

_PAD: Final = 4
_INDEX_WIDTH: Final = 24
_SWITCH: Final = (24, 12)
_WHITE: Final = (255, 255, 255)
_INK: Final = (33, 33, 33)
_MUTED: Final = (117, 117, 117)
_ACCENT: Final = (25, 118, 210)
_BUTTON: Final = (225, 236, 250)
_OFF: Final = (189, 189, 189)
_SELECTED: Final = (255, 236, 179)
_FOCUSED: Final = "(focused)"
"""How ``world.py`` marks the focused field in its state; the picture shows focus as a thick outline instead."""


# Screens repeat across steps and episodes (every episode starts on Home) and elements are immutable, so a drawn
# screen is reused: drawing and compressing one costs far more than a simulator step.
@functools.lru_cache(maxsize=1024)
def screen_png(title: str, elements: tuple[UIElement, ...]) -> bytes:
    """The PNG of one screen: its title bar, then one row per element (``SIZE`` x ``SIZE`` pixels, RGB).

    Rows are drawn by kind: ``button`` a filled box with its label, ``toggle`` its label and a switch (knob right and
    filled when on), ``field`` its label and an outlined box holding its text (thick when focused), ``app`` an icon
    with the app's initial, ``item`` its label with its state at the right; any other kind (``text``) as
    ``label: state``. A ``selected`` state highlights the row. Text too wide for its row ends in ``…``.

    Args:
        title: the screen's title (the first line of the screen text).
        elements: the screen's elements, in index order.
    """
    image = Image.new("RGB", (SIZE, SIZE), _WHITE)
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, SIZE - 1, TITLE_HEIGHT - 1), fill=_ACCENT)
    draw_text(draw, (_PAD, 0, SIZE - _PAD, TITLE_HEIGHT), title, _WHITE)
    height, shown = row_layout(len(elements))
    for row, element in enumerate(elements[:shown]):
        top = TITLE_HEIGHT + row * height
        _element(draw, element, top, top + height)
    if shown < len(elements):
        top = TITLE_HEIGHT + shown * height
        draw_text(draw, (_INDEX_WIDTH, top, SIZE - _PAD, top + height), MORE, _INK)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def row_layout(rows: int) -> tuple[int, int]:
    """Row height and how many element rows are drawn for a screen of ``rows`` elements.

    The rows share the space under the title bar at :data:`ROW_HEIGHT` each, lower when that does not fit (never
    below :data:`MIN_ROW_HEIGHT`); when even that does not fit, the last row that fits shows :data:`MORE` instead.
    """
    space = SIZE - TITLE_HEIGHT
    if rows == 0:
        return ROW_HEIGHT, 0
    height = max(MIN_ROW_HEIGHT, min(ROW_HEIGHT, space // rows))
    fit = space // height
    return height, rows if rows <= fit else fit - 1


def _element(draw: ImageDraw.ImageDraw, element: UIElement, top: int, bottom: int) -> None:
    states = element.state.split(", ")
    left, right = _INDEX_WIDTH, SIZE - _PAD
    if "selected" in states:
        draw.rectangle((0, top, SIZE - 1, bottom - 1), fill=_SELECTED)
    draw_text(draw, (_PAD, top, left, bottom), f"[{element.index}]", _MUTED)
    box = (left, top + 2, right, bottom - 3)
    match element.kind:
        case "button":
            draw.rectangle(box, fill=_BUTTON, outline=_ACCENT)
            label = f"{element.text} ({element.state})" if element.state else element.text
            draw_text(draw, (left + _PAD, top, right - _PAD, bottom), label, _INK)
        case "toggle":
            _switch(draw, right, (top + bottom) // 2, on="on" in states)
            draw_text(draw, (left, top, right - _SWITCH[0] - _PAD, bottom), element.text, _INK)
        case "field":
            label_right = left + draw_text(draw, (left, top, right, bottom), element.text, _MUTED) + _PAD
            focused = element.state.endswith(_FOCUSED)
            value = element.state.removesuffix(_FOCUSED).rstrip() if focused else element.state
            field = (label_right, box[1], right, box[3])
            draw.rectangle(field, outline=_ACCENT if focused else _MUTED, width=2 if focused else 1)
            draw_text(draw, (label_right + _PAD, top, right - _PAD, bottom), value, _INK)
        case "app":
            side = box[3] - box[1]
            draw.rectangle((left, box[1], left + side, box[3]), fill=_ACCENT)
            draw_text(draw, (left + 1, top, left + side + 1, bottom), element.text[:1], _WHITE, align="center")
            draw_text(draw, (left + side + _PAD, top, right, bottom), element.text, _INK)
        case "item":
            state = "" if element.state == "selected" else element.state
            state_width = draw_text(draw, (left, top, right, bottom), state, _MUTED, align="right")
            draw_text(draw, (left, top, right - state_width - _PAD, bottom), element.text, _INK)
            draw.line((left, bottom - 1, right, bottom - 1), fill=_OFF)
        case _:
            label = f"{element.text}: {element.state}" if element.state else element.text
            draw_text(draw, (left, top, right, bottom), label, _INK)


def _switch(draw: ImageDraw.ImageDraw, right: int, middle: int, *, on: bool) -> None:
    width, height = _SWITCH
    track = (right - width, middle - height // 2, right, middle + height // 2)
    knob_left = track[2] - height if on else track[0]
    draw.rounded_rectangle(track, radius=height // 2, fill=_ACCENT if on else _OFF)
    draw.ellipse((knob_left + 1, track[1] + 1, knob_left + height - 1, track[3] - 1), fill=_WHITE)


def draw_text(
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    text: str,
    fill: tuple[int, int, int],
    *,
    align: Literal["left", "right", "center"] = "left",
) -> int:
    """Draw ``text`` in the default font inside ``box``, vertically centred and shortened to fit (:func:`fit_text`).

    Returns:
        The width drawn, in pixels (0 for nothing).
    """
    left, top, right, bottom = box
    text = fit_text(text, right - left)
    if not text:
        return 0
    font = default_font()
    width = int(font.getlength(text))
    x = {"left": left, "right": right - width, "center": (left + right - width) // 2}[align]
    ink_top, ink_bottom = font.getbbox("Ag")[1::2]
    draw.text((x, (top + bottom - ink_top - ink_bottom) // 2), text, font=font, fill=fill)
    return width


def fit_text(text: str, width: int) -> str:
    """``text`` as it fits ``width`` pixels in the default font: whole, or cut short and ended with ``…``."""
    font = default_font()
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + MORE) > width:
        text = text[:-1]
    return text.rstrip() + MORE if text else ""


@functools.cache
def default_font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's built-in font: embedded in Pillow, so nothing is read or downloaded and every machine draws alike."""
    return ImageFont.load_default()
