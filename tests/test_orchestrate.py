"""`up`'s process management: children and their descendants never outlive a stop, or `up` itself."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from distrl_stream.cli.up_ui import process_table
from distrl_stream.config import load_config
from distrl_stream.monitor.prometheus import RoleMetrics
from distrl_stream.orchestrate import (
    VISION_MAX_MODEL_LEN,
    LocalStack,
    UpMetrics,
    UpOptions,
    up_profile,
    uses_external_kafka,
)
from distrl_stream.processes import ChildProcess, descendants
from tests.monitor.scrape import scrape, serve, value

# A child that starts a grandchild in a session of its own (as `serve` does with vLLM), prints its pid, and waits.
FAMILY = textwrap.dedent(
    """
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(f"pid={grandchild.pid}", flush=True)
    time.sleep(300)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _grandchild_pid(log: Path) -> int:
    pid = re.compile(r"^pid=(\d+)$", re.MULTILINE)
    assert _wait_for(lambda: pid.search(log.read_text()) is not None), log.read_text()
    return int(pid.search(log.read_text()).group(1))


def test_stop_ends_the_child_and_a_descendant_in_its_own_session(tmp_path: Path) -> None:
    child = ChildProcess("family", [sys.executable, "-c", FAMILY], dict(os.environ), tmp_path / "family.log")
    child.start()
    grandchild = _grandchild_pid(child.log_path)
    assert grandchild in descendants(child.pid)
    child.stop(5.0)
    assert not child.running()
    assert _wait_for(lambda: not _alive(grandchild)), "the grandchild outlived the stop"


def test_a_child_that_ignores_sigterm_is_killed_after_its_grace(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('sig' + 'term ignored', flush=True); time.sleep(300)"
    )
    child = ChildProcess("stubborn", [sys.executable, "-c", stubborn], dict(os.environ), tmp_path / "s.log")
    child.start()
    assert _wait_for(lambda: "sigterm ignored" in child.log_path.read_text())
    started = time.monotonic()
    assert child.stop(0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    # A stand-in for `up` that gets SIGKILL (no cleanup can run): the parent-death signal still ends its child.
    parent_code = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from distrl_stream.processes import ChildProcess
        child = ChildProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(300)"], dict(os.environ),
                             Path({str(tmp_path / "sleeper.log")!r}))
        child.start()
        print(child.pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert _alive(child_pid)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_for(lambda: not _alive(child_pid)), "the child outlived its killed parent"


def test_a_crashed_role_is_reported_with_its_log(tmp_path: Path) -> None:
    stack = LocalStack(load_config(None, data_dir=tmp_path), UpOptions())
    # The cause first, then more shutdown noise than the tail shows (as vLLM's engine dies): the report names both.
    # (The message is split so that the command line, which heads the log, does not name it.)
    crash = (
        "import sys; print('Value' + 'Error: the real cause'); print('shutting down\\n' * 100, end=''); "
        "print('bad things', flush=True); sys.exit(3)"
    )
    stack.collectors = [
        ChildProcess("collector-0", [sys.executable, "-c", crash], dict(os.environ), tmp_path / "c.log")
    ]
    stack.collectors[0].start()
    assert _wait_for(lambda: stack.failure() is not None)
    failure = stack.failure()
    assert failure is not None and "collector-0 exited with code 3" in failure and "bad things" in failure
    assert "first error: ValueError: the real cause" in failure
    assert stack.stop()["collector-0"] == 3


def test_an_abort_during_a_spawn_waits_for_the_child_s_pid_so_that_the_stop_reaches_it(tmp_path: Path) -> None:
    stack = LocalStack(load_config(None, data_dir=tmp_path), UpOptions())
    with pytest.raises(KeyboardInterrupt):
        stack.abort_start()  # outside a spawn: at once, as Ctrl-C
    # A signal inside the spawn (in subprocess.Popen) would have lost the running child's pid: it is deferred.
    stack._spawning = True
    stack.abort_start()
    stack._spawning = False
    with pytest.raises(KeyboardInterrupt):
        stack._spawn("serve", ["--help"])
    (child,) = stack._spawned
    assert child.pid is not None
    assert stack.stop()["serve"] is not None  # stopped and reaped, not forgotten


def test_a_child_that_ends_cleanly_is_no_failure(tmp_path: Path) -> None:
    stack = LocalStack(load_config(None, data_dir=tmp_path), UpOptions())
    stack.learner = ChildProcess("learner", [sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "l.log")
    stack.learner.start()
    assert _wait_for(lambda: stack.learner.returncode is not None)
    assert stack.failure() is None


def test_the_dashboard_footer_lists_processes_and_time_left(tmp_path: Path) -> None:
    stack = LocalStack(load_config(None, data_dir=tmp_path), UpOptions())
    stack.learner = ChildProcess("learner", [sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "l.log")
    stack.learner.start()
    assert _wait_for(lambda: stack.learner.returncode is not None)
    stack.started_at = time.monotonic() - 30
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(process_table(stack, 120.0))
    text = out.getvalue()
    assert "learner" in text and "exited 0" in text and str(stack.learner.log_path) in text
    assert re.search(r"up for 3\d s, 9\d s left", text)


def test_sync_collectors_get_a_round_mode_learner_of_one_episode_per_env(tmp_path: Path) -> None:
    sync = load_config(None, data_dir=tmp_path, collector={"mode": "sync", "envs": 3})
    assert LocalStack(sync, UpOptions(collectors=2)).learner_env() == {"DISTRL_LEARNER__ROUND_EPISODES": "6"}
    explicit = load_config(None, data_dir=tmp_path, collector={"mode": "sync"}, learner={"round_episodes": 5})
    assert LocalStack(explicit, UpOptions()).learner_env() == {}  # the user's round wins (the child reads it too)
    assert LocalStack(load_config(None, data_dir=tmp_path), UpOptions()).learner_env() == {}


def test_up_profile_fills_only_the_fields_left_at_their_defaults(tmp_path: Path) -> None:
    cfg = load_config(None, data_dir=tmp_path, learner={"updates_per_version": 7}, env={"templates": ["set_alarm"]})
    profile = up_profile(cfg)
    assert "updates_per_version" not in profile["learner"] and profile["learner"]["threads"] == 1
    assert "env" not in profile  # the user's templates stay
    assert profile["collector"] == {"envs": 4, "samples_per_insert": 2.0}
    assert "max_model_len" not in profile.get("inference", {})
    # A vision policy's prompt holds its screenshot's tokens: the longer context, unless the user chose one.
    assert up_profile(cfg, vision=True)["inference"]["max_model_len"] == VISION_MAX_MODEL_LEN
    chosen = load_config(None, data_dir=tmp_path, inference={"max_model_len": 700})
    assert "max_model_len" not in up_profile(chosen, vision=True).get("inference", {})


def test_the_pretrained_profile_trains_on_the_templates_a_pretrained_model_sometimes_solves(tmp_path: Path) -> None:
    profile = up_profile(load_config(None, data_dir=tmp_path), pretrained=True)
    assert profile["env"]["templates"] == ["take_photo", "turn_on_setting", "alarm_on"]
    assert profile["learner"]["batch_episodes"] == 4 and profile["learner"]["policy_lr"] == 1e-4
    assert profile["learner"]["critic_warmup_updates"] == 2
    chosen = load_config(None, data_dir=tmp_path, env={"templates": ["create_note"]})
    assert "env" not in up_profile(chosen, pretrained=True)  # the user's templates stay


def test_up_profile_keeps_a_field_set_to_its_library_default(tmp_path: Path) -> None:
    # learner.gamma 0.5 is the library default, written on purpose: it must not become the profile's 0.9.
    path = tmp_path / "run.toml"
    path.write_text("[learner]\ngamma = 0.5\n[collector]\nenvs = 8\n")
    profile = up_profile(load_config(path, data_dir=tmp_path))
    assert "gamma" not in profile["learner"] and profile["learner"]["policy_lr"] == 1e-3
    assert "envs" not in profile["collector"]


def test_up_profile_leaves_out_a_rate_limit_filtered_bc_could_never_lift(tmp_path: Path) -> None:
    profile = up_profile(load_config(None, data_dir=tmp_path, learner={"algorithm": "filtered_bc"}))
    assert profile["collector"] == {"envs": 4}  # no samples_per_insert: no success, no update, no version
    # And what it does set passes the pacing check.
    load_config(
        None,
        data_dir=tmp_path,
        collector=profile["collector"],
        learner={**profile["learner"], "algorithm": "filtered_bc"},
    )


def test_a_cluster_given_at_the_default_address_is_the_users_not_the_embedded_one(tmp_path: Path) -> None:
    assert uses_external_kafka(load_config(None, data_dir=tmp_path, kafka={"bootstrap_servers": "127.0.0.1:9092"}))
    assert not uses_external_kafka(load_config(None, data_dir=tmp_path))


def test_two_roles_in_one_process_keep_their_own_registries(served: list[RoleMetrics]) -> None:
    a = UpMetrics("r1", processes=lambda: {"learner": True, "collector-0": False}, uptime_s=lambda: None)
    b = UpMetrics("r2", processes=lambda: {}, uptime_s=lambda: 5.0)
    first, second = scrape(serve(a, served)), scrape(serve(b, served))
    assert value(first, "distrl_up_process_running", process="learner", run="r1") == 1
    assert value(first, "distrl_up_process_running", process="collector-0") == 0
    assert value(first, "distrl_up_uptime_seconds") is None
    assert value(second, "distrl_up_uptime_seconds", run="r2") == 5.0
    assert value(second, "distrl_up_process_running") is None


def test_a_child_started_but_not_yet_kept_is_stopped_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM to `up` right after a child started, before `up` kept it as its server (the exception unwinds
    past the assignment): stop() must stop it all the same."""
    sleeper = tmp_path / "sleeper"
    sleeper.write_text("#!/bin/sh\nexec sleep 300\n")
    sleeper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(sleeper))  # what _spawn runs: a stand-in that just waits
    stack = LocalStack(load_config(None, data_dir=tmp_path), UpOptions())
    child = stack._spawn("serve", ["serve", "--watch"])  # not assigned to stack.server, as if interrupted here
    assert child.running() and stack.server is None
    codes = stack.stop()
    assert "serve" in codes and not child.running()
