"""The simulated phone's world: state, screens, and what every action does to them.

Everything the agent needs is on the screen it sees: toggles show their state, lists say when more items are above or
below, fields show what is typed into them. Screens stay small (at most ten elements) so that a rendered observation
fits in a few hundred characters.

The world is a plain mutable object. Actions are validated against the current screen *before* anything changes,
so an impossible action leaves every field of the world as it was.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

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
from distrl_stream.envs.base import UIElement, render_screen

APPS: Final = ("Settings", "Clock", "Contacts", "Store", "Notes", "Music", "Messages", "Camera")
NETWORK_SETTINGS: Final = ("Wi-Fi", "Bluetooth", "Airplane mode")
DISPLAY_SETTINGS: Final = ("Dark theme", "Auto-rotate")
SOUND_SETTINGS: Final = ("Do not disturb", "Vibrate")
FONT_SIZES: Final = ("Small", "Medium", "Large", "Huge")
MUSIC_OPTIONS: Final = ("Shuffle", "Repeat")
STORE_FAMILIES: Final = (
    "Maps", "Chess", "Radio", "Weather", "Fitness", "Recipes",
    "Podcasts", "Translate", "Budget", "Sudoku", "Flashlight", "Scanner",
)  # fmt: skip
STORE_VARIANTS: Final = ("", " Pro", " Lite", " Plus")
STORE_RESULTS: Final = 3
MAX_ALARMS: Final = 4
MAX_VOLUME: Final = 10
# Items per page of the scrolling lists; scrolling moves one page.
PAGE: Final = {"contacts": 4, "notes": 3, "music": 4}
# A virtual 1080x2400 portrait screen: element i is a full-width row, so x/y clicks map back to elements.
ROW_TOP: Final = 200
ROW_HEIGHT: Final = 160
SCREEN_WIDTH: Final = 1080
_ROW_BOUNDS: Final = tuple(
    (0, ROW_TOP + i * ROW_HEIGHT, SCREEN_WIDTH, ROW_TOP + (i + 1) * ROW_HEIGHT) for i in range(16)
)


@dataclass
class Contact:
    """An address-book entry."""

    name: str
    phone: str = ""
    favorite: bool = False


@dataclass
class Alarm:
    """An alarm clock entry (HH:MM)."""

    time: str
    on: bool = True


@dataclass
class Note:
    """A note in the Notes app."""

    title: str
    pinned: bool = False


@dataclass
class Screen:
    """One entry of the navigation stack, with the screen's own transient state."""

    name: str
    arg: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    focused: str | None = None
    scroll: int = 0
    selected: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the screen for navigation: (name, argument)."""
        return (self.name, self.arg)


class _El:
    """An element while the screen is built: what it shows and what clicking it does."""

    __slots__ = ("field", "kind", "on_click", "on_long", "opens", "state", "text")

    def __init__(
        self,
        kind: str,
        text: str,
        state: str = "",
        on_click: Callable[[], None] | None = None,
        on_long: Callable[[], None] | None = None,
        field: str | None = None,
        opens: tuple[str, str] | None = None,
    ) -> None:
        self.kind, self.text, self.state = kind, text, state
        self.on_click, self.on_long, self.field, self.opens = on_click, on_long, field, opens


@dataclass
class Applied:
    """What applying one action did: validity, the reason when invalid, and whether it ended the episode."""

    valid: bool
    reason: str | None = None
    status: str | None = None


@dataclass
class World:
    """The whole state of the simulated phone."""

    settings: dict[str, bool]
    font_size: str
    volume: int
    alarms: list[Alarm]
    contacts: list[Contact]
    store_seed: int
    notes: list[Note]
    songs: list[str]
    music: dict[str, bool]
    photos: int = 0
    installed: set[str] = field(default_factory=set)
    timer: int | None = None
    calls: list[str] = field(default_factory=list)
    store_opened: list[str] = field(default_factory=list)
    playing: str | None = None
    is_playing: bool = False
    sent: list[tuple[str, str]] = field(default_factory=list)
    stack: list[Screen] = field(default_factory=lambda: [Screen("home")])

    # ---- observation -------------------------------------------------------------------------------------------

    @property
    def screen(self) -> Screen:
        """The screen on top of the stack (the one shown)."""
        return self.stack[-1]

    def clone(self) -> World:
        """A deep copy (tests compare worlds before and after invalid actions)."""
        return copy.deepcopy(self)

    def elements(self) -> list[_El]:
        """The current screen's elements, in index order."""
        return _SCREENS[self.screen.name](self, self.screen)

    def title(self) -> str:
        """The current screen's title line."""
        s = self.screen
        return _TITLES[s.name] + (f" {s.arg}" if s.arg else "")

    def render(self) -> tuple[str, tuple[UIElement, ...]]:
        """Screen text and elements as the agent sees them."""
        els = tuple(
            UIElement(
                index=i,
                kind=e.kind,
                text=e.text,
                state=e.state,
                clickable=e.on_click is not None or e.field is not None,
                long_clickable=e.on_long is not None,
                editable=e.field is not None,
                bounds=_ROW_BOUNDS[i],
            )
            for i, e in enumerate(self.elements())
        )
        return render_screen(self.title(), els), els

    # ---- actions -----------------------------------------------------------------------------------------------

    def apply(self, action: Action) -> Applied:
        """Carry out one parsed action, or refuse it with a reason and change nothing."""
        match action:
            case Click() | LongPress():
                return self._press(action)
            case TypeText(text=text, index=index):
                return self._type(text, index)
            case Scroll(direction=direction):
                return self._scroll(direction)
            case NavigateBack():
                if len(self.stack) == 1:
                    return Applied(False, "already on the home screen")
                self.stack.pop()
                return Applied(True)
            case NavigateHome():
                if len(self.stack) == 1:
                    return Applied(False, "already on the home screen")
                del self.stack[1:]
                return Applied(True)
            case OpenApp(app_name=name):
                if name not in APPS:
                    return Applied(False, f"no app named {name[:40]!r} (apps: {', '.join(APPS)})")
                self.stack[1:] = [Screen(name.lower())]
                return Applied(True)
            case KeyboardEnter():
                return self._enter()
            case Wait():
                return Applied(True)
            case Status(goal_status=goal_status):
                return Applied(True, status=goal_status)
        # Kinds made for web pages (select, drag) have nothing to act on in this world.
        return Applied(False, f"the simulator has no {action.action_type.value} action ({action.to_text()})")

    def _target(self, action: Click | LongPress, els: list[_El]) -> tuple[int, str | None]:
        if action.index is not None:
            if action.index >= len(els):
                return -1, f"no element {action.index} on this screen (it has 0..{len(els) - 1})"
            return action.index, None
        assert action.x is not None and action.y is not None  # the parser guarantees x and y together
        row = (action.y - ROW_TOP) // ROW_HEIGHT
        if action.x >= SCREEN_WIDTH or action.y < ROW_TOP or row >= len(els):
            return -1, f"no element at ({action.x}, {action.y})"
        return row, None

    def _press(self, action: Click | LongPress) -> Applied:
        els = self.elements()
        i, reason = self._target(action, els)
        if reason is not None:
            return Applied(False, reason)
        el = els[i]
        if isinstance(action, LongPress):
            if el.on_long is None:
                return Applied(False, f"element {i} ({el.kind} {el.text}) cannot be long-pressed")
            el.on_long()
            return Applied(True)
        if el.field is not None:
            self.screen.focused = el.field
            return Applied(True)
        if el.on_click is None:
            return Applied(False, f"element {i} ({el.kind} {el.text}) is not clickable")
        el.on_click()
        return Applied(True)

    def _type(self, text: str, index: int | None) -> Applied:
        s = self.screen
        if index is None:
            if s.focused is None:
                return Applied(False, "no text field is focused; give the field's index")
            s.fields[s.focused] = text
            return Applied(True)
        els = self.elements()
        if index >= len(els):
            return Applied(False, f"no element {index} on this screen (it has 0..{len(els) - 1})")
        target = els[index].field
        if target is None:
            return Applied(False, f"element {index} ({els[index].kind} {els[index].text}) is not a text field")
        s.fields[target] = text
        s.focused = target
        return Applied(True)

    def _scroll(self, direction: str) -> Applied:
        s = self.screen
        page = PAGE.get(s.name)
        if page is None:
            return Applied(False, "nothing to scroll on this screen")
        if direction not in ("up", "down"):
            return Applied(False, f"this list scrolls up and down, not {direction}")
        n = len(self._list_items(s.name))
        s.selected = None  # a selection scrolled out of sight would be hidden state
        if direction == "down" and s.scroll + page < n:
            s.scroll += page
        elif direction == "up" and s.scroll > 0:
            s.scroll -= page
        return Applied(True)

    def _enter(self) -> Applied:
        s = self.screen
        if s.focused is None:
            return Applied(False, "no text field is focused")
        if s.name == "store":
            self._search()
        return Applied(True)

    # ---- helpers the screens share ------------------------------------------------------------------------------

    def _list_items(self, name: str) -> list[str]:
        if name == "contacts":
            return [c.name for c in self.contacts]
        if name == "notes":
            return [n.title for n in self.notes]
        return list(self.songs)

    def list_position(self, name: str, label: str) -> int:
        """Where ``label`` is in the scrolling list of screen ``name`` (-1 when absent)."""
        items = self._list_items(name)
        return items.index(label) if label in items else -1

    def _open(self, name: str, arg: str = "") -> Callable[[], None]:
        return lambda: self.stack.append(Screen(name, arg))

    def _pop(self) -> None:
        self.stack.pop()

    def _scroll_marks(self, s: Screen, n: int, page: int) -> list[_El]:
        marks = []
        if s.scroll > 0:
            marks.append(_El("text", "More above"))
        if s.scroll + page < n:
            marks.append(_El("text", "More below"))
        return marks

    def _search(self) -> None:
        query = self.screen.fields.get("Query", "").strip()
        if query:
            self.stack.append(Screen("results", query))

    def results(self, query: str) -> list[str]:
        """What the Store lists for a search: three variants of a known app family, in this world's own order."""
        if query not in STORE_FAMILIES:
            return []
        variants = [query + v for v in STORE_VARIANTS]
        return random.Random(self.store_seed * 100 + STORE_FAMILIES.index(query)).sample(variants, STORE_RESULTS)

    def contact(self, name: str) -> Contact | None:
        """The contact called ``name``, if any."""
        return next((c for c in self.contacts if c.name == name), None)

    def alarm(self, time: str) -> Alarm | None:
        """The alarm set for ``time``, if any."""
        return next((a for a in self.alarms if a.time == time), None)

    def note(self, title: str) -> Note | None:
        """The note titled ``title``, if any."""
        return next((n for n in self.notes if n.title == title), None)


# ---- screens ------------------------------------------------------------------------------------------------------
# Each builds the elements of one screen from the world; closures capture what a click does.


def _home(w: World, s: Screen) -> list[_El]:
    els = [_El("app", app, on_click=w._open(app.lower()), opens=(app.lower(), "")) for app in APPS]
    # The status bar, as on a phone: tasks that combine a setting with another app need it to be observable.
    status = ", ".join(f"{name} {'on' if w.settings[name] else 'off'}" for name in NETWORK_SETTINGS)
    els.append(_El("text", "Status", status))
    return els


def _toggle(w: World, name: str, store: dict[str, bool]) -> _El:
    def flip() -> None:
        store[name] = not store[name]

    return _El("toggle", name, "on" if store[name] else "off", on_click=flip)


def _settings(w: World, s: Screen) -> list[_El]:
    els = [_toggle(w, name, w.settings) for name in NETWORK_SETTINGS]
    els.append(_El("button", "Display", on_click=w._open("display"), opens=("display", "")))
    els.append(_El("button", "Sound", on_click=w._open("sound"), opens=("sound", "")))
    return els


def _display(w: World, s: Screen) -> list[_El]:
    els = [_toggle(w, name, w.settings) for name in DISPLAY_SETTINGS]
    els.append(_El("item", "Font size", w.font_size, on_click=w._open("font"), opens=("font", "")))
    return els


def _font(w: World, s: Screen) -> list[_El]:
    def choose(size: str) -> Callable[[], None]:
        return lambda: setattr(w, "font_size", size)

    return [_El("item", size, "selected" if w.font_size == size else "", on_click=choose(size)) for size in FONT_SIZES]


def _sound(w: World, s: Screen) -> list[_El]:
    def louder() -> None:
        w.volume = min(MAX_VOLUME, w.volume + 1)

    def quieter() -> None:
        w.volume = max(0, w.volume - 1)

    els = [
        _El("text", "Volume", str(w.volume)),
        _El("button", "Volume up", on_click=louder),
        _El("button", "Volume down", on_click=quieter),
    ]
    els.extend(_toggle(w, name, w.settings) for name in SOUND_SETTINGS)
    return els


def _clock(w: World, s: Screen) -> list[_El]:
    els = [_El("button", "Timer", on_click=w._open("timer"), opens=("timer", ""))]
    for alarm in w.alarms:

        def flip(a: Alarm = alarm) -> None:
            a.on = not a.on

        def select(a: Alarm = alarm) -> None:
            s.selected = a.time

        state = ("on" if alarm.on else "off") + (", selected" if s.selected == alarm.time else "")
        els.append(_El("toggle", alarm.time, state, on_click=flip, on_long=select))
    if len(w.alarms) < MAX_ALARMS:
        els.append(_El("button", "Add alarm", on_click=w._open("new_alarm"), opens=("new_alarm", "")))
    if s.selected is not None:

        def delete() -> None:
            w.alarms = [a for a in w.alarms if a.time != s.selected]
            s.selected = None

        els.append(_El("button", "Delete", on_click=delete))
    return els


def _field(s: Screen, name: str) -> _El:
    value = s.fields.get(name, "")
    if s.focused == name:
        value = f"{value} (focused)" if value else "(focused)"
    return _El("field", name, value, field=name)


def _new_alarm(w: World, s: Screen) -> list[_El]:
    def save() -> None:
        time = s.fields.get("Time", "")
        if _is_time(time) and w.alarm(time) is None and len(w.alarms) < MAX_ALARMS:
            w.alarms.append(Alarm(time))
            w.alarms.sort(key=lambda a: a.time)
            w._pop()

    return [_field(s, "Time"), _El("button", "Save", on_click=save)]


def _timer(w: World, s: Screen) -> list[_El]:
    def start() -> None:
        minutes = s.fields.get("Minutes", "")
        if minutes.isdigit() and 0 < int(minutes) < 100:
            w.timer = int(minutes)

    state = f"running {w.timer} min" if w.timer else "off"
    return [_El("text", "Timer", state), _field(s, "Minutes"), _El("button", "Start", on_click=start)]


def _contacts(w: World, s: Screen) -> list[_El]:
    page = PAGE["contacts"]
    els = [_El("button", "Add contact", on_click=w._open("new_contact"), opens=("new_contact", ""))]
    for c in w.contacts[s.scroll : s.scroll + page]:
        els.append(_El("item", c.name, on_click=w._open("contact", c.name), opens=("contact", c.name)))
    return els + w._scroll_marks(s, len(w.contacts), page)


def _contact(w: World, s: Screen) -> list[_El]:
    c = w.contact(s.arg)
    if c is None:  # deleted while on the stack
        return [_El("text", "Contact deleted")]

    def call() -> None:
        w.calls.append(c.name)

    def favorite() -> None:
        c.favorite = not c.favorite

    def delete() -> None:
        w.contacts.remove(c)
        w._pop()

    return [
        _El("text", "Phone", c.phone or "none"),
        _El("button", "Call", on_click=call),
        _El("toggle", "Favorite", "on" if c.favorite else "off", on_click=favorite),
        _El("button", "Delete", on_click=delete),
    ]


def _new_contact(w: World, s: Screen) -> list[_El]:
    def save() -> None:
        name = s.fields.get("Name", "").strip()
        if name and w.contact(name) is None:
            w.contacts.append(Contact(name, s.fields.get("Phone", "").strip()))
            w.contacts.sort(key=lambda c: c.name)
            # As on Android, saving shows the new contact (so whether it was saved is never below the fold).
            w.stack[-1] = Screen("contact", name)

    return [_field(s, "Name"), _field(s, "Phone"), _El("button", "Save", on_click=save)]


def _store(w: World, s: Screen) -> list[_El]:
    return [_field(s, "Query"), _El("button", "Search", on_click=w._search)]


def _results(w: World, s: Screen) -> list[_El]:
    hits = w.results(s.arg)
    if not hits:
        return [_El("text", "No results")]
    return [
        _El("item", app, "installed" if app in w.installed else "", on_click=_store_page(w, app), opens=("app", app))
        for app in hits
    ]


def _store_page(w: World, app: str) -> Callable[[], None]:
    def open_page() -> None:
        w.store_opened.append(app)
        w.stack.append(Screen("app", app))

    return open_page


def _app_page(w: World, s: Screen) -> list[_El]:
    if s.arg in w.installed:
        return [_El("text", "Installed")]
    return [_El("button", "Install", on_click=lambda: w.installed.add(s.arg))]


def _notes(w: World, s: Screen) -> list[_El]:
    page = PAGE["notes"]
    els = [_El("button", "New note", on_click=w._open("new_note"), opens=("new_note", ""))]
    for note in w.notes[s.scroll : s.scroll + page]:

        def select(n: Note = note) -> None:
            s.selected = n.title

        state = "selected" if s.selected == note.title else ""
        key = ("note", note.title)
        els.append(_El("item", note.title, state, on_click=w._open(*key), on_long=select, opens=key))
    if s.selected is not None:

        def delete() -> None:
            w.notes = [n for n in w.notes if n.title != s.selected]
            s.selected = None
            s.scroll = min(s.scroll, max(0, (len(w.notes) - 1) // page * page))

        els.append(_El("button", "Delete", on_click=delete))
    return els + w._scroll_marks(s, len(w.notes), page)


def _note(w: World, s: Screen) -> list[_El]:
    note = w.note(s.arg)
    if note is None:  # deleted while on the stack
        return [_El("text", "Note deleted")]

    def pin() -> None:
        note.pinned = not note.pinned

    return [_El("toggle", "Pinned", "on" if note.pinned else "off", on_click=pin)]


def _new_note(w: World, s: Screen) -> list[_El]:
    def save() -> None:
        title = s.fields.get("Title", "").strip()
        if title and w.note(title) is None:
            w.notes.append(Note(title))
            w._pop()

    return [_field(s, "Title"), _El("button", "Save", on_click=save)]


def _music(w: World, s: Screen) -> list[_El]:
    page = PAGE["music"]
    els = [_toggle(w, name, w.music) for name in MUSIC_OPTIONS]
    for song in w.songs[s.scroll : s.scroll + page]:
        els.append(_El("item", song, on_click=w._open("player", song), opens=("player", song)))
    return els + w._scroll_marks(s, len(w.songs), page)


def _player(w: World, s: Screen) -> list[_El]:
    playing = w.playing == s.arg and w.is_playing

    def play_pause() -> None:
        if playing:
            w.is_playing = False
        else:
            w.playing, w.is_playing = s.arg, True

    return [_El("button", "Play", "playing" if playing else "paused", on_click=play_pause)]


def _messages(w: World, s: Screen) -> list[_El]:
    els = [_El("button", "New message", on_click=w._open("new_message"), opens=("new_message", ""))]
    els.extend(_El("text", f"To {to}", text) for to, text in w.sent[-3:])
    return els


def _new_message(w: World, s: Screen) -> list[_El]:
    def send() -> None:
        to, text = s.fields.get("To", "").strip(), s.fields.get("Message", "").strip()
        if to and text:
            w.sent.append((to, text))
            w._pop()

    return [_field(s, "To"), _field(s, "Message"), _El("button", "Send", on_click=send)]


def _camera(w: World, s: Screen) -> list[_El]:
    def shoot() -> None:
        w.photos += 1

    return [_El("text", "Photos", str(w.photos)), _El("button", "Shutter", on_click=shoot)]


def _is_time(text: str) -> bool:
    return len(text) == 5 and text[2] == ":" and text[:2].isdigit() and text[3:].isdigit() and int(text[:2]) < 24


_SCREENS: Final[dict[str, Callable[[World, Screen], list[_El]]]] = {
    "home": _home,
    "settings": _settings,
    "display": _display,
    "font": _font,
    "sound": _sound,
    "clock": _clock,
    "new_alarm": _new_alarm,
    "timer": _timer,
    "contacts": _contacts,
    "contact": _contact,
    "new_contact": _new_contact,
    "store": _store,
    "results": _results,
    "app": _app_page,
    "notes": _notes,
    "note": _note,
    "new_note": _new_note,
    "music": _music,
    "player": _player,
    "messages": _messages,
    "new_message": _new_message,
    "camera": _camera,
}
_TITLES: Final[dict[str, str]] = {
    "home": "Home",
    "settings": "Settings",
    "display": "Display",
    "font": "Font size",
    "sound": "Sound",
    "clock": "Clock",
    "new_alarm": "New alarm",
    "timer": "Timer",
    "contacts": "Contacts",
    "contact": "Contact",
    "new_contact": "New contact",
    "store": "Store",
    "results": "Results for",
    "app": "Store page",
    "notes": "Notes",
    "note": "Note",
    "new_note": "New note",
    "music": "Music",
    "player": "Player",
    "messages": "Messages",
    "new_message": "New message",
    "camera": "Camera",
}
