"""The action space every role shares: AndroidWorld-style JSON actions, a strict parser, and canonical text.

An action travels as compact JSON with a fixed key order, e.g. ``{"action_type":"click","index":3}``. Candidate
lists, model outputs and trajectory events all use exactly these strings, so choice mode can ask the model to pick
one of them and the learner can score the same tokens. :func:`parse_action` turns any text into either a typed
:data:`Action` or an :class:`InvalidAction` carrying the reason; it never raises.

Kinds (``action_type``) and their fields, with an example of each:

- ``click``: ``index`` (element) or ``x`` and ``y`` (pixels) -- ``{"action_type":"click","index":3}``
- ``long_press``: ``index`` or ``x`` and ``y`` -- ``{"action_type":"long_press","index":0}``
- ``type``: ``text``; optional ``index`` (focus that element first) -- ``{"action_type":"type","text":"Ana"}``
- ``scroll``: ``direction`` (up/down/left/right); optional ``index`` -- ``{"action_type":"scroll","direction":"down"}``
- ``select``: ``index`` (a dropdown or list box) and the option's ``text`` or its 0-based position ``option`` --
  ``{"action_type":"select","index":2,"text":"Blue"}``
- ``drag``: ``index`` (the element to drag) and ``target`` (the element to drop it on) --
  ``{"action_type":"drag","index":1,"target":4}``
- ``navigate_back``, ``navigate_home``, ``keyboard_enter``, ``wait``: no fields -- ``{"action_type":"wait"}``
- ``open_app``: ``app_name`` -- ``{"action_type":"open_app","app_name":"Clock"}``
- ``status``: ``goal_status`` (complete, infeasible) -- ``{"action_type":"status","goal_status":"complete"}``

AndroidWorld's own names ``input_text`` (for ``type``) and ``tap`` (for ``click``) are accepted and rendered back
under our names, so a model prompted the AndroidWorld way still speaks this space.
"""

from __future__ import annotations

import functools
import json
import math
import unicodedata
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Final, Literal

Direction = Literal["up", "down", "left", "right"]
GoalStatus = Literal["complete", "infeasible"]

DIRECTIONS: Final[tuple[str, ...]] = ("up", "down", "left", "right")
GOAL_STATUSES: Final[tuple[str, ...]] = ("complete", "infeasible")

# Bounds that keep a hostile or runaway model output cheap to reject (a 1 MB blob is not an action).
MAX_ACTION_CHARS: Final = 2000
MAX_TEXT_CHARS: Final = 200
MAX_INDEX: Final = 9999
MAX_COORD: Final = 100_000

# The one key order of canonical text: kind first, then target, then payload.
_KEY_ORDER: Final[tuple[str, ...]] = (
    "action_type",
    "index",
    "target",
    "x",
    "y",
    "direction",
    "option",
    "text",
    "app_name",
    "goal_status",
)
_ALIASES: Final[dict[str, str]] = {"input_text": "type", "tap": "click"}
# The string encoder json.dumps(ensure_ascii=False) uses (the C one where available).
_encode_string = json.encoder.encode_basestring


class ActionType(StrEnum):
    """The ``action_type`` values of the action space."""

    CLICK = "click"
    LONG_PRESS = "long_press"
    TYPE = "type"
    SCROLL = "scroll"
    SELECT = "select"
    DRAG = "drag"
    NAVIGATE_BACK = "navigate_back"
    NAVIGATE_HOME = "navigate_home"
    OPEN_APP = "open_app"
    KEYBOARD_ENTER = "keyboard_enter"
    WAIT = "wait"
    STATUS = "status"


# Which fields each kind takes; `index`/`x`/`y` are checked separately for the pointer kinds.
_FIELDS: Final[dict[ActionType, frozenset[str]]] = {
    ActionType.CLICK: frozenset({"index", "x", "y"}),
    ActionType.LONG_PRESS: frozenset({"index", "x", "y"}),
    ActionType.TYPE: frozenset({"text", "index"}),
    ActionType.SCROLL: frozenset({"direction", "index"}),
    ActionType.SELECT: frozenset({"index", "option", "text"}),
    ActionType.DRAG: frozenset({"index", "target"}),
    ActionType.NAVIGATE_BACK: frozenset(),
    ActionType.NAVIGATE_HOME: frozenset(),
    ActionType.OPEN_APP: frozenset({"app_name"}),
    ActionType.KEYBOARD_ENTER: frozenset(),
    ActionType.WAIT: frozenset(),
    ActionType.STATUS: frozenset({"goal_status"}),
}


class _Rendering:
    """Canonical JSON rendering shared by every action class."""

    __slots__ = ()
    action_type: ClassVar[ActionType]

    def to_dict(self) -> dict[str, Any]:
        """The action as a JSON object in canonical key order; unset optional fields are left out."""
        out: dict[str, Any] = {"action_type": self.action_type.value}
        for key in _keys_of(type(self)):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def to_text(self) -> str:
        """Canonical text: compact JSON, fixed key order, non-ASCII kept as is."""
        return _canonical_text(self)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.to_text()


@functools.cache
def _keys_of(cls: type) -> tuple[str, ...]:
    return tuple(key for key in _KEY_ORDER[1:] if key in cls.__dataclass_fields__)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=65536)
def _canonical_text(action: Action) -> str:
    # Hand-built rather than json.dumps: candidates are rendered on every step, and this is ~5x faster while giving
    # exactly json.dumps(to_dict(), separators=(",", ":"), ensure_ascii=False) (a property test checks that).
    parts = [f'{{"action_type":"{action.action_type.value}"']
    for key in _keys_of(type(action)):
        value = getattr(action, key)
        if value is not None:
            parts.append(f'"{key}":{value}' if isinstance(value, int) else f'"{key}":{_encode_string(value)}')
    return ",".join(parts) + "}"


@dataclass(frozen=True, slots=True)
class Click(_Rendering):
    """Tap an element by index, or a point by pixel coordinates (exactly one of the two)."""

    index: int | None = None
    x: int | None = None
    y: int | None = None
    action_type: ClassVar[ActionType] = ActionType.CLICK


@dataclass(frozen=True, slots=True)
class LongPress(_Rendering):
    """Press and hold an element by index, or a point by pixel coordinates."""

    index: int | None = None
    x: int | None = None
    y: int | None = None
    action_type: ClassVar[ActionType] = ActionType.LONG_PRESS


@dataclass(frozen=True, slots=True)
class TypeText(_Rendering):
    """Type ``text`` into the element ``index`` (focusing it first), or into the focused field when omitted."""

    text: str
    index: int | None = None
    action_type: ClassVar[ActionType] = ActionType.TYPE


@dataclass(frozen=True, slots=True)
class Scroll(_Rendering):
    """Scroll the screen (or the scrollable element ``index``) so that content further ``direction`` shows."""

    direction: Direction
    index: int | None = None
    action_type: ClassVar[ActionType] = ActionType.SCROLL


@dataclass(frozen=True, slots=True)
class Select(_Rendering):
    """Pick an option of the dropdown or list box ``index`` by its ``text`` or its 0-based position ``option``.

    Exactly one of ``text`` and ``option``; in a list box that takes several options, picking one toggles it.
    """

    index: int
    option: int | None = None
    text: str | None = None
    action_type: ClassVar[ActionType] = ActionType.SELECT


@dataclass(frozen=True, slots=True)
class Drag(_Rendering):
    """Press on the element ``index``, move the pointer onto the element ``target`` and release it there."""

    index: int
    target: int
    action_type: ClassVar[ActionType] = ActionType.DRAG


@dataclass(frozen=True, slots=True)
class NavigateBack(_Rendering):
    """The system back button."""

    action_type: ClassVar[ActionType] = ActionType.NAVIGATE_BACK


@dataclass(frozen=True, slots=True)
class NavigateHome(_Rendering):
    """The system home button."""

    action_type: ClassVar[ActionType] = ActionType.NAVIGATE_HOME


@dataclass(frozen=True, slots=True)
class OpenApp(_Rendering):
    """Launch an app by its name as the home screen shows it."""

    app_name: str
    action_type: ClassVar[ActionType] = ActionType.OPEN_APP


@dataclass(frozen=True, slots=True)
class KeyboardEnter(_Rendering):
    """Press Enter on the keyboard (submits the focused field where the screen has a submit action)."""

    action_type: ClassVar[ActionType] = ActionType.KEYBOARD_ENTER


@dataclass(frozen=True, slots=True)
class Wait(_Rendering):
    """Do nothing for one step (let the screen settle)."""

    action_type: ClassVar[ActionType] = ActionType.WAIT


@dataclass(frozen=True, slots=True)
class Status(_Rendering):
    """End the episode, declaring the task complete or infeasible."""

    goal_status: GoalStatus
    action_type: ClassVar[ActionType] = ActionType.STATUS


Action = (
    Click
    | LongPress
    | TypeText
    | Scroll
    | Select
    | Drag
    | NavigateBack
    | NavigateHome
    | OpenApp
    | KeyboardEnter
    | Wait
    | Status
)


@dataclass(frozen=True, slots=True)
class InvalidAction:
    """Text that is not an action of this space (or an action impossible on the current screen).

    Attributes:
        reason: one line saying what is wrong, for logs, trajectory events and the invalid-action penalty.
        raw: the text as received (truncated to :data:`MAX_ACTION_CHARS`), or the canonical text of a parsed action
            that the screen could not carry out.
    """

    reason: str
    raw: str = ""


def parse_action(text: str) -> Action | InvalidAction:
    """Parse model text into a typed action, strictly; never raises.

    The text (surrounding whitespace aside) must be exactly one JSON object with an ``action_type`` this space knows,
    exactly the fields that kind takes, and values of the right type and range. Anything else, including prose around
    the object, duplicate keys, unknown keys, booleans or floats where an integer belongs, yields an
    :class:`InvalidAction` whose ``reason`` names the first problem found.

    Args:
        text: what the model (or a user) produced.

    Returns:
        The typed action, or an :class:`InvalidAction`.
    """
    if not isinstance(text, str):
        return InvalidAction(f"expected text, got {type(text).__name__}", "")
    raw = text[:MAX_ACTION_CHARS]
    if len(text) > MAX_ACTION_CHARS:
        return InvalidAction(f"action text longer than {MAX_ACTION_CHARS} characters", raw)
    stripped = text.strip()
    if not stripped:
        return InvalidAction("empty action text", raw)
    try:
        obj = _DECODER.decode(stripped)
    except _DuplicateKeyError as exc:
        return InvalidAction(f"duplicate key {exc.args[0]!r}", raw)
    except (ValueError, RecursionError) as exc:
        return InvalidAction(f"not valid JSON: {_first_line(exc)}", raw)
    if not isinstance(obj, dict):
        return InvalidAction(f"expected a JSON object, got {type(obj).__name__}", raw)
    try:
        return _from_dict(obj)
    except _Reject as exc:
        return InvalidAction(str(exc), raw)


def action_from_dict(obj: dict[str, Any]) -> Action | InvalidAction:
    """Validate an already-decoded JSON object (same rules as :func:`parse_action`); never raises."""
    try:
        return _from_dict(obj)
    except _Reject as exc:
        return InvalidAction(str(exc), _safe_dump(obj))


def render_action(action: Action) -> str:
    """Canonical text of an action (the same as ``action.to_text()``)."""
    return action.to_text()


def canonicalize(text: str) -> str | None:
    """Canonical text for any valid spelling of an action (key order, spacing, aliases), or None if invalid."""
    parsed = parse_action(text)
    return None if isinstance(parsed, InvalidAction) else parsed.to_text()


class _Reject(Exception):
    """Internal: a JSON object that is not an action; the message becomes the InvalidAction reason."""


class _DuplicateKeyError(ValueError):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    # json accepts NaN/Infinity by default; they are not JSON and never a coordinate.
    raise ValueError(f"{name} is not allowed")


_DECODER: Final = json.JSONDecoder(object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant)


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:120]


def _safe_dump(obj: Any) -> str:
    try:
        return json.dumps(obj, ensure_ascii=False, default=str)[:MAX_ACTION_CHARS]
    except (TypeError, ValueError, RecursionError):
        return repr(obj)[:MAX_ACTION_CHARS]


def _from_dict(obj: dict[str, Any]) -> Action:
    kind_value = obj.get("action_type")
    if kind_value is None:
        raise _Reject("missing key 'action_type'")
    if not isinstance(kind_value, str):
        raise _Reject(f"'action_type' must be a string, got {type(kind_value).__name__}")
    kind_value = _ALIASES.get(kind_value, kind_value)
    try:
        kind = ActionType(kind_value)
    except ValueError:
        known = ", ".join(t.value for t in ActionType)
        raise _Reject(f"unknown action_type {kind_value[:40]!r} (known: {known})") from None
    fields = {k: v for k, v in obj.items() if k != "action_type"}
    unknown = sorted(set(fields) - _FIELDS[kind])
    if unknown:
        raise _Reject(f"{kind.value} does not take {', '.join(repr(k[:40]) for k in unknown)}")

    if kind in (ActionType.CLICK, ActionType.LONG_PRESS):
        index, x, y = _target(kind, fields)
        return Click(index, x, y) if kind is ActionType.CLICK else LongPress(index, x, y)
    if kind is ActionType.TYPE:
        return TypeText(_text(fields, "text", MAX_TEXT_CHARS), _optional_int(fields, "index", MAX_INDEX))
    if kind is ActionType.SCROLL:
        direction = _choice(fields, "direction", DIRECTIONS)
        return Scroll(direction, _optional_int(fields, "index", MAX_INDEX))  # type: ignore[arg-type]
    if kind is ActionType.SELECT:
        return _select(fields)
    if kind is ActionType.DRAG:
        return _drag(fields)
    if kind is ActionType.OPEN_APP:
        return OpenApp(_text(fields, "app_name", 100))
    if kind is ActionType.STATUS:
        return Status(_choice(fields, "goal_status", GOAL_STATUSES))  # type: ignore[arg-type]
    return _NO_FIELD_ACTIONS[kind]


_NO_FIELD_ACTIONS: Final[dict[ActionType, Action]] = {
    ActionType.NAVIGATE_BACK: NavigateBack(),
    ActionType.NAVIGATE_HOME: NavigateHome(),
    ActionType.KEYBOARD_ENTER: KeyboardEnter(),
    ActionType.WAIT: Wait(),
}


def _target(kind: ActionType, fields: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    has_index, has_x, has_y = "index" in fields, "x" in fields, "y" in fields
    if has_index and (has_x or has_y):
        raise _Reject(f"{kind.value} takes either 'index' or 'x' and 'y', not both")
    if has_index:
        return _optional_int(fields, "index", MAX_INDEX), None, None
    if has_x and has_y:
        return None, _optional_int(fields, "x", MAX_COORD), _optional_int(fields, "y", MAX_COORD)
    if has_x or has_y:
        raise _Reject(f"{kind.value} needs both 'x' and 'y'")
    raise _Reject(f"{kind.value} needs 'index' or 'x' and 'y'")


def _select(fields: dict[str, Any]) -> Select:
    if "index" not in fields:
        raise _Reject("select needs 'index' (the dropdown)")
    index = _optional_int(fields, "index", MAX_INDEX)
    assert index is not None  # present, checked above
    has_text, has_option = "text" in fields, "option" in fields
    if has_text == has_option:
        raise _Reject("select takes either 'text' or 'option' (the option's position), exactly one")
    if has_text:
        return Select(index, text=_text(fields, "text", MAX_TEXT_CHARS))
    return Select(index, option=_optional_int(fields, "option", MAX_INDEX))


def _drag(fields: dict[str, Any]) -> Drag:
    for key in ("index", "target"):
        if key not in fields:
            raise _Reject(f"drag needs '{key}' (the element to {'drag' if key == 'index' else 'drop it on'})")
    index, target = _optional_int(fields, "index", MAX_INDEX), _optional_int(fields, "target", MAX_INDEX)
    assert index is not None and target is not None  # present, checked above
    if index == target:
        raise _Reject("drag needs a 'target' other than the dragged element 'index'")
    return Drag(index, target)


def _optional_int(fields: dict[str, Any], key: str, maximum: int) -> int | None:
    if key not in fields:
        return None
    value = fields[key]
    # bool is an int subclass in Python, and 3.0 is a float: both are the model being sloppy, so both are invalid.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value):
            raise _Reject(f"'{key}' must be an integer, got {value!r}")
        raise _Reject(f"'{key}' must be an integer, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise _Reject(f"'{key}' must be in 0..{maximum}, got {value}")
    return value


def _text(fields: dict[str, Any], key: str, max_chars: int) -> str:
    if key not in fields:
        raise _Reject(f"missing key '{key}'")
    value = fields[key]
    if not isinstance(value, str):
        raise _Reject(f"'{key}' must be a string, got {type(value).__name__}")
    if not value:
        raise _Reject(f"'{key}' must not be empty")
    if len(value) > max_chars:
        raise _Reject(f"'{key}' longer than {max_chars} characters")
    for ch in value:
        # Control characters and lone surrogates cannot be typed and break UTF-8 encoders downstream.
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise _Reject(f"'{key}' contains the control or surrogate character U+{ord(ch):04X}")
    return value


def _choice(fields: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    if key not in fields:
        raise _Reject(f"missing key '{key}'")
    value = fields[key]
    if not isinstance(value, str) or value not in allowed:
        raise _Reject(f"'{key}' must be one of {', '.join(allowed)}, got {str(value)[:40]!r}")
    return value
