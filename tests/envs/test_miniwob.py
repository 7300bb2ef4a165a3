"""MiniWoB++ in real headless chromium: a scripted oracle speaking our action space solves real episodes."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from distrl_stream.config import load_config
from distrl_stream.envs.actions import Drag, TypeText
from distrl_stream.envs.base import Observation
from distrl_stream.envs.miniwob import MiniWoBEnv
from distrl_stream.envs.miniwob_suite import suite_tasks
from distrl_stream.envs.tasks import miniwob_tasks

SECTION = load_config().env
pytestmark = [
    pytest.mark.browser,
    # One browser serves the whole module, so its tests share the module's event loop.
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        shutil.which(SECTION.chrome_binary) is None or shutil.which(SECTION.chromedriver) is None,
        reason=f"chromium/chromedriver not installed at {SECTION.chrome_binary}, {SECTION.chromedriver} "
        "(apt-get install chromium chromium-driver, or run `make setup`)",
    ),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[MiniWoBEnv]:
    browser = MiniWoBEnv.from_config(SECTION)
    try:
        yield browser
    finally:
        await browser.close()


def oracle(obs: Observation) -> list[str]:
    """The actions that solve the episode on this first screen, read off the utterance like a person would."""
    u, els = obs.instruction, obs.elements

    def click(pred: object) -> str:
        index = next(e.index for e in els if pred(e))  # type: ignore[operator]
        return f'{{"action_type":"click","index":{index}}}'

    if u == "Click the button.":
        return [click(lambda e: e.kind == "button")]
    if m := re.fullmatch(r'Click on the "(.+)" button\.', u):
        return [click(lambda e: e.kind == "button" and e.text == m[1])]
    if m := re.fullmatch(r"Click button (\w+)\.", u):
        return [click(lambda e: e.kind == "button" and e.text == m[1])]
    if m := re.fullmatch(r'Click on the link "(.+)"\.', u):
        return [click(lambda e: e.kind == "link" and e.text == m[1])]
    if u == "Focus into the textbox.":
        return [click(lambda e: e.kind == "field")]
    if m := re.fullmatch(r'Enter "(.+)" into the text field and press Submit\.', u):
        field = next(e.index for e in els if e.kind == "field")
        return [f'{{"action_type":"type","index":{field},"text":"{m[1]}"}}', click(lambda e: e.text == "Submit")]
    if m := re.fullmatch(r"Select (.*) and click Submit\.", u):
        names = [] if m[1] == "nothing" else re.split(r",? and |, ", m[1])
        return [click(lambda e, n=n: e.kind == "checkbox" and e.text == n) for n in names] + [
            click(lambda e: e.text == "Submit")
        ]
    raise AssertionError(f"no oracle for {u!r}")


SOLVED = ["click-test", "click-button", "click-link", "focus-text", "enter-text", "click-checkboxes"]


async def test_scripted_oracle_succeeds_on_real_episodes(env: MiniWoBEnv) -> None:
    for task in miniwob_tasks(SOLVED, "train", 2 * len(SOLVED)):
        obs = await env.reset(task)
        assert obs.instruction and obs.elements, task.id
        for text in oracle(obs):
            assert text in env.candidates(obs), (task.id, text, obs.text)
            result = await env.step(text)
            assert result.info.valid, result.info.reason
            obs = result.observation
        assert result.done and result.info.success and result.reward == 1.0, (task.id, result.info.extra)
        assert result.info.extra["miniwob_raw_reward"] > 0


async def test_wrong_action_gets_a_non_positive_reward(env: MiniWoBEnv) -> None:
    task = miniwob_tasks(["click-test-2"], "test", 1)[0]
    obs = await env.reset(task)
    target = re.fullmatch(r"Click button (\w+)\.", obs.instruction)
    assert target is not None
    wrong = next(e.index for e in obs.elements if e.kind == "button" and e.text != target[1])
    result = await env.step(f'{{"action_type":"click","index":{wrong}}}')
    assert result.done and not result.info.success and result.reward <= 0
    assert result.info.extra["miniwob_raw_reward"] < 0  # MiniWoB's own verdict: failure


async def test_actions_a_web_page_cannot_do_are_invalid_and_change_nothing(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["enter-text"], "train", 1)[0])
    button = next(e.index for e in obs.elements if e.kind == "button")
    for text, reason in [
        ('{"action_type":"navigate_home"}', "no back or home"),
        ('{"action_type":"open_app","app_name":"Clock"}', "no apps"),
        ('{"action_type":"click","index":99}', "no element 99"),
        (f'{{"action_type":"type","index":{button},"text":"x"}}', "is not a text field"),
    ]:
        result = await env.step(text)
        assert not result.info.valid and reason in (result.info.reason or "")
        assert result.observation == obs and not result.done


async def test_same_seed_gives_the_same_page(env: MiniWoBEnv) -> None:
    task = miniwob_tasks(["click-button"], "train", 1)[0]
    first = await env.reset(task)
    await env.reset(miniwob_tasks(["click-link"], "train", 1)[0])
    assert (await env.reset(task)).text == first.text


async def test_close_ends_the_browser_processes() -> None:
    browser = MiniWoBEnv.from_config(SECTION)
    await browser.reset(miniwob_tasks(["click-test"], "train", 1)[0])
    pid = browser.browser_pid
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    await browser.close()
    await browser.close()  # idempotent
    assert not os.path.exists(f"/proc/{pid}")


def index_of(obs: Observation, kind: str, text: str | None = None) -> int:
    return next(e.index for e in obs.elements if e.kind == kind and (text is None or e.text == text))


async def test_dropdown_option_picked_by_text_or_position_earns_the_page_reward(env: MiniWoBEnv) -> None:
    for k, task in enumerate(miniwob_tasks(["choose-list"], "train", 2)):
        obs = await env.reset(task)
        target = re.fullmatch(r"Select (.+) from the list and click Submit\.", obs.instruction)
        assert target is not None
        dropdown = index_of(obs, "select")
        options = obs.elements[dropdown].text.split(" | ")
        pick = (
            f'{{"action_type":"select","index":{dropdown},"text":"{target[1]}"}}'
            if k == 0
            else f'{{"action_type":"select","index":{dropdown},"option":{options.index(target[1])}}}'
        )
        if k == 0:
            assert pick in env.candidates(obs)
        result = await env.step(pick)
        assert result.info.valid and result.observation.elements[dropdown].state == target[1]
        result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
        assert result.info.success and result.info.extra["miniwob_raw_reward"] > 0, task.id


async def test_list_box_picks_toggle_and_earn_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["click-scroll-list"], "train", 1)[0])
    target = re.fullmatch(r"Select (.+) from the scroll list and click Submit\.", obs.instruction)
    assert target is not None
    box = index_of(obs, "select")
    names = target[1].split(", ")
    stray = next(o for o in obs.elements[box].text.split(" | ") if o not in names)
    for name in [*names, stray, stray]:  # the stray option picked twice: on, then off again
        result = await env.step(f'{{"action_type":"select","index":{box},"text":"{name}"}}')
        assert result.info.valid
    assert result.observation.elements[box].state == ", ".join(
        o for o in obs.elements[box].text.split(" | ") if o in names
    )
    result = await env.step(f'{{"action_type":"click","index":{index_of(result.observation, "button", "Submit")}}}')
    assert result.info.success, result.info.extra


async def test_slider_typed_to_a_value_earns_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["use-slider"], "train", 1)[0])
    target = re.fullmatch(r"Select (-?\d+) with the slider and hit Submit\.", obs.instruction)
    assert target is not None
    slider = index_of(obs, "slider")
    low, high = obs.elements[slider].text.split("..")
    outside = await env.step(f'{{"action_type":"type","index":{slider},"text":"{int(high) + 1}"}}')
    assert not outside.info.valid and f"from {low} to {high}" in (outside.info.reason or "")
    text = f'{{"action_type":"type","index":{slider},"text":"{target[1]}"}}'
    assert text in env.candidates(obs)
    result = await env.step(text)
    assert result.observation.elements[slider].state == target[1]
    result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
    assert result.info.success, result.info.extra


async def test_date_field_typed_as_the_page_shows_dates_earns_the_page_reward(env: MiniWoBEnv) -> None:
    task = miniwob_tasks(["enter-date"], "train", 1)[0]
    for _ in range(2):  # the second episode starts with the caret left in the field by the first
        obs = await env.reset(task)
        target = re.fullmatch(r"Enter (\S+) as the date and hit submit\.", obs.instruction)
        assert target is not None
        result = await env.step(f'{{"action_type":"type","index":{index_of(obs, "field")},"text":"{target[1]}"}}')
        assert result.info.valid
    result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
    assert result.info.success, result.info.extra


async def test_field_below_the_window_is_scrolled_into_view_before_the_pointer_click(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["focus-text"], "train", 1)[0])
    driver = env._gym.instance.driver
    driver.execute_script("document.getElementById('area').style.marginTop = '3000px';")
    obs = (await env.step('{"action_type":"wait"}')).observation
    field = obs.elements[index_of(obs, "field")]
    height = driver.execute_script("return window.innerHeight;")
    assert field.bounds is not None and field.bounds[1] > height  # really out of the window
    result = await env.step(f'{{"action_type":"click","index":{field.index}}}')
    assert result.info.valid and result.info.success, result.info


async def test_pointer_click_outside_the_window_is_invalid_not_an_error(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["click-test"], "train", 1)[0])
    result = await env.step('{"action_type":"click","x":5000,"y":5000}')
    assert not result.info.valid and "outside" in (result.info.reason or "")
    assert result.observation == obs and not result.done


async def test_every_task_of_the_suite_resets_and_steps_without_error(env: MiniWoBEnv) -> None:
    names = suite_tasks()
    for task in miniwob_tasks(names, "train", len(names)):
        obs = await env.reset(task)
        options = env.candidates(obs)
        result = await env.step(options[0] if options else '{"action_type":"wait"}')
        assert result.info.step == 1, task.id


async def test_spinner_typed_to_a_value_earns_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["use-spinner"], "train", 1)[0])
    target = re.fullmatch(r"Select (-?\d+) with the spinner and hit Submit\.", obs.instruction)
    assert target is not None
    spinner = index_of(obs, "spinner")  # its keyboard entry is blocked by the page: the widget's value is set
    text = f'{{"action_type":"type","index":{spinner},"text":"{target[1]}"}}'
    assert text in env.candidates(obs)
    result = await env.step(text)
    assert result.observation.elements[spinner].state == target[1]
    result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
    assert result.info.success, result.info.extra


async def test_date_picker_day_clicked_after_opening_it_earns_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["choose-date-easy"], "train", 1)[0])
    target = re.fullmatch(r"Select 12/(\d\d)/2016 as the date and hit submit\.", obs.instruction)
    assert target is not None
    field = index_of(obs, "field")
    assert not obs.elements[field].editable  # read-only: only the picker fills it
    assert not any('"type"' in text for text in env.candidates(obs))
    opened = (await env.step(f'{{"action_type":"click","index":{field}}}')).observation
    day = index_of(opened, "link", str(int(target[1])))  # December 2016 is the only month the picker allows
    result = await env.step(f'{{"action_type":"click","index":{day}}}')
    assert result.observation.elements[field].state.startswith(f"12/{target[1]}/2016")
    result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
    assert result.info.success, result.info.extra


async def test_text_copied_from_the_page_is_a_candidate_and_earns_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["copy-paste"], "train", 1)[0])
    source, answer = (e.index for e in obs.elements if e.kind == "field")
    if obs.elements[source].text != "to-copy":
        source, answer = answer, source
    copied = env._handles[source].value  # the textarea's whole text, trailing space included
    text = TypeText(text=copied, index=answer).to_text()
    assert text in env.candidates(obs)
    await env.step(f'{{"action_type":"type","index":{answer},"text":"stale"}}')
    result = await env.step(text)  # typing replaces what the field held
    assert result.observation.elements[answer].state.startswith(copied.strip())
    result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
    assert result.info.success, result.info.extra


async def test_drags_onto_sortable_items_and_boxes_earn_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["drag-items"], "train", 1)[0])
    target = re.fullmatch(r"Drag (\w+) to the (\d)\w\w position\.", obs.instruction)
    assert target is not None, obs.instruction  # the seed asks for a numbered position
    items = [e.index for e in obs.elements if "draggable" in e.state]  # each item by its label, not its icon
    assert [obs.elements[k].kind for k in items] == ["text"] * 5
    text = Drag(index_of(obs, "text", target[1]), items[int(target[2]) - 1]).to_text()
    assert text in env.candidates(obs)
    result = await env.step(text)
    assert result.info.success, result.info.extra

    obs = await env.reset(miniwob_tasks(["drag-box"], "train", 1)[0])
    small, large = index_of(obs, "text", "s"), index_of(obs, "text", "L")
    result = await env.step(Drag(small, large).to_text())
    assert result.info.valid and not result.done
    result = await env.step(f'{{"action_type":"click","index":{index_of(obs, "button", "Submit")}}}')
    assert result.info.success, result.info.extra
    beyond = await env.reset(miniwob_tasks(["drag-box"], "train", 1)[0])
    refused = await env.step(Drag(small, 99).to_text())
    assert not refused.info.valid and "no element 99" in (refused.info.reason or "")
    assert refused.observation == beyond


async def test_icons_without_text_are_named_by_their_classes_and_earn_the_page_reward(env: MiniWoBEnv) -> None:
    obs = await env.reset(miniwob_tasks(["email-inbox-delete"], "train", 1)[0])
    target = re.fullmatch(r"Find the email by (\w+) and click the trash icon to delete it\.", obs.instruction)
    assert target is not None
    sender = index_of(obs, "text", target[1])
    trash = next(e.index for e in obs.elements[sender:] if e.kind == "icon" and e.text == "trash")
    result = await env.step(f'{{"action_type":"click","index":{trash}}}')
    assert result.info.success, result.info.extra
