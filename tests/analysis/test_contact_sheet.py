"""Contact sheets: an episode's screenshots left to right, with placeholders for the ones that cannot be read."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from PIL import Image

from distrl_stream.analysis.contact_sheet import GAP, LINE_HEIGHT, TILE_HEIGHT, TILE_MIN_WIDTH, contact_sheet
from distrl_stream.events import TrajectoryEvent
from distrl_stream.testing.samples import png, sample_trajectory, with_screenshots

COLOURS = [(200, 30, 30), (30, 160, 30), (30, 30, 200)]
SHEET_HEIGHT = GAP + LINE_HEIGHT + GAP + TILE_HEIGHT + 2 * LINE_HEIGHT + GAP


def episode(folder: Path, sizes: list[tuple[int, int]]) -> TrajectoryEvent:
    event = sample_trajectory(random.Random(3), steps=len(sizes), observation_chars=40, candidates=2)
    return with_screenshots(event, [png(size, COLOURS[i]) for i, size in enumerate(sizes)], folder)


def test_a_three_step_episode_gives_three_tiles_left_to_right(tmp_path: Path) -> None:
    # Square screens scale to TILE_HEIGHT square; a narrow portrait one keeps its proportions in a wider tile.
    sheet = contact_sheet(episode(tmp_path, [(256, 256), (256, 256), (60, 240)]))
    assert sheet is not None and (sheet.steps, sheet.unreadable) == (3, 0)
    widths = [TILE_HEIGHT, TILE_HEIGHT, TILE_MIN_WIDTH]
    assert sheet.image.size == (GAP + sum(w + GAP for w in widths), SHEET_HEIGHT)
    middle = GAP + LINE_HEIGHT + GAP + TILE_HEIGHT // 2
    lefts = [GAP, GAP + widths[0] + GAP, GAP + widths[0] + GAP + widths[1] + GAP]
    for left, width, colour in zip(lefts, widths, COLOURS, strict=True):
        assert sheet.image.getpixel((left + width // 2, middle)) == colour
    assert Image.open(io.BytesIO(sheet.png())).size == sheet.image.size


@pytest.mark.parametrize("damage", ["altered", "missing", "not an image"])
def test_a_screenshot_that_cannot_be_read_becomes_a_counted_placeholder(tmp_path: Path, damage: str) -> None:
    event = episode(tmp_path, [(256, 256)] * 3)
    uri = event.steps[1].screenshot_uri
    assert uri is not None
    stored = Path(uri.removeprefix("file://"))
    if damage == "altered":
        stored.write_bytes(png((256, 256), (0, 0, 0)))
    elif damage == "missing":
        stored.unlink()
    else:  # stored and recorded as they are: the digest matches, the bytes are no PNG
        event = with_screenshots(
            event, [png((256, 256), COLOURS[0]), b"not a png", png((256, 256), COLOURS[2])], tmp_path
        )
    sheet = contact_sheet(event)
    assert sheet is not None and (sheet.steps, sheet.unreadable) == (3, 1)
    assert sheet.image.size == (GAP + 3 * (TILE_HEIGHT + GAP), SHEET_HEIGHT)
    corner = (GAP + TILE_HEIGHT + GAP + 2, GAP + LINE_HEIGHT + GAP + TILE_HEIGHT - 2)  # inside, below the reason
    assert sheet.image.getpixel(corner) == (200, 200, 200)
    assert sheet.image.getpixel((GAP + TILE_HEIGHT // 2, GAP + LINE_HEIGHT + GAP + 5)) == COLOURS[0]


def test_an_episode_without_screenshots_has_no_sheet() -> None:
    assert contact_sheet(sample_trajectory(random.Random(1), steps=2)) is None
