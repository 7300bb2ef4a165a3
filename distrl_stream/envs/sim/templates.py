"""Task templates of the simulated phone, and how tasks are drawn from them.

A template turns a seed into parameter values, an initial world in which the task is not yet done, an instruction,
a success check on the world, and the ops the oracle follows. Tasks are split into train and held-out test sets by
a stable hash: templates with many distinct instructions (names, times, titles) hold out whole *instructions*, so a
test task asks for something no train task asks for; the few small templates (a handful of settings) hold out
*worlds* (seeds) instead, since holding out one of three settings would leave nothing to learn it from.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Final, Literal

from distrl_stream.envs.actions import Action
from distrl_stream.envs.base import Split, Task
from distrl_stream.envs.seeding import stable_int
from distrl_stream.envs.sim.oracle import Op, fill, hold, next_action, tap
from distrl_stream.envs.sim.world import (
    DISPLAY_SETTINGS,
    FONT_SIZES,
    MAX_VOLUME,
    MUSIC_OPTIONS,
    NETWORK_SETTINGS,
    SOUND_SETTINGS,
    STORE_FAMILIES,
    STORE_VARIANTS,
    Alarm,
    Contact,
    Note,
    World,
)

NAMES: Final = (
    "Ana", "Ben", "Carla", "David", "Elena", "Farah", "Gabe", "Hana", "Ivan", "Jade",
    "Kai", "Lena", "Marco", "Nina", "Omar", "Paula", "Quinn", "Rosa", "Sam", "Tara",
    "Umar", "Vera", "Will", "Xena", "Yuri", "Zoe", "Alex", "Bella", "Chris", "Dana",
    "Eli", "Fiona", "Greg", "Iris", "Jon", "Kim", "Leo", "Maya", "Noah", "Olga",
)  # fmt: skip
PHONES: Final = tuple(f"555-01{i:02d}" for i in range(100))
TIMES: Final = tuple(f"{h:02d}:{m:02d}" for h in range(5, 23) for m in (0, 15, 30, 45))
MINUTES: Final = tuple(str(m) for m in range(2, 32))
FAMILIES: Final = STORE_FAMILIES
ALL_APPS: Final = tuple(family + v for family in STORE_FAMILIES for v in STORE_VARIANTS)
NOTE_TITLES: Final = (
    "Groceries", "Trip plan", "Books", "Gifts", "Chores", "Ideas", "Packing", "Movies", "Garden", "Workout",
    "Birthday", "Meeting", "Homework", "Errands", "Goals", "Dinner", "Party", "Repairs", "Taxes", "Pets",
    "Wishlist", "Quotes", "Holiday", "Lessons", "Moving", "Wedding", "Car", "Plants", "Bills", "Games",
)  # fmt: skip
SONGS: Final = (
    "Blue Sky", "Golden Hour", "Night Drive", "Paper Moon", "River Song", "Slow Dance", "Summer Rain", "Wild Fire",
    "City Lights", "Ocean Eyes", "Silver Line", "Morning Sun", "Red Balloon", "Quiet Storm", "Green Valley",
    "Last Train", "Starlight", "Echo Park", "Falling Leaves", "Open Road", "Sweet Home", "Northern Wind",
    "Velvet Night", "Happy Days",
)  # fmt: skip
MESSAGES: Final = (
    "On my way", "See you soon", "Running late", "Call me back", "Happy birthday", "Good morning", "Thanks a lot",
    "Be there at 5", "Lunch today?", "Miss you", "All good here", "Got it", "Meet at noon", "Sounds great",
    "Good night",
)  # fmt: skip

# Which vocabulary each text field draws its choice-mode texts from, and which task parameter fills it.
FIELD_VOCAB: Final[dict[str, tuple[str, ...]]] = {
    "Time": TIMES,
    "Minutes": MINUTES,
    "Name": NAMES,
    "Phone": PHONES,
    "Query": FAMILIES,
    "Title": NOTE_TITLES,
    "To": NAMES,
    "Message": MESSAGES,
}
FIELD_PARAM: Final[dict[str, str]] = {
    "Time": "time",
    "Minutes": "minutes",
    "Name": "name",
    "Phone": "phone",
    "Query": "query",
    "Title": "title",
    "To": "name",
    "Message": "text",
}
TEXTS_PER_FIELD: Final = 3
TEST_PERCENT: Final = 20
HORIZON_SLACK: Final = 3
MAX_HORIZON: Final = 15

Params = dict[str, str]

# Navigation paths the templates share.
SETTINGS: Final = (("settings", ""),)
DISPLAY: Final = (*SETTINGS, ("display", ""))
SOUND: Final = (*SETTINGS, ("sound", ""))
CLOCK: Final = (("clock", ""),)
NEW_ALARM: Final = (*CLOCK, ("new_alarm", ""))
CONTACTS: Final = (("contacts", ""),)
NEW_CONTACT: Final = (*CONTACTS, ("new_contact", ""))
STORE: Final = (("store", ""),)
NOTES: Final = (("notes", ""),)
MUSIC: Final = (("music", ""),)
NEW_MESSAGE: Final = (("messages", ""), ("new_message", ""))


@dataclass(frozen=True)
class Template:
    """A family of tasks.

    Attributes:
        name: stable identifier (part of task ids).
        split_on: what the train/test hash looks at: ``instruction`` (held-out parameter values) or ``world``
            (held-out seeds).
        build: draws parameters and an initial world (where the task is not done) from a seeded generator.
        instruction: the natural-language goal for given parameters.
        success: the check on the world state.
        ops: the oracle's sub-goals for given parameters.
    """

    name: str
    split_on: Literal["instruction", "world"]
    build: Callable[[random.Random], tuple[Params, World]]
    instruction: Callable[[Params], str]
    success: Callable[[World, Params], bool]
    ops: Callable[[Params], list[Op]]


def base_world(rng: random.Random) -> World:
    """A random, plausible phone: the backdrop every template then adjusts to its needs."""
    settings = {name: rng.random() < 0.5 for name in (*NETWORK_SETTINGS, *DISPLAY_SETTINGS, *SOUND_SETTINGS)}
    alarms = [Alarm(t, rng.random() < 0.5) for t in sorted(rng.sample(TIMES, rng.randint(1, 3)))]
    names = sorted(rng.sample(NAMES, rng.randint(2, 7)))
    contacts = [Contact(n, rng.choice(PHONES), rng.random() < 0.2) for n in names]
    notes = [Note(t, rng.random() < 0.2) for t in rng.sample(NOTE_TITLES, rng.randint(1, 5))]
    songs = rng.sample(SONGS, rng.randint(4, 8))
    world = World(
        settings=settings,
        font_size=rng.choice(FONT_SIZES),
        volume=rng.randint(0, MAX_VOLUME),
        alarms=alarms,
        contacts=contacts,
        store_seed=rng.randrange(1 << 30),
        notes=notes,
        songs=songs,
        music={name: rng.random() < 0.5 for name in MUSIC_OPTIONS},
        photos=rng.randint(0, 30),
        installed=set(rng.sample(ALL_APPS, rng.randint(0, 4))),
    )
    if rng.random() < 0.3:
        world.playing = rng.choice(songs)
    return world


# ---- the templates ------------------------------------------------------------------------------------------------


def _setting_template(name: str, group: tuple[str, ...], path: tuple, on: bool | None) -> Template:
    """Turn one setting of ``group`` on or off (``on=None``: the direction is a parameter too)."""

    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        setting = rng.choice(group)
        want = on if on is not None else rng.random() < 0.5
        w.settings[setting] = not want
        return {"setting": setting, "state": "on" if want else "off"}, w

    return Template(
        name,
        "world",
        build,
        lambda p: f"Turn {p['state']} {p['setting']}",
        lambda w, p: w.settings[p["setting"]] == (p["state"] == "on"),
        lambda p: [tap(path, p["setting"], lambda w: w.settings[p["setting"]] == (p["state"] == "on"))],
    )


def _font_size() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        size = rng.choice(FONT_SIZES)
        w.font_size = rng.choice([s for s in FONT_SIZES if s != size])
        return {"size": size}, w

    return Template(
        "set_font_size",
        "world",
        build,
        lambda p: f"Set the font size to {p['size']}",
        lambda w, p: w.font_size == p["size"],
        lambda p: [tap((*DISPLAY, ("font", "")), p["size"], lambda w: w.font_size == p["size"])],
    )


def _volume() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        target = rng.randint(0, MAX_VOLUME)
        choices = [v for v in range(MAX_VOLUME + 1) if 1 <= abs(v - target) <= 4]
        w.volume = rng.choice(choices)
        return {"volume": str(target)}, w

    def ops(p: Params) -> list[Op]:
        n = int(p["volume"])
        return [tap(SOUND, lambda w: "Volume up" if w.volume < n else "Volume down", lambda w: w.volume == n)]

    return Template(
        "set_volume",
        "world",
        build,
        lambda p: f"Set the volume to {p['volume']}",
        lambda w, p: w.volume == int(p["volume"]),
        ops,
    )


def _set_alarm() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        time = rng.choice([t for t in TIMES if w.alarm(t) is None])
        return {"time": time}, w

    def ops(p: Params) -> list[Op]:
        return [fill(NEW_ALARM, "Time", p["time"]), tap(NEW_ALARM, "Save", lambda w: w.alarm(p["time"]) is not None)]

    return Template(
        "set_alarm",
        "instruction",
        build,
        lambda p: f"Set an alarm for {p['time']}",
        lambda w, p: w.alarm(p["time"]) is not None,
        ops,
    )


def _alarm_toggle(on: bool) -> Template:
    state = "on" if on else "off"

    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        alarm = rng.choice(w.alarms)
        alarm.on = not on
        return {"time": alarm.time}, w

    def is_done(w: World, p: Params) -> bool:
        alarm = w.alarm(p["time"])
        return alarm is not None and alarm.on == on

    return Template(
        f"alarm_{state}",
        "instruction",
        build,
        lambda p: f"Turn {state} the {p['time']} alarm",
        is_done,
        lambda p: [tap(CLOCK, p["time"], lambda w: is_done(w, p))],
    )


def _delete_alarm() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        return {"time": rng.choice(w.alarms).time}, w

    return Template(
        "delete_alarm",
        "instruction",
        build,
        lambda p: f"Delete the {p['time']} alarm",
        lambda w, p: w.alarm(p["time"]) is None,
        lambda p: [hold(CLOCK, p["time"], lambda w: w.alarm(p["time"]) is None)],
    )


def _start_timer() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        return {"minutes": rng.choice(MINUTES)}, base_world(rng)

    def ops(p: Params) -> list[Op]:
        path = (*CLOCK, ("timer", ""))
        return [fill(path, "Minutes", p["minutes"]), tap(path, "Start", lambda w: w.timer == int(p["minutes"]))]

    return Template(
        "start_timer",
        "instruction",
        build,
        lambda p: f"Start a timer for {p['minutes']} minutes",
        lambda w, p: w.timer == int(p["minutes"]),
        ops,
    )


def _new_name(rng: random.Random, w: World) -> str:
    return rng.choice([n for n in NAMES if w.contact(n) is None])


def _add_contact(with_phone: bool, then_call: bool = False) -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        params = {"name": _new_name(rng, w)}
        if with_phone:
            params["phone"] = rng.choice(PHONES)
        return params, w

    def saved(w: World, p: Params) -> bool:
        c = w.contact(p["name"])
        return c is not None and c.phone == p.get("phone", "")

    def success(w: World, p: Params) -> bool:
        return saved(w, p) and (not then_call or p["name"] in w.calls)

    def ops(p: Params) -> list[Op]:
        steps = [fill(NEW_CONTACT, "Name", p["name"])]
        if with_phone:
            steps.append(fill(NEW_CONTACT, "Phone", p["phone"]))
        steps.append(tap(NEW_CONTACT, "Save", lambda w: saved(w, p)))
        if then_call:
            steps.append(tap((*CONTACTS, ("contact", p["name"])), "Call", lambda w: p["name"] in w.calls))
        return steps

    def instruction(p: Params) -> str:
        text = f"Add a contact named {p['name']}"
        if with_phone:
            text += f" with phone {p['phone']}"
        return text + (" and call them" if then_call else "")

    name = "add_contact_and_call" if then_call else "add_contact_phone" if with_phone else "add_contact"
    return Template(name, "instruction", build, instruction, success, ops)


def _contact_action(name: str, verb: str, label: str, done: Callable[[World, str], bool]) -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        contact = rng.choice(w.contacts)
        contact.favorite = False
        return {"name": contact.name}, w

    return Template(
        name,
        "instruction",
        build,
        lambda p: verb.format(name=p["name"]),
        lambda w, p: done(w, p["name"]),
        lambda p: [tap((*CONTACTS, ("contact", p["name"])), label, lambda w: done(w, p["name"]))],
    )


def _favorite(w: World, name: str) -> bool:
    c = w.contact(name)
    return c is not None and c.favorite


def _store_first() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        return {"query": rng.choice(FAMILIES)}, base_world(rng)

    def ops(p: Params) -> list[Op]:
        q = p["query"]
        in_results = _on_stack(("results", q))
        return [
            fill(STORE, "Query", q),
            tap(STORE, "Search", in_results, chained=True),
            tap((*STORE, ("results", q)), lambda w: w.results(q)[0], lambda w: w.results(q)[0] in w.store_opened),
        ]

    return Template(
        "store_open_first",
        "world",
        build,
        lambda p: f"Search the Store for {p['query']} and open the first result",
        lambda w, p: w.results(p["query"])[0] in w.store_opened,
        ops,
    )


def _install_app() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        family = rng.choice(FAMILIES)
        app = rng.choice(w.results(family))
        w.installed.discard(app)
        return {"app": app, "query": family}, w

    def ops(p: Params) -> list[Op]:
        q, app = p["query"], p["app"]
        return [
            fill(STORE, "Query", q),
            tap(STORE, "Search", _on_stack(("results", q)), chained=True),
            tap((*STORE, ("results", q), ("app", app)), "Install", lambda w: app in w.installed),
        ]

    return Template(
        "install_app",
        "instruction",
        build,
        lambda p: f"Install {p['app']} from the Store",
        lambda w, p: p["app"] in w.installed,
        ops,
    )


def _create_note() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        return {"title": rng.choice([t for t in NOTE_TITLES if w.note(t) is None])}, w

    def ops(p: Params) -> list[Op]:
        path = (*NOTES, ("new_note", ""))
        return [fill(path, "Title", p["title"]), tap(path, "Save", lambda w: w.note(p["title"]) is not None)]

    return Template(
        "create_note",
        "instruction",
        build,
        lambda p: f"Create a note titled {p['title']}",
        lambda w, p: w.note(p["title"]) is not None,
        ops,
    )


def _delete_note() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        return {"title": rng.choice(w.notes).title}, w

    return Template(
        "delete_note",
        "instruction",
        build,
        lambda p: f"Delete the note {p['title']}",
        lambda w, p: w.note(p["title"]) is None,
        lambda p: [hold(NOTES, p["title"], lambda w: w.note(p["title"]) is None)],
    )


def _pin_note() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        note = rng.choice(w.notes)
        note.pinned = False
        return {"title": note.title}, w

    def pinned(w: World, p: Params) -> bool:
        note = w.note(p["title"])
        return note is not None and note.pinned

    return Template(
        "pin_note",
        "instruction",
        build,
        lambda p: f"Pin the note {p['title']}",
        pinned,
        lambda p: [tap((*NOTES, ("note", p["title"])), "Pinned", lambda w: pinned(w, p))],
    )


def _play_song() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        song = rng.choice(w.songs)
        if w.playing == song:
            w.is_playing = False
        return {"song": song}, w

    def playing(w: World, p: Params) -> bool:
        return w.playing == p["song"] and w.is_playing

    return Template(
        "play_song",
        "instruction",
        build,
        lambda p: f"Play {p['song']} in Music",
        playing,
        lambda p: [tap((*MUSIC, ("player", p["song"])), "Play", lambda w: playing(w, p))],
    )


def _music_option() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        option = rng.choice(MUSIC_OPTIONS)
        w.music[option] = False
        return {"option": option}, w

    return Template(
        "music_option",
        "world",
        build,
        lambda p: f"Turn on {p['option']} in Music",
        lambda w, p: w.music[p["option"]],
        lambda p: [tap(MUSIC, p["option"], lambda w: w.music[p["option"]])],
    )


def _send_message() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        return {"name": rng.choice(w.contacts).name, "text": rng.choice(MESSAGES)}, w

    def ops(p: Params) -> list[Op]:
        sent = (p["name"], p["text"])
        return [
            fill(NEW_MESSAGE, "To", p["name"]),
            fill(NEW_MESSAGE, "Message", p["text"]),
            tap(NEW_MESSAGE, "Send", lambda w: sent in w.sent),
        ]

    return Template(
        "send_message",
        "instruction",
        build,
        lambda p: f"Send '{p['text']}' to {p['name']}",
        lambda w, p: (p["name"], p["text"]) in w.sent,
        ops,
    )


def _take_photo() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        return {"before": str(w.photos)}, w

    return Template(
        "take_photo",
        "world",
        build,
        lambda p: "Take a photo",
        lambda w, p: w.photos > int(p["before"]),
        lambda p: [tap((("camera", ""),), "Shutter", lambda w: w.photos > int(p["before"]))],
    )


def _two_settings() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        first, second = rng.sample(NETWORK_SETTINGS, 2)
        w.settings[first] = w.settings[second] = False
        return {"first": first, "second": second}, w

    return Template(
        "two_settings",
        "world",
        build,
        lambda p: f"Turn on {p['first']} and {p['second']}",
        lambda w, p: w.settings[p["first"]] and w.settings[p["second"]],
        lambda p: [tap(SETTINGS, p[k], lambda w, k=k: w.settings[p[k]]) for k in ("first", "second")],
    )


def _airplane_and_alarm() -> Template:
    def build(rng: random.Random) -> tuple[Params, World]:
        w = base_world(rng)
        w.settings["Airplane mode"] = False
        return {"time": rng.choice([t for t in TIMES if w.alarm(t) is None])}, w

    def ops(p: Params) -> list[Op]:
        airplane = tap(SETTINGS, "Airplane mode", lambda w: w.settings["Airplane mode"])
        alarm = [fill(NEW_ALARM, "Time", p["time"]), tap(NEW_ALARM, "Save", lambda w: w.alarm(p["time"]) is not None)]
        return [airplane, *(replace(op, group=1) for op in alarm)]

    return Template(
        "airplane_and_alarm",
        "instruction",
        build,
        lambda p: f"Turn on Airplane mode and set an alarm for {p['time']}",
        lambda w, p: w.settings["Airplane mode"] and w.alarm(p["time"]) is not None,
        ops,
    )


def _on_stack(key: tuple[str, str]) -> Callable[[World], bool]:
    return lambda w: any(s.key == key for s in w.stack)


TEMPLATES: Final[dict[str, Template]] = {
    t.name: t
    for t in (
        _setting_template("turn_on_setting", NETWORK_SETTINGS, SETTINGS, True),
        _setting_template("turn_off_setting", NETWORK_SETTINGS, SETTINGS, False),
        _setting_template("display_option", DISPLAY_SETTINGS, DISPLAY, None),
        _setting_template("sound_option", SOUND_SETTINGS, SOUND, None),
        _font_size(),
        _volume(),
        _set_alarm(),
        _alarm_toggle(on=False),
        _alarm_toggle(on=True),
        _delete_alarm(),
        _start_timer(),
        _add_contact(with_phone=False),
        _add_contact(with_phone=True),
        _add_contact(with_phone=True, then_call=True),
        _contact_action("call_contact", "Call {name}", "Call", lambda w, n: n in w.calls),
        _contact_action("favorite_contact", "Add {name} to favorites", "Favorite", _favorite),
        _contact_action("delete_contact", "Delete the contact {name}", "Delete", lambda w, n: w.contact(n) is None),
        _store_first(),
        _install_app(),
        _create_note(),
        _delete_note(),
        _pin_note(),
        _play_song(),
        _music_option(),
        _send_message(),
        _take_photo(),
        _two_settings(),
        _airplane_and_alarm(),
    )
}


# ---- tasks --------------------------------------------------------------------------------------------------------


def split_of(template: Template, instruction: str, seed: int) -> Split:
    """Which split a drawn task belongs to (about :data:`TEST_PERCENT` percent go to test)."""
    key = instruction if template.split_on == "instruction" else f"{template.name}:{seed}"
    return "test" if stable_int(key) % 100 < TEST_PERCENT else "train"


def instantiate(template: Template, seed: int) -> tuple[Params, World, str]:
    """Parameters, initial world and instruction of ``template`` for ``seed`` (deterministic)."""
    params, world = template.build(random.Random(seed))
    return params, world, template.instruction(params)


def make_task(template_name: str, index: int, split: Split) -> Task:
    """The ``index``-th task of a template in a split: deterministic, and never in the other split."""
    template = TEMPLATES[template_name]
    for attempt in count():
        seed = stable_int(f"{template.name}:{split}:{index}:{attempt}")
        params, world, instruction = instantiate(template, seed)
        if split_of(template, instruction, seed) == split:
            break
    plan = solve(world, template.ops(params))
    return Task(
        id=f"sim/{template.name}/{seed}",
        env="sim",
        template=template.name,
        instruction=instruction,
        split=split,
        horizon=min(MAX_HORIZON, len(plan) + HORIZON_SLACK),
        seed=seed,
        params=tuple(sorted(params.items())),
    )


def sim_tasks(split: Split, n: int, templates: Sequence[str] = (), start: int = 0) -> list[Task]:
    """``n`` tasks of a split, round-robin over ``templates`` (all when empty), from task number ``start`` on."""
    names = list(templates) or list(TEMPLATES)
    unknown = [t for t in names if t not in TEMPLATES]
    if unknown:
        raise KeyError(f"unknown sim templates {unknown}; known: {sorted(TEMPLATES)}")
    return [make_task(names[k % len(names)], k // len(names), split) for k in range(start, start + n)]


def solve(world: World, ops: Sequence[Op], limit: int = 40) -> list[Action]:
    """Roll the oracle out on a copy of ``world`` and return its actions (the shortest candidate-action path)."""
    w = world.clone()
    actions: list[Action] = []
    while (action := next_action(w, ops)) is not None:
        if len(actions) >= limit:
            raise RuntimeError(f"oracle did not finish within {limit} steps")
        applied = w.apply(action)
        if not applied.valid:
            raise RuntimeError(f"oracle chose an invalid action {action.to_text()}: {applied.reason}")
        actions.append(action)
    return actions


@functools.lru_cache(maxsize=8192)
def field_texts(task: Task, field: str) -> tuple[str, ...]:
    """The texts choice mode offers for a text field: the task's value for it (if any) plus distractors.

    Deterministic per task and field, and shuffled, so the right text's position says nothing.
    """
    vocab = FIELD_VOCAB.get(field, ())
    if not vocab:
        return ()
    rng = random.Random(stable_int(f"{task.seed}:{field}"))
    wanted = task.param(FIELD_PARAM[field])
    texts = [wanted] if wanted in vocab else []
    while len(texts) < TEXTS_PER_FIELD:
        text = rng.choice(vocab)
        if text not in texts:
            texts.append(text)
    rng.shuffle(texts)
    return tuple(texts)


def iter_vocabulary() -> Iterator[str]:
    """Every name, label and text the simulator can show or type (for tokenizer training)."""
    for vocab in FIELD_VOCAB.values():
        yield from vocab
    yield from SONGS
    yield from ALL_APPS
