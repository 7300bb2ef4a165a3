"""An Android device or emulator driven through ``adb``, behind the DeviceEnv protocol.

Observation: ``uiautomator dump`` of the current window, parsed into numbered elements (clickable, checkable,
editable, scrollable or labelled nodes), plus ``screencap`` PNG bytes when screenshots are on. Actions become
``input tap/swipe/text/keyevent`` and ``monkey`` launches. There is no success check on a real device: success comes
from the judge (``env.judge = "llm"``), otherwise an episode ends on ``status`` or at the horizon with reward 0.

Every adb call is an asyncio subprocess with a timeout, so many devices are driven concurrently from one process.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

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
from distrl_stream.errors import AdbError, EnvError

DUMP_PATH: Final = "/sdcard/window_dump.xml"
LONG_PRESS_MS: Final = 800
SWIPE_MS: Final = 300
_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
# `input text` treats %s as a space and cannot type outside ASCII.
_TYPABLE = re.compile(r"^[\x20-\x7e]+$")
# Java's package-name rule, which Android application ids follow: two or more dot-separated identifiers.
_PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z][A-Za-z0-9_]*)+")


@dataclass(frozen=True, slots=True)
class WindowDump:
    """A parsed ``uiautomator dump``: the package in front, the screen size, and the numbered elements."""

    package: str
    size: tuple[int, int]
    elements: tuple[UIElement, ...]


def parse_uiautomator(xml: str | bytes) -> WindowDump:
    """Parse a ``uiautomator dump`` into numbered elements, in document order.

    Kept: nodes that can be acted on (clickable, long-clickable, checkable, scrollable, editable) and nodes that carry
    a label (text or content-desc), if their on-screen box is not empty. A clickable row without a label of its own
    (the usual Android list item) takes the texts inside it as its label, and those texts are not listed again.

    Raises:
        EnvError: the dump is not uiautomator XML.
    """
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise EnvError(f"android: window dump is not XML ({exc}): {str(xml)[:120]!r}") from None
    if root.tag != "hierarchy":
        raise EnvError(f"android: window dump has root <{root.tag}>, expected <hierarchy>")
    walk = _Walk()
    for node in root:
        walk.visit(node, labelled_by_parent=False)
    return WindowDump(walk.package, walk.size, tuple(walk.elements))


class _Walk:
    """Depth-first pass over the dump's nodes, collecting elements."""

    def __init__(self) -> None:
        self.package = ""
        self.size = (0, 0)
        self.elements: list[UIElement] = []

    def visit(self, node: ET.Element, labelled_by_parent: bool) -> None:
        a = node.attrib
        self.package = self.package or a.get("package", "")
        box = _BOUNDS.fullmatch(a.get("bounds", ""))
        if box is None:
            return
        left, top, right, bottom = (int(v) for v in box.groups())
        self.size = (max(self.size[0], right), max(self.size[1], bottom))
        flag = {k: a.get(k) == "true" for k in ("clickable", "long-clickable", "checkable", "scrollable", "checked")}
        cls = a.get("class", "")
        editable = "EditText" in cls
        resource = a.get("resource-id", "").rpartition("/")[2]
        text, desc = a.get("text", "").strip(), a.get("content-desc", "").strip()
        pressable = flag["clickable"] or flag["long-clickable"] or flag["checkable"]
        actionable = pressable or flag["scrollable"] or editable
        labels_children = pressable and not editable and not (text or desc)
        if labels_children:
            text = ", ".join(_texts(node))[:80]
        visible = right > left and bottom > top
        if visible and (actionable or ((text or desc) and not labelled_by_parent)):
            self._add(cls, flag, editable, text, desc, resource, a, (left, top, right, bottom))
        for child in node:
            self.visit(child, labelled_by_parent or labels_children)

    def _add(
        self,
        cls: str,
        flag: dict[str, bool],
        editable: bool,
        text: str,
        desc: str,
        resource: str,
        a: dict[str, str],
        bounds: tuple[int, int, int, int],
    ) -> None:
        kind, state = _kind(cls, flag, editable)
        label = (desc or resource or "text field") if editable else (text or desc or resource or kind)
        if editable:
            state = text
        if a.get("focused") == "true":
            state = f"{state}, focused" if state else "focused"
        if a.get("selected") == "true":
            state = f"{state}, selected" if state else "selected"
        self.elements.append(
            UIElement(
                index=len(self.elements),
                kind=kind,
                text=label,
                state=state,
                clickable=flag["clickable"] or flag["checkable"] or editable,
                long_clickable=flag["long-clickable"],
                editable=editable,
                bounds=bounds,
            )
        )


def _texts(node: ET.Element) -> list[str]:
    """The texts (or content descriptions) inside a node, in order."""
    out = []
    for child in node.iter("node"):
        label = child.attrib.get("text", "").strip() or child.attrib.get("content-desc", "").strip()
        if label and child is not node:
            out.append(label)
    return out


def _kind(cls: str, flag: dict[str, bool], editable: bool) -> tuple[str, str]:
    if editable:
        return "field", ""
    on_off = "on" if flag["checked"] else "off"
    if "Switch" in cls or "ToggleButton" in cls:
        return "toggle", on_off
    if "CheckBox" in cls:
        return "checkbox", "checked" if flag["checked"] else "unchecked"
    if "RadioButton" in cls:
        return "radio", "checked" if flag["checked"] else "unchecked"
    if flag["checkable"]:
        return "toggle", on_off
    if "Button" in cls:
        return "button", ""
    if flag["scrollable"]:
        return "list", ""
    if "TextView" in cls:
        return ("item" if flag["clickable"] else "text"), ""
    return ("item" if flag["clickable"] else "view"), ""


class AndroidEnv(EnvBase):
    """A device reached through adb.

    Args:
        adb_path: the adb executable.
        serial: the device's serial (``adb -s``); None for the only attached device.
        timeout_s: timeout of one adb command.
        settle_s: wait after each action before reading the screen (animations, app start).
        apps: app name -> package for ``open_app``; a name containing a dot is taken as a package. Either way an
            invalid package name (not dot-separated Java identifiers) makes the action invalid.
        screenshots: attach ``screencap`` PNG bytes to every observation.
    """

    kind: EnvKind = "android"

    def __init__(
        self,
        adb_path: str = "adb",
        serial: str | None = None,
        timeout_s: float = 30.0,
        settle_s: float = 1.0,
        apps: Mapping[str, str] | None = None,
        screenshots: bool = False,
    ) -> None:
        super().__init__()
        self._adb_path, self._serial = adb_path, serial
        self._timeout_s, self._settle_s = timeout_s, settle_s
        self._apps = dict(apps or {})
        self._screenshots = screenshots
        self._screen_size = (1080, 2400)

    @classmethod
    def from_config(cls, section: EnvConfig) -> AndroidEnv:
        """An environment set up from the ``env`` config section."""
        return cls(
            section.adb_path,
            section.adb_serial,
            section.adb_timeout_s,
            section.android_settle_s,
            section.android_apps,
            section.screenshots,
        )

    def candidates(self, observation: Observation) -> list[str]:
        """Clicks and long presses where the UI allows them, scrolls on scrollable screens, back and home.

        Text to type cannot be enumerated on a real device, so choice mode on Android offers no ``type`` actions.
        """
        out: list[str] = []
        for el in observation.elements:
            if el.clickable:
                out.append(Click(index=el.index).to_text())
            if el.long_clickable:
                out.append(LongPress(index=el.index).to_text())
        if any(el.kind == "list" for el in observation.elements):
            out.extend(Scroll(direction=d).to_text() for d in ("up", "down"))
        out.extend((NavigateBack().to_text(), NavigateHome().to_text()))
        return out

    async def close(self) -> None:
        """Nothing to release: each adb call is its own process, and the device stays as it is."""

    async def adb(self, *args: str) -> bytes:
        """Run one adb command against the device and return its stdout.

        The arguments are taken literally: for ``shell`` and ``exec-out`` adb joins them with spaces into one command
        line that the device's ``sh -c`` runs, so each is shell-quoted here first (a ``;`` or ``$(...)`` in an
        action's text would otherwise run as a command of its own).

        Raises:
            AdbError: adb is missing, failed, or timed out; the message has the command and adb's error output.
        """
        prefix = [self._adb_path, *(("-s", self._serial) if self._serial else ())]
        command = shlex.join([*prefix, *args])  # as typed in a terminal: the local shell unquotes it once
        if args[:1] in (("shell",), ("exec-out",)):
            args = (args[0], *map(shlex.quote, args[1:]))
        argv = [*prefix, *args]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise AdbError(f"cannot run {command}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AdbError(f"{command} timed out after {self._timeout_s:g} s") from None
        if proc.returncode != 0:
            message = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
            raise AdbError(f"{command} failed (exit {proc.returncode}): {message[:300]}")
        return out

    async def _reset(self, task: Task) -> Observation:
        if task.env != "android":
            raise EnvError(f"android: cannot run task {task.id} of env {task.env}")
        await self.adb("shell", "input", "keyevent", "KEYCODE_HOME")
        await self._settle()
        return await self._observe(task.instruction)

    async def _apply(self, action: Action) -> Outcome:
        shown = self._observation
        assert shown is not None  # EnvBase.step checks the episode is live
        if isinstance(action, Status):
            return Outcome(shown, done=True)
        command = self._command(action, shown)
        if isinstance(command, str):
            return Outcome(shown, valid=False, reason=command)
        for args in command:
            await self.adb(*args)
        await self._settle()
        return Outcome(await self._observe(shown.instruction))

    def _command(self, action: Action, shown: Observation) -> list[list[str]] | str:
        """The adb invocations for an action, or the reason it is impossible on this screen."""
        els = shown.elements
        match action:
            case Click() | LongPress():
                point = self._point(action.index, action.x, action.y, els)
                if isinstance(point, str):
                    return point
                x, y = point
                if isinstance(action, Click):
                    return [["shell", "input", "tap", str(x), str(y)]]
                return [["shell", "input", "swipe", str(x), str(y), str(x), str(y), str(LONG_PRESS_MS)]]
            case TypeText(text=text, index=index):
                if not _TYPABLE.fullmatch(text):
                    return "adb input text can type printable ASCII only"
                commands = []
                if index is not None:
                    if index >= len(els):
                        return f"no element {index} on this screen (it has 0..{len(els) - 1})"
                    if not els[index].editable:
                        return f"element {index} ({els[index].kind} {els[index].text}) is not a text field"
                    x, y = _center(els[index].bounds)
                    commands.append(["shell", "input", "tap", str(x), str(y)])
                commands.append(["shell", "input", "text", text.replace(" ", "%s")])
                return commands
            case Scroll(direction=direction, index=index):
                if index is not None and index >= len(els):
                    return f"no element {index} on this screen (it has 0..{len(els) - 1})"
                box = els[index].bounds if index is not None else None
                return [["shell", "input", "swipe", *map(str, self._swipe(direction, box)), str(SWIPE_MS)]]
            case NavigateBack():
                return [["shell", "input", "keyevent", "KEYCODE_BACK"]]
            case NavigateHome():
                return [["shell", "input", "keyevent", "KEYCODE_HOME"]]
            case KeyboardEnter():
                return [["shell", "input", "keyevent", "KEYCODE_ENTER"]]
            case OpenApp(app_name=name):
                package = self._apps.get(name) or (name if "." in name else None)
                if package is None:
                    known = ", ".join(sorted(self._apps)) or "none configured (env.android_apps)"
                    return f"no package known for app {name[:40]!r} (known: {known})"
                if not _PACKAGE.fullmatch(package):
                    return (
                        f"{package[:60]!r} (for app {name[:40]!r}) is not an Android package name: dot-separated "
                        "identifiers of letters, digits and _, each starting with a letter (com.android.settings)"
                    )
                return [["shell", "monkey", "-p", package, "-c", "android.intent.category.LAUNCHER", "1"]]
            case Wait():
                return []
        # Kinds made for web pages (select, drag) have no adb command.
        return f"the device has no {action.action_type.value} action ({action.to_text()})"

    def _point(
        self, index: int | None, x: int | None, y: int | None, els: tuple[UIElement, ...]
    ) -> tuple[int, int] | str:
        if index is None:
            assert x is not None and y is not None  # the parser guarantees x and y together
            width, height = self._screen_size
            if x >= width or y >= height:
                return f"({x}, {y}) is off the {width}x{height} screen"
            return x, y
        if index >= len(els):
            return f"no element {index} on this screen (it has 0..{len(els) - 1})"
        return _center(els[index].bounds)

    def _swipe(self, direction: str, box: tuple[int, int, int, int] | None) -> tuple[int, int, int, int]:
        """Finger path that reveals content further in ``direction`` (scrolling down drags the finger up)."""
        left, top, right, bottom = box or (0, 0, *self._screen_size)
        cx, cy = (left + right) // 2, (top + bottom) // 2
        dx, dy = (right - left) * 3 // 10, (bottom - top) * 3 // 10
        return {
            "down": (cx, cy + dy, cx, cy - dy),
            "up": (cx, cy - dy, cx, cy + dy),
            "right": (cx + dx, cy, cx - dx, cy),
            "left": (cx - dx, cy, cx + dx, cy),
        }[direction]

    async def _observe(self, instruction: str) -> Observation:
        await self.adb("shell", "uiautomator", "dump", DUMP_PATH)
        dump = parse_uiautomator(await self.adb("exec-out", "cat", DUMP_PATH))
        if dump.size[0] > 0 and dump.size[1] > 0:
            self._screen_size = dump.size
        screenshot = await self.adb("exec-out", "screencap", "-p") if self._screenshots else None
        screen = render_screen(dump.package or "Android", dump.elements)
        return Observation(instruction, screen, dump.elements, screenshot)

    async def _settle(self) -> None:
        if self._settle_s > 0:
            await asyncio.sleep(self._settle_s)


def _center(bounds: tuple[int, int, int, int] | None) -> tuple[int, int]:
    assert bounds is not None  # parse_uiautomator keeps only nodes with bounds
    left, top, right, bottom = bounds
    return (left + right) // 2, (top + bottom) // 2
