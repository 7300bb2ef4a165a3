"""The learner's data model: an episode as the learner stores it, and the padded batch its updates compute on.

- :class:`EpisodeRecord` / :class:`StepRecord` are plain dataclasses holding what the learner needs per episode and
  step, decoupled from Avro: :func:`episode_from_event` fills them from a TrajectoryEvent (the ingest reader and
  offline replay both use it), and the replay buffer stores them whole.
- :func:`collate` lays episodes out as the ``[B, T]`` tensors of :mod:`distrl_stream.learner.aride`
  (:class:`EpisodeBatch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from distrl_stream.errors import ActionConstraintError, ScreenshotError, TrajectoryError
from distrl_stream.events import Tensor as WireTensor
from distrl_stream.events import Termination, TrajectoryEvent
from distrl_stream.events.screenshots import read_screenshot

# The choice-mode check log π is computed under (``ChoiceConstraint.allowed``): given a step's candidates and action
# tokens, it raises ActionConstraintError when the tokens are not one of the candidates' tokenisations.
ActionCheck = Callable[[Sequence[str], Sequence[int]], object]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step as the learner needs it (the fields of the event's Step it uses).

    Attributes:
        observation: the screen text the policy saw (the prompt is rebuilt from it).
        candidates: the candidate action strings offered in choice mode (empty in free mode).
        action_text: exactly what the policy produced.
        action: canonical JSON of the parsed action, or "" when invalid.
        valid: whether the env/validator accepted the action.
        reward: r_t.
        done: True on the terminal step (success or a ``status`` action); False on a truncated episode's last step.
        behaviour_logprob: log μ(a_t|s_t), the sum over the action's tokens as served.
        token_ids: the action's token ids.
        token_logprobs: per-token behaviour log-probs.
        policy_version: the version that produced the action (0 = base model).
        screenshot_uri: where the screen's PNG is (claim check), when the collector captured one.
        screenshot_sha256: its sha256; a vision policy's prompt is rebuilt from the verified image.
        prompt_token_ids: the prompt as the server tokenised it, what log π is computed on; None for events written
            before TrajectoryEvent v3 (the prompt is then re-rendered from the observation).
        mode: how the action was asked, "choice" or "free" (how π(a|s) must be recomputed): the step's own mode
            (TrajectoryEvent v4), else its episode's.
    """

    observation: str
    candidates: tuple[str, ...]
    action_text: str
    action: str
    valid: bool
    reward: float
    done: bool
    behaviour_logprob: float
    token_ids: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    policy_version: int
    screenshot_uri: str | None = None
    screenshot_sha256: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    mode: str = "choice"

    @property
    def choices(self) -> list[str] | None:
        """The choice the server was asked to make (log π under the same constraint), or None in free mode."""
        return list(self.candidates) if self.mode == "choice" else None


@dataclass(frozen=True, slots=True)
class EpisodeRecord:
    """One finished episode as the learner stores it.

    Attributes:
        episode_id: unique id (the Kafka key of its TrajectoryEvent).
        task_id: the task it attempted.
        instruction: the task's instruction text.
        success: whether the task was solved.
        termination: why it ended (success, failure, truncated, env_error, ...).
        steps: the steps, in order.
        mode: "choice" or "free": the collector's mode (a choice-mode episode may hold free steps, ``StepRecord.mode``).
        collector_id: the collector that produced it.
        env_kind: sim, miniwob or android.
        task_template: the task's template name.
        split: train or test.
        final_observation: a truncated episode's screen after its last step, s_L, when the collector recorded it
            (TrajectoryEvent v2); the Retrace bootstrap V(s_L) is the critic's value of it (without it: 0).
        final_candidates: the actions offered on that screen (its prompt lists them in the chat format).
    """

    episode_id: str
    task_id: str
    instruction: str
    success: bool
    termination: str
    steps: tuple[StepRecord, ...]
    mode: str = "choice"
    collector_id: str = ""
    env_kind: str = ""
    task_template: str = ""
    split: str = "train"
    final_observation: str | None = None
    final_candidates: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def terminal(self) -> bool:
        """True when the last step is terminal (done); False when the episode was truncated."""
        return bool(self.steps) and self.steps[-1].done

    def previous_actions(self, t: int) -> list[str]:
        """The action texts of the steps before step ``t`` (what the prompt of step t shows as history)."""
        return [step.action_text for step in self.steps[:t]]

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeRecord:
        """Inverse of :meth:`to_dict`."""
        steps = tuple(
            StepRecord(
                **{
                    **s,
                    "candidates": tuple(s["candidates"]),
                    "token_ids": tuple(s["token_ids"]),
                    "token_logprobs": tuple(s["token_logprobs"]),
                    "prompt_token_ids": None if s.get("prompt_token_ids") is None else tuple(s["prompt_token_ids"]),
                    # Checkpoints written before steps had a mode: the episode's.
                    "mode": s.get("mode", data.get("mode", "choice")),
                }
            )
            for s in data["steps"]
        )
        # Checkpoints written before final_candidates existed lack the key: the default holds.
        return cls(**{**data, "steps": steps, "final_candidates": tuple(data.get("final_candidates", ()))})


@dataclass(frozen=True)
class EpisodeBatch:
    """Episodes in the padded ``[B, T]`` layout of :mod:`distrl_stream.learner.aride`.

    Flat per-step tensors the trainer computes (log-probs, entropies, values) are in episode-major order, the order
    of ``[step for episode in episodes for step in episode.steps]``, and enter this layout with ``aride.pad_steps``.

    Attributes:
        mask: ``[B, T]`` bool, True on real steps.
        rewards: ``[B, T]`` float32.
        done: ``[B, T]`` bool.
        invalid: ``[B, T]`` bool, True where the action was invalid.
        behaviour_logp: ``[B, T]`` float32 log μ(a_t|s_t).
        policy_version: ``[B, T]`` int64 behaviour policy version.
        success: ``[B]`` bool.
        truncated: ``[B]`` bool, True when the last step is not terminal (needs a bootstrap value).
    """

    mask: Tensor
    rewards: Tensor
    done: Tensor
    invalid: Tensor
    behaviour_logp: Tensor
    policy_version: Tensor
    success: Tensor
    truncated: Tensor

    @property
    def lengths(self) -> Tensor:
        """``[B]`` number of steps per episode."""
        return self.mask.sum(dim=1)


def collate(episodes: Sequence[EpisodeRecord]) -> EpisodeBatch:
    """Build the padded batch tensors of ``episodes`` (left-aligned, padded to the longest)."""
    lengths = [len(e) for e in episodes]
    b, t = len(episodes), max(lengths, default=0)
    mask = torch.zeros(b, t, dtype=torch.bool)
    rewards = torch.zeros(b, t)
    done = torch.zeros(b, t, dtype=torch.bool)
    invalid = torch.zeros(b, t, dtype=torch.bool)
    behaviour_logp = torch.zeros(b, t)
    version = torch.zeros(b, t, dtype=torch.long)
    for i, episode in enumerate(episodes):
        n = lengths[i]
        mask[i, :n] = True
        rewards[i, :n] = torch.tensor([s.reward for s in episode.steps])
        done[i, :n] = torch.tensor([s.done for s in episode.steps])
        invalid[i, :n] = torch.tensor([not s.valid for s in episode.steps])
        behaviour_logp[i, :n] = torch.tensor([s.behaviour_logprob for s in episode.steps])
        version[i, :n] = torch.tensor([s.policy_version for s in episode.steps])
    return EpisodeBatch(
        mask=mask,
        rewards=rewards,
        done=done,
        invalid=invalid,
        behaviour_logp=behaviour_logp,
        policy_version=version,
        success=torch.tensor([e.success for e in episodes], dtype=torch.bool),
        truncated=torch.tensor([not e.terminal for e in episodes], dtype=torch.bool),
    )


def episode_from_event(
    event: TrajectoryEvent,
    *,
    base_model: str | None = None,
    base_fingerprint: str = "",
    check_action: ActionCheck | None = None,
    screenshots: bool = False,
    vocab_size: int | None = None,
) -> EpisodeRecord:
    """Convert a trajectory event into the learner's episode record.

    ``done`` as in docs/design.md §5.1: True only on a terminal last step (success, failure, or a ``status`` action);
    a truncated episode's last step has ``done = False`` (its value after the horizon is bootstrapped). A step's mode
    is its own (``Step.mode``, TrajectoryEvent v4: a choice-mode screen without candidates is asked in free mode),
    else the episode's; candidates are kept only on choice-mode steps (free-mode log-probs use the whole vocabulary).

    Args:
        event: the trajectory.
        base_model: the learner's base model id (``ModelConfig.base_model_id``, what collectors record); an episode
            acted by another base is refused. None: not checked.
        base_fingerprint: the learner's base model fingerprint: an episode that records another one (a different
            model in a folder of the same name) is refused. "" (or an episode without one): not checked.
        check_action: the learner's choice constraint (:data:`ActionCheck`); a choice-mode step whose tokens it
            refuses is refused here rather than at the first update that computes log π on it. None: not checked.
        screenshots: the learner's policy reads screenshots: every step's is read back and verified here
            (:func:`check_screenshots`), so a missing or altered image is refused, never trained on.
        vocab_size: the policy's vocabulary: an action or prompt token id at or above it is refused here (it would
            fail every forward pass on it). None: not checked.

    Raises:
        TrajectoryError: no steps, a step without action tokens, an unknown mode, a choice-mode step without
            candidates, a step marked done
            before the last, token ids that are not a 1-D integer array, a tensor whose bytes do not match its dtype
            and shape, token log-probs that do not match the tokens one for one, a non-finite reward or log-prob,
            another base model than ``base_model``, choice-mode tokens ``check_action`` refuses, or (``screenshots``)
            a step whose screenshot is missing or not the bytes its sha256 names, a token id outside ``vocab_size``,
            prompt token ids that are not a non-empty 1-D integer array.
    """
    if not event.steps:
        raise TrajectoryError(f"episode {event.episode_id!r} has no steps")
    if base_model is not None and event.base_model != base_model:
        raise TrajectoryError(
            f"episode {event.episode_id!r} was acted by base model {event.base_model!r}, "
            f"not by this learner's {base_model!r}"
        )
    if base_fingerprint and event.base_fingerprint and event.base_fingerprint != base_fingerprint:
        raise TrajectoryError(
            f"episode {event.episode_id!r} was acted by base model {event.base_model!r} with fingerprint "
            f"{event.base_fingerprint[:16]}…, not by this learner's (fingerprint {base_fingerprint[:16]}…): another "
            "model in a folder of the same name"
        )
    if event.mode not in ("choice", "free"):
        raise TrajectoryError(f"episode {event.episode_id!r} has unknown mode {event.mode!r}")
    last = len(event.steps) - 1
    steps = []
    for t, step in enumerate(event.steps):
        where = f"episode {event.episode_id!r} step {t}"
        if step.done and t != last:
            raise TrajectoryError(f"{where} is marked done before the last step")
        ids = _array(step.token_ids, f"{where}: token_ids")
        token_logprobs = _array(step.token_logprobs, f"{where}: token_logprobs")
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.size == 0:
            raise TrajectoryError(f"{where}: token_ids must be a non-empty 1-D integer array ({ids.dtype}{ids.shape})")
        _check_ids(ids, vocab_size, f"{where}: token_ids")
        prompt_ids = None
        if step.prompt_token_ids is not None:
            prompt_ids = _array(step.prompt_token_ids, f"{where}: prompt_token_ids")
            if prompt_ids.ndim != 1 or prompt_ids.dtype.kind not in "iu" or prompt_ids.size == 0:
                raise TrajectoryError(
                    f"{where}: prompt_token_ids must be a non-empty 1-D integer array "
                    f"({prompt_ids.dtype}{prompt_ids.shape})"
                )
            _check_ids(prompt_ids, vocab_size, f"{where}: prompt_token_ids")
        if token_logprobs.shape != ids.shape:
            raise TrajectoryError(f"{where}: {token_logprobs.size} token log-probs for {ids.size} tokens")
        token_logprobs = token_logprobs.astype(float)
        if not (math.isfinite(step.reward) and math.isfinite(step.behaviour_logprob)):
            raise TrajectoryError(f"{where}: non-finite reward or behaviour log-prob")
        if step.policy_version < 0:
            raise TrajectoryError(f"{where}: negative policy version {step.policy_version}")
        mode = step.mode or event.mode
        if mode not in ("choice", "free"):
            raise TrajectoryError(f"{where} has unknown mode {mode!r}")
        if mode == "choice" and not step.candidates:
            raise TrajectoryError(f"{where}: choice mode without candidates")
        steps.append(
            StepRecord(
                observation=step.observation,
                candidates=tuple(step.candidates) if mode == "choice" else (),
                action_text=step.action_text,
                action=step.action,
                valid=step.valid,
                reward=float(step.reward),
                done=bool(step.done) and t == last and event.termination != Termination.TRUNCATED,
                behaviour_logprob=float(step.behaviour_logprob),
                token_ids=tuple(int(i) for i in ids),
                token_logprobs=tuple(float(x) for x in token_logprobs),
                policy_version=int(step.policy_version),
                screenshot_uri=step.screenshot_uri,
                screenshot_sha256=step.screenshot_sha256,
                prompt_token_ids=None if prompt_ids is None else tuple(prompt_ids.tolist()),
                mode=mode,
            )
        )
    episode = EpisodeRecord(
        episode_id=event.episode_id,
        task_id=event.task_id,
        instruction=event.instruction,
        success=bool(event.success),
        termination=str(event.termination),
        steps=tuple(steps),
        mode=event.mode,
        collector_id=event.collector_id,
        env_kind=event.env_kind,
        task_template=event.task_template,
        split=event.split,
        # Only a cut episode has a value beyond its data; a terminal one must never bootstrap.
        final_observation=event.final_observation if event.termination == Termination.TRUNCATED else None,
        final_candidates=tuple(event.final_candidates) if event.termination == Termination.TRUNCATED else (),
    )
    if check_action is not None:
        try:
            check_choices(episode, check_action)
        except ActionConstraintError as exc:
            raise TrajectoryError(f"{exc} (its action tokens are not one of its candidates)") from None
    if screenshots:
        try:
            check_screenshots(episode)
        except ScreenshotError as exc:
            raise TrajectoryError(str(exc)) from None
    return episode


def check_choices(episode: EpisodeRecord, check: ActionCheck) -> None:
    """Check every choice-mode step's action tokens with ``check`` (free-mode steps pass).

    Raises:
        ActionConstraintError: a step whose tokens were not sampled under the choice among its candidates (named).
    """
    for t, step in enumerate(episode.steps):
        if step.mode != "choice":
            continue
        try:
            check(step.candidates, step.token_ids)
        except ActionConstraintError as exc:
            raise ActionConstraintError(f"episode {episode.episode_id!r} step {t}: {exc}") from None


def check_screenshots(episode: EpisodeRecord) -> None:
    """Read back every step's screenshot through its claim check and verify its sha256.

    Raises:
        ScreenshotError: a step without one, or whose image is missing, unreadable or altered (named).
    """
    for t in range(len(episode)):
        step_screenshot(episode, t)


def step_screenshot(episode: EpisodeRecord, t: int, read: Callable[[str, str], bytes] = read_screenshot) -> bytes:
    """Step ``t``'s screenshot, read by ``read`` (a verifying reader: :func:`read_screenshot`, or a cache of it).

    Raises:
        ScreenshotError: the step has none, or its image is missing, unreadable or altered (the step named).
    """
    step = episode.steps[t]
    where = f"episode {episode.episode_id!r} step {t}"
    if step.screenshot_uri is None or step.screenshot_sha256 is None:
        raise ScreenshotError(f"{where}: no screenshot for a policy that reads them")
    try:
        return read(step.screenshot_uri, step.screenshot_sha256)
    except ScreenshotError as exc:
        raise ScreenshotError(f"{where}: {exc}") from None


def _check_ids(ids: np.ndarray, vocab_size: int | None, where: str) -> None:
    if ids.min() < 0:
        raise TrajectoryError(f"{where}: negative token id")
    if vocab_size is not None and ids.max() >= vocab_size:
        raise TrajectoryError(f"{where}: token id {int(ids.max())} outside the policy's vocabulary of {vocab_size}")


def _array(tensor: WireTensor, where: str) -> np.ndarray:
    """The numpy view of a wire tensor; bytes that do not fill its dtype and shape are a :class:`TrajectoryError`."""
    try:
        return tensor.to_numpy()
    except (TypeError, ValueError) as exc:  # unknown dtype name; byte count that does not fit the shape
        raise TrajectoryError(
            f"{where}: tensor {tensor.dtype}{tensor.shape} of {len(tensor.data)} bytes: {exc}"
        ) from None
