"""MiniWoB++ in headless chromium, behind the DeviceEnv protocol.

Each :class:`MiniWoBEnv` owns one chromium (started on the first ``reset``, ~2 s) and switches between MiniWoB tasks
by loading the task's page. The page's DOM becomes numbered elements (buttons, links, fields, checkboxes, text);
our actions become MiniWoB actions (element clicks, focus-and-type, key presses, coordinate clicks and scrolls); the
page's own reward decides success. Selenium calls block, so every browser call runs in a worker thread
(``asyncio.to_thread``) and many environments overlap.

Rewards follow the project's convention (1.0 on success, else 0.0); MiniWoB's own raw reward (+1/-1) and
time-decayed reward are kept in ``info.extra``.
"""

from __future__ import annotations

import asyncio
import io
import logging
import shutil
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Final

import numpy as np

from distrl_stream.config import EnvConfig
from distrl_stream.envs.actions import (
    Action,
    Click,
    KeyboardEnter,
    LongPress,
    NavigateBack,
    NavigateHome,
    OpenApp,
    Scroll,
    Status,
    TypeText,
    Wait,
)
from distrl_stream.envs.base import EnvBase, EnvKind, Observation, Outcome, Task, UIElement, render_screen
from distrl_stream.errors import EnvError

log = logging.getLogger(__name__)

# Chromium as root in a container: no sandbox, no GPU, and nothing that phones home or updates itself.
CHROME_FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
# More elements than this would blow the prompt budget; the learnable subset stays far below it.
MAX_ELEMENTS: Final = 30
_FIELD_TAGS: Final = frozenset({"input_text", "input_password", "input_email", "input_search", "input_tel", "textarea"})
_KINDS: Final = {"button": "button", "input_checkbox": "checkbox", "input_radio": "radio", "a": "link"}


class MiniWoBEnv(EnvBase):
    """One headless chromium running MiniWoB++ tasks (``Task.template`` names the task, ``Task.seed`` its instance).

    Args:
        chrome_binary: the chromium executable.
        chromedriver: the matching chromedriver.
        episode_time_s: the page's episode time limit (MiniWoB's own default of 10 s assumes a fast agent).
        screenshots: attach a PNG screenshot to every observation.
    """

    kind: EnvKind = "miniwob"

    def __init__(
        self,
        chrome_binary: str | Path = "/usr/bin/chromium",
        chromedriver: str | Path = "/usr/bin/chromedriver",
        episode_time_s: float = 60.0,
        screenshots: bool = False,
    ) -> None:
        super().__init__()
        self._chrome, self._driver_path = str(chrome_binary), str(chromedriver)
        self._episode_ms = int(episode_time_s * 1000)
        self._screenshots = screenshots
        self._gym: Any = None
        self._refs: list[int] = []
        self._fields: list[str] = []

    @classmethod
    def from_config(cls, section: EnvConfig) -> MiniWoBEnv:
        """An environment set up from the ``env`` config section."""
        return cls(section.chrome_binary, section.chromedriver, section.miniwob_episode_time_s, section.screenshots)

    @property
    def browser_pid(self) -> int | None:
        """Process id of chromedriver (its children are the browser), once started."""
        if self._gym is None:
            return None
        return self._gym.instance.driver.service.process.pid

    def candidates(self, observation: Observation) -> list[str]:
        """Clicks on every element, and for each text field the task's field values typed into it."""
        out: list[str] = []
        for el in observation.elements:
            if el.editable:
                out.extend(TypeText(text=value, index=el.index).to_text() for value in self._fields)
            out.append(Click(index=el.index).to_text())
        return out

    async def close(self) -> None:
        """Quit chromium and remove its profile directory."""
        gym, self._gym = self._gym, None
        if gym is not None:
            await asyncio.to_thread(gym.close)

    async def _reset(self, task: Task) -> Observation:
        if task.env != "miniwob":
            raise EnvError(f"miniwob: cannot run task {task.id} of env {task.env}")
        if task.template.startswith("flight.") or "/" in task.template:
            raise EnvError(f"miniwob: task {task.template!r} is not supported (FlightWoB needs an HTTP server)")
        return await asyncio.to_thread(self._reset_sync, task)

    async def _apply(self, action: Action) -> Outcome:
        return await asyncio.to_thread(self._apply_sync, action)

    # ---- blocking parts (worker thread) -----------------------------------------------------------------------------

    def _reset_sync(self, task: Task) -> Observation:
        page = _html_dir() / f"{task.template}.html"
        if not page.is_file():
            raise EnvError(f"miniwob: no task {task.template!r} (no {page.name} in {page.parent})")
        try:
            if self._gym is None:
                self._gym = _start(task.template, self._chrome, self._driver_path)
            elif self._gym.subdomain != task.template:
                self._gym.instance.load(task.template)
                self._gym.subdomain = task.template
            self._gym.instance.driver.execute_script(f"core.EPISODE_MAX_TIME = {self._episode_ms};")
            obs, _ = self._gym.reset(
                seed=task.seed, options={"data_mode": task.split, "record_screenshots": self._screenshots}
            )
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"miniwob: could not start {task.template} (seed {task.seed}): {exc}") from exc
        self._fields = [value for _, value in obs["fields"] if value]
        return self._observe(obs, done=False)

    def _apply_sync(self, action: Action) -> Outcome:
        shown = self._observation
        assert shown is not None  # EnvBase.step checks the episode is live
        if isinstance(action, Status):
            return Outcome(shown, done=True, extra={"miniwob_raw_reward": 0.0})
        mw_action = self._translate(action, shown)
        if isinstance(mw_action, str):
            return Outcome(shown, valid=False, reason=mw_action)
        try:
            obs, _, terminated, _, info = self._gym.step(mw_action)
        except Exception as exc:
            raise EnvError(f"miniwob: browser failed on {action.to_text()}: {exc}") from exc
        raw = float(info.get("raw_reward") or 0.0)
        extra = {
            "miniwob_raw_reward": raw,
            "miniwob_reward": float(info.get("env_reward") or 0.0),
            "miniwob_reason": str(info.get("reason")),
        }
        observation = self._observe(obs, done=terminated)
        return Outcome(observation, success=terminated and raw > 0, done=terminated, extra=extra)

    def _translate(self, action: Action, shown: Observation) -> dict[str, Any] | str:
        """The MiniWoB action for ours, or the reason it is impossible here."""
        gym = self._gym
        n = len(shown.elements)
        match action:
            case Click(index=index) if index is not None:
                if index >= n:
                    return f"no element {index} on this page (it has 0..{n - 1})"
                element = shown.elements[index]
                if (element.editable or self._refs[index] < 0) and element.bounds is not None:
                    # A real pointer click where MiniWoB's element click falls short: headless chromium fires no
                    # focus event for element.focus() (focus-text needs one), and text runs (negative refs) are
                    # not DOM elements at all.
                    left, top, right, bottom = element.bounds
                    return gym.create_action("CLICK_COORDS", coords=_coords((left + right) / 2, (top + bottom) / 2))
                return gym.create_action("CLICK_ELEMENT", ref=self._refs[index])
            case Click(x=x, y=y):
                return gym.create_action("CLICK_COORDS", coords=_coords(x, y))
            case TypeText(text=text, index=index):
                if index is None:
                    return gym.create_action("TYPE_TEXT", text=text)
                if index >= n:
                    return f"no element {index} on this page (it has 0..{n - 1})"
                if not shown.elements[index].editable:
                    return f"element {index} ({shown.elements[index].kind}) is not a text field"
                return gym.create_action("FOCUS_ELEMENT_AND_TYPE_TEXT", ref=self._refs[index], text=text)
            case KeyboardEnter():
                keys = gym.action_space_config.allowed_keys
                return gym.create_action("PRESS_KEY", key=list(keys).index("<Enter>"))
            case Scroll(direction=direction):
                if direction not in ("up", "down"):
                    return f"MiniWoB pages scroll up and down, not {direction}"
                kind = "SCROLL_UP_COORDS" if direction == "up" else "SCROLL_DOWN_COORDS"
                return gym.create_action(kind, coords=_coords(80, 105))
            case Wait():
                return gym.create_action("NONE")
            case LongPress():
                return "MiniWoB pages have no long press"
            case NavigateBack() | NavigateHome():
                return "MiniWoB pages have no back or home button"
            case OpenApp():
                return "MiniWoB has no apps to open"
        return f"unsupported action {action.to_text()}"

    def _observe(self, obs: dict[str, Any], done: bool) -> Observation:
        task = self.task
        instruction = obs.get("utterance") or (self._observation.instruction if self._observation else "")
        if done:
            self._refs = []
            title = f"{task.template if task else 'MiniWoB'} (episode over)"
            return Observation(instruction, render_screen(title, ()), ())
        elements, refs = _elements(obs["dom_elements"])
        self._refs = refs
        screenshot = _png(obs["screenshot"]) if self._screenshots else None
        title = task.template if task is not None else "MiniWoB"
        return Observation(instruction, render_screen(title, elements), elements, screenshot)


def _coords(x: float, y: float) -> np.ndarray:
    return np.array([x, y], dtype=np.float32)


def _png(pixels: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _elements(dom: tuple[dict[str, Any], ...]) -> tuple[tuple[UIElement, ...], list[int]]:
    """Numbered elements from MiniWoB's DOM list: leaves with text, controls; checkbox labels folded in."""
    by_parent: dict[int, list[dict[str, Any]]] = {}
    for el in dom:
        by_parent.setdefault(int(el["parent"]), []).append(el)
    used_labels: set[int] = set()
    out: list[UIElement] = []
    refs: list[int] = []
    for el in dom:
        ref, tag, text = int(el["ref"]), str(el["tag"]), str(el["text"]).strip()
        is_leaf = bool(el["flags"][3])
        if ref in used_labels or not is_leaf:
            continue
        state = ""
        kind = _KINDS.get(tag, "text")
        editable = tag in _FIELD_TAGS
        if editable:
            kind, state = "field", str(el["value"])
            text = text or str(el["id"]) or "input"
        elif tag in ("input_checkbox", "input_radio"):
            siblings = [s for s in by_parent.get(int(el["parent"]), []) if s["tag"] == "t"]
            used_labels.update(int(s["ref"]) for s in siblings)
            text = " ".join(str(s["text"]).strip() for s in siblings)
            state = "checked" if str(el["value"]).lower() == "true" else "unchecked"
        elif "alink" in str(el["classes"]).split():
            kind = "link"
        elif not text:
            continue
        if el["flags"][0]:
            state = f"{state}, focused" if state else "focused"
        left, top = float(el["left"][0]), float(el["top"][0])
        width, height = float(el["width"][0]), float(el["height"][0])
        bounds = (int(left), int(top), int(left + width), int(top + height))
        out.append(UIElement(len(out), kind, text, state, clickable=True, editable=editable, bounds=bounds))
        refs.append(ref)
        if len(out) >= MAX_ELEMENTS:
            break
    return tuple(out), refs


def _html_dir() -> Path:
    from miniwob.selenium_instance import HTML_DIR

    return Path(HTML_DIR) / "miniwob"


def _start(subdomain: str, chrome_binary: str, chromedriver: str) -> Any:
    """A MiniWoB gym environment whose chromium gets our flags and a fresh profile directory."""
    from miniwob.environment import MiniWoBEnvironment
    from miniwob.fields import get_field_extractor
    from miniwob.selenium_instance import SeleniumInstance
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    class Instance(SeleniumInstance):  # type: ignore[misc]
        """miniwob's instance with our chromium flags (its own lack --disable-quic etc.) and task switching."""

        def create_driver(self) -> None:
            self.profile_dir = tempfile.mkdtemp(prefix="distrl-chromium-")
            options = webdriver.ChromeOptions()
            for flag in CHROME_FLAGS:
                options.add_argument(flag)
            options.add_argument(f"--user-data-dir={self.profile_dir}")
            options.binary_location = chrome_binary
            self.driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
            self.driver.implicitly_wait(5)
            self._open_page()

        def load(self, task_name: str) -> None:
            self.url = urllib.parse.urljoin(self.url, f"{task_name}.html")
            self.field_extractor = get_field_extractor(task_name)
            self._open_page()

        def _open_page(self) -> None:
            self.driver.get(self.url)
            WebDriverWait(self.driver, 5).until(expected_conditions.element_to_be_clickable((By.ID, "sync-task-cover")))
            self.inner_width, self.inner_height = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight];"
            )

        def close(self) -> None:
            super().close()
            shutil.rmtree(getattr(self, "profile_dir", ""), ignore_errors=True)

    class Gym(MiniWoBEnvironment):  # type: ignore[misc]
        def _hard_reset_instance(self) -> None:
            if getattr(self, "instance", None):
                self.instance.close()
            self.instance = Instance(index=0, **self.instance_kwargs)
            self.instance.start()
            self.instance.wait()

    for path, what in ((chrome_binary, "chromium"), (chromedriver, "chromedriver")):
        if shutil.which(path) is None:
            raise EnvError(f"miniwob: {what} not found at {path!r} (Debian: apt-get install chromium chromium-driver)")
    try:
        return Gym(subdomain=subdomain, action_space_config="all_supported")
    except Exception as exc:
        raise EnvError(f"miniwob: chromium did not start ({chrome_binary}, {chromedriver}): {exc}") from exc
