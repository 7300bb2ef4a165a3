"""Replay buffer with Distributed Prioritized Experience Replay (DPER, docs/design.md §5.7).

- Items: whole episodes, :class:`~distrl_stream.learner.records.EpisodeRecord` (see :mod:`.records`).
- Storage: a circular buffer of ``capacity`` step slots. An episode is stored whole in consecutive slots (wrapping
  past the end); writing over a slot evicts the whole episode that owned it, so eviction takes whole oldest episodes
  and every stored episode keeps its boundaries. The sampled item is a whole episode: it never crosses a boundary
  and always ends with its terminal (or truncation) step.
- Sampling: proportional to p(τ)^α through a sum tree whose leaf for an episode is the slot of its first step
  (O(log capacity) per draw); importance weights w = (N·P(τ))^(−β_is) / max_τ' w(τ'), the max over the episodes in
  the buffer; new episodes enter at the current max priority in the buffer.
- Priority: p(τ) = w1·mean_t|δ_t| + w2·mean_t ρ_t + w3·mean_t H_t, H_t = −log π(a_t|s_t)
  (:func:`trajectory_priorities`); the learner refreshes the sampled episodes' priorities after each update
  (:meth:`ReplayBuffer.update_priorities`) and the next 1/K of the buffer, round robin, so all of them every K
  updates (:meth:`ReplayBuffer.refresh_next`).
- Checkpoints: :meth:`ReplayBuffer.state_dict` is plain JSON-serialisable data (no pickle) and
  :meth:`ReplayBuffer.from_state_dict` restores the exact layout, priorities and random state.

In a learner group each member keeps the buffer of the trajectories it consumed: that is the "distributed" in DPER.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from distrl_stream.config import LearnerConfig
from distrl_stream.errors import ReplayBufferError
from distrl_stream.learner.records import EpisodeRecord

_STATE_FORMAT = 1


# ----------------------------------------------------------------------------------------------------------------
# DPER priority and importance-weight schedule
# ----------------------------------------------------------------------------------------------------------------


def trajectory_priorities(
    deltas: Tensor, rhos: Tensor, logp: Tensor, mask: Tensor, w1: float, w2: float, w3: float
) -> Tensor:
    """p(τ) = w1·mean_t|δ_t| + w2·mean_t ρ_t + w3·mean_t H_t with H_t = −log π(a_t|s_t).

    Args:
        deltas: ``[B, T]`` TD errors δ_t (``aride.td_errors``).
        rhos: ``[B, T]`` importance ratios ρ_t (``aride.importance_ratios``).
        logp: ``[B, T]`` log π(a_t|s_t) under the current policy.
        mask: ``[B, T]`` bool.
        w1: weight of the TD-error term.
        w2: weight of the importance-ratio term.
        w3: weight of the entropy (surprise) term.

    Returns:
        ``[B]`` priorities, detached.
    """
    m = mask.to(deltas.dtype)
    n = m.sum(dim=1).clamp(min=1.0)

    def mean(x: Tensor) -> Tensor:
        return (x.detach() * m).sum(dim=1) / n

    return w1 * mean(deltas.abs()) + w2 * mean(rhos) + w3 * mean(-logp)


def is_beta(update: int, start: float, end: float, anneal_updates: int) -> float:
    """β_is after ``update`` updates: linear from ``start`` to ``end`` over ``anneal_updates``, then ``end``."""
    if anneal_updates <= 0:
        return end
    frac = min(max(update, 0) / anneal_updates, 1.0)
    return start + frac * (end - start)


# ----------------------------------------------------------------------------------------------------------------
# Sum tree
# ----------------------------------------------------------------------------------------------------------------


class SumTree:
    """Binary tree over ``size`` non-negative leaves whose inner nodes hold the sums of their children.

    Inner nodes are recomputed from their children on every update (never incremented), so sums do not drift.
    """

    def __init__(self, size: int) -> None:
        """Build an all-zero tree with ``size`` leaves."""
        self.size = size
        self._leaves = 1 << max(size - 1, 0).bit_length()  # leaves padded to a power of two
        self._tree = np.zeros(2 * self._leaves)  # node i has children 2i, 2i+1; root 1; leaves from _leaves

    @property
    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._tree[1])

    def __getitem__(self, index: int) -> float:
        return float(self._tree[self._leaves + index])

    def leaves(self) -> np.ndarray:
        """A copy of the leaf values, ``[size]``."""
        return self._tree[self._leaves : self._leaves + self.size].copy()

    def update(self, index: int, value: float) -> None:
        """Set leaf ``index`` to ``value`` and recompute its ancestors."""
        if not 0 <= index < self.size:
            raise IndexError(f"leaf {index} out of range [0, {self.size})")
        node = self._leaves + index
        self._tree[node] = value
        node //= 2
        while node >= 1:
            self._tree[node] = self._tree[2 * node] + self._tree[2 * node + 1]
            node //= 2

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass in [0, total), the leaf where the running sum of leaves passes it (vectorised)."""
        node = np.ones(len(masses), dtype=np.int64)
        mass = np.asarray(masses, dtype=np.float64).copy()
        for _ in range(self._leaves.bit_length() - 1):  # tree depth
            left = 2 * node
            left_sum = self._tree[left]
            go_right = mass >= left_sum
            mass = np.where(go_right, mass - left_sum, mass)
            node = left + go_right
        return node - self._leaves


# ----------------------------------------------------------------------------------------------------------------
# Replay buffer
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """A sampled batch of whole episodes.

    Attributes:
        keys: the buffer keys of the sampled episodes (for :meth:`ReplayBuffer.update_priorities`); an episode drawn
            twice appears twice.
        episodes: the episodes, aligned with ``keys``.
        probabilities: ``[B]`` P(τ) each was drawn with.
        is_weights: ``[B]`` float32 importance weights (all 1 for uniform samples).
    """

    keys: list[int]
    episodes: list[EpisodeRecord]
    probabilities: np.ndarray
    is_weights: Tensor = field(repr=False)


class ReplayBuffer:
    """Episode-aware circular replay buffer with proportional prioritised sampling (DPER).

    Keys are integers assigned at insertion and never reused, so a priority update for an episode that was evicted
    in the meantime is recognised and ignored.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.5,
        *,
        initial_priority: float = 1.0,
        min_priority: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        """Create an empty buffer.

        Args:
            capacity: number of step slots (the most steps held at once).
            alpha: priority exponent α (0 = uniform sampling).
            initial_priority: the priority of the first episode (later ones enter at the current max).
            min_priority: priorities are floored here so that every stored episode can still be drawn.
            seed: seed of the buffer's own random generator.
        """
        if capacity < 1:
            raise ReplayBufferError(f"capacity must be at least 1 step, got {capacity}")
        if alpha < 0:
            raise ReplayBufferError(f"alpha must be >= 0, got {alpha}")
        self.capacity = capacity
        self.alpha = alpha
        self.initial_priority = initial_priority
        self.min_priority = min_priority
        self.rng = np.random.default_rng(seed)
        self._tree = SumTree(capacity)  # leaf = slot of an episode's first step, value p^α; 0 elsewhere
        self._owner = np.full(capacity, -1, dtype=np.int64)  # key of the episode occupying each slot
        self._start: dict[int, int] = {}  # key -> first slot, in insertion order (oldest first)
        self._refreshed_up_to = -1  # refresh_next's round robin: the last key it re-scored (keys only ever grow)
        self._episodes: dict[int, EpisodeRecord] = {}
        self._priority: dict[int, float] = {}
        self._write = 0
        self._next_key = 0
        self._steps = 0
        self.episodes_evicted = 0

    @classmethod
    def from_config(cls, cfg: LearnerConfig) -> ReplayBuffer:
        """An empty buffer of ``[learner]``'s capacity, α and seed."""
        return cls(cfg.buffer_capacity_steps, cfg.dper_alpha, seed=cfg.seed)

    # -- contents ----------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of episodes held."""
        return len(self._episodes)

    @property
    def num_steps(self) -> int:
        """Number of steps held (at most ``capacity``)."""
        return self._steps

    def __contains__(self, key: object) -> bool:
        return key in self._episodes

    def __iter__(self) -> Iterator[int]:
        """Keys of the held episodes, oldest first."""
        return iter(list(self._start))

    def keys(self) -> list[int]:
        """Keys of the held episodes, oldest first."""
        return list(self._start)

    def items(self) -> Iterator[tuple[int, EpisodeRecord]]:
        """(key, episode) pairs, oldest first."""
        return ((k, self._episodes[k]) for k in list(self._start))

    def get(self, key: int) -> EpisodeRecord:
        """The episode stored under ``key``."""
        try:
            return self._episodes[key]
        except KeyError:
            raise ReplayBufferError(f"no episode with key {key} in the buffer (evicted or never added)") from None

    def priority(self, key: int) -> float:
        """The current priority p(τ) of an episode."""
        self.get(key)
        return self._priority[key]

    def slots(self, key: int) -> list[int]:
        """The step slots an episode occupies, in step order (wrapping past the end of the ring)."""
        start, n = self._start[key], len(self.get(key))
        return [(start + i) % self.capacity for i in range(n)]

    def stats(self) -> dict[str, float]:
        """Fill and priority statistics (the learner's ``buffer_*`` and ``priority_*`` metrics).

        ``buffer_success`` is the share of stored episodes that succeeded and ``priority_success_share`` the chance
        that one draw is a success (their share of the sampling mass p^α): the second above the first is how far DPER
        leans towards successes.
        """
        fill = {
            "buffer_episodes": float(len(self)),
            "buffer_steps": float(self.num_steps),
            "buffer_fill": self.num_steps / self.capacity,
            "buffer_evicted": float(self.episodes_evicted),
        }
        if not len(self):
            empty = ("priority_mean", "priority_max", "priority_min", "buffer_success", "priority_success_share")
            return fill | dict.fromkeys(empty, 0.0)
        priorities = np.array([self.priority(k) for k in self])
        success = np.array([self._episodes[k].success for k in self], dtype=bool)
        mass = np.array([self._tree[self._start[k]] for k in self])  # each episode's p^α, as the draws read it
        return fill | {
            "priority_mean": float(priorities.mean()),
            "priority_max": float(priorities.max()),
            "priority_min": float(priorities.min()),
            "buffer_success": float(success.mean()),
            "priority_success_share": float(mass[success].sum() / mass.sum()),
        }

    @property
    def max_priority(self) -> float:
        """The largest priority in the buffer (``initial_priority`` when empty): where new episodes enter."""
        return max(self._priority.values(), default=self.initial_priority)

    # -- insertion and removal ---------------------------------------------------------------------------------

    def add(self, episode: EpisodeRecord) -> int:
        """Store an episode whole at the write position, evicting whole oldest episodes to make room.

        Args:
            episode: the episode; at least one step, at most ``capacity`` steps, ``done`` only on the last step.

        Returns:
            The episode's key.

        Raises:
            ReplayBufferError: the episode cannot be stored (empty, longer than the buffer, done before the end).
        """
        n = len(episode.steps)
        if n == 0:
            raise ReplayBufferError(f"episode {episode.episode_id!r} has no steps")
        if n > self.capacity:
            raise ReplayBufferError(
                f"episode {episode.episode_id!r} has {n} steps, more than the buffer's capacity of {self.capacity}"
            )
        if any(step.done for step in episode.steps[:-1]):
            raise ReplayBufferError(f"episode {episode.episode_id!r} has a done step before its last step")
        priority = self.max_priority
        slots = (self._write + np.arange(n)) % self.capacity
        for owner in np.unique(self._owner[slots]):
            if owner >= 0:
                self._evict(int(owner))
        key = self._next_key
        self._next_key += 1
        self._owner[slots] = key
        self._start[key] = self._write
        self._episodes[key] = episode
        self._steps += n
        self._write = (self._write + n) % self.capacity
        self._set_priority(key, priority)
        return key

    def remove(self, keys: Iterable[int]) -> list[EpisodeRecord]:
        """Drop episodes (e.g. ones that became too stale); unknown keys are ignored. Returns what was dropped."""
        held = list(dict.fromkeys(k for k in keys if k in self._episodes))
        removed = [self._episodes[k] for k in held]
        for k in held:
            self._drop(k)
        return removed

    def _evict(self, key: int) -> None:
        self._drop(key)
        self.episodes_evicted += 1

    def _drop(self, key: int) -> None:
        start = self._start.pop(key)
        episode = self._episodes.pop(key)
        del self._priority[key]
        self._owner[(start + np.arange(len(episode))) % self.capacity] = -1
        self._tree.update(start, 0.0)
        self._steps -= len(episode)

    # -- priorities ----------------------------------------------------------------------------------------------

    def _set_priority(self, key: int, priority: float) -> None:
        p = max(priority, self.min_priority)
        self._priority[key] = p
        self._tree.update(self._start[key], p**self.alpha)

    def update_priorities(self, keys: Sequence[int], priorities: Sequence[float] | np.ndarray | Tensor) -> int:
        """Set new priorities p(τ) for sampled episodes; keys evicted since they were sampled are skipped.

        Args:
            keys: buffer keys (duplicates allowed; the last value wins).
            priorities: one non-negative finite priority per key.

        Returns:
            How many held episodes were updated.

        Raises:
            ReplayBufferError: lengths differ, or a priority is negative, NaN or infinite.
        """
        values = (
            priorities.detach().cpu().double().numpy() if isinstance(priorities, Tensor) else np.asarray(priorities)
        )
        values = values.astype(np.float64).reshape(-1)
        if len(values) != len(keys):
            raise ReplayBufferError(f"{len(keys)} keys but {len(values)} priorities")
        bad = [(k, v) for k, v in zip(keys, values, strict=True) if not math.isfinite(v) or v < 0]
        if bad:
            raise ReplayBufferError(f"priorities must be finite and >= 0; got (key, priority) {bad[:5]}")
        updated = 0
        for k, v in zip(keys, values, strict=True):
            if k in self._episodes:
                self._set_priority(k, float(v))
                updated += 1
        return updated

    def refresh_next(
        self,
        score: Callable[[list[int], list[EpisodeRecord]], Sequence[float] | Tensor],
        count: int,
        batch_size: int = 32,
    ) -> int:
        """Recompute the priorities of the next ``count`` held episodes after the last one re-scored, oldest first
        and wrapping around (round robin), ``batch_size`` episodes per ``score`` call.

        Args:
            score: maps (keys, episodes) to their priorities, e.g. the learner's forward pass followed by
                :func:`trajectory_priorities`.
            count: episodes to re-score (all of them at most).
            batch_size: episodes per call.

        Returns:
            How many episodes were updated.
        """
        keys = self.keys()
        after = [k for k in keys if k > self._refreshed_up_to]
        chosen = (after + [k for k in keys if k <= self._refreshed_up_to])[: max(count, 0)]
        updated = 0
        for start in range(0, len(chosen), batch_size):
            chunk = chosen[start : start + batch_size]
            updated += self.update_priorities(chunk, score(chunk, [self._episodes[k] for k in chunk]))
            self._refreshed_up_to = chunk[-1]
        return updated

    # -- sampling ------------------------------------------------------------------------------------------------

    def sample(self, batch_size: int, beta: float) -> Sample:
        """Draw ``batch_size`` episodes with replacement, P(τ) = p(τ)^α / Σ p^α, with importance weights.

        w(τ) = (N·P(τ))^(−β) / max_τ' (N·P(τ'))^(−β), the max over every episode in the buffer (it belongs to the
        least likely one), so weights lie in (0, 1] and only ever scale an update down.

        Args:
            batch_size: episodes to draw.
            beta: importance-sampling exponent β_is (see :func:`is_beta`).

        Raises:
            ReplayBufferError: the buffer is empty.
        """
        if not self._episodes:
            raise ReplayBufferError("cannot sample from an empty replay buffer")
        total = self._tree.total
        leaves = self._tree.find(self.rng.random(batch_size) * total)
        # Rounding at the top of the range can land on an empty leaf; draw those again.
        empty = self._owner[leaves] < 0
        while empty.any():
            leaves[empty] = self._tree.find(self.rng.random(int(empty.sum())) * total)
            empty = self._owner[leaves] < 0
        keys = [int(k) for k in self._owner[leaves]]
        probs = np.array([self._tree[int(slot)] for slot in leaves]) / total
        n = len(self._episodes)
        p_min = min(self._priority.values()) ** self.alpha / total
        weights = (n * probs) ** (-beta) / (n * p_min) ** (-beta)
        return Sample(
            keys=keys,
            episodes=[self._episodes[k] for k in keys],
            probabilities=probs,
            is_weights=torch.tensor(weights, dtype=torch.float32),
        )

    def sample_uniform(self, batch_size: int, among: Sequence[int] | None = None) -> Sample:
        """Draw ``batch_size`` episodes uniformly with replacement (the baselines' sampling), weights 1.

        Args:
            batch_size: episodes to draw.
            among: restrict the draw to these keys (e.g. the episodes a filter kept); default all.

        Raises:
            ReplayBufferError: nothing to draw from.
        """
        pool = [k for k in (self.keys() if among is None else among) if k in self._episodes]
        if not pool:
            raise ReplayBufferError("no episodes to sample from (buffer empty or none of the given keys held)")
        keys = [pool[i] for i in self.rng.integers(0, len(pool), size=batch_size)]
        return Sample(
            keys=keys,
            episodes=[self._episodes[k] for k in keys],
            probabilities=np.full(batch_size, 1.0 / len(pool)),
            is_weights=torch.ones(batch_size),
        )

    # -- snapshot ------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly, as JSON-serialisable data."""
        return {
            "format": _STATE_FORMAT,
            "capacity": self.capacity,
            "alpha": self.alpha,
            "initial_priority": self.initial_priority,
            "min_priority": self.min_priority,
            "write": self._write,
            "next_key": self._next_key,
            "episodes_evicted": self.episodes_evicted,
            "refreshed_up_to": self._refreshed_up_to,
            "rng": self.rng.bit_generator.state,
            "episodes": [
                {"key": k, "start": s, "priority": self._priority[k], "episode": self._episodes[k].to_dict()}
                for k, s in self._start.items()
            ],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ReplayBuffer:
        """Rebuild a buffer from :meth:`state_dict` output (same slots, keys, priorities and random state).

        Raises:
            ReplayBufferError: the snapshot is of another format or inconsistent.
        """
        if state.get("format") != _STATE_FORMAT:
            raise ReplayBufferError(f"replay buffer snapshot format {state.get('format')!r}, expected {_STATE_FORMAT}")
        try:
            buf = cls(
                state["capacity"],
                state["alpha"],
                initial_priority=state["initial_priority"],
                min_priority=state["min_priority"],
            )
            buf.rng.bit_generator.state = state["rng"]
            for item in state["episodes"]:
                key, start, episode = int(item["key"]), int(item["start"]), EpisodeRecord.from_dict(item["episode"])
                slots = (start + np.arange(len(episode))) % buf.capacity
                if (buf._owner[slots] >= 0).any() or key >= state["next_key"]:
                    raise ReplayBufferError(f"episode key {key} overlaps another or is out of range")
                buf._owner[slots] = key
                buf._start[key] = start
                buf._episodes[key] = episode
                buf._steps += len(episode)
                buf._set_priority(key, float(item["priority"]))
            buf._write = int(state["write"])
            buf._next_key = int(state["next_key"])
            buf.episodes_evicted = int(state["episodes_evicted"])
            buf._refreshed_up_to = int(state.get("refreshed_up_to", -1))  # absent from snapshots before it
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayBufferError(f"malformed replay buffer snapshot: {exc!r}") from None
        return buf
