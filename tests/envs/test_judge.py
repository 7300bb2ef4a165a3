"""The LLM judge and the judged environment, against a local stand-in for the judge service.

The real judge (a hosted VLM, or a vLLM server elsewhere) cannot be reached from the test machines, so each test
starts a tiny OpenAI-compatible HTTP server in a thread that answers chat completions the way the test wants:
YES, NO, slowly, with garbage, or with an HTTP error. The client code under test is the real one, over real HTTP.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from distrl_stream.envs import JudgedEnv, LLMJudge, SimEnv, sim_tasks
from distrl_stream.envs.base import Observation
from distrl_stream.errors import EpisodeStateError, JudgeError
from tests.fixtures.http import BackgroundHttpServer, JsonHandler


@dataclass
class FakeJudge:
    """What the stand-in server answers, and what it received."""

    url: str
    reply: str = "YES"
    status: int = 200
    slow: bool = False
    requests: list[dict] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def judge_server() -> Iterator[FakeJudge]:
    state = FakeJudge(url="")

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            state.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **self.read_json()})
            if state.slow:
                state.release.wait(10)
            if state.status != 200:
                self.send_json(state.status, {"error": "overloaded"})
            elif state.reply == "<not json>":
                self.send_bytes(state.status, b"<html>proxy error</html>")
            else:
                self.send_json(200, {"choices": [{"message": {"role": "assistant", "content": state.reply}}]})

    with BackgroundHttpServer(Handler) as server:
        state.url = f"{server.url}/v1"
        try:
            yield state
        finally:
            state.release.set()  # a slow answer still waiting must not hold up the server's shutdown


OBS = Observation("Turn on Wi-Fi", "Settings\n[0] toggle Wi-Fi: on", screenshot=b"\x89PNG fake")


async def test_judge_asks_a_yes_no_question_with_task_screen_and_actions(judge_server: FakeJudge) -> None:
    judge = LLMJudge(judge_server.url, "judge-model", api_key="sk-test", timeout_s=5)
    task = sim_tasks("train", 1)[0]
    verdict = await judge.evaluate(task, OBS, ['{"action_type":"click","index":0}'])
    await judge.aclose()
    assert verdict.success and verdict.reason == "YES"
    request = judge_server.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["model"] == "judge-model"
    assert request["auth"] == "Bearer sk-test"
    text, image = request["messages"][1]["content"]
    assert "Turn on Wi-Fi" in text["text"] and "[0] toggle Wi-Fi: on" in text["text"]
    assert '{"action_type":"click","index":0}' in text["text"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,")


@pytest.mark.parametrize(("reply", "success"), [("NO", False), ("no.", False), ("Yes, the toggle is on", True)])
async def test_judge_reads_the_first_word(judge_server: FakeJudge, reply: str, success: bool) -> None:
    judge_server.reply = reply
    judge = LLMJudge(judge_server.url, "m", timeout_s=5)
    assert (await judge.evaluate(sim_tasks("train", 1)[0], OBS, [])).success is success
    await judge.aclose()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ({"reply": "Maybe"}, "neither YES nor NO"),
        ({"reply": "<not json>"}, "sent no chat completion"),
        ({"status": 503}, "HTTP 503"),
        ({"slow": True}, "timed out after 0.3 s"),
    ],
)
async def test_judge_failures_are_typed_errors_naming_the_endpoint(
    judge_server: FakeJudge, setup: dict, message: str
) -> None:
    for key, value in setup.items():
        setattr(judge_server, key, value)
    judge = LLMJudge(judge_server.url, "m", timeout_s=0.3)
    with pytest.raises(JudgeError, match=message) as info:
        await judge.evaluate(sim_tasks("train", 1)[0], OBS, [])
    assert judge_server.url in str(info.value)
    await judge.aclose()


async def test_unreachable_judge_is_a_typed_error() -> None:
    judge = LLMJudge("http://127.0.0.1:9/v1", "m", timeout_s=2)
    with pytest.raises(JudgeError, match="unreachable"):
        await judge.evaluate(sim_tasks("train", 1)[0], OBS, [])
    await judge.aclose()


async def test_judged_env_asks_only_when_the_agent_declares_completion(judge_server: FakeJudge) -> None:
    env = JudgedEnv(SimEnv(), LLMJudge(judge_server.url, "m", timeout_s=5), judge_on="status")
    task = sim_tasks("train", 1, templates=["take_photo"])[0]
    await env.reset(task)
    first = await env.step('{"action_type":"click","index":7}')  # open Camera: not complete yet
    assert not judge_server.requests and first.reward == 0.0 and not first.done
    result = await env.step('{"action_type":"status","goal_status":"complete"}')
    assert len(judge_server.requests) == 1
    assert result.done and result.reward == 1.0 and result.info.success
    assert result.info.extra["env_success"] is False and result.info.extra["judge"] == "YES"
    with pytest.raises(EpisodeStateError):
        await env.step('{"action_type":"wait"}')
    await env.close()


async def test_judge_overrides_the_env_success_check(judge_server: FakeJudge) -> None:
    judge_server.reply = "NO"
    env = JudgedEnv(SimEnv(), LLMJudge(judge_server.url, "m", timeout_s=5))
    task = sim_tasks("train", 1, templates=["take_photo"])[0]
    await env.reset(task)
    await env.step('{"action_type":"click","index":7}')
    result = await env.step('{"action_type":"click","index":1}')  # Shutter: the sim says success
    assert result.done and result.reward == 0.0 and not result.info.success
    assert result.info.extra["env_success"] is True
    await env.close()


async def test_every_step_mode_asks_after_each_valid_step_and_ends_on_yes(judge_server: FakeJudge) -> None:
    judge_server.reply = "NO"
    env = JudgedEnv(SimEnv(), LLMJudge(judge_server.url, "m", timeout_s=5), judge_on="every_step")
    await env.reset(sim_tasks("train", 1, templates=["set_alarm"])[0])
    invalid = await env.step("not an action")
    assert not judge_server.requests and not invalid.info.valid
    await env.step('{"action_type":"click","index":1}')
    assert len(judge_server.requests) == 1
    judge_server.reply = "YES"
    result = await env.step('{"action_type":"click","index":0}')
    assert len(judge_server.requests) == 2 and result.done and result.reward == 1.0
    await env.close()


async def test_credentials_in_the_judge_url_go_as_basic_auth_and_never_into_messages(judge_server: FakeJudge) -> None:
    url = judge_server.url.replace("http://", "http://judge:s3cret@")
    judge = LLMJudge(url, "m", timeout_s=5)
    assert (await judge.evaluate(sim_tasks("train", 1)[0], OBS, [])).success
    await judge.aclose()
    assert judge_server.requests[0]["auth"] == "Basic " + base64.b64encode(b"judge:s3cret").decode()
    judge_server.status = 503
    judge = LLMJudge(url, "m", timeout_s=5)
    with pytest.raises(JudgeError) as info:
        await judge.evaluate(sim_tasks("train", 1)[0], OBS, [])
    await judge.aclose()
    assert "s3cret" not in str(info.value) and "judge:**********@" in str(info.value)
