"""A scripted policy for the simulated phone: the oracle, with a given share of uniformly random actions.

It plays where a model would (``run_episode``), so its episodes are ordinary trajectories: the demonstrations of an
offline warm start (``bench/learning.py`` clones a noisy one before RL), random-play data for tests, or the random
reference of a benchmark in any environment (no oracle: ``env`` None, ``noise`` 1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from distrl_stream.envs.sim import SimEnv
from distrl_stream.envs.sim.oracle import OracleError
from distrl_stream.inference.client import ActionResult
from distrl_stream.policy.prompt import Prompt


class ScriptedPolicy:
    """The simulator's oracle, replaced by a uniform random candidate with probability ``noise``.

    It answers like :class:`~distrl_stream.inference.client.InferenceClient` (``act``), so the collector's own
    episode loop records its episodes; the actions are tokenised as the policy's tokenizer spells them, and the
    behaviour log-prob is the scripted policy's own probability of the chosen candidate. ``noise`` 1 is uniform
    random play, the only setting without a simulator to ask (``env`` None: any environment with candidates);
    ``version`` is the policy version its steps are tagged with.

    Raises:
        ValueError: ``env`` is None and ``noise`` is below 1 (there is no oracle to follow).
    """

    def __init__(
        self,
        env: SimEnv | None,
        tokenizer: PreTrainedTokenizerBase,
        noise: float,
        rng: random.Random,
        version: int = 0,
    ) -> None:
        if env is None and noise < 1:
            raise ValueError(f"ScriptedPolicy: noise {noise} follows the simulator's oracle: pass env, or noise 1")
        self.env = env
        self.tokenizer = tokenizer
        self.noise = noise
        self.rng = rng
        self.version = version

    async def act(
        self, prompt: Prompt, candidates: Sequence[str] | None = None, *, mode: str = "choice"
    ) -> ActionResult:
        options = list(candidates or ())
        try:
            oracle = self.env.oracle_action() if self.env is not None else None
        except OracleError:  # a random action made the task impossible (e.g. deleted the alarm to turn on)
            oracle = None
        best = oracle.to_text() if oracle is not None else self.rng.choice(options)
        text = self.rng.choice(options) if self.rng.random() < self.noise else best
        probability = (1 - self.noise) * (text == best) + self.noise / len(options)
        ids = (*self.tokenizer(text)["input_ids"], self.tokenizer.eos_token_id)
        logprobs = (math.log(probability), *([0.0] * (len(ids) - 1)))
        return ActionResult(
            text=text,
            token_ids=ids,
            tokens=tuple(self.tokenizer.convert_ids_to_tokens(list(ids))),
            token_logprobs=logprobs,
            logprob=sum(logprobs),
            # Tokenised as a server does a text prompt (the tokenizer's special tokens); an image prompt's expansion
            # is the processor's, which a scripted policy does not have.
            prompt_token_ids=tuple(self.tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else (),
            model="scripted",
            version=self.version,
            mode="choice",
            finish_reason="stop",
            latency_s=0.0,
        )
