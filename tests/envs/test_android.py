"""The adb adapter, against a fake device.

No Android emulator can run on the test machines, so these tests drive ``tests/envs/fake_adb/adb``: a small
program that answers like adb, replays uiautomator dumps (written in the exact format ``uiautomator dump`` emits)
for a few Settings screens, moves between them on taps and key events, and logs every command it receives. The
adapter code under test is the real one, running real subprocesses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distrl_stream.envs.android import AndroidEnv, parse_uiautomator
from distrl_stream.envs.base import Task
from distrl_stream.envs.tasks import android_tasks
from distrl_stream.errors import AdbError, EnvError

FAKE_ADB = Path(__file__).parent / "fake_adb" / "adb"
TASK: Task = android_tasks(["Turn on Wi-Fi"], horizon=10, split="train")[0]


class Device:
    """The fake device's command log and an adb path that runs it with this interpreter."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.adb = state / "adb"
        self.adb.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_ADB}" "$@"\n')
        self.adb.chmod(0o755)
        self._seen = 0

    def new_commands(self) -> list[str]:
        """Commands received since the last call."""
        log = self.state / "commands.log"
        lines = log.read_text().splitlines() if log.exists() else []
        fresh, self._seen = lines[self._seen :], len(lines)
        return fresh

    def programs_run(self) -> list[str]:
        """Every program the device's shell ran, with its arguments shell-quoted."""
        log = self.state / "device.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Device:
    monkeypatch.setenv("FAKE_ADB_STATE", str(tmp_path))
    monkeypatch.setenv("FAKE_ADB_SERIAL", "emulator-5554")
    return Device(tmp_path)


def make_env(device: Device, **kwargs: object) -> AndroidEnv:
    options = {"serial": "emulator-5554", "settle_s": 0.0, "apps": {"Settings": "com.android.settings"}}
    return AndroidEnv(str(device.adb), **{**options, **kwargs})  # type: ignore[arg-type]


async def test_round_trip_observation_parsed_and_actions_sent_as_adb_commands(device: Device) -> None:
    env = make_env(device)
    obs = await env.reset(TASK)
    assert device.new_commands() == [
        "shell input keyevent KEYCODE_HOME",
        "shell uiautomator dump /sdcard/window_dump.xml",
        "exec-out cat /sdcard/window_dump.xml",
    ]
    assert obs.instruction == "Turn on Wi-Fi"
    assert obs.screen.splitlines()[:2] == ["com.google.android.apps.nexuslauncher", "[0] item Settings"]
    assert '{"action_type":"click","index":0}' in env.candidates(obs)

    result = await env.step('{"action_type":"click","index":0}')  # the Settings icon at [60,1900][210,2100]
    assert device.new_commands()[0] == "shell input tap 135 2000"
    assert "[2] item Network & internet, Mobile, Wi‑Fi, hotspot" in result.observation.screen
    assert "[1] list recycler_view" in result.observation.screen

    await env.step('{"action_type":"click","index":2}')
    assert device.new_commands()[0] == "shell input tap 540 495"
    result = await env.step('{"action_type":"click","index":2}')  # the Wi-Fi switch
    assert device.new_commands()[0] == "shell input tap 540 480"
    assert "[2] toggle Use Wi‑Fi: on" in result.observation.screen
    assert result.info.valid and result.reward == 0.0 and not result.done  # no success check on a real device

    result = await env.step('{"action_type":"navigate_back"}')
    assert device.new_commands()[0] == "shell input keyevent KEYCODE_BACK"
    assert result.observation.screen.startswith("com.android.settings\n[0] item Search settings")
    result = await env.step('{"action_type":"status","goal_status":"complete"}')
    assert result.done and not device.new_commands()


@pytest.mark.parametrize(
    ("action", "commands"),
    [
        ('{"action_type":"long_press","index":1}', ["shell input swipe 540 1380 540 1380 800"]),
        ('{"action_type":"click","x":10,"y":20}', ["shell input tap 10 20"]),
        ('{"action_type":"scroll","direction":"down"}', ["shell input swipe 540 1920 540 480 300"]),
        ('{"action_type":"scroll","direction":"up","index":1}', ["shell input swipe 540 768 540 1992 300"]),
        ('{"action_type":"keyboard_enter"}', ["shell input keyevent KEYCODE_ENTER"]),
        ('{"action_type":"navigate_home"}', ["shell input keyevent KEYCODE_HOME"]),
        (
            '{"action_type":"open_app","app_name":"Settings"}',
            ["shell monkey -p com.android.settings -c android.intent.category.LAUNCHER 1"],
        ),
        (
            '{"action_type":"open_app","app_name":"com.android.settings"}',
            ["shell monkey -p com.android.settings -c android.intent.category.LAUNCHER 1"],
        ),
        ('{"action_type":"type","text":"wifi now"}', ["shell input text wifi%snow"]),
        ('{"action_type":"type","text":"it\'s"}', ["shell input text 'it'\"'\"'s'"]),
        ('{"action_type":"wait"}', []),
    ],
)
async def test_each_action_becomes_the_right_adb_command(device: Device, action: str, commands: list[str]) -> None:
    env = make_env(device)
    await env.reset(TASK)
    await env.step('{"action_type":"click","index":0}')  # into Settings
    device.new_commands()
    result = await env.step(action)
    assert result.info.valid, result.info.reason
    sent = device.new_commands()
    assert [c for c in sent if "uiautomator" not in c and "exec-out" not in c] == commands


async def test_type_into_a_field_taps_it_first(device: Device) -> None:
    env = make_env(device)
    await env.reset(TASK)
    await env.step('{"action_type":"click","index":0}')
    obs = (await env.step('{"action_type":"click","index":0}')).observation  # the search bar
    assert obs.elements[0].editable and obs.elements[0].state == "focused"
    device.new_commands()
    result = await env.step('{"action_type":"type","index":0,"text":"wifi"}')
    assert device.new_commands()[:2] == ["shell input tap 553 150", "shell input text wifi"]
    assert result.observation.elements[0].state == "wifi, focused"


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ('{"action_type":"click","index":40}', "no element 40 on this screen"),
        ('{"action_type":"type","index":1,"text":"x"}', "is not a text field"),
        ('{"action_type":"type","text":"café"}', "printable ASCII only"),
        ('{"action_type":"open_app","app_name":"Clock"}', "no package known for app 'Clock'"),
        ('{"action_type":"click","x":5000,"y":10}', "off the 1080x2400 screen"),
        ('{"action_type":"drag","index":0,"target":1}', "the device has no drag action"),
        ('{"action_type":"select","index":0,"option":1}', "the device has no select action"),
    ],
)
async def test_impossible_actions_send_nothing_and_say_why(device: Device, action: str, reason: str) -> None:
    env = make_env(device)
    await env.reset(TASK)
    device.new_commands()
    result = await env.step(action)
    assert not result.info.valid and reason in (result.info.reason or "")
    assert device.new_commands() == []


async def test_shell_arguments_reach_the_device_whole_and_run_no_other_command(device: Device) -> None:
    # adb joins the arguments of `shell` into one line for the device's sh -c, as the fake does.
    env = make_env(device)
    await env.adb("shell", "input", "text", "a;reboot")
    await env.adb("shell", "input", "text", "$(reboot)")
    assert device.programs_run() == ["input text 'a;reboot'", "input text '$(reboot)'"]


@pytest.mark.parametrize(
    ("app", "apps"),
    [
        pytest.param("a.b;reboot", {}, id="name"),
        pytest.param("com.android.settings && reboot", {}, id="name-with-space"),
        pytest.param("Evil", {"Evil": "com.evil;reboot"}, id="configured"),
        pytest.param("Numbered", {"Numbered": "com.1password"}, id="segment-starting-with-a-digit"),
    ],
)
async def test_open_app_takes_only_an_android_package_name(device: Device, app: str, apps: dict[str, str]) -> None:
    env = make_env(device, apps=apps)
    await env.reset(TASK)
    device.new_commands()
    result = await env.step(json.dumps({"action_type": "open_app", "app_name": app}))
    assert not result.info.valid and "is not an Android package name" in (result.info.reason or "")
    assert device.new_commands() == []
    assert "reboot" not in device.programs_run()


async def test_screenshots_are_png_bytes_from_screencap(device: Device) -> None:
    env = make_env(device, screenshots=True)
    obs = await env.reset(TASK)
    assert obs.screenshot is not None and obs.screenshot.startswith(b"\x89PNG\r\n\x1a\n")
    assert device.new_commands()[-1] == "exec-out screencap -p"


async def test_adb_failures_are_typed_errors_with_the_command(device: Device, tmp_path: Path) -> None:
    with pytest.raises(AdbError, match="device 'other' not found"):
        await make_env(device, serial="other").reset(TASK)
    with pytest.raises(AdbError, match="cannot run"):
        await AndroidEnv(str(tmp_path / "no-adb"), settle_s=0).reset(TASK)


def test_parser_rejects_what_is_not_a_window_dump() -> None:
    with pytest.raises(EnvError, match="not XML"):
        parse_uiautomator("UI hierchary dumped to: /dev/tty")
    with pytest.raises(EnvError, match="expected <hierarchy>"):
        parse_uiautomator("<html/>")
    dump = parse_uiautomator((FAKE_ADB.parent / "screens" / "internet.xml").read_text())
    assert dump.package == "com.android.settings" and dump.size == (1080, 2400)
    assert [e.kind for e in dump.elements] == ["text", "button", "toggle", "item"]
