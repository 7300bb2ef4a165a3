"""The explorer in headless Chromium against a real broker: the table, a filter, an episode, live updates, dead
letters, and screen text carrying script that stays text. Each test saves a screenshot of its page (in its tmp_path)."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from distrl_stream.config import Config, load_config
from distrl_stream.events import Termination, TrajectoryEvent, encode, event_key
from distrl_stream.explorer import Explorer
from distrl_stream.kafka.producer import Producer
from distrl_stream.kafka.topics import TopicNames, delete_run_topics, ensure_run_topics
from distrl_stream.testing.samples import (
    png,
    sample_dead_letter,
    sample_trajectory,
    sample_weight_version,
    with_screenshots,
)

pytestmark = [pytest.mark.kafka, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
EPISODES = 10
# Markup a web page or app could put on its screen: it must show as text, and nothing of it may run.
PAYLOAD = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2; alert(1)">"><b>bold</b>'


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium driven by Playwright (no browser download)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs chromium (apt-get install chromium)", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


def _episode(rng: random.Random, run: str, *, template: str, success: bool, steps: int = 3) -> TrajectoryEvent:
    event = sample_trajectory(rng, run=run, steps=steps, observation_chars=120, candidates=3, action_tokens=4)
    return dataclasses.replace(
        event,
        task_template=template,
        success=success,
        total_reward=float(success),
        termination=Termination.SUCCESS if success else Termination.TRUNCATED,
    )


def _publish(cfg: Config, topics: TopicNames, events: list[TrajectoryEvent]) -> None:
    with Producer(cfg.kafka) as producer:
        for i, event in enumerate(events):
            partition = i % cfg.kafka.trajectory_partitions
            producer.produce(topics.trajectories, encode(event), event_key(event), partition=partition)
        producer.flush()


def _record(cfg: Config, topics: TopicNames, shots_dir: Path) -> list[TrajectoryEvent]:
    """EPISODES episodes of two templates (the first with screenshots, the last with hostile screen text), two weight
    versions and a dead letter pointing at the first episode, published on ``cfg``'s run."""
    rng = random.Random(34)
    events = [
        _episode(rng, cfg.run, template="open_setting" if i % 2 else "toggle_wifi", success=i % 3 == 0)
        for i in range(EPISODES)
    ]
    shots = [png((120, 200), (40 * i, 90, 160)) for i in range(3)]
    # On a thread of its own: the store's asyncio.run cannot run inside Playwright's event loop on this one.
    with ThreadPoolExecutor(1) as pool:
        events[0] = pool.submit(with_screenshots, events[0], shots, shots_dir).result()
    hostile = [dataclasses.replace(s, observation=PAYLOAD, candidates=[PAYLOAD, s.action]) for s in events[-1].steps]
    events[-1] = dataclasses.replace(events[-1], steps=hostile, instruction=PAYLOAD, task_id=PAYLOAD)
    _publish(cfg, topics, events)
    with Producer(cfg.kafka) as producer:
        for version in (1, 2):
            producer.produce_event(topics.weights, sample_weight_version(rng, version=version))
        letter = dataclasses.replace(
            sample_dead_letter(rng, topic=topics.trajectories), partition=0, offset=0, error_message=PAYLOAD
        )
        producer.produce_event(topics.dlq, letter)
        producer.flush()
    return events


def _started(cfg: Config, index: Path, **options: Any) -> Explorer:
    """The explorer on a free port. One record per partition first, so the rest comes in through the backfill."""
    app = Explorer(cfg.kafka, cfg.run, index, port=0, first_chunk=1, **options)
    app.start()
    return app


@pytest.fixture(scope="module")
def recorded_run(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Config, list[TrajectoryEvent]]]:
    """A recorded run the read-only tests share (publishing and starting it once saves seconds a test)."""
    folder = tmp_path_factory.mktemp("explored")
    cfg = load_config(
        None, run=f"explored-{uuid.uuid4().hex[:8]}", kafka={"bootstrap_servers": kafka_bootstrap}, data_dir=folder
    )
    topics = ensure_run_topics(cfg)
    try:
        yield cfg, _record(cfg, topics, folder / "shots")
    finally:
        delete_run_topics(cfg)


@pytest.fixture(scope="module")
def recorded(recorded_run: tuple[Config, list[TrajectoryEvent]]) -> list[TrajectoryEvent]:
    return recorded_run[1]


@pytest.fixture(scope="module")
def explorer(
    recorded_run: tuple[Config, list[TrajectoryEvent]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Explorer]:
    app = _started(recorded_run[0], tmp_path_factory.mktemp("index") / "index.sqlite")
    yield app
    app.stop()


def _snap(page: Page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def test_episode_table_lists_the_runs_episodes_and_a_filter_narrows_it(
    explorer: Explorer, recorded: list[TrajectoryEvent], page: Page, tmp_path: Path
) -> None:
    page.goto(explorer.url + "episodes")
    rows = page.locator("table.episodes tr:has(td)")
    expect(rows).to_have_count(EPISODES, timeout=20_000)
    for event in recorded:
        expect(page.locator(f'a[title="{event.episode_id}"]')).to_have_count(1)
    _snap(page, tmp_path, "episodes")
    page.fill("input[name=template]", "open_setting")
    page.select_option("select[name=success]", "no")
    page.click("button[type=submit]")
    wanted = {e.episode_id for e in recorded if e.task_template == "open_setting" and not e.success}
    expect(rows).to_have_count(len(wanted))
    shown = {rows.nth(i).locator("a").first.get_attribute("title") for i in range(len(wanted))}
    assert shown == wanted
    assert "template=open_setting" in page.url and "success=no" in page.url  # the view is a link
    _snap(page, tmp_path, "episodes-filtered")


def test_an_episode_opens_with_its_screenshots_and_steps(
    explorer: Explorer, recorded: list[TrajectoryEvent], page: Page, tmp_path: Path
) -> None:
    first = recorded[0]
    page.goto(explorer.url + "episodes")
    page.locator(f'a[title="{first.episode_id}"]').click(timeout=20_000)
    expect(page.locator("section.step")).to_have_count(len(first.steps))
    images = page.locator("section.step figure img")
    expect(images).to_have_count(len(first.steps))
    # Loaded and decoded: the claim check was read and verified, and the bytes are a real image.
    widths = images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert widths == [120] * len(first.steps)
    step = first.steps[1]
    section = page.locator("#step-1")
    expect(section.locator("pre").first).to_have_text(step.observation)
    expect(section.locator("li.chosen")).to_have_text(step.action)
    expect(section).to_contain_text(f"{step.behaviour_logprob:.4f}")
    _snap(page, tmp_path, "episode")


def test_an_episode_published_while_the_page_is_open_appears_without_a_reload(
    run_config: Config, run_topics: TopicNames, page: Page, tmp_path: Path
) -> None:
    _record(run_config, run_topics, tmp_path / "shots")  # a run of its own: the shared one stays as recorded
    explorer = _started(run_config, tmp_path / "index.sqlite")
    try:
        page.goto(explorer.url + "episodes")
        rows = page.locator("table.episodes tr:has(td)")
        expect(rows).to_have_count(EPISODES, timeout=20_000)
        page.evaluate("window.__same_document = true")
        late = _episode(random.Random(1), run_config.run, template="late_template", success=True)
        _publish(run_config, run_topics, [late])
        expect(page.locator(f'a[title="{late.episode_id}"]')).to_have_count(1, timeout=15_000)
        expect(rows).to_have_count(EPISODES + 1)
        assert page.evaluate("window.__same_document") is True  # updated in place, not reloaded
        _snap(page, tmp_path, "episodes-live")
    finally:
        explorer.stop()


def test_screen_text_carrying_script_stays_text(
    explorer: Explorer, recorded: list[TrajectoryEvent], page: Page, tmp_path: Path
) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    hostile = recorded[-1]
    page.goto(explorer.url + "episodes")
    page.locator(f'a[title="{hostile.episode_id}"]').click(timeout=20_000)
    expect(page.locator("#step-0 pre").first).to_have_text(PAYLOAD)
    expect(page.locator("#step-0 ol.candidates li").first).to_have_text(PAYLOAD)
    expect(page.locator("dd", has_text="window.__xss").first).to_be_visible()
    assert page.locator("main img[src=x], main script, main b").count() == 0
    _snap(page, tmp_path, "hostile-episode")
    page.goto(explorer.url + "dead-letters")
    expect(page.locator("td", has_text="window.__xss").first).to_have_text(PAYLOAD)
    assert page.locator("main img[src=x], main script, main b").count() == 0
    assert page.evaluate("window.__xss") is None and dialogs == []
    _snap(page, tmp_path, "hostile-dead-letters")


def test_overview_and_dead_letters_show_versions_and_reasons(
    explorer: Explorer, recorded: list[TrajectoryEvent], page: Page, tmp_path: Path
) -> None:
    page.goto(explorer.url)
    expect(page.locator("table").first.locator("tr:has(td)")).to_have_count(2, timeout=20_000)
    expect(page.locator("main")).to_contain_text("toggle_wifi")
    _snap(page, tmp_path, "overview")
    page.goto(explorer.url + "dead-letters")
    source = page.locator("td a", has_text=".trajectories[0]@0")
    source.click()
    expect(page.locator("section.step")).to_have_count(len(recorded[0].steps))
    _snap(page, tmp_path, "dead-letters-source")


def test_the_app_only_reads_and_answers_unknown_positions_with_404(explorer: Explorer) -> None:
    assert httpx.get(explorer.url + "episode/0/999").status_code == 404
    assert httpx.post(explorer.url + "episodes").status_code == 405
    bad = httpx.get(explorer.url + "episodes?success=maybe")
    assert bad.status_code == 400 and "success: &#x27;maybe&#x27; is not yes or no" in bad.text


def test_a_token_is_required_when_set_and_traded_for_a_cookie(
    recorded_run: tuple[Config, list[TrajectoryEvent]], tmp_path: Path
) -> None:
    app = _started(recorded_run[0], tmp_path / "t.sqlite", token="s3cret")
    try:
        assert httpx.get(app.url + "episodes").status_code == 401
        with httpx.Client(follow_redirects=True) as client:
            answer = client.get(app.url + "episodes?token=s3cret&success=yes")
            assert answer.status_code == 200 and answer.url.query == b"success=yes"
            assert client.get(app.url).status_code == 200  # the cookie carries it now
        assert httpx.get(app.url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    finally:
        app.stop()
