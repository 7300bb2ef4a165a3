"""MiniWoB++ in headless chromium, behind the DeviceEnv protocol.

Each :class:`MiniWoBEnv` owns one chromium (started on the first ``reset``, ~2 s) and switches between MiniWoB tasks
by loading the task's page. The page's DOM becomes numbered elements (buttons, links, fields, checkboxes, dropdowns,
sliders, scrollable lists, text); our actions are carried out in the page with Selenium (element clicks, pointer
clicks after scrolling the target into view, focus-and-type, key presses, wheel and element scrolls, option picks),
and MiniWoB reports the page's reward and next observation. An action the page cannot take (a pointer target out of
reach, a vanished element) is an invalid action with the browser's reason, not an error. Selenium calls block, so
every browser call runs in a worker thread (``asyncio.to_thread``) and many environments overlap.

Rewards follow the project's convention (1.0 on success, else 0.0); MiniWoB's own raw reward (+1/-1) and
time-decayed reward are kept in ``info.extra``.
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import re
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from distrl_stream.config import EnvConfig
from distrl_stream.envs.actions import (
    MAX_TEXT_CHARS,
    Action,
    Click,
    Drag,
    KeyboardEnter,
    LongPress,
    NavigateBack,
    NavigateHome,
    OpenApp,
    Scroll,
    Select,
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
# More elements than this would blow the prompt budget; a month's calendar (31 days and its header) and the form
# around it fit, and the learnable subset stays far below it.
MAX_ELEMENTS: Final = 48
_FIELD_TAGS: Final = frozenset(
    {
        "input_text",
        "input_password",
        "input_email",
        "input_search",
        "input_tel",
        "input_number",
        "input_date",
        "input_time",
        "textarea",
    }
)
# Widgets whose value is a number set through jQuery UI (typing a number sets it).
_NUMBER_WIDGETS: Final = frozenset({"slider", "spinner"})
_KINDS: Final = {"button": "button", "input_checkbox": "checkbox", "input_radio": "radio", "a": "link"}
# Texts offered for typing into one field: enough for the page's words, few enough to keep choice mode short.
MAX_TYPED: Final = 40
_QUOTED: Final = re.compile(r'"([^"]+)"|\'([^\']+)\'')
_NUMBER: Final = re.compile(r"[-+]?\d[\d/:.,-]*")
_WORD: Final = re.compile(r"[^\W_]+(?:['-][^\W_]+)*")
# Pixels a wheel or element scroll moves: most of MiniWoB's 160x210 task area.
SCROLL_PX: Final = 150

# Widgets MiniWoB's DOM list leaves out or flattens: dropdowns and list boxes (their options), jQuery UI sliders and
# spinners (the value lives in the widget), read-only fields (filled by a widget, e.g. a date picker, never typed
# into), and scrollable containers (whether there is more above or below); and which elements can be dragged
# (inside jQuery UI draggables, items of sortable lists, HTML draggables: which one, by its ref).
_WIDGETS_JS: Final = """
var out = {}, draggable = {}, info = core.previousDOMInfo || {};
for (var ref in info) {
  var el = info[ref], root = el.closest && el.closest('.ui-draggable, .ui-sortable > *, [draggable="true"]');
  if (root) draggable[ref] = root.dataset.wob_ref;
  if (el instanceof HTMLSelectElement) {
    var options = Array.from(el.options);
    out[ref] = {kind: 'select', multiple: el.multiple, options: options.map(function (o) { return o.text.trim(); }),
                selected: options.filter(function (o) { return o.selected; }).map(function (o) { return o.index; })};
  } else if (el.classList && el.classList.contains('ui-slider') && window.jQuery) {
    var s = jQuery(el);
    out[ref] = {kind: 'slider', value: String(s.slider('value')),
                min: String(s.slider('option', 'min')), max: String(s.slider('option', 'max'))};
  } else if (el.classList && el.classList.contains('ui-spinner-input') && window.jQuery) {
    var n = jQuery(el);
    var low = n.spinner('option', 'min'), high = n.spinner('option', 'max');
    out[ref] = {kind: 'spinner', value: String(n.spinner('value')),
                min: low == null ? '' : String(low), max: high == null ? '' : String(high)};
  } else if ((el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement) && el.readOnly) {
    out[ref] = {kind: 'readonly'};
  } else if (el instanceof HTMLElement && !(el instanceof HTMLTextAreaElement) && el.scrollHeight > el.clientHeight + 1
             && /(auto|scroll)/.test(getComputedStyle(el).overflowY)) {
    out[ref] = {kind: 'scroll', up: el.scrollTop > 0, down: el.scrollTop + el.clientHeight < el.scrollHeight - 1};
  }
}
return [out, draggable];
"""
# A point on the empty page: below the task area, or the window's bottom-left corner.
_OUTSIDE_JS: Final = """
var wrap = document.getElementById('wrap').getBoundingClientRect();
return [1, Math.min(window.innerHeight - 1, wrap.bottom + 20)];
"""
# Where an element's centre is in the window now (for a text run: its parent's).
_CENTRE_JS: Final = """
var r = core.previousDOMInfo[arguments[0]].getBoundingClientRect();
return [r.left + r.width / 2, r.top + r.height / 2];
"""
# Pointer moves between the press and the release of a drag: jQuery UI starts a drag only after the pointer has moved.
DRAG_STEPS: Final = 8
# Scroll an element (or a text run's parent) into view; how far it moved, and the viewport's size.
_INTO_VIEW_JS: Final = """
var el = core.previousDOMInfo[arguments[0]];
if (!el) return [0, 0, window.innerWidth, window.innerHeight];
var a = el.getBoundingClientRect();
el.scrollIntoView({block: 'nearest', inline: 'nearest'});
var b = el.getBoundingClientRect();
return [b.left - a.left, b.top - a.top, window.innerWidth, window.innerHeight];
"""
_SELECT_JS: Final = """
var el = core.previousDOMInfo[arguments[0]], position = arguments[1];
var option = el.options[position];
if (el.multiple) { option.selected = !option.selected; } else { el.selectedIndex = position; }
el.dispatchEvent(new Event('input', {bubbles: true}));
el.dispatchEvent(new Event('change', {bubbles: true}));
"""
# Typing into a numbered field replaces what it holds (as in the simulator); a focused date or time input keeps
# typing into the segment its caret is in, so it is blurred first and refocusing starts at the first segment.
_FOCUS_JS: Final = """
var el = core.previousDOMInfo[arguments[0]];
if (el.type === 'date' || el.type === 'time') el.blur();
el.value = '';
return core.elementClick(arguments[0]);
"""
_NUMBER_WIDGET_JS: Final = "jQuery(core.previousDOMInfo[arguments[0]])[arguments[1]]('value', arguments[2]);"
_SCROLL_ELEMENT_JS: Final = """
var el = core.previousDOMInfo[arguments[0]], top = el.scrollTop, left = el.scrollLeft;
el.scrollBy(arguments[1], arguments[2]);
return el.scrollTop !== top || el.scrollLeft !== left;
"""
_SCROLL_DELTAS: Final = {
    "up": (0, -SCROLL_PX),
    "down": (0, SCROLL_PX),
    "left": (-SCROLL_PX, 0),
    "right": (SCROLL_PX, 0),
}


@dataclass(frozen=True, slots=True)
class _Handle:
    """How to reach a numbered element in the page: its ref, the ref to scroll into view, its widget details."""

    ref: int
    anchor: int
    widget: dict[str, Any] | None = None
    value: str = ""
    draggable: bool = False


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
        self._handles: list[_Handle] = []
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
        """Choice-mode actions on the current screen.

        A click on every element but dropdowns and lists; for each text field or slider, text typed into it (see
        :func:`typed_values`); for each dropdown, a pick of each option not already picked (every option of a list
        box, where a pick toggles); for each scrollable list, a scroll towards the side that has more; for each
        draggable element, a drag onto every other draggable element (a sortable list's items, the boxes of a page).
        """
        out: list[str] = []
        page = [
            (el.index, self._handles[el.index].value if el.kind == "field" else el.text)
            for el in observation.elements
            if el.index < len(self._handles) and el.kind in ("text", "field")
        ]
        draggable = [el.index for el in observation.elements if el.index < len(self._handles)]
        draggable = [k for k in draggable if self._handles[k].draggable]
        for el in observation.elements:
            widget = self._handles[el.index].widget if el.index < len(self._handles) else None
            if el.kind == "select" and widget is not None:
                out.extend(
                    Select(el.index, text=text).to_text()
                    for k, text in enumerate(widget["options"])
                    if widget["multiple"] or k not in widget["selected"]
                )
                continue
            if el.kind == "list" and widget is not None:
                out.extend(Scroll(d, el.index).to_text() for d in ("up", "down") if widget[d])  # type: ignore[arg-type]
                continue
            if el.editable:
                texts = [text for k, text in page if k != el.index]
                values = typed_values(self._fields, observation.instruction, texts)
                if el.kind in _NUMBER_WIDGETS:
                    values = [value for value in values if _is_number(value)]
                out.extend(TypeText(text=value, index=el.index).to_text() for value in values)
            out.append(Click(index=el.index).to_text())
            if el.index in draggable:
                out.extend(Drag(el.index, target).to_text() for target in draggable if target != el.index)
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
        if self._gym is not None and self._gym.instance.died:
            # MiniWoB's own restart would reopen the first task's page; start over on this one instead.
            log.warning("miniwob: the browser failed; starting a new one for %s", task.id)
            gym, self._gym = self._gym, None
            gym.close()
        try:
            if self._gym is None:
                self._gym = _start(task.template, self._chrome, self._driver_path)
            elif self._gym.subdomain != task.template:
                self._gym.instance.load(task.template)
                self._gym.subdomain = task.template
            driver = self._gym.instance.driver
            driver.execute_script(f"core.EPISODE_MAX_TIME = {self._episode_ms};")
            # A popup the last episode left open outside the task area (a date picker) would make the same seed start
            # differently; a click on the empty page below the task closes it, as it would for a person.
            _click_at(*driver.execute_script(_OUTSIDE_JS), driver)
            obs, _ = self._gym.reset(
                seed=task.seed, options={"data_mode": task.split, "record_screenshots": self._screenshots}
            )
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"miniwob: could not start {task.template} (seed {task.seed}): {exc}") from exc
        if self._gym.instance.died:
            raise EnvError(f"miniwob: {task.template} (seed {task.seed}) failed in the page on reset")
        self._fields = [value for _, value in obs["fields"] if value]
        return self._observe(obs, done=False)

    def _apply_sync(self, action: Action) -> Outcome:
        from selenium.common.exceptions import InvalidSessionIdException, NoSuchWindowException, WebDriverException

        shown = self._observation
        assert shown is not None  # EnvBase.step checks the episode is live
        if isinstance(action, Status):
            return Outcome(shown, done=True, extra={"miniwob_raw_reward": 0.0})
        gym = self._gym
        try:
            refused = self._perform(action, shown, gym.instance.driver)
        except (InvalidSessionIdException, NoSuchWindowException) as exc:
            raise EnvError(f"miniwob: browser failed on {action.to_text()}: {first_line(exc)}") from exc
        except WebDriverException as exc:
            # The page could not take it (a pointer target out of reach, an element gone): the world is unchanged.
            refused = f"the page could not take it: {first_line(exc)}"
        if refused is not None:
            return Outcome(shown, valid=False, reason=refused)
        try:
            # The action is done; a no-op step makes MiniWoB read the reward, the end flag and the next screen.
            obs, _, terminated, _, info = gym.step(None)
        except Exception as exc:
            raise EnvError(f"miniwob: browser failed after {action.to_text()}: {exc}") from exc
        if gym.instance.died:
            raise EnvError(f"miniwob: the page failed after {action.to_text()} (see the log for its traceback)")
        raw = float(info.get("raw_reward") or 0.0)
        extra = {
            "miniwob_raw_reward": raw,
            "miniwob_reward": float(info.get("env_reward") or 0.0),
            "miniwob_reason": str(info.get("reason")),
        }
        observation = self._observe(obs, done=terminated)
        return Outcome(observation, success=terminated and raw > 0, done=terminated, extra=extra)

    def _perform(self, action: Action, shown: Observation, driver: Any) -> str | None:
        """Carry out the action in the page; the reason it is impossible here, or None when done."""
        from miniwob.selenium_actions import execute_press_key, execute_scroll_coords, execute_type_text

        n = len(shown.elements)
        index = getattr(action, "index", None)
        if index is not None and index >= n:
            return f"no element {index} on this page (it has 0..{n - 1})"
        element = shown.elements[index] if index is not None else None
        handle = self._handles[index] if index is not None else None
        match action:
            case Click() if element is not None and handle is not None:
                if element.editable or handle.ref < 0 or element.kind in ("field", "select"):
                    # A real pointer click where a script click falls short: headless chromium fires no focus event
                    # for element.focus() (focus-text needs one), and text runs (negative refs) are not DOM elements.
                    return self._pointer_click(element, handle, driver)
                result = driver.execute_script("return core.elementClick(arguments[0]);", handle.ref)
                return None if result is True else f"element {index} could not be clicked: {result}"
            case Click(x=x, y=y):
                return _click_at(float(x or 0), float(y or 0), driver)
            case TypeText(text=text) if element is not None and handle is not None:
                if not element.editable:
                    return f"element {index} ({element.kind}) is not a text field"
                if element.kind in _NUMBER_WIDGETS:
                    return _set_number(index, text, element.kind, handle, driver)
                driver.execute_script(_FOCUS_JS, handle.ref)
                execute_type_text(text, driver)
            case TypeText(text=text):
                execute_type_text(text, driver)
            case Select() if element is not None and handle is not None:
                return _select(action, element, handle, driver)
            case Drag(target=target) if element is not None and handle is not None:
                if target >= n:
                    return f"no element {target} on this page (it has 0..{n - 1})"
                return self._drag(element, handle, self._handles[target], driver)
            case KeyboardEnter():
                execute_press_key("<Enter>", driver)
            case Scroll(direction=direction) if handle is not None:
                dx, dy = _SCROLL_DELTAS[direction]
                if not driver.execute_script(_SCROLL_ELEMENT_JS, handle.ref, dx, dy):
                    return f"element {index} ({element.kind if element else ''}) does not scroll {direction}"
            case Scroll(direction=direction):
                if direction not in ("up", "down"):
                    return f"MiniWoB pages scroll up and down, not {direction}"
                execute_scroll_coords(80, 105, SCROLL_PX if direction == "down" else -SCROLL_PX, 150, driver)
            case Wait():
                pass
            case LongPress():
                return "MiniWoB pages have no long press"
            case NavigateBack() | NavigateHome():
                return "MiniWoB pages have no back or home button"
            case OpenApp():
                return "MiniWoB has no apps to open"
        return None

    def _pointer_click(self, element: UIElement, handle: _Handle, driver: Any) -> str | None:
        """Click the element's centre with the pointer, scrolling it into view first (page or container)."""
        if element.bounds is None:
            return f"element {element.index} has no position on the page"
        left, top, right, bottom = element.bounds
        dx, dy, width, height = driver.execute_script(_INTO_VIEW_JS, handle.anchor)
        x, y = (left + right) / 2 + dx, (top + bottom) / 2 + dy
        if not (0 <= x < width and 0 <= y < height):
            return f"element {element.index} is outside the window even after scrolling ({x:.0f}, {y:.0f})"
        return _click_at(x, y, driver)

    def _drag(self, element: UIElement, handle: _Handle, target: _Handle, driver: Any) -> str | None:
        """Press on the element's centre, move the pointer in steps onto the target's centre, release it there."""
        from selenium.webdriver.common.action_chains import ActionChains

        if element.bounds is None:
            return f"element {element.index} has no position on the page"
        driver.execute_script(_INTO_VIEW_JS, handle.anchor)
        (x, y), (tx, ty) = (driver.execute_script(_CENTRE_JS, h.anchor) for h in (handle, target))
        width, height = driver.execute_script("return [window.innerWidth, window.innerHeight];")
        for px, py in ((x, y), (tx, ty)):
            if not (0 <= px < width and 0 <= py < height):
                return f"({px:.0f}, {py:.0f}) is outside the {width}x{height} window"
        chain = ActionChains(driver, duration=0)
        pointer = chain.w3c_actions.pointer_action
        pointer.move_to_location(int(x), int(y))
        pointer.click_and_hold()
        for k in range(1, DRAG_STEPS + 1):
            pointer.move_to_location(int(x + (tx - x) * k / DRAG_STEPS), int(y + (ty - y) * k / DRAG_STEPS))
        pointer.release()
        chain.w3c_actions.perform()
        return None

    def _observe(self, obs: dict[str, Any], done: bool) -> Observation:
        task = self.task
        instruction = obs.get("utterance") or (self._observation.instruction if self._observation else "")
        if done:
            self._handles = []
            title = f"{task.template if task else 'MiniWoB'} (episode over)"
            return Observation(instruction, render_screen(title, ()), ())
        widgets, draggable = self._gym.instance.driver.execute_script(_WIDGETS_JS)
        elements, self._handles = _elements(
            obs["dom_elements"],
            {int(ref): w for ref, w in widgets.items()},
            {int(ref): str(root) for ref, root in draggable.items()},
        )
        screenshot = png(obs["screenshot"]) if self._screenshots else None
        title = task.template if task is not None else "MiniWoB"
        return Observation(instruction, render_screen(title, elements), elements, screenshot)


def typed_values(fields: list[str], instruction: str, texts: list[str]) -> list[str]:
    """What choice mode offers to type into a field, most likely first, at most :data:`MAX_TYPED`.

    The task's field values (MiniWoB's own extraction from the instruction), the instruction's quoted phrases and
    number-like tokens (dates, times, amounts), then the page's other texts and field contents, whole and word by
    word -- the text a person would copy from the screen into the field.
    """
    spans = [m[1] or m[2] for m in _QUOTED.finditer(instruction)]
    spans += [m[0].rstrip(".,:;") for m in _NUMBER.finditer(instruction)]
    words = [word for text in texts for word in _WORD.findall(text)]
    # A field's contents are copied verbatim, trailing space and all; the rest is trimmed.
    values = [*(v.strip() for v in (*fields, *spans)), *texts, *words]
    unique = dict.fromkeys(v for v in values if v.strip() and len(v) <= MAX_TEXT_CHARS and v.isprintable())
    return list(unique)[:MAX_TYPED]


def first_line(exc: BaseException) -> str:
    text = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
    return str(text).strip().splitlines()[0][:160]


def _click_at(x: float, y: float, driver: Any) -> str | None:
    """A pointer click at window coordinates, or why not (outside the window: WebDriver would refuse it)."""
    from miniwob.selenium_actions import execute_click_coords

    width, height = driver.execute_script("return [window.innerWidth, window.innerHeight];")
    if not (0 <= x < width and 0 <= y < height):
        return f"({x:.0f}, {y:.0f}) is outside the {width}x{height} window"
    execute_click_coords(x, y, driver)
    return None


def _select(action: Select, element: UIElement, handle: _Handle, driver: Any) -> str | None:
    """Pick an option by text or position (toggle it in a list box that takes several)."""
    if element.kind != "select" or handle.widget is None:
        return f"element {element.index} ({element.kind}) is not a dropdown or list box"
    options: list[str] = handle.widget["options"]
    if action.text is not None:
        if action.text not in options:
            shown = ", ".join(options[:12])
            return f"element {element.index} has no option {action.text[:40]!r} (options: {shown})"
        position = options.index(action.text)
    else:
        position = action.option if action.option is not None else -1
        if not 0 <= position < len(options):
            return f"element {element.index} has options 0..{len(options) - 1}, not {position}"
    driver.execute_script(_SELECT_JS, handle.ref, position)
    return None


def _set_number(index: int | None, text: str, kind: str, handle: _Handle, driver: Any) -> str | None:
    """Set a jQuery UI slider or spinner to a number within its range (the page reads the widget's value)."""
    assert handle.widget is not None  # sliders and spinners are recognised from their widget details
    try:
        value = float(text)
    except ValueError:
        return f"element {index} is a {kind}: type a number, not {text[:40]!r}"
    low, high = _bound(handle.widget["min"], -math.inf), _bound(handle.widget["max"], math.inf)
    if not low <= value <= high:
        return f"element {index} is a {kind} from {handle.widget['min']} to {handle.widget['max']}, not {text}"
    driver.execute_script(_NUMBER_WIDGET_JS, handle.ref, kind, int(value) if value.is_integer() else value)
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _bound(text: str, unbounded: float) -> float:
    # A spinner without a minimum or maximum has an empty one.
    return float(text) if _is_number(text) else unbounded


def png(pixels: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _elements(
    dom: tuple[dict[str, Any], ...], widgets: dict[int, dict[str, Any]], draggable: dict[int, str]
) -> tuple[tuple[UIElement, ...], list[_Handle]]:
    """Numbered elements from MiniWoB's DOM list: leaves with text, controls, widgets; checkbox labels folded in.

    ``draggable`` maps the refs inside a draggable to the draggable's own ref: one element stands for it, its first
    one that is not an icon (a sortable item by its label, a dialog by its title, not by every button in it).
    """
    roots: list[str | None] = []
    by_parent: dict[int, list[dict[str, Any]]] = {}
    for el in dom:
        by_parent.setdefault(int(el["parent"]), []).append(el)
    used_labels: set[int] = set()
    out: list[UIElement] = []
    handles: list[_Handle] = []
    for el in dom:
        ref, tag, text = int(el["ref"]), str(el["tag"]), str(el["text"]).strip()
        widget = widgets.get(ref)
        if ref in used_labels or not (el["flags"][3] or widget):
            continue
        state = ""
        kind = _KINDS.get(tag, "text")
        editable = tag in _FIELD_TAGS
        if widget is not None and widget["kind"] == "select":
            kind, text = "select", " | ".join(widget["options"]) or "(no options)"
            state = ", ".join(widget["options"][k] for k in widget["selected"])
        elif widget is not None and widget["kind"] in _NUMBER_WIDGETS:
            kind, state, editable = widget["kind"], widget["value"], True
            text = f"{widget['min']}..{widget['max']}" if widget["min"] and widget["max"] else "number"
        elif widget is not None and widget["kind"] == "readonly":
            kind, state, editable = "field", str(el["value"]), False
            text = text or str(el["id"]) or "input"
        elif widget is not None:
            kind, text = "list", "scrollable"
            state = " and ".join(
                f"more {side}" for side in ("above", "below") if widget["up" if side == "above" else "down"]
            )
        elif editable:
            kind, state = "field", str(el["value"])
            text = text or str(el["id"]) or "input"
        elif tag in ("input_checkbox", "input_radio"):
            siblings = [s for s in by_parent.get(int(el["parent"]), []) if s["tag"] == "t"]
            used_labels.update(int(s["ref"]) for s in siblings)
            text = " ".join(str(s["text"]).strip() for s in siblings)
            state = "checked" if str(el["value"]).lower() == "true" else "unchecked"
        elif "alink" in str(el["classes"]).split():
            kind = "link"
        elif not text and tag != "t" and (str(el["classes"]).strip() or el["id"]):
            # A control drawn as an image or icon (email-inbox's trash and star, social-media's like and retweet, a
            # tic-tac-toe cell): no text, so it is named by its classes, else its id, the only names the page gives.
            kind, text = "icon", " ".join(str(el["classes"]).split()) or str(el["id"])
        elif not text:
            continue
        anchor = ref if ref >= 0 else int(el["parent"])
        if el["flags"][0]:
            state = f"{state}, focused" if state else "focused"
        left, top = float(el["left"][0]), float(el["top"][0])
        width, height = float(el["width"][0]), float(el["height"][0])
        bounds = (int(left), int(top), int(left + width), int(top + height))
        out.append(UIElement(len(out), kind, text, state, clickable=True, editable=editable, bounds=bounds))
        value = str(el["value"]) if tag in _FIELD_TAGS else ""
        handles.append(_Handle(ref, anchor, widget, value))
        roots.append(draggable.get(anchor))
        if len(out) >= MAX_ELEMENTS:
            break
    chosen: dict[str, int] = {}
    for k, root in enumerate(roots):
        if root is None:
            continue
        if root not in chosen or (out[chosen[root]].kind == "icon" and out[k].kind != "icon"):
            chosen[root] = k
    for k in chosen.values():
        state = out[k].state
        out[k] = replace(out[k], state=f"draggable, {state}" if state else "draggable")
        handles[k] = replace(handles[k], draggable=True)
    return tuple(out), handles


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
