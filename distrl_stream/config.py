"""The one configuration tree of distrl-stream.

Every knob of every role is a field here, documented where it is declared, with its default and, for the
algorithm's hyper-parameters, where the default comes from. Values come from, lowest to highest precedence:
defaults < TOML file (``--config``) < environment (``DISTRL_<SECTION>__<FIELD>``, e.g.
``DISTRL_KAFKA__BOOTSTRAP_SERVERS``) < command-line flags. The tree is frozen: roles read it, never change it.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import unquote, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from distrl_stream import pacing
from distrl_stream.errors import ConfigError


class Section(BaseModel):
    """A frozen config section that rejects unknown keys (a typo in a TOML file is an error, not a no-op)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def is_secret_property(name: str) -> bool:
    """Whether a librdkafka (or Schema Registry client) property holds a password or key (``sasl.password``,
    ``ssl.key.password``, ``ssl.keystore.password``, ``ssl.key.pem``, ``sasl.oauthbearer.client.secret``,
    ``basic.auth.user.info``, ...)."""
    name = name.lower()
    return (
        any(word in name for word in ("password", "secret", "passphrase"))
        or name.endswith("key.pem")
        # The Schema Registry client's user:password (basic.auth.user.info; our schema_registry_basic_auth).
        or "basic.auth" in name.replace("_", ".")
        # Its unsecured-JWT settings can carry credentials; librdkafka itself treats it as sensitive.
        or name == "sasl.oauthbearer.config"
    )


MASK = "**********"
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_QUERY_PARAM = re.compile(r"([^&=?]+)=([^&]*)")
# Names of query parameters and fsspec storage options that carry credentials (token, sig, X-Amz-Signature, api_key,
# account_key, sas_token, connection_string, ...).
_SECRET_WORDS = ("password", "passwd", "secret", "token", "key", "sig", "credential", "auth", "connection_string")


def _secret_name(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_WORDS)


def mask_secrets(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``**********``: the password of a
    ``user:password@`` (a lone ``token@`` whole) and the values of query parameters named like secrets.

    What logs, errors, events, metric labels and ``config show`` carry of a URL from the configuration (inference
    servers, the judge, the Schema Registry, the artifact store); the real URL goes only to the client that uses it.
    """
    return _URL.sub(lambda match: _mask_url(match.group(0)), text)


def _mask_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL after all (an unbalanced IPv6 bracket): show none of it
        return f"{url.split('://', 1)[0]}://{MASK}"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    query = _QUERY_PARAM.sub(lambda m: f"{m.group(1)}={MASK}" if _secret_name(m.group(1)) else m.group(0), parts.query)
    return parts._replace(netloc=netloc, query=query).geturl()


def url_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@``, and that user and password (decoded; None without them): for an HTTP
    client to send as basic auth, so the URLs it logs and reports carry no secret."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    bare = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))


def _masked_url(url: str | None) -> str | None:
    """Serializer of a URL field: masked in JSON (``config show``), as a SecretStr is."""
    return None if url is None else mask_secrets(url)


class KafkaConfig(Section):
    """Where the Kafka cluster is and how every client talks to it."""

    bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="Kafka bootstrap servers (host:port,...). `up` replaces it with the embedded broker's address.",
    )
    client: dict[str, str | SecretStr] = Field(
        default_factory=dict,
        description="Extra librdkafka properties passed to every client (producer, consumer, admin), e.g. "
        'security.protocol, sasl.mechanism, sasl.username, ssl.ca.location. Env: DISTRL_KAFKA__CLIENT=\'{"k":"v"}\'. '
        "Passwords and keys (sasl.password, ssl.key.password, ssl.key.pem, ...) are kept masked: `config show` and "
        "logs print ********** for them. Rebalances stay eager: a cooperative partition.assignment.strategy or "
        "group.protocol consumer is refused (docs/learner.md).",
    )
    trajectory_partitions: int = Field(
        4, ge=1, description="Partitions of {run}.trajectories: the most learner-group members that can share it."
    )
    replication_factor: int = Field(1, ge=1, description="Replication of the run's topics (3 on a real cluster).")
    compression: Literal["lz4", "zstd", "snappy", "gzip", "none"] = Field(
        "lz4", description="Producer compression codec."
    )
    max_message_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest message (one whole trajectory) producers send and {run}.trajectories accepts.",
    )
    trajectory_retention_ms: int = Field(
        -1, ge=-1, description="Retention of {run}.trajectories (retention.ms); -1 keeps them: they are the replay log."
    )
    metrics_retention_ms: int = Field(
        7 * 24 * 3600 * 1000, ge=-1, description="Retention of {run}.metrics (default 7 days; -1 keeps them)."
    )
    dlq_retention_ms: int = Field(
        28 * 24 * 3600 * 1000,
        ge=-1,
        description="Retention of {run}.dlq (default 28 days: time to look into bad records; -1 keeps them).",
    )
    schema_registry_url: str | None = Field(
        None,
        pattern=r"^(https?|mock)://\S+$",
        description="A Confluent-compatible Schema Registry (Confluent, Karapace, Apicurio's ccompat API, Redpanda), "
        "e.g. http://registry:8081: event schemas are registered under {topic}-value with BACKWARD_TRANSITIVE "
        "compatibility and the wire ids come from it. None: the static ids of schemas/ids.json (offline mode). "
        "mock:// is the client's in-process registry, for tests.",
    )
    schema_registry_basic_auth: SecretStr | None = Field(
        None,
        description="user:password for the registry's HTTP basic auth (the client's basic.auth.user.info); "
        "masked in `config show` and logs.",
    )
    schema_registry_timeout_s: float = Field(
        10.0, gt=0.0, description="Bound on each Schema Registry request (an unreachable registry fails start-up)."
    )

    @field_validator("schema_registry_basic_auth", mode="after")
    @classmethod
    def _user_and_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and ":" not in value.get_secret_value():
            raise ValueError("must be user:password")
        return value

    _show_registry_url = field_serializer("schema_registry_url", when_used="json")(_masked_url)

    @field_validator("client", mode="after")
    @classmethod
    def _mask_secrets(cls, client: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        return {k: SecretStr(v) if isinstance(v, str) and is_secret_property(k) else v for k, v in client.items()}

    @field_validator("client", mode="after")
    @classmethod
    def _eager_rebalances(cls, client: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        # The learner group's reader takes each rebalance's whole assignment and hands partitions over at the revoke
        # (docs/learner.md, "A record read before a rebalance is never used after it"); incremental assignment
        # (cooperative-sticky, or KIP-848's broker-side protocol) would hand it only the changes.
        strategy = client.get("partition.assignment.strategy", "")
        if isinstance(strategy, str) and "cooperative" in strategy.lower():
            raise ValueError(
                f"partition.assignment.strategy {strategy!r}: the learner group rebalances eagerly; use range or "
                "roundrobin"
            )
        protocol = client.get("group.protocol", "classic")
        # librdkafka reads this one without regard to case or surrounding spaces.
        if isinstance(protocol, str) and protocol.strip().lower() != "classic":
            raise ValueError(
                f"group.protocol {protocol!r}: the learner group uses the classic protocol; set classic or leave it out"
            )
        return client

    def client_properties(self) -> dict[str, str]:
        """``client`` with the secrets revealed: only for handing to librdkafka, never for printing."""
        return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in self.client.items()}


class BrokerConfig(Section):
    """The embedded single-node KRaft broker that `kafka start` and `up` run."""

    kafka_home: Path | None = Field(
        default_factory=lambda: Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None,
        description="Apache Kafka installation (a folder with libs/*.jar). Default: $KAFKA_HOME, then the one "
        "`kafka use` recorded in this environment (`make setup` does), then the user cache that `kafka install` fills.",
    )
    port: int = Field(0, ge=0, le=65535, description="Client listener port; 0 picks a free one.")
    heap_mb: int = Field(512, ge=128, description="JVM heap of the broker (-Xms/-Xmx).")
    startup_timeout_s: float = Field(60.0, gt=0, description="How long to wait for the broker to answer.")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Extra server.properties entries (they win over the generated ones), e.g. log.retention.hours.",
    )


# The update rules the learner implements, listed once: the online ones (``learner.algorithm``), and behaviour cloning
# of every episode, which only the offline phase (``--replay-algorithm``) uses.
OnlineAlgorithm = Literal["aride", "digirl", "filtered_bc"]
Algorithm = Literal[OnlineAlgorithm, "bc"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)


class LearnerConfig(Section):
    """The learner's algorithm: A-RIDE (or a baseline), its critics, the replay buffer and DPER (docs/design.md §5).

    Sources of defaults: "paper" (DistRL, arXiv 2410.14803), "authors' code" (their released configs/trainer), or
    "ours" with the reason. Where the paper gives no value the authors' code wins (docs/design.md §5).
    """

    algorithm: OnlineAlgorithm = Field(
        "aride",
        description="Update rule: A-RIDE; DigiRL-style filtered advantage-weighted updates; or filtered behaviour "
        "cloning on successful episodes.",
    )
    gamma: float = Field(0.5, ge=0.0, le=1.0, description="Discount γ. Source: authors' code (gamma: 0.5).")
    retrace_lambda: float = Field(
        1.0, ge=0.0, le=1.0, description="Retrace trace decay λ. Source: authors' code (its traces are min(1, ρ): λ=1)."
    )
    c_bar: float = Field(
        1.0, gt=0.0, description="Retrace trace truncation c̄ in c_i = λ·min(c̄, ρ_i). Source: authors' code (min(1, ρ))."
    )
    rho_bar: float = Field(
        1.0, gt=0.0, description="Policy-gradient importance-weight clip ρ̄. Source: authors' code (clip_pg_rho 1.0)."
    )
    entropy_coef: float = Field(
        0.05, ge=0.0, description="Entropy bonus β. Source: authors' code (entropy_coeff 0.05 when entropy is on)."
    )
    invalid_penalty: float = Field(
        0.1, ge=0.0, description="Invalid-action penalty λ_inv. Source: authors' code (lambda_penalty 0.1)."
    )
    critic_loss: Literal["bce", "mse"] = Field(
        "bce",
        description="Step-critic loss towards the clipped Retrace target. Source: ours: V is a success probability "
        "and BCE keeps gradients alive where the sigmoid saturates.",
    )
    critic_hidden: int = Field(256, ge=1, description="Hidden width of the critic heads. Source: ours (small MLP).")
    trajectory_critic: bool = Field(
        False,
        description="Train DigiRL's instruction-level critic V_traj (always on for algorithm=digirl). Source: ours.",
    )
    dper_w1: float = Field(50.0, ge=0.0, description="DPER weight of mean|δ|. Source: authors' code (dper_w1 50).")
    dper_w2: float = Field(1.0, ge=0.0, description="DPER weight of mean ρ. Source: authors' code (w2 1.0).")
    dper_w3: float = Field(
        0.01,
        ge=0.0,
        description="DPER weight of mean −log π(a_t|s_t) (the authors' code; the policy's entropy instead measured no "
        "better, docs/learner.md). Source: authors' code (w3 0.01).",
    )
    dper_alpha: float = Field(
        0.5,
        ge=0.0,
        description="Priority exponent α (P ∝ p^α). Source: ours (docs/design.md §5.7; the authors' code never "
        "let priorities reach sampling, so it has none).",
    )
    is_beta_start: float = Field(
        0.4,
        ge=0.0,
        le=1.0,
        description="Importance-sampling exponent β_is at the start. Source: ours, PER's (Schaul et al. 2016) value; "
        "neither the paper nor the code gives one.",
    )
    is_beta_end: float = Field(1.0, ge=0.0, le=1.0, description="β_is after annealing. Source: ours, PER's value.")
    is_beta_anneal_updates: int = Field(
        2000,
        ge=0,
        description="Updates over which β_is rises linearly to its end value (0: no annealing). Source: ours.",
    )
    buffer_capacity_steps: int = Field(
        10_000, ge=1, description="Replay buffer capacity in steps. Source: authors' code (capacity 10000 steps)."
    )
    batch_episodes: int = Field(
        8, ge=1, description="Episodes per update (whole episodes). Source: ours, sized for a CPU update."
    )
    min_buffer_episodes: int = Field(
        8, ge=1, description="Episodes held before the first update. Source: ours (one batch of distinct episodes)."
    )
    micro_batch_steps: int | None = Field(
        None,
        ge=1,
        description="Steps (prompts) per forward pass of the policy; None: the whole batch in one pass (the tiny "
        "models). An update over more steps first computes the loss's gradient with respect to each step's log π, "
        "then redoes the forward one micro-batch at a time with gradient and accumulates, so peak memory is one "
        "micro-batch's, not the batch's, for one forward pass more (docs/learner.md). Source: ours.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing): less memory per micro-batch for a third more compute. Source: ours.",
    )
    shared_prefix: bool = Field(
        True,
        description="Compute the prompt prefix an update's steps share (an episode's system message and task) once "
        "per pass: the steps of a micro-batch are packed into one sequence where each step attends to exactly what "
        "it attends to alone, so log π and its gradient are unchanged for fewer tokens. Text policies on sdpa "
        "attention; image prompts take the unpacked pass (docs/learner.md). Source: ours.",
    )
    optimizer: Literal["adam", "adamw"] = Field(
        "adam", description="Optimiser of policy and critics. Source: authors' code."
    )
    policy_lr: float = Field(1e-4, gt=0.0, description="Policy (LoRA) learning rate. Source: authors' code (lm_lr).")
    critic_lr: float = Field(1e-4, gt=0.0, description="Critic learning rate (both heads). Source: authors' code.")
    max_grad_norm: float = Field(
        0.01, gt=0.0, description="Gradient-norm clip of each update. Source: authors' code (max_grad_norm 0.01)."
    )
    updates_per_version: int = Field(
        20,
        ge=1,
        description="Updates between published weight versions. Source: authors' code (20 actor steps per iteration, "
        "then the policy is shipped).",
    )
    priority_refresh_interval: int = Field(
        20,
        ge=1,
        description="K: every held episode's priority is re-scored once per K updates, 1/K of the buffer after each "
        "update, round robin (the sampled ones are re-scored after every update too). Source: authors' code (a full "
        "refresh once per 20-step iteration; spread out here, so that no update takes minutes on a pretrained "
        "model).",
    )
    # Judged on an episode's oldest step when it arrives; the collector's pause_above_policy_lag limits the lag at the
    # source instead, so that no data is collected only to be dropped here.
    drop_above_policy_lag: int = Field(
        10,
        ge=0,
        description="Drop (count as stale) trajectories with a step more than this many versions behind the "
        "learner's current version. Source: ours.",
    )
    # Arrival is not enough: an episode admitted 3 versions behind is still replayed after hundreds of updates, and
    # the policy then learns from what an old policy did (docs/learner.md, "Stability", measures what that does).
    advantage_centering: bool = Field(
        False,
        description="A-RIDE: subtract each batch's mean advantage before the policy loss (a batch baseline). "
        "Source: ours (off = the paper's A_t).",
    )
    critic_warmup_updates: int = Field(
        0,
        ge=0,
        description="A-RIDE: the first N updates train only the critics (the policy is not stepped), so advantages "
        "start from a fitted V instead of an untrained head's ~0.5. Source: ours (0 = the paper's loss from the "
        "first update).",
    )
    digirl_quantile: float = Field(
        0.9,
        gt=0.0,
        lt=1.0,
        description="DigiRL filter: keep trajectories at or above this quantile of 1{success} − V_traj. "
        "Source: authors' code (top 10%).",
    )
    digirl_lambda: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="DigiRL step advantage mix λ^{L−1−t}·R + (1 − λ^{L−1−t})·δ_t. Source: ours (even mix).",
    )
    checkpoint_interval_updates: int = Field(
        100, ge=1, description="Updates between learner checkpoints. Source: ours."
    )
    seed: int = Field(0, description="Seed of the learner's sampling and initialisation. Source: ours.")
    max_replay_ratio: float = Field(
        0.0,
        ge=0.0,
        description="Asynchronous mode: at most this many sampled episodes (updates × batch_episodes) per record "
        "read from {run}.trajectories since the learner started, usable or not (the buffer's episodes at start count "
        "as read: the count collector.samples_per_insert keeps, so the two cannot wait for each other; at least "
        "samples_per_insert when both are set, distrl_stream.pacing); the learner waits for data beyond it. 0: no "
        "cap (update as fast as the CPU allows). A learner on a fast device otherwise replays the same episodes many "
        "times over and drifts. Source: ours (Acme's samples_per_insert).",
    )
    round_episodes: int = Field(
        0,
        ge=0,
        description="Round mode (synchronous baseline, DigiRL's multi-machine scheme) when > 0: wait for this many "
        "new trajectories acted by the current version, do updates_per_version updates, publish one version, "
        "repeat. 0: asynchronous (update whenever the buffer holds min_buffer_episodes).",
    )
    init_adapter: Path | None = Field(
        None,
        description="Warm start: a peft LoRA adapter folder (the LoRA shape of the model section) the policy starts "
        "from; published as the first version at start. None: a fresh adapter (the base model's behaviour).",
    )
    max_updates: int = Field(
        0, ge=0, description="Stop after this many updates (checkpoint, exit). 0: run until stopped."
    )
    metrics_interval_s: float = Field(5.0, gt=0.0, description="Seconds between learner MetricEvents.")
    ingest_queue_episodes: int = Field(
        2000,
        ge=1,
        description="Decoded trajectories waiting for the trainer; above it the reader pauses its partitions (it "
        "keeps polling, so the group never times it out).",
    )
    feature_cache_size: int = Field(
        100_000, ge=0, description="Prompts whose frozen-base critic features are cached (the base never changes)."
    )
    checkpoint_keep: int = Field(2, ge=1, description="Checkpoints kept on disk (older ones are deleted).")
    threads: int = Field(0, ge=0, description="torch CPU threads of the learner (0: torch's default).")
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve the learner's Prometheus metrics at /metrics on this port, on all "
        "interfaces (0: a free port, logged; None: off); in a learner group each member on a host serves on this "
        "port + its local rank. docs/monitor.md lists the metrics.",
    )
    tensorboard_dir: Path | None = Field(
        None,
        description="Also write the learner's metrics as TensorBoard scalars into this folder (needs the tensorboard "
        "package: the `tensorboard` extra). None: off.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the policy's forward and backward passes run: cuda, cpu, or auto (CUDA when torch sees a "
        "GPU for every learner member on the host, else the CPU). On CUDA each member uses the GPU of its local rank "
        "and the base model is loaded in learner.dtype; on CPU in float32 (bf16 runs as autocast).",
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Precision of the policy's forward and backward passes: auto (bfloat16 on CUDA and on CPUs with "
        "AVX-512 BF16 or AMX units, float32 elsewhere; decided once and logged at start), bfloat16 (autocast; the "
        "LoRA master weights, optimiser state and every loss stay float32) or float32 (docs/learner.md, "
        "'Precision').",
    )


class ModelConfig(Section):
    """The policy model: its base weights and the LoRA adapter shape the learner trains and the server accepts."""

    policy_id: str = Field(
        "policy",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.]{0,63}$",
        description="Policy id: the key of {run}.weights and the prefix of served names (<policy_id>-v<N>, "
        "version 0 = the base model).",
    )
    base: Path | None = Field(
        None,
        description="Base model folder (any vLLM-servable causal LM, e.g. a Qwen2.5 instruct model on disk), or the "
        "name of a known pretrained model (`distrl-stream model list`, e.g. smollm2-135m-instruct), pulled into "
        "data_dir/models/<name> on first use. None: build the local model of `size` into data_dir/models/<size>.",
    )
    size: Literal["tiny", "small", "tiny-vl"] = Field(
        "tiny",
        description="Local model to build when `base` is None: tiny ≈0.33M params, small ≈10M, tiny-vl a ≈0.7M "
        "vision-language model (Idefics3) whose policy reads each screen's screenshot.",
    )
    seed: int = Field(0, description="Seed of the local model's initialisation (same seed, same files).")
    modality: Literal["auto", "text", "vision"] = Field(
        "auto",
        description="What the policy reads: text (the screen as text), or vision (the screenshot with the text; the "
        "base must be a vision-language model, and collectors capture screenshots whatever env.screenshots says). "
        "auto: vision when the base folder's config has a vision tower (docs/design.md §6.1).",
    )
    lora_rank: int = Field(8, ge=1, description="LoRA rank r; the server is started with --max-lora-rank r.")
    lora_alpha: int = Field(16, ge=1, description="LoRA scaling α (peft lora_alpha).")
    lora_dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="LoRA dropout. 0 keeps the learner's log-probs equal to the server's (vLLM applies none).",
    )
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        description='Modules that get LoRA weights: peft\'s names, or ["all-linear"] for every linear layer but '
        "the output head, whatever the architecture calls them (Qwen2 and Llama: q/k/v/o and gate/up/down "
        "projections); vLLM serves LoRA on all of them.",
    )

    @property
    def base_model_id(self) -> str:
        """The base model's id recorded in trajectories and versions: the folder name of ``base``, else the size."""
        return self.base.name if self.base is not None else self.size


# Room left in a message of {run}.artifacts for a chunk's key and headers (path, offsets, sha256).
ARTIFACT_HEADER_BYTES = 4096


class ArtifactsConfig(Section):
    """Where the learner publishes each adapter version and how servers fetch it (docs/deployment.md)."""

    store: str = Field(
        "kafka",
        pattern=r"^(kafka|file|[a-z][a-z0-9+.-]*://\S+)$",
        description="Publish target of adapter versions. kafka (default): the folder travels in chunks on "
        "{run}.artifacts, so a server needs nothing but the broker (any number of hosts). file: servers read the "
        "learner's data_dir/runs/<run>/artifacts folder (one host, or a shared filesystem). An fsspec base URL "
        "(s3://bucket/prefix, gs://..., http(s)://...): the folder is uploaded under <url>/<run>/<policy_id>/v<N>.",
    )
    chunk_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest chunk of an adapter file on {run}.artifacts (one Kafka message each); must stay under "
        "kafka.max_message_bytes, the topic's message limit.",
    )
    keep_versions: int = Field(
        3,
        ge=1,
        description="Versions per policy that stay readable: on {run}.artifacts version v reuses the record keys of "
        "version v - keep_versions, so compaction drops the older one, and the learner's artifact folder (what a "
        "file store serves) is pruned to the newest keep_versions at each publish (a server that joins late needs "
        "the newest; a checkpoint holds its own adapter).",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the fsspec filesystem of an fsspec store, for the learner's upload and the "
        'servers\' download, e.g. {key = "...", secret = "...", endpoint_url = "..."} for s3 or {headers = '
        '{Authorization = "..."}} for http(s). Env: DISTRL_ARTIFACTS__STORAGE_OPTIONS=\'{"k":"v"}\'. Credentials go '
        "here, never in the store's URL (which every weight-version event carries); values named like secrets "
        "(key, secret, token, password, ...) are kept masked: `config show` and logs print **********.",
    )
    fetch_timeout_s: float = Field(120.0, gt=0, description="Bound on fetching one adapter version from the store.")
    upload_retries: int = Field(
        3,
        ge=0,
        description="Retries of an object-store upload the store refused (a throttle, an outage); a version still "
        "refused is counted (versions_not_uploaded), never announced, and the learner trains on.",
    )
    upload_backoff_s: float = Field(
        1.0, gt=0, description="Wait before the first upload retry; each further one waits twice as long."
    )

    @field_validator("store", mode="after")
    @classmethod
    def _no_credentials_in_the_url(cls, store: str) -> str:
        if "://" in store and "@" in urlsplit(store).netloc:
            raise ValueError("credentials in the URL would be published on {run}.weights: put them in storage_options")
        return store

    @field_validator("storage_options", mode="after")
    @classmethod
    def _mask_secret_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        return _wrap_secrets(options)

    def storage_options_values(self) -> dict[str, Any]:
        """``storage_options`` with the secrets revealed: only for handing to fsspec, never for printing."""
        return _reveal(self.storage_options)


def _wrap_secrets(options: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _wrap_secrets(v) if isinstance(v, dict) else SecretStr(v) if isinstance(v, str) and _secret_name(k) else v
        for k, v in options.items()
    }


def _reveal(options: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _reveal(v) if isinstance(v, dict) else v.get_secret_value() if isinstance(v, SecretStr) else v
        for k, v in options.items()
    }


class InferenceConfig(Section):
    """The vLLM policy server (`serve`) and the client every collector uses to ask it for actions."""

    host: str = Field("127.0.0.1", description="Address the server listens on and clients connect to.")
    port: int = Field(8000, ge=0, le=65535, description="Server port; 0 picks a free one at start.")
    url: str | None = Field(
        None, description="Base URL of an already running server (e.g. http://gpu-host:8000); overrides host/port."
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Base URLs of several running servers; a client spreads its requests over them (fewest in "
        "flight) and moves on to another when one fails. Overrides url and host/port; empty: the one server of url "
        "(or host:port). `collect --inference-url` (repeatable) sets it.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="Key the server requires on every /v1 request (vLLM --api-key) and every client sends as "
        "`Authorization: Bearer`. Env: DISTRL_INFERENCE__API_KEY. Kept masked: `config show` prints **********.",
    )
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="auto: GPU defaults when CUDA is visible, else the CPU recipe (docs/design.md §8)."
    )
    dtype: str = Field(
        "auto",
        description="Precision the server serves in: auto (bfloat16 on a GPU and on CPUs with AVX-512 BF16 or AMX "
        "units, float32 elsewhere: the learner's rule, docs/design.md §8), or any vLLM --dtype (bfloat16, float32, "
        "float16, ...) passed on as given.",
    )
    max_model_len: int = Field(512, ge=16, description="Prompt + action tokens per request (vLLM --max-model-len).")
    cpu_kvcache_gb: int = Field(1, ge=1, description="KV-cache GiB on CPU (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="vLLM --gpu-memory-utilization on GPU (CPU: always 0.2, docs/design.md §8)."
    )
    keep_versions: int = Field(
        2, ge=1, description="LoRA versions kept loaded; older ones are unloaded when a newer one is loaded."
    )
    retired_adapter_grace_s: float = Field(
        120.0,
        ge=0,
        description="How long an unloaded version's staged adapter folder stays on disk: vLLM reloads it from there "
        "for a request accepted before the unload, and a missing folder kills its engine. Keep it above the "
        "clients' request_timeout_s.",
    )
    startup_timeout_s: float = Field(300.0, gt=0, description="How long `serve` waits for /v1/models to answer.")
    stop_timeout_s: float = Field(15.0, gt=0, description="Grace period after SIGTERM before the server is killed.")
    restarts: int = Field(
        3,
        ge=0,
        description="Times `serve` restarts a vLLM server that exited on its own (its engine died: on saturated CPU "
        "cores vLLM's own execute timeout can kill it) before giving up; 0: exit at once. The weight watcher starts "
        "over with each restart and loads the newest version again.",
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra vLLM server arguments, appended as given.")
    log_file: Path | None = Field(None, description="Server log file. None: <data_dir>/runs/<run>/logs/vllm.log.")
    watch_weights: bool = Field(
        True, description="Run the weight-version watcher inside `serve` (hot-loads {run}.weights versions)."
    )
    mode: Literal["choice", "free"] = Field(
        "choice",
        description="choice: pick among the env's candidate actions (valid by construction, exact ρ); free: "
        "free-form text parsed into an action (the paper's setting).",
    )
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature (the learner recomputes with it).")
    max_tokens: int = Field(
        64, ge=1, description="Free mode: most tokens per action. Choice mode bounds it by the longest candidate."
    )
    free_stop: list[str] = Field(
        default_factory=lambda: ["\n"], description="Free mode: stop strings (an action is one line)."
    )
    request_timeout_s: float = Field(30.0, gt=0, description="Timeout of one HTTP request to the server.")
    retries: int = Field(
        2,
        ge=0,
        description="Further rounds of attempts when every server failed a request (connection error, timeout, 5xx).",
    )
    retry_backoff_s: float = Field(
        0.5, ge=0, description="Delay before the next round of attempts when every server failed; doubles each round."
    )
    server_backoff_s: float = Field(
        1.0, ge=0, description="A failed server gets no new request for this long (unless every other one failed)."
    )
    server_backoff_max_s: float = Field(
        30.0, ge=0, description="The failed server's backoff doubles on each consecutive failure, up to this."
    )
    max_connections: int = Field(64, ge=1, description="Concurrent HTTP connections of one client.")
    version_poll_s: float = Field(
        2.0, gt=0, description="How often a client re-reads /v1/models to switch to the newest loaded version."
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve the weight watcher's (inside `serve`) Prometheus metrics at /metrics on this port, on all "
        "interfaces (0: a free port, logged; None: off). docs/monitor.md lists the metrics.",
    )

    @field_validator("urls", mode="after")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{mask_secrets(repr(url))} is not an http(s):// base URL (e.g. http://gpu-host:8000)")
        if len(set(urls)) != len(urls):
            raise ValueError("lists a server twice")
        return [url.rstrip("/") for url in urls]

    _show_url = field_serializer("url", when_used="json")(_masked_url)

    @field_serializer("urls", when_used="json")
    def _show_urls(self, urls: list[str]) -> list[str]:
        return [mask_secrets(url) for url in urls]

    @property
    def base_url(self) -> str:
        """The one server of ``url`` (or host:port): where `serve` listens and a single-server client connects."""
        return (self.url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def server_urls(self) -> tuple[str, ...]:
        """Where clients send requests: ``urls``, or else the one server of ``base_url``."""
        return tuple(self.urls) or (self.base_url,)


# The MiniWoB++ tasks a small policy learns from (docs/envs.md), through either adapter.
_MINIWOB_SUBSET = (
    "click-test",
    "click-test-2",
    "click-button",
    "click-link",
    "focus-text",
    "focus-text-2",
    "enter-text",
    "click-checkboxes",
)


class EnvConfig(Section):
    """The environments collectors run: which kind, its tasks, its latency, and how success is judged."""

    kind: Literal["sim", "miniwob", "android", "browsergym", "gymnasium"] = Field(
        "sim",
        description="Environment kind: the built-in simulated phone, MiniWoB++ in headless chromium (Selenium), "
        "adb, any BrowserGym task (Playwright), or a Gymnasium env with text actions (docs/envs.md).",
    )
    seed: int = Field(0, description="Seed of task sampling and of the simulator's latency noise.")
    templates: list[str] = Field(
        default_factory=list,
        description="Sim task templates to draw tasks from (empty: all). A curriculum starts with a few easy ones.",
    )
    pool_size: int = Field(
        2000, ge=1, description="Tasks per split in the task pool (sim: over the templates; miniwob: seeds per task)."
    )
    task_sampler: Literal["uniform", "curriculum"] = Field(
        "uniform",
        description="How collectors draw train tasks: uniformly, or DigiRL's curriculum (templates weighted by "
        "p(1 − p) of their recent success p, so most episodes are at the edge of the policy's ability; "
        "envs.tasks.CurriculumSampler). The test split is always uniform. Source: DigiRL (curriculum), ours (weight).",
    )
    curriculum_window: int = Field(
        20, ge=1, description="Curriculum: recent episodes per template its success rate is measured on. Source: ours."
    )
    latency: Literal["none", "lognormal"] = Field(
        "none", description="Sim step-latency model: none (tests) or log-normal with a per-task scale (benchmarks)."
    )
    latency_mean_s: float = Field(0.5, ge=0.0, description="Mean sim step latency in seconds over tasks and steps.")
    latency_sigma: float = Field(0.5, ge=0.0, description="Log-normal width of the per-step latency within a task.")
    latency_task_spread: float = Field(
        100.0, ge=1.0, description="Slowest/fastest ratio of per-task latency scales (DistRL reports ~100x on Android)."
    )
    miniwob_tasks: list[str] = Field(
        default_factory=lambda: list(_MINIWOB_SUBSET),
        description="MiniWoB++ tasks to draw from (the learnable subset documented in docs/envs.md).",
    )
    miniwob_episode_time_s: float = Field(
        60.0, gt=0.0, description="MiniWoB episode time limit; its own 10 s default assumes a fast agent."
    )
    browsergym_tasks: list[str] = Field(
        default_factory=lambda: [f"browsergym/miniwob.{name}" for name in _MINIWOB_SUBSET],
        description="BrowserGym task ids to draw from (default: the MiniWoB++ learnable subset through BrowserGym; "
        "webarena.*, workarena.* and the like need their package and servers).",
    )
    browsergym_actions: list[
        Literal["chat", "infeas", "bid", "coord", "nav", "tab", "miniwob_all", "webarena", "workarena"]
    ] = Field(
        default_factory=lambda: ["bid", "coord", "nav", "chat", "infeas"],
        min_length=1,
        description="BrowserGym high-level action subsets the policy may use in free mode (default: element and "
        "coordinate actions, navigation, answering in the chat, declaring a task infeasible). Source: BrowserGym.",
    )
    browsergym_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts the BrowserGym browser may reach besides loopback and file:// pages, e.g. a WebArena "
        "server's (empty: none; everything else fails to load).",
    )
    gymnasium_env: str = Field(
        "",
        description="The Gymnasium env of kind 'gymnasium': a registered id (MyEnv-v0, or module:MyEnv-v0 to import "
        "its module first) or an entry point module:Class. Its action space must be gymnasium.spaces.Text.",
    )
    gymnasium_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the Gymnasium env's constructor."
    )
    gymnasium_horizon: int = Field(
        20, ge=1, description="Most steps of a Gymnasium episode (the env may end it first)."
    )
    chrome_binary: Path = Field(
        default_factory=lambda: Path(os.environ.get("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")),
        description="Chromium for MiniWoB++ and BrowserGym (driven by Playwright, no browser download). "
        "Default: $MINIWOB_CHROME_BINARY, then /usr/bin/chromium.",
    )
    chromedriver: Path = Field(
        default_factory=lambda: Path(os.environ.get("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")),
        description="chromedriver matching chrome_binary. Default: $MINIWOB_CHROMEDRIVER, then /usr/bin/chromedriver.",
    )
    screenshots: bool = Field(
        False,
        description="Attach a PNG screenshot to every observation: MiniWoB and Android capture it, the simulator "
        "draws its screen.",
    )
    adb_path: str = Field("adb", description="The adb executable (a name on PATH or a path).")
    adb_serial: str | None = Field(None, description="Device serial for adb -s (None: the only device attached).")
    adb_timeout_s: float = Field(30.0, gt=0.0, description="Timeout of one adb command.")
    android_settle_s: float = Field(1.0, ge=0.0, description="Wait after each Android action before reading the UI.")
    android_apps: dict[str, str] = Field(
        default_factory=dict,
        description="App name -> package for open_app on Android, e.g. {'Clock': 'com.google.android.deskclock'}.",
    )
    android_tasks: list[str] = Field(
        default_factory=list, description="Instructions of the Android tasks (success comes from the judge)."
    )
    android_horizon: int = Field(15, ge=1, description="Most steps of an Android episode.")
    judge: Literal["env", "llm"] = Field(
        "env", description="Who decides success: the environment's own check, or an LLM judge over HTTP."
    )
    judge_url: str | None = Field(
        None, description="Base URL of an OpenAI-compatible API for the judge, e.g. http://host:8000/v1."
    )
    judge_model: str = Field("", description="Model name the judge endpoint serves.")
    judge_api_key: SecretStr | None = Field(None, description="Bearer token for the judge endpoint, if it needs one.")
    judge_timeout_s: float = Field(30.0, gt=0.0, description="Timeout of one judge request.")
    judge_on: Literal["status", "every_step"] = Field(
        "status",
        description="When to ask the judge: when the agent declares the task complete (and at the horizon), "
        "or after every step (as DigiRL's evaluator does; one request per step).",
    )

    _show_judge_url = field_serializer("judge_url", when_used="json")(_masked_url)

    @model_validator(mode="after")
    def _judge_needs_endpoint(self) -> EnvConfig:
        if self.judge == "llm" and (not self.judge_url or not self.judge_model):
            raise ValueError("judge = 'llm' needs judge_url and judge_model")
        return self


class MonitorConfig(Section):
    """Trackers besides the {run}.metrics topic, Prometheus (each role's metrics_port) and TensorBoard."""

    wandb_project: str | None = Field(
        None,
        description="Log to this Weights & Biases project (the `wandb` extra): the learner's metrics per update, its "
        "versions and metric windows, collectors' throughput, up's held-out evaluations; one W&B run per process, "
        "grouped by the run name. None: off.",
    )
    wandb_entity: str | None = Field(None, description="W&B entity (team or user). None: your default entity.")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None,
        description="online, or offline (files only, no network; `wandb sync` them later). None: W&B's own default "
        "($WANDB_MODE, else online).",
    )
    wandb_dir: Path | None = Field(
        None, description="Where W&B writes its run files (a wandb/ folder inside). None: the run's folder."
    )


class CollectorConfig(Section):
    """The collector role: K environments acting with the served policy, publishing each finished episode."""

    envs: int = Field(8, ge=1, description="K: environments one collector process runs concurrently (one event loop).")
    mode: Literal["async", "sync"] = Field(
        "async",
        description="async: each env loops on its own with the newest served version (DistRL). sync: DigiRL's "
        "multi-machine baseline: rounds of one episode per env on one version, a barrier, then a wait for the next "
        "version.",
    )
    split: Literal["train", "test"] = Field(
        "train", description="Task split episodes are drawn from (test: an evaluation collector)."
    )
    collector_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
        description="Names this collector in trajectories and metrics; unique per process within a run. "
        "None: <hostname>-<pid>.",
    )
    # Only new episodes wait: running ones go on, and the learner's drop_above_policy_lag decides whether their data
    # is still used.
    pause_above_policy_lag: int | None = Field(
        None,
        ge=0,
        description="Pause new episodes while the served version is more than this many versions behind the "
        "learner's newest published version (read from {run}.weights). None: never pause.",
    )
    samples_per_insert: float | None = Field(
        None,
        gt=0.0,
        description="Rate limit (async mode), as Reverb's samples-per-insert: once the learner has published a "
        "version cut after an update, start new episodes only while the records on {run}.trajectories stay within "
        "learner_step × learner.batch_episodes / samples_per_insert of the learner's newest version, plus "
        "learner.min_buffer_episodes and one version's worth (distrl_stream.pacing). Collection then never runs ahead "
        "of what the learner can use, which on shared cores leaves it the CPU. Refused with learner.algorithm = "
        "filtered_bc (no success, no update: a pause could last for good). None: no limit. Source: ours (Reverb's "
        "SampleToInsertRatio).",
    )
    version_refresh_s: float = Field(
        1.0, gt=0.0, description="How often a paused or waiting collector re-reads the served and published versions."
    )
    sync_version_timeout_s: float = Field(
        600.0,
        gt=0.0,
        description="sync: how long to wait for the next version after a round; then the next round runs on the "
        "version served (with a warning).",
    )
    on_error: Literal["publish", "drop"] = Field(
        "publish",
        description="Episodes ended by an inference or environment error: publish the steps done so far (termination "
        "inference_error / env_error; async mode never publishes an episode without steps, sync mode does, so that "
        "the learner's round counts every attempt) or drop them (async mode only: a round would wait for a dropped "
        "attempt). Both are counted in metrics.",
    )
    error_backoff_s: float = Field(
        1.0, ge=0.0, description="Pause of an env slot after an errored episode; doubles while errors repeat."
    )
    error_backoff_max_s: float = Field(10.0, ge=0.0, description="Longest pause after repeated errors.")
    shutdown_grace_s: float = Field(
        30.0,
        ge=0.0,
        description="After SIGTERM/SIGINT, how long in-flight episodes may take to finish; those still running are "
        "abandoned (never published, counted). A second signal abandons them at once.",
    )
    flush_timeout_s: float = Field(
        30.0, gt=0.0, description="At exit, how long to wait for the broker to acknowledge queued trajectories."
    )
    metrics_interval_s: float = Field(10.0, gt=0.0, description="Seconds between MetricEvents on {run}.metrics.")
    max_episodes: int | None = Field(
        None, ge=1, description="Run this many episodes in all, then stop as on SIGTERM. None: until stopped."
    )
    duration_s: float | None = Field(
        None, gt=0.0, description="Stop as on SIGTERM after this many seconds. None: until stopped."
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve the collector's Prometheus metrics at /metrics on this port, on all "
        "interfaces (0: a free port, logged; None: off). docs/monitor.md lists the metrics.",
    )


class Config(BaseSettings):
    """Root of the configuration tree."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix="DISTRL_",
        env_nested_delimiter="__",
        nested_model_default_partial_update=True,
    )

    run: str = Field(
        "demo",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
        description="Run name: prefixes every topic ({run}.trajectories, ...) so runs never mix.",
    )
    data_dir: Path = Field(
        Path("distrl-data"),
        description="Where runs keep their files: broker data, models, adapters, checkpoints, logs.",
    )
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    collector: CollectorConfig = Field(default_factory=CollectorConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)

    @model_validator(mode="after")
    def _chunks_fit_in_a_message(self) -> Config:
        if self.artifacts.chunk_bytes + ARTIFACT_HEADER_BYTES > self.kafka.max_message_bytes:
            raise ValueError(
                f"artifacts.chunk_bytes ({self.artifacts.chunk_bytes}) plus {ARTIFACT_HEADER_BYTES} bytes of headers "
                f"must fit in kafka.max_message_bytes ({self.kafka.max_message_bytes})"
            )
        return self

    @model_validator(mode="after")
    def _pacing_cannot_stall(self) -> Config:
        pacing.check(self.collector, self.learner)
        return self

    @model_validator(mode="after")
    def _artifacts_outlive_the_served_versions(self) -> Config:
        # A server that joins late loads its newest inference.keep_versions from {run}.artifacts (or the learner's
        # pruned folder): all must be there.
        if self.artifacts.keep_versions < self.inference.keep_versions:
            raise ValueError(
                f"artifacts.keep_versions ({self.artifacts.keep_versions}) must be at least inference.keep_versions "
                f"({self.inference.keep_versions})"
            )
        return self

    @property
    def run_dir(self) -> Path:
        """Files of this run (artifacts, checkpoints, logs)."""
        return self.data_dir / "runs" / self.run

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) > environment > TOML file > defaults.
        toml_file = _TOML_FILE.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


# The TOML path of the load in progress: pydantic-settings takes its sources from the class, not the call.
_TOML_FILE: ContextVar[Path | None] = ContextVar("distrl_toml_file", default=None)


def sync_round_episodes(collector: CollectorConfig, collectors: int) -> int:
    """The learner's ``round_episodes`` that pairs with ``collectors`` processes of this collector section.

    Synchronous collectors run rounds of one episode per env, so the learner's round is every env's episode (DigiRL's
    multi-machine scheme); asynchronous collectors pair with an asynchronous learner (0).
    """
    return collector.envs * collectors if collector.mode == "sync" else 0


def load_config(path: Path | None = None, **overrides: Any) -> Config:
    """Build the effective configuration, raising :class:`ConfigError` with one line naming the bad field.

    Args:
        path: optional TOML file.
        overrides: values from command-line flags; nested sections as dicts (``kafka={"bootstrap_servers": ...}``).
    """
    if path is not None and not path.is_file():
        raise ConfigError("--config", f"no such file: {path}")
    token = _TOML_FILE.set(path)
    try:
        return Config(**overrides)
    except ValidationError as exc:
        raise _first_error(exc) from None
    except ValueError as exc:  # malformed TOML or env JSON
        raise ConfigError(str(path) if path else "environment", str(exc).splitlines()[0]) from None
    finally:
        _TOML_FILE.reset(token)


def _first_error(exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"]) or "config"
    message = err["msg"]
    if err.get("type") == "value_error" and "error" in err.get("ctx", {}):
        message = str(err["ctx"]["error"])  # a validator's own sentence, without pydantic's "Value error, "
    if err.get("type") == "extra_forbidden":
        message = "unknown field"
    elif (
        "input" in err
        and not isinstance(err["input"], dict)
        and not any(is_secret_property(str(p)) for p in err["loc"])
    ):
        message = f"{message} (got {mask_secrets(repr(err['input']))})"
    return ConfigError(field, message)
