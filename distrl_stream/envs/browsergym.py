"""BrowserGym tasks (MiniWoB++, WebArena, WorkArena, ...) behind the DeviceEnv protocol.

Each :class:`BrowserGymEnv` wraps one ``gymnasium.make("browsergym/<task>")`` environment: BrowserGym launches
chromium through Playwright on every reset, shows the page's accessibility tree with its element ids (``[13] button
'Click Me!'``), carries out BrowserGym's high-level actions (``click("13")``, ``fill("14", "Myron")``) and scores the
episode with the task's own validation. This module picks the browser (Debian's chromium, no download), fences it
to loopback and the task's pages, prunes the tree as AgentLab's agents read it, and builds choice-mode candidates
from the interactive elements (docs/envs.md, "BrowserGym").

Playwright's sync API is bound to the thread that started it, and BrowserGym keeps one Playwright per process: every
BrowserGym call of the process runs on one worker thread (:data:`_THREAD`), so a collector's BrowserGym envs take
turns in the browser while the event loop stays free.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from distrl_stream.config import EnvConfig
from distrl_stream.envs.actions import (
    Action,
    Click,
    Drag,
    InvalidAction,
    KeyboardEnter,
    NavigateBack,
    Scroll,
    Select,
    Status,
    TypeText,
    Wait,
    parse_action,
)
from distrl_stream.envs.base import EnvBase, EnvKind, Observation, Outcome, Task, TextAction, UIElement
from distrl_stream.envs.miniwob import first_line, png, typed_values
from distrl_stream.errors import ConfigError, EnvError

log = logging.getLogger(__name__)

_THREAD: Final = ThreadPoolExecutor(max_workers=1, thread_name_prefix="browsergym")
# The chromium revision Playwright 1.44 (browsergym's pin) looks for in its browsers folder.
PLAYWRIGHT_CHROMIUM_DIR: Final = "chromium-1117"
# Everything but loopback, file:// pages and the allowed hosts goes to this proxy, where nothing listens: the page
# fails to load (net::ERR_PROXY_CONNECTION_FAILED) instead of reaching the network.
_DEAD_PROXY: Final = "http://127.0.0.1:9"
# Benchmarks served by their own web servers: the package that registers them and the settings it reads.
SERVED_BENCHMARKS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "webarena": (
        "browsergym-webarena",
        ("WA_SHOPPING", "WA_SHOPPING_ADMIN", "WA_REDDIT", "WA_GITLAB", "WA_WIKIPEDIA", "WA_MAP", "WA_HOMEPAGE"),
    ),
    "visualwebarena": (
        "browsergym-visualwebarena",
        ("VWA_CLASSIFIEDS", "VWA_CLASSIFIEDS_RESET_TOKEN", "VWA_SHOPPING", "VWA_REDDIT", "VWA_WIKIPEDIA"),
    ),
    "workarena": ("browsergym-workarena", ("SNOW_INSTANCE_URL", "SNOW_INSTANCE_UNAME", "SNOW_INSTANCE_PWD")),
}
# Roles whose element takes typed text, and those whose element picks among options.
_TEXT_ROLES: Final = frozenset({"textbox", "searchbox", "spinbutton"})
_OPTION_ROLES: Final = frozenset({"combobox", "listbox"})
# Pixels a page scroll moves (BrowserGym's scroll(dx, dy)).
SCROLL_PX: Final = 200
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Control:
    """An interactive element of the page: what choice mode offers actions on."""

    bid: str
    role: str
    name: str
    value: str
    options: tuple[str, ...] = ()


class BrowserGymEnv(EnvBase):
    """One BrowserGym task environment at a time (``Task.template`` is the task id, ``Task.seed`` its instance).

    Args:
        chrome_binary: the chromium Playwright drives (Debian's, no download).
        action_subsets: BrowserGym's high-level action subsets the policy may use (``bid``, ``coord``, ``nav``...).
        allowed_hosts: hosts the browser may reach besides loopback and file:// pages (a WebArena server's).
        screenshots: attach a PNG screenshot to every observation.
        browsers_dir: where the Playwright browsers folder pointing at ``chrome_binary`` is made.
    """

    kind: EnvKind = "browsergym"

    def __init__(
        self,
        chrome_binary: str | Path = "/usr/bin/chromium",
        action_subsets: tuple[str, ...] = ("bid", "coord", "nav", "chat", "infeas"),
        allowed_hosts: tuple[str, ...] = (),
        screenshots: bool = False,
        browsers_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self._chrome = str(chrome_binary)
        self._subsets = list(action_subsets)
        self._allowed = allowed_hosts
        self._screenshots = screenshots
        self._browsers_dir = browsers_dir or Path.home() / ".cache" / "distrl-stream" / "playwright-browsers"
        self._gym: Any = None
        self._actions: Any = None
        self._controls: list[_Control] = []
        self._broken = False

    @classmethod
    def from_config(cls, section: EnvConfig) -> BrowserGymEnv:
        """An environment set up from the ``env`` config section."""
        return cls(
            section.chrome_binary,
            tuple(section.browsergym_actions),
            tuple(section.browsergym_allowed_hosts),
            section.screenshots,
        )

    def parse(self, text: str) -> Action | TextAction | InvalidAction:
        """The project's JSON actions (their ``index`` is the element's BrowserGym id), or one BrowserGym call."""
        if text.lstrip().startswith("{"):
            return parse_action(text)
        try:
            self._action_set().to_python_code(text)
        except Exception as exc:  # pyparsing's ParseException, NameError for a function outside the subsets
            return InvalidAction(f"not one of BrowserGym's actions ({', '.join(self._subsets)}): {exc}", text)
        return TextAction(text.strip())

    def candidates(self, observation: Observation) -> list[str]:
        """Choice-mode actions on the current page, in BrowserGym's syntax.

        A click on every interactive element; for each text box, text typed into it (the instruction's quoted
        phrases and numbers, then the page's texts, as for MiniWoB); for each dropdown or list box, a pick of each
        of its options.
        """
        out: list[str] = []
        texts = [c.name for c in self._controls if c.name]
        for control in self._controls:
            bid = json.dumps(control.bid)
            if control.role in _OPTION_ROLES and control.options:
                out.extend(f"select_option({bid}, {json.dumps(option)})" for option in control.options)
                continue
            if control.role in _TEXT_ROLES:
                values = typed_values([], observation.instruction, [t for t in texts if t != control.name])
                out.extend(f"fill({bid}, {json.dumps(value)})" for value in values)
            out.append(f"click({bid})")
        return out

    async def close(self) -> None:
        """Close the task's browser, its chat window's browser, and the task."""
        gym, self._gym = self._gym, None
        if gym is not None:
            await _run(gym.close)

    async def _reset(self, task: Task) -> Observation:
        if task.env != "browsergym":
            raise EnvError(f"browsergym: cannot run task {task.id} of env {task.env}")
        return await _run(lambda: self._reset_sync(task))

    async def _apply(self, action: Action | TextAction) -> Outcome:
        return await _run(lambda: self._apply_sync(action))

    # ---- blocking parts (the BrowserGym thread) ---------------------------------------------------------------------

    def _action_set(self) -> Any:
        if self._actions is None:
            from browsergym.core.action.highlevel import HighLevelActionSet

            # One action per step (our step is one action), parsed strictly: text around the call is invalid.
            self._actions = HighLevelActionSet(subsets=self._subsets, multiaction=False, strict=True)
        return self._actions

    def _reset_sync(self, task: Task) -> Observation:
        if self._gym is not None and (self._broken or self._gym.spec.id != task.template):
            gym, self._gym = self._gym, None
            if self._broken:
                log.warning("browsergym: the last episode's browser failed; building a new env for %s", task.id)
            _close_quietly(gym)
        self._broken = False
        try:
            if self._gym is None:
                self._gym = self._make(task.template)
            obs, _ = self._gym.reset(seed=task.seed)
        except Exception as exc:
            self._broken = True
            problem = first_line(exc)
            raise EnvError(f"browsergym: could not start {task.template} (seed {task.seed}): {problem}") from exc
        return self._observe(obs)

    def _make(self, task_id: str) -> Any:
        import gymnasium

        import_benchmark(task_id)
        use_chromium(self._chrome, self._browsers_dir)
        # Loopback bypasses any proxy in chromium, and file:// pages never use one.
        proxy = {"server": _DEAD_PROXY, "bypass": ",".join(self._allowed)}
        return gymnasium.make(
            task_id,
            headless=True,
            action_mapping=self._action_set().to_python_code,
            pw_chromium_kwargs={"executable_path": self._chrome, "proxy": proxy},
            disable_env_checker=True,
        )

    def _apply_sync(self, action: Action | TextAction) -> Outcome:
        shown = self._observation
        assert shown is not None  # EnvBase.step checks the episode is live
        if isinstance(action, Status):
            return Outcome(shown, done=True)
        code = action.text if isinstance(action, TextAction) else _to_call(action)
        if code is None:
            return Outcome(shown, valid=False, reason=f"BrowserGym has no {action.to_text()} action")
        try:
            obs, reward, terminated, truncated, _ = self._gym.step(code)
        except Exception as exc:
            self._broken = True
            raise EnvError(f"browsergym: the browser failed on {code}: {first_line(exc)}") from exc
        error = str(obs.get("last_action_error") or "").strip().split("\n", 1)[0][:200]
        done = bool(terminated or truncated)
        extra = {"browsergym_reward": float(reward), "browsergym_code": code, "browsergym_error": error}
        if error and not done:
            # The page could not take it (no such element, a timeout): nothing the task counts happened.
            return Outcome(self._observe(obs), valid=False, reason=error, extra=extra)
        return Outcome(self._observe(obs), success=done and reward > 0, done=done, extra=extra)

    def _observe(self, obs: dict[str, Any]) -> Observation:
        from browsergym.utils.obs import flatten_axtree_to_str

        goal = str(obs.get("goal") or (self._observation.instruction if self._observation else ""))
        properties = obs["extra_element_properties"]
        # AgentLab's generic agent reads the tree this way: visible elements only, generic containers skipped,
        # static text its parent already names left out, clickable elements marked.
        tree = flatten_axtree_to_str(
            obs["axtree_object"], extra_properties=properties, with_clickable=True, filter_visible_only=True
        )
        self._controls, elements = _controls(obs["axtree_object"], properties)
        screenshot = png(obs["screenshot"]) if self._screenshots else None
        return Observation(goal, tree, elements, screenshot)


def _to_call(action: Action) -> str | None:
    """The BrowserGym call for one of the project's actions (its index being the BrowserGym id), or None."""
    match action:
        case Click(index=int(index)):
            return f'click("{index}")'
        case Click(x=x, y=y):
            return f"mouse_click({x}, {y})"
        case TypeText(index=int(index), text=text):
            return f'fill("{index}", {json.dumps(text)})'
        case TypeText(text=text):
            return f"keyboard_type({json.dumps(text)})"
        case Select(index=index, text=str(text)):
            return f'select_option("{index}", {json.dumps(text)})'
        case Scroll(direction=direction):
            dx, dy = {"up": (0, -SCROLL_PX), "down": (0, SCROLL_PX), "left": (-SCROLL_PX, 0), "right": (SCROLL_PX, 0)}[
                direction
            ]
            return f"scroll({dx}, {dy})"
        case Drag(index=index, target=target):
            return f'drag_and_drop("{index}", "{target}")'
        case KeyboardEnter():
            return 'keyboard_press("Enter")'
        case NavigateBack():
            return "go_back()"
        case Wait():
            return "noop()"
    return None  # long_press, navigate_home, open_app, a select by position: nothing in BrowserGym's set


def _controls(tree: dict[str, Any], properties: dict[str, Any]) -> tuple[list[_Control], tuple[UIElement, ...]]:
    """The visible interactive elements of the tree, in its order; UI elements for those with a numeric id."""
    nodes = tree["nodes"]
    by_id = {node["nodeId"]: node for node in nodes}

    def text(node: dict[str, Any], key: str) -> str:
        return str((node.get(key) or {}).get("value") or "").strip()

    controls: list[_Control] = []
    elements: list[UIElement] = []
    for node in (by_id[node_id] for node_id in [nodes[0]["nodeId"], *_descendants(nodes[0], by_id)]):
        bid = node.get("browsergym_id")
        props = properties.get(bid or "", {})
        role = text(node, "role")
        if not bid or node.get("ignored") or not props.get("visibility"):
            continue
        if not (props.get("clickable") or role in _TEXT_ROLES or role in _OPTION_ROLES):
            continue
        options = tuple(
            text(by_id[child], "name")
            for child in _descendants(node, by_id)
            if text(by_id[child], "role") == "option" and text(by_id[child], "name")
        )
        checked = {str(p["name"]): str(p["value"].get("value")) for p in node.get("properties") or ()}.get("checked")
        state = {"true": "checked", "false": "unchecked"}.get(checked or "", text(node, "value"))
        control = _Control(bid, role, text(node, "name"), state, options)
        controls.append(control)
        if bid.isdigit():
            box = props.get("bbox")
            bounds = (int(box[0]), int(box[1]), int(box[0] + box[2]), int(box[1] + box[3])) if box else None
            editable = role in _TEXT_ROLES
            elements.append(UIElement(int(bid), role, control.name, control.value, True, False, editable, bounds))
    return controls, tuple(elements)


def _descendants(node: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[str]:
    """The ids of a node's descendants in the tree's reading order (depth first, as the flattened text lists them)."""
    out: list[str] = []
    stack = list(reversed(node.get("childIds") or ()))
    while stack:
        child = stack.pop()
        if child in by_id:
            out.append(child)
            stack.extend(reversed(by_id[child].get("childIds") or ()))
    return out


def use_chromium(chrome_binary: str, browsers_dir: Path) -> None:
    """Make every chromium Playwright launches in this process ``chrome_binary``, without a browser download.

    BrowserGym passes our ``executable_path`` to the task's browser but launches its chat window's browser with
    Playwright's defaults, which look for Playwright's own chromium build in its browsers folder. A folder laid out
    as Playwright expects (``chromium-1117/chrome-linux/chrome``), linking to ``chrome_binary`` and named by
    ``PLAYWRIGHT_BROWSERS_PATH``, sends that launch to the same chromium. The variable must be set before the
    process's Playwright starts (BrowserGym starts it on the first reset), so one chromium serves the process.
    """
    if shutil.which(chrome_binary) is None:
        raise EnvError(f"browsergym: no chromium at {chrome_binary!r} (env.chrome_binary; apt-get install chromium)")
    link = browsers_dir / PLAYWRIGHT_CHROMIUM_DIR / "chrome-linux" / "chrome"
    target = Path(chrome_binary).resolve()
    if not link.is_symlink() or link.resolve() != target:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(browsers_dir)


def import_benchmark(task_id: str) -> None:
    """Register the task's BrowserGym benchmark with gymnasium (importing its package), MiniWoB++ from our pages.

    Raises:
        ConfigError: the benchmark's package is not installed, or it needs servers that are not configured.
    """
    benchmark = task_id.removeprefix("browsergym/").split(".", 1)[0]
    if benchmark == "miniwob":
        # The MiniWoB++ pages ship in the miniwob package the Selenium adapter uses: no server needed.
        from miniwob.selenium_instance import HTML_DIR

        os.environ.setdefault("MINIWOB_URL", (Path(HTML_DIR) / "miniwob").as_uri() + "/")
    if benchmark in ("miniwob", "openended"):
        importlib.import_module("browsergym.miniwob" if benchmark == "miniwob" else "browsergym.core")
        return
    package, settings = SERVED_BENCHMARKS.get(benchmark, (f"browsergym-{benchmark}", ()))
    try:
        importlib.import_module(package.replace("-", "."))
    except ImportError:
        raise ConfigError(
            "env.browsergym_tasks",
            f"{task_id}: install {package} and run its servers; installed here: browsergym/miniwob.*, "
            "browsergym/openended",
        ) from None
    missing = [name for name in settings if not os.environ.get(name)]
    if missing:
        raise ConfigError("env.browsergym_tasks", f"{task_id}: no servers configured; set {', '.join(missing)}")


def check_config(section: EnvConfig) -> None:
    """Check the BrowserGym settings before anything starts: one line naming the setting and what is known.

    Raises:
        ConfigError: no chromium at ``env.chrome_binary``; no tasks; a task id that is not a registered BrowserGym
            task, or whose benchmark is not installed or has no servers configured.
    """
    import difflib

    import gymnasium

    if shutil.which(section.chrome_binary) is None:
        raise ConfigError("env.chrome_binary", f"no chromium at {str(section.chrome_binary)!r} (apt-get install it)")
    if not section.browsergym_tasks:
        raise ConfigError("env.browsergym_tasks", "empty: name at least one BrowserGym task id")
    for task_id in section.browsergym_tasks:
        if not task_id.startswith("browsergym/"):
            raise ConfigError("env.browsergym_tasks", f"{task_id!r}: BrowserGym task ids start with 'browsergym/'")
        import_benchmark(task_id)
        known = [name for name in gymnasium.envs.registry if name.startswith("browsergym/")]
        if task_id not in known:
            close = difflib.get_close_matches(task_id, known, n=3) or known[:3]
            raise ConfigError("env.browsergym_tasks", f"no BrowserGym task {task_id!r} (closest: {', '.join(close)})")


async def _run(fn: Callable[[], _T]) -> _T:
    return await asyncio.get_running_loop().run_in_executor(_THREAD, fn)


def _close_quietly(gym: Any) -> None:
    try:
        gym.close()
    except Exception as exc:  # a browser that already died cannot be closed cleanly; the next one is independent
        log.warning("browsergym: closing the failed env: %s", first_line(exc))
