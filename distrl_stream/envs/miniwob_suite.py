"""Which MiniWoB++ tasks the adapter can solve at all: a scripted reachability check over its own candidates.

For every task of the installed MiniWoB++ package, :func:`check_suite` runs one page seed through
:class:`~distrl_stream.envs.miniwob.MiniWoBEnv` (or the same pages through BrowserGym,
:class:`~distrl_stream.envs.browsergym.BrowserGymEnv`) and searches depth-first over the sequences of choice-mode
candidates (``env.candidates``), re-running the same seed for each branch. A task is *reachable* when some sequence
earns the page's own reward; otherwise the row says why not:

- ``unsupported``: every sequence up to the depth bound was tried (or the page offers nothing to act on), so the
  adapter's candidates cannot express a solution (a canvas, a drag, free text, an unmapped widget);
- ``budget``: the per-task time or episode budget ran out first;
- ``error``: the task did not reset or step cleanly (the message says what failed).

Candidates that share words with the instruction are tried first, text typed verbatim from the instruction before other
text, and among equals actions on controls before clicks on plain text (it only orders the search; every candidate is
still tried; numbers match by value, so ``05`` names ``5``).
Typing into a field replaces its text, so after a step that typed into a field the search does not type into that field
again straight away: that sequence is the same as typing the second text alone, which is tried anyway. A step that
leaves the screen unchanged continues the same episode (no reset): the page looked the same, so the next
candidate is tried from there, and the path recorded is the one actually played. Screens already seen are not expanded
twice.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from distrl_stream.envs.actions import Click, InvalidAction, TypeText, parse_action
from distrl_stream.envs.base import EnvBase, Observation, Task
from distrl_stream.envs.miniwob import MiniWoBEnv

Reason = Literal["", "unsupported", "budget", "error"]
# The package also registers FlightWoB's three tasks, a separate benchmark served over HTTP (the adapter refuses them).
FLIGHTWOB_PREFIX: Final = "flight."
_WORD: Final = re.compile(r"[a-z0-9]+")
# The element a BrowserGym call acts on: its first argument, a BrowserGym id (``click("13")``).
_BID: Final = re.compile(r'^\w+\("(\d+)"')


@dataclass(frozen=True, slots=True)
class SuiteRow:
    """The check's verdict on one task.

    Attributes:
        task: the MiniWoB task name.
        elements: numbered elements on the first screen.
        candidates: choice-mode candidates on the first screen.
        reachable: some sequence of candidates earned the page's reward.
        reason: why not (``unsupported``, ``budget``, ``error``); empty when reachable.
        detail: one line: the solution found, how far the search went, or the error.
        episodes: episodes (resets) the search used.
        seconds: wall-clock seconds spent on the task.
        solution: the candidate texts that solved it, in order (empty when not reachable).
    """

    task: str
    elements: int
    candidates: int
    reachable: bool
    reason: Reason
    detail: str
    episodes: int
    seconds: float
    solution: tuple[str, ...] = ()


def suite_tasks() -> list[str]:
    """The MiniWoB++ task names the installed ``miniwob`` package registers, sorted (FlightWoB left out)."""
    import gymnasium
    import miniwob  # noqa: F401 - importing it registers its tasks

    ids = [env_id for env_id in gymnasium.envs.registry if env_id.startswith("miniwob/")]
    names = (env_id.removeprefix("miniwob/").removesuffix("-v1") for env_id in ids)
    return sorted(name for name in names if not name.startswith(FLIGHTWOB_PREFIX))


class _Budget:
    def __init__(self, seconds: float, episodes: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.episodes_left = episodes
        self.used = 0

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def spend(self) -> bool:
        """Take one episode from the budget; False when none is left."""
        if self.episodes_left <= 0 or self.expired():
            return False
        self.episodes_left -= 1
        self.used += 1
        return True


async def check_task(
    env: EnvBase,
    name: str,
    *,
    seed: int = 0,
    budget_s: float = 10.0,
    max_episodes: int = 200,
    max_depth: int = 3,
) -> SuiteRow:
    """Search the adapter's candidates on one seed of ``name`` for a sequence the page rewards.

    Args:
        env: the browser to run it in (left open; reused across tasks).
        name: the MiniWoB task name.
        seed: the page seed every branch re-runs.
        budget_s: wall-clock seconds for the search (from the first screen on).
        max_episodes: resets the search may use.
        max_depth: the longest candidate sequence tried (steps that leave the screen unchanged do not count).

    Returns:
        The row for ``name``; an error is reported in the row, never raised.
    """
    started = time.monotonic()
    budget = _Budget(budget_s, max_episodes)
    template = name if env.kind == "miniwob" else f"browsergym/miniwob.{name}"
    task = Task(f"{env.kind}/{name}/{seed}", env.kind, template, f"MiniWoB {name}", "train", 10_000, seed)
    first: Observation | None = None
    n_candidates = 0

    def row(reachable: bool, reason: Reason, detail: str, solution: tuple[str, ...] = ()) -> SuiteRow:
        elements = len(first.elements) if first is not None else 0
        seconds = round(time.monotonic() - started, 2)
        return SuiteRow(name, elements, n_candidates, reachable, reason, detail, budget.used, seconds, solution)

    try:
        budget.spend()
        first = await env.reset(task)
        # The search's clock starts once the page is up: a browser's first start (seconds under load) is not search.
        budget.deadline = time.monotonic() + budget_s
        n_candidates = len(env.candidates(first))
        # Frontier: the actions that reach a screen, its depth (screens changed on the way), its candidates.
        frontier: deque[tuple[tuple[str, ...], int, list[str]]] = deque([((), 0, _ordered(env, first, None))])
        seen = {_screen(first)}
        live: tuple[str, ...] | None = ()  # the path the browser's current episode has played, if still usable
        current = first
        while frontier:
            path, depth, options = frontier.popleft()
            for k, option in enumerate(options):
                if live != path:
                    if not budget.spend():
                        return row(False, "budget", f"{len(seen)} screens seen, depth {depth} of {max_depth}")
                    replayed = await _replay(env, task, path)
                    if replayed is None:
                        break  # the page did not replay the same way (a time- or randomness-driven page)
                    live, current = path, replayed
                elif budget.expired():
                    return row(False, "budget", f"{len(seen)} screens seen, depth {depth} of {max_depth}")
                result = await env.step(option)
                if result.info.success:
                    return row(True, "", f"solved in {len(path) + 1} steps", (*path, option))
                if result.done or not result.info.valid:
                    live = None if result.done else path
                    continue
                after = result.observation
                if _screen(after) == _screen(current):
                    live = path = (*path, option)  # nothing visible changed: go on from here
                    current = after
                    continue
                live = None
                if _screen(after) not in seen and depth + 1 < max_depth:
                    # Depth first while the browser is already there; this screen's other options come after.
                    seen.add(_screen(after))
                    live, current = (*path, option), after
                    frontier.appendleft((path, depth, options[k + 1 :]))
                    frontier.appendleft((live, depth + 1, _ordered(env, after, option)))
                    break
        if n_candidates == 0:
            return row(False, "unsupported", "nothing on the first screen to act on")
        return row(False, "unsupported", f"no sequence of up to {max_depth} screen changes succeeds ({len(seen)} seen)")
    except Exception as exc:  # the row is the report: any failure of the page is a finding
        return row(False, "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


def _screen(observation: Observation) -> tuple[tuple[str, str, str], ...]:
    """What a screen shows (focus included: a focused field may open a picker the page does not list)."""
    return tuple((e.kind, e.text, e.state) for e in observation.elements)


def _ordered(env: EnvBase, observation: Observation, came_by: str | None) -> list[str]:
    """The screen's candidates, those naming more of the instruction's words first (stable otherwise).

    ``came_by`` is the step that led to this screen: after typing into a field, typing into it again is left out.
    """
    instruction = observation.instruction
    words = _words(instruction)
    retyped = parse_action(came_by) if came_by is not None else None
    if not isinstance(retyped, TypeText) or retyped.index is None:
        retyped = None

    def overlap(option: str) -> tuple[int, bool]:
        # What the option names: the text it types or picks, else the label of the element it acts on; among equals,
        # acting on a control (a button, link, field, widget) before clicking plain text, which rarely does anything.
        action = parse_action(option)
        if isinstance(action, InvalidAction):  # a BrowserGym call: its own words and its element's label
            bid = _BID.match(option)
            label = next((e.text for e in observation.elements if bid and str(e.index) == bid[1]), "")
            return len(words & _words(f"{option} {label}")), True
        named = getattr(action, "text", None)
        index = getattr(action, "index", None)
        verbatim = isinstance(action, TypeText) and action.text in instruction
        control = not isinstance(action, Click) or index is None or observation.elements[index].kind != "text"
        if named is None and index is not None:
            named = observation.elements[index].text
        return len(words & _words(f"{action.action_type} {named or ''}")) + verbatim, control

    def kept(option: str) -> bool:
        action = parse_action(option)
        return retyped is None or not (isinstance(action, TypeText) and action.index == retyped.index)

    return sorted(filter(kept, env.candidates(observation)), key=overlap, reverse=True)


def _words(text: str) -> set[str]:
    """Lower-case words; numbers by value (``05`` and ``5`` are the same word)."""
    return {str(int(word)) if word.isdigit() else word for word in _WORD.findall(text.lower())}


async def _replay(env: EnvBase, task: Task, path: tuple[str, ...]) -> Observation | None:
    """Reset the seed and play ``path``; the screen it ends on, or None when the page ended or refused a step."""
    observation = await env.reset(task)
    for option in path:
        result = await env.step(option)
        if result.done or not result.info.valid:
            return None
        observation = result.observation
    return observation


async def check_suite(
    tasks: Sequence[str] | None = None,
    *,
    seed: int = 0,
    budget_s: float = 10.0,
    max_episodes: int = 200,
    max_depth: int = 3,
    progress: Callable[[SuiteRow, int, int], None] | None = None,
    env_factory: Callable[[], EnvBase] = MiniWoBEnv,
) -> list[SuiteRow]:
    """Check every task (default: the whole installed suite) in one browser, one task after another.

    Args:
        tasks: task names; None for :func:`suite_tasks`.
        seed: the page seed of each task.
        budget_s: wall-clock seconds per task.
        max_episodes: resets per task.
        max_depth: the longest candidate sequence tried per task.
        progress: called after each task with its row, the number of tasks done and the total.
        env_factory: makes the browser (e.g. ``lambda: MiniWoBEnv.from_config(config.env)``, or a ``BrowserGymEnv``
            for the same pages through BrowserGym); a fresh one replaces it
            after a task that ended in an error.

    Returns:
        One row per task, in the order given.
    """
    names = list(tasks) if tasks is not None else suite_tasks()
    rows: list[SuiteRow] = []
    env = env_factory()
    try:
        for name in names:
            result = await check_task(
                env, name, seed=seed, budget_s=budget_s, max_episodes=max_episodes, max_depth=max_depth
            )
            rows.append(result)
            if result.reason == "error":
                # A failed page can leave the browser in any state; the next task gets a clean one.
                await env.close()
                env = env_factory()
            if progress is not None:
                progress(result, len(rows), len(names))
    finally:
        await env.close()
    return rows


def counts_by_reason(rows: Sequence[SuiteRow]) -> dict[str, int]:
    """How many tasks are reachable, and how many are not for each reason."""
    out = {"reachable": 0, "unsupported": 0, "budget": 0, "error": 0}
    for r in rows:
        out["reachable" if r.reachable else r.reason] += 1
    return out


def markdown_table(rows: Sequence[SuiteRow]) -> str:
    """The rows as the support table of docs/envs.md."""
    lines = ["| task | elements | candidates | reachable | why not / how |", "|---|---|---|---|---|"]
    for r in rows:
        verdict = "yes" if r.reachable else "no"
        why = r.detail if r.reachable else f"{r.reason}: {r.detail}"
        lines.append(f"| {r.task} | {r.elements} | {r.candidates} | {verdict} | {why.replace('|', '/')} |")
    return "\n".join(lines)
