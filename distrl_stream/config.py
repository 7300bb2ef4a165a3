"""The one configuration tree of distrl-stream.

Every knob of every role is a field here, documented where it is declared, with its default and, for the
algorithm's hyper-parameters, where the default comes from. Values come from, lowest to highest precedence:
defaults < TOML file (``--config``) < environment (``DISTRL_<SECTION>__<FIELD>``, e.g.
``DISTRL_KAFKA__BOOTSTRAP_SERVERS``) < command-line flags. The tree is frozen: roles read it, never change it.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from distrl_stream.errors import ConfigError


class Section(BaseModel):
    """A frozen config section that rejects unknown keys (a typo in a TOML file is an error, not a no-op)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaConfig(Section):
    """Where the Kafka cluster is and how every client talks to it."""

    bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="Kafka bootstrap servers (host:port,...). `up` replaces it with the embedded broker's address.",
    )
    client: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka properties passed to every client (producer, consumer, admin), e.g. "
        "security.protocol, sasl.mechanism, sasl.username, ssl.ca.location. Env: DISTRL_KAFKA__CLIENT='{\"k\":\"v\"}'.",
    )
    trajectory_partitions: int = Field(
        4, ge=1, description="Partitions of {run}.trajectories: the most learner-group members that can share it."
    )
    replication_factor: int = Field(1, ge=1, description="Replication of the run's topics (3 on a real cluster).")
    compression: Literal["lz4", "zstd", "snappy", "gzip", "none"] = Field(
        "lz4", description="Producer compression codec."
    )


class BrokerConfig(Section):
    """The embedded single-node KRaft broker that `kafka start` and `up` run."""

    kafka_home: Path | None = Field(
        default_factory=lambda: Path(os.environ["KAFKA_HOME"]) if os.environ.get("KAFKA_HOME") else None,
        description="Apache Kafka installation (a folder with libs/*.jar). Default: $KAFKA_HOME, then the "
        "user cache that `kafka install` fills.",
    )
    port: int = Field(0, ge=0, le=65535, description="Client listener port; 0 picks a free one.")
    heap_mb: int = Field(512, ge=128, description="JVM heap of the broker (-Xms/-Xmx).")
    startup_timeout_s: float = Field(60.0, gt=0, description="How long to wait for the broker to answer.")


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
    if err.get("type") == "extra_forbidden":
        message = "unknown field"
    elif "input" in err and not isinstance(err["input"], dict):
        message = f"{message} (got {err['input']!r})"
    return ConfigError(field, message)
