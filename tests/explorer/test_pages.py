"""The explorer's HTML without services: untrusted text escaped everywhere, the chosen candidate marked, links that
keep the filters."""

from __future__ import annotations

import dataclasses
import random
from html.parser import HTMLParser

from distrl_stream.events import Termination, TrajectoryEvent
from distrl_stream.explorer import pages
from distrl_stream.explorer.index import DeadLetterRow, EpisodeRow, Filters
from distrl_stream.testing.samples import sample_trajectory

PAYLOAD = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'><a href="javascript:alert(3)">x</a>'


class _Tags(HTMLParser):
    """Every tag and attribute value of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [f"{k}={v}" for k, v in attrs]


def _parse(html: str) -> _Tags:
    tags = _Tags()
    tags.feed(html)
    return tags


def _hostile_event() -> tuple[TrajectoryEvent, str]:
    rng = random.Random(7)
    event = sample_trajectory(rng, steps=2, candidates=2)
    steps = [
        dataclasses.replace(s, observation=PAYLOAD, candidates=[PAYLOAD, s.action], action_text=PAYLOAD)
        for s in event.steps
    ]
    hostile = dataclasses.replace(
        event, steps=steps, instruction=PAYLOAD, task_template=PAYLOAD, final_observation=PAYLOAD
    )
    return hostile, pages.episode(hostile, 0, 3, newest=0, screenshots={})


def test_screen_text_in_an_episode_page_stays_text() -> None:
    _event, html = _hostile_event()
    found = _parse(html)
    assert "script" not in found.tags and "img" not in found.tags and "a" not in found.tags
    assert not any("javascript:" in a or a.startswith("onerror") for a in found.attributes)
    assert html.count(pages.esc(PAYLOAD)) >= 6  # observation, candidate, action text, per step; and the rest


def test_the_chosen_candidate_is_marked_and_only_it() -> None:
    event, html = _hostile_event()
    chosen = event.steps[0].action
    assert f'<li class="chosen">{pages.esc(chosen)}</li>' in html
    assert html.count('class="chosen"') == len(event.steps)


def test_each_step_shows_version_lag_and_log_prob() -> None:
    rng = random.Random(2)
    event = sample_trajectory(rng, steps=2, policy_version=1)
    html = pages.episode(event, 1, 9, newest=3, screenshots={})
    assert html.count("1 (lag 2)") == 2
    assert f"{event.steps[0].behaviour_logprob:.4f}" in html


def test_a_screenshot_that_does_not_verify_shows_why_instead_of_an_image() -> None:
    rng = random.Random(4)
    event = sample_trajectory(rng, steps=2)
    steps = [dataclasses.replace(s, screenshot_uri="file:///x.png", screenshot_sha256="0" * 64) for s in event.steps]
    event = dataclasses.replace(event, steps=steps)
    html = pages.episode(event, 0, 5, newest=0, screenshots={0: None, 1: "screenshot <altered>"})
    assert '<img src="/screenshot/0/5/0"' in html and "/screenshot/0/5/1" not in html
    assert "screenshot &lt;altered&gt;" in html


def _row(**changes: object) -> EpisodeRow:
    event = sample_trajectory(random.Random(5), steps=1)
    return dataclasses.replace(EpisodeRow.of(event, 2, 40, 1_700_000_000_000, newest=0), **changes)


def test_table_links_keep_the_filters_and_escape_values() -> None:
    query = {"template": 'a"b&c', "success": "no"}
    html = pages.episode_table([_row(task_template=PAYLOAD)], 120, Filters.parse(query), query)
    found = _parse(html)
    assert "script" not in found.tags and "img" not in found.tags
    hrefs = [a.removeprefix("href=") for a in found.attributes if a.startswith("href=")]
    assert "/episode/2/40" in hrefs
    sort_links = [h for h in hrefs if "sort=" in h]
    assert sort_links and all("template=a%22b%26c" in h and "success=no" in h for h in sort_links)
    assert any("page=2" in h for h in hrefs)  # 120 episodes: a next page


def test_dead_letters_link_trajectory_sources_and_escape_reasons() -> None:
    letter = DeadLetterRow(0, 0, 1_700_000_000_000, "r.trajectories", 3, 17, "EventDecodeError", PAYLOAD, "learner-0")
    other = dataclasses.replace(letter, topic="r.weights", offset=1)
    html = pages.dead_letters([letter, other], 2, 1, "r.trajectories")
    found = _parse(html)
    assert "script" not in found.tags and "img" not in found.tags
    assert [a for a in found.attributes if a.startswith("href=")] == ["href=/episode/3/17"]


def test_filter_form_values_are_escaped() -> None:
    query = {"task": '"><script>alert(1)</script>'}
    found = _parse(pages.filter_form(Filters.parse(query), query))
    assert "script" not in found.tags
    assert 'value="><script>alert(1)</script>' in found.attributes


def test_a_step_asked_in_another_mode_says_so() -> None:
    event = sample_trajectory(random.Random(6), steps=2)
    event = dataclasses.replace(event, steps=[dataclasses.replace(event.steps[0], mode="free"), event.steps[1]])
    html = pages.episode(event, 0, 1, newest=0, screenshots={})
    assert html.count("<dt>asked in</dt><dd>free mode</dd>") == 1


def test_an_attempt_that_failed_before_its_first_step_has_a_page() -> None:
    # A sync collector publishes such an attempt so that the learner's round counts it.
    event = dataclasses.replace(
        sample_trajectory(random.Random(5), steps=1), steps=[], termination=Termination.ENV_ERROR
    )
    html = pages.episode(event, 0, 3, newest=0, screenshots={})
    assert "env_error" in html and "<li" not in html
