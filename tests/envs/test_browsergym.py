"""BrowserGym in real headless chromium (Debian's, through Playwright): MiniWoB++ tasks solved and failed, the
sandbox, a browser that dies mid-episode, a collector episode; and the settings refused before anything starts."""

from __future__ import annotations

import functools
import http.server
import random
import shutil
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import pytest_asyncio

from distrl_stream.collector import run_episode
from distrl_stream.config import EnvConfig, load_config
from distrl_stream.envs import browsergym
from distrl_stream.envs.base import Task
from distrl_stream.envs.browsergym import BrowserGymEnv
from distrl_stream.envs.tasks import miniwob_tasks, task_pool
from distrl_stream.errors import ConfigError, EnvError
from distrl_stream.events import TrajectoryEvent
from distrl_stream.events.serde import decode, encode

SECTION = load_config(env={"kind": "browsergym"}).env
_T = TypeVar("_T")


def in_browser(test: _T) -> _T:
    """Marks a test that runs real chromium on the module's event loop (one browser env serves the module)."""
    for mark in (
        pytest.mark.browser,
        pytest.mark.asyncio(loop_scope="module"),
        pytest.mark.skipif(
            shutil.which(SECTION.chrome_binary) is None,
            reason=f"no chromium at {SECTION.chrome_binary} (apt-get install chromium, or run `make setup`)",
        ),
    ):
        test = mark(test)
    return test


def task(name: str) -> Task:
    """Seed 0 of a MiniWoB++ task through BrowserGym."""
    return miniwob_tasks([f"browsergym/miniwob.{name}"], "train", 1, env="browsergym")[0]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserGymEnv]:
    gym = BrowserGymEnv(SECTION.chrome_binary, screenshots=True, browsers_dir=tmp_path_factory.mktemp("pw"))
    try:
        yield gym
    finally:
        await gym.close()


@in_browser
async def test_enter_text_is_solved_by_its_candidates_and_failed_by_a_wrong_text(env: BrowserGymEnv) -> None:
    obs = await env.reset(task("enter-text"))
    assert obs.instruction == 'Enter "Myron" into the text field and press Submit.'
    assert "textbox" in obs.screen and "button 'Submit'" in obs.screen
    assert obs.screenshot is not None and obs.screenshot.startswith(b"\x89PNG")
    [field] = [e for e in obs.elements if e.editable]
    [submit] = [e for e in obs.elements if e.text == "Submit"]
    options = env.candidates(obs)
    assert f'fill("{field.index}", "Myron")' in options and f'click("{submit.index}")' in options
    typed = await env.step(f'fill("{field.index}", "Myron")')
    assert typed.info.valid and not typed.done
    done = await env.step(f'click("{submit.index}")')
    assert done.done and done.info.success and done.reward == 1.0

    await env.reset(task("enter-text"))
    await env.step(f'fill("{field.index}", "Nobody")')
    wrong = await env.step(f'click("{submit.index}")')
    assert wrong.done and not wrong.info.success and wrong.reward == 0.0


@in_browser
async def test_json_actions_index_elements_by_their_browsergym_id(env: BrowserGymEnv) -> None:
    obs = await env.reset(task("click-test"))
    [button] = [e for e in obs.elements if e.text == "Click Me!"]
    assert f"[{button.index}] button 'Click Me!'" in obs.screen
    result = await env.step(f'{{"action_type":"click","index":{button.index}}}')
    assert result.info.success and result.info.extra["browsergym_code"] == f'click("{button.index}")'


@in_browser
async def test_impossible_and_unknown_actions_are_invalid_and_use_a_step(env: BrowserGymEnv) -> None:
    obs = await env.reset(task("click-test"))
    missing = await env.step('click("999")')
    assert not missing.info.valid and 'bid "999"' in (missing.info.reason or "") and missing.info.step == 1
    outside = await env.step("tab_focus(0)")  # the tab subset is not configured
    assert not outside.info.valid and "tab_focus" in (outside.info.reason or "")
    prose = await env.step("I would click the button")
    assert not prose.info.valid and not prose.done
    assert env.candidates(obs) == env.candidates(prose.observation)  # nothing happened to the page


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A web page served on this machine's own non-loopback address: reachable, unless the sandbox blocks it."""
    root = tmp_path_factory.mktemp("site")
    (root / "page.html").write_text("<html><title>Outside</title><button>Reached</button></html>")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent; this picks the address of the default route
        address = probe.getsockname()[0]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield address, server.server_address[1]
    finally:
        server.shutdown()


@in_browser
async def test_the_browser_reaches_only_loopback_and_allowed_hosts(
    env: BrowserGymEnv, page_server: tuple[str, int], tmp_path: Path
) -> None:
    host, port = page_server
    url = f"http://{host}:{port}/page.html"
    await env.reset(task("click-test"))
    blocked = await env.step(f'goto("{url}")')
    assert "ERR_PROXY_CONNECTION_FAILED" in blocked.info.extra["browsergym_error"]
    assert "Reached" not in blocked.observation.screen

    allowed = BrowserGymEnv(SECTION.chrome_binary, allowed_hosts=(host,), browsers_dir=tmp_path)
    try:
        await allowed.reset(task("click-test"))
        reached = await allowed.step(f'goto("{url}")')
        assert not reached.info.extra["browsergym_error"] and "button 'Reached'" in reached.observation.screen
    finally:
        await allowed.close()


@in_browser
async def test_a_browser_dying_mid_episode_is_an_env_error_and_the_next_reset_starts_a_new_one(
    env: BrowserGymEnv,
) -> None:
    await env.reset(task("click-test"))
    dead = env._gym.unwrapped.browser
    await browsergym._run(dead.close)  # on the Playwright thread, as the browser's own calls are
    with pytest.raises(EnvError, match="browser failed"):
        await env.step('click("13")')
    obs = await env.reset(task("click-test"))
    assert env._gym.unwrapped.browser is not dead and "Click Me!" in obs.screen


@in_browser
async def test_a_collector_episode_on_browsergym_miniwob_publishes_a_valid_trajectory(
    env: BrowserGymEnv, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    from distrl_stream.testing.scripted import ScriptedPolicy

    policy = ScriptedPolicy(None, AutoTokenizer.from_pretrained(tiny_model_dir), 1.0, random.Random(0))
    one = task("click-test")
    outcome = await run_episode(env, one, policy, "choice", episode_id="bg-1")
    event = decode(encode(outcome.to_event(run="t", collector_id="c", mode="choice", base_model="tiny")))
    assert isinstance(event, TrajectoryEvent) and event.success and event.env_kind == "browsergym"
    assert event.steps[0].candidates == ['click("13")'] and event.steps[0].action == 'click("13")'
    assert event.instruction == "Click the button."


def test_an_unknown_task_id_names_the_setting_and_the_closest_tasks() -> None:
    section = EnvConfig(kind="browsergym", browsergym_tasks=["browsergym/miniwob.click-tset"])
    with pytest.raises(ConfigError, match=r"env\.browsergym_tasks: .*closest: browsergym/miniwob\.click-test"):
        task_pool(section, "train")


def test_a_benchmark_without_its_package_or_servers_is_refused_before_anything_starts() -> None:
    section = EnvConfig(kind="browsergym", browsergym_tasks=["browsergym/webarena.310"])
    with pytest.raises(ConfigError, match=r"env\.browsergym_tasks: .*install browsergym-webarena"):
        task_pool(section, "train")


def test_a_missing_chromium_names_env_chrome_binary() -> None:
    section = EnvConfig(kind="browsergym", chrome_binary=Path("/nonexistent/chromium"))
    with pytest.raises(ConfigError, match=r"^env\.chrome_binary: no chromium at '/nonexistent/chromium'"):
        task_pool(section, "train")
