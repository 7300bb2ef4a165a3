"""The simulated phone's screenshots: deterministic PNGs of one size, one per distinct screen, when asked."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from distrl_stream.config import load_config
from distrl_stream.envs import make_env
from distrl_stream.envs.base import UIElement
from distrl_stream.envs.sim import SimEnv, make_task, screen_png
from distrl_stream.envs.sim.render import MIN_ROW_HEIGHT, ROW_HEIGHT, SIZE, TITLE_HEIGHT, row_layout
from distrl_stream.envs.sim.templates import TEMPLATES, instantiate

TASK = make_task("turn_on_setting", 0, "train")


def decode(png: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(png))
    image.load()
    return image


def chunk_types(png: bytes) -> list[bytes]:
    """The PNG's chunk types in file order (after the 8-byte signature: length, type, data, CRC)."""
    types, at = [], 8
    while at < len(png):
        length = int.from_bytes(png[at : at + 4], "big")
        types.append(png[at + 4 : at + 8])
        at += 12 + length
    return types


def home() -> tuple[str, tuple[UIElement, ...]]:
    world = instantiate(TEMPLATES[TASK.template], TASK.seed)[1]
    return world.title(), world.render()[1]


def test_the_same_screen_gives_the_same_bytes_without_metadata() -> None:
    first = screen_png(*home())
    screen_png.cache_clear()  # draw it again rather than get the cached bytes back
    again = screen_png(*home())
    assert again == first and again is not first
    assert set(chunk_types(first)) == {b"IHDR", b"IDAT", b"IEND"}  # no time, text or physical-size chunk


def test_every_screen_has_the_same_size() -> None:
    many = tuple(
        UIElement(i, "item", f"Row {i} with a label far too long to fit on one row of the screen") for i in range(40)
    )
    for title, elements in (home(), ("Empty", ()), ("Overflowing " * 10, many)):
        image = decode(screen_png(title, elements))
        assert (image.size, image.mode) == ((SIZE, SIZE), "RGB")


def test_rows_shrink_then_stop_with_a_marker() -> None:
    assert row_layout(10) == (ROW_HEIGHT, 10)  # the simulator's largest screens keep full-height rows
    assert row_layout(16) == (MIN_ROW_HEIGHT, 16)
    assert row_layout(17) == (MIN_ROW_HEIGHT, 15)  # the 16th row that fits shows the marker
    rows = [UIElement(i, "item", f"Song {i}") for i in range(41)]
    # Rows past the marker are not drawn: 40 and 41 elements look the same, 15 (all drawn) does not.
    assert screen_png("Music", tuple(rows[:40])) == screen_png("Music", tuple(rows))
    assert screen_png("Music", tuple(rows[:15])) != screen_png("Music", tuple(rows[:40]))


def test_different_screens_give_different_bytes() -> None:
    title, elements = home()
    assert screen_png(title, elements) != screen_png("Settings", elements)
    assert screen_png(title, elements) != screen_png(title, elements[:-1])


@pytest.mark.parametrize(("kind", "state"), [("toggle", "on"), ("field", "Rosa (focused)"), ("item", "selected")])
def test_an_element_state_is_visible(kind: str, state: str) -> None:
    shown = decode(screen_png("Screen", (UIElement(0, kind, "Label", state),)))
    plain = decode(screen_png("Screen", (UIElement(0, kind, "Label", "off" if kind == "toggle" else ""),)))
    first_row, title_bar = (0, TITLE_HEIGHT, SIZE, TITLE_HEIGHT + ROW_HEIGHT), (0, 0, SIZE, TITLE_HEIGHT)
    assert shown.crop(first_row).tobytes() != plain.crop(first_row).tobytes()
    assert shown.crop(title_bar).tobytes() == plain.crop(title_bar).tobytes()


async def test_sim_env_attaches_a_png_of_each_screen_when_asked() -> None:
    env = SimEnv(screenshots=True)
    obs = await env.reset(TASK)
    shots = [obs.screenshot]
    while (action := env.oracle_action()) is not None:
        obs = (await env.step(action)).observation
        shots.append(obs.screenshot)
    assert len(shots) == 3 and len(set(shots)) == 3  # Home, Settings, Settings with the setting turned on
    assert shots[-1] == screen_png(env.world.title(), obs.elements)
    assert all(shot is not None and decode(shot).size == (SIZE, SIZE) for shot in shots)


async def test_sim_env_attaches_none_by_default() -> None:
    env = SimEnv()
    assert (await env.reset(TASK)).screenshot is None
    action = env.oracle_action()
    assert action is not None
    assert (await env.step(action)).observation.screenshot is None


async def test_the_factory_passes_the_screenshots_flag() -> None:
    on = make_env(load_config(env={"kind": "sim", "screenshots": True}).env)
    off = make_env(load_config(env={"kind": "sim"}).env)
    assert (await on.reset(TASK)).screenshot is not None
    assert (await off.reset(TASK)).screenshot is None
