"""Shortest-path oracle for the simulated phone.

A task's solution is a short list of *ops* ("have Wi-Fi on in Settings", "have 07:30 typed in the Time field of New
alarm", "press Save there"). The oracle is closed-loop: from whatever state the world is in, it finds the first op not
yet achieved, routes to that op's screen by the cheaper of *back* and *home* (counting the scrolls each route needs),
and then acts on the screen. Routes and ops use only choice-mode candidates, so the oracle's path is a shortest path
over the candidate action set (``tests/envs/test_sim.py`` checks this against breadth-first search).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from distrl_stream.envs.actions import Action, Click, LongPress, NavigateBack, NavigateHome, Scroll, TypeText
from distrl_stream.envs.sim.world import PAGE, World

Key = tuple[str, str]
Path = tuple[Key, ...]
Predicate = Callable[[World], bool]

# A hop the oracle cannot make by clicking (Store -> results needs typing first): never route through it.
_UNREACHABLE = 1_000


class OracleError(RuntimeError):
    """The oracle found no way forward: a bug in a template's ops, never a property of the agent."""


@dataclass(frozen=True)
class Op:
    """One sub-goal: be on ``path`` and do something there until ``done`` holds.

    Attributes:
        path: screens from the home screen to the one the op acts on, e.g. ``(("settings", ""), ("display", ""))``.
        kind: ``tap`` (click the element labelled ``label``), ``fill`` (type ``value`` into the field ``label``) or
            ``hold`` (long-press ``label``, then press Delete).
        label: the element's text, or a function of the world giving it (volume up/down).
        done: when this op is achieved.
        value: what ``fill`` types.
        chained: the op also counts as achieved once the next op (of its group) is: a typed field is gone after Save.
        group: ops of different groups are independent sub-tasks, done in whichever order is cheaper from here.
    """

    path: Path
    kind: str
    label: str | Callable[[World], str]
    done: Predicate
    value: str = ""
    chained: bool = False
    group: int = 0


def tap(path: Path, label: str | Callable[[World], str], done: Predicate, chained: bool = False) -> Op:
    """Click ``label`` on ``path`` until ``done``."""
    return Op(path, "tap", label, done, chained=chained)


def fill(path: Path, label: str, value: str) -> Op:
    """Type ``value`` into field ``label`` on ``path`` (achieved while it shows, or once the next op is)."""

    def typed(w: World) -> bool:
        return _at(w, path) and w.screen.fields.get(label) == value

    return Op(path, "fill", label, typed, value=value, chained=True)


def hold(path: Path, label: str, done: Predicate) -> Op:
    """Long-press ``label`` on ``path`` to select it, then press Delete, until ``done``."""
    return Op(path, "hold", label, done)


def next_action(w: World, ops: Sequence[Op]) -> Action | None:
    """The oracle's action in state ``w`` for a task solved by ``ops`` (None when every op is achieved).

    Ops with different ``group`` numbers are independent sub-tasks (Airplane mode and an alarm): the oracle works on
    the one whose next op is cheapest to reach from where the world is now.
    """
    achieved = [False] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        chained = ops[i].chained and i + 1 < len(ops) and ops[i + 1].group == ops[i].group and achieved[i + 1]
        achieved[i] = chained or ops[i].done(w)
    pending: dict[int, Op] = {}
    for op, ok in zip(ops, achieved, strict=True):
        if not ok and op.group not in pending:
            pending[op.group] = op
    if not pending:
        return None
    op = min(pending.values(), key=lambda o: (route_cost(w, o.path), o.group))
    move = route(w, op.path)
    return move if move is not None else _act(w, op)


def route(w: World, path: Path) -> Action | None:
    """The first move of a cheapest route from the current screen to ``path`` (None when already there)."""
    current = [s.key for s in w.stack[1:]]
    common = _common(current, path)
    if common == len(current) == len(path):
        return None
    if common == len(current):
        return _forward(w, path[common])
    by_back = (len(current) - common) + _forward_cost(w, path, common)
    by_home = 1 + _forward_cost(w, path, 0)
    return NavigateBack() if by_back <= by_home else NavigateHome()


def route_cost(w: World, path: Path) -> int:
    """Steps of a cheapest route from the current screen to ``path``."""
    current = [s.key for s in w.stack[1:]]
    common = _common(current, path)
    if common == len(current):
        return _forward_cost(w, path, common)
    return min((len(current) - common) + _forward_cost(w, path, common), 1 + _forward_cost(w, path, 0))


def _common(current: list[Key], path: Path) -> int:
    common = 0
    while common < min(len(current), len(path)) and current[common] == path[common]:
        common += 1
    return common


def _at(w: World, path: Path) -> bool:
    return len(w.stack) == len(path) + 1 and all(s.key == k for s, k in zip(w.stack[1:], path, strict=True))


def _forward_cost(w: World, path: Path, start: int) -> int:
    """Steps to walk ``path[start:]`` forward from the screen at depth ``start`` (its scroll as it is now)."""
    cost = 0
    for depth in range(start, len(path)):
        parent = path[depth - 1][0] if depth > 0 else "home"
        name, arg = path[depth]
        if name == "results":
            return _UNREACHABLE
        page = PAGE.get(parent)
        if page is not None and arg:
            offset = w.stack[depth].scroll if depth == start and depth < len(w.stack) else 0
            cost += abs(w.list_position(parent, arg) // page - offset // page)
        cost += 1
    return cost


def _forward(w: World, key: Key) -> Action:
    for i, el in enumerate(w.elements()):
        if el.opens == key:
            return Click(index=i)
    move = _scroll_towards(w, key[1])
    if move is None:
        raise OracleError(f"no way from {w.title()!r} to {key}")
    return move


def _scroll_towards(w: World, label: str) -> Action | None:
    s = w.screen
    page = PAGE.get(s.name)
    if page is None or not label:
        return None
    pos = w.list_position(s.name, label)
    if pos < 0:
        return None
    return Scroll(direction="down") if pos >= s.scroll + page else Scroll(direction="up")


def _index(w: World, label: str) -> int | Action:
    for i, el in enumerate(w.elements()):
        if el.text == label:
            return i
    move = _scroll_towards(w, label)
    if move is None:
        raise OracleError(f"no element {label!r} on {w.title()!r}")
    return move


def _act(w: World, op: Op) -> Action:
    label = op.label(w) if callable(op.label) else op.label
    found = _index(w, label)
    if not isinstance(found, int):
        return found
    if op.kind == "fill":
        return TypeText(text=op.value, index=found)
    if op.kind == "hold":
        if w.screen.selected != label:
            return LongPress(index=found)
        delete = _index(w, "Delete")
        if not isinstance(delete, int):
            return delete
        return Click(index=delete)
    return Click(index=found)
