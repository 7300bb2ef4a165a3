"""What every Kafka client shares: how its librdkafka configuration is assembled, where its logs go, and how a
refused login ends a wait at once."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import KafkaAuthenticationError, KafkaClientError

# librdkafka logs to stderr by default, over a CLI's or dashboard's output; route it through logging instead.
LIBRDKAFKA_LOGGER = logging.getLogger("distrl_stream.kafka.librdkafka")


class _LoginFailuresAtDebug(logging.Filter):
    """librdkafka logs every refused login attempt as an error; the waiting wrapper raises it as one typed line
    (:class:`LoginWatch`), so the log keeps them at debug level instead of repeating them over a CLI's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        if any(text in record.getMessage() for text in ("SASL authentication error", "SSL handshake failed")):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


LIBRDKAFKA_LOGGER.addFilter(_LoginFailuresAtDebug())

# Room a DeadLetter needs beyond the record it wraps (the DLQ topic and producers allow this much more).
DEAD_LETTER_OVERHEAD_BYTES = 64 * 1024


def client_config(
    kafka: KafkaConfig, defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The librdkafka configuration of one client.

    Precedence, lowest first: the wrapper's ``defaults``, every property of ``kafka.client`` (so a user's
    ``security.protocol``, ``sasl.*``, ``ssl.*``... reach every producer, consumer and admin client), then the
    caller's ``overrides``. Its ``error_cb`` is a :class:`LoginWatch` (:func:`login_watch`) that passes every error on
    to the ``error_cb`` given in ``defaults`` or ``overrides``, if any.
    """
    conf: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers, "logger": LIBRDKAFKA_LOGGER}
    conf.update(defaults)
    conf.update(kafka.client_properties())
    if overrides:
        conf.update(overrides)
    conf["error_cb"] = LoginWatch(conf, conf.get("error_cb"))
    return conf


def login_watch(conf: Mapping[str, Any]) -> LoginWatch:
    """The :class:`LoginWatch` of a configuration built by :func:`client_config`."""
    watch = conf["error_cb"]
    assert isinstance(watch, LoginWatch)
    return watch


def build_client(factory: Any, conf: dict[str, Any], what: str) -> Any:
    """Construct a confluent-kafka client, turning librdkafka's rejection of the configuration into a typed error."""
    try:
        return factory(conf)
    except (KafkaException, ValueError, TypeError) as exc:
        raise KafkaClientError(f"invalid {what} configuration: {error_text(exc)}") from None


def error_text(exc: BaseException) -> str:
    """A client error's own message: librdkafka's text for a ``KafkaException``, else ``str(exc)``."""
    if isinstance(exc, KafkaException) and exc.args:
        return exc.args[0].str()
    return str(exc)


# Failures that retrying with the same settings cannot fix. librdkafka treats them as transient: it reports them to
# error_cb only and keeps reconnecting, so a request would just end with _TRANSPORT at its timeout.
_LOGIN_ERRORS = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL})
_BROKER_PREFIX = re.compile(r"^\w+://\S+?: ")  # "sasl_ssl://127.0.0.1:9093/bootstrap: "
_STATE_SUFFIX = re.compile(r" \(after \d+ms in state \w+\).*$")  # "(after 388ms in state AUTH_REQ)"
_SLICE_S = 0.25  # how long one wait lasts before error_cb is served and checked again

T = TypeVar("T")


class LoginWatch:
    """A client's ``error_cb``: remembers the first authentication or TLS failure, as a one-line typed error.

    error_cb runs only inside a client's ``poll()``/``flush()``, never during ``list_topics()`` or while a future is
    awaited, so waits that must end at a refused login go through :meth:`metadata` and :meth:`result`, which wait
    in short slices and serve the callbacks between them.

    Args:
        conf: the client's librdkafka configuration (for the user, mechanism and address in the message).
        chained: the wrapper's own error callback, called with every error.
    """

    def __init__(self, conf: Mapping[str, Any], chained: Callable[[KafkaError], None] | None = None) -> None:
        self.bootstrap_servers = str(conf.get("bootstrap.servers", ""))
        self.user = conf.get("sasl.username")
        self.mechanism = conf.get("sasl.mechanisms") or conf.get("sasl.mechanism") or "GSSAPI"
        self.chained = chained
        self.failure: KafkaAuthenticationError | None = None
        self._lock = threading.Lock()

    def __call__(self, err: KafkaError) -> None:
        if err.code() in _LOGIN_ERRORS:
            with self._lock:
                if self.failure is None:
                    self.failure = KafkaAuthenticationError(self._describe(err))
        if self.chained is not None:
            self.chained(err)
        elif self.failure is not None:
            # The refused login (or a consequence of it: "all brokers are down"), which check() raises.
            LIBRDKAFKA_LOGGER.debug("%s", err.str())
        else:
            # What librdkafka logs by itself when no error_cb is set.
            LIBRDKAFKA_LOGGER.warning("%s", err.str())

    def check(self) -> None:
        """Raise the recorded failure, if any.

        Raises:
            KafkaAuthenticationError: the cluster refused this client's login or TLS handshake.
        """
        if self.failure is not None:
            raise self.failure

    def metadata(self, client: Any, topic: str | None, timeout_s: float) -> Any:
        """``client.list_topics(topic)`` within ``timeout_s``, ended early by a refused login.

        ``client`` must be safe to ``poll(0)`` (an admin client or a producer, not a consumer that holds records).

        Raises:
            KafkaAuthenticationError: the login or TLS handshake was refused.
            KafkaException: no answer within ``timeout_s`` (librdkafka's own error).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                return client.list_topics(topic, timeout=max(0.01, min(_SLICE_S, remaining)))
            except KafkaException as exc:
                client.poll(0)
                self.check()
                if remaining <= _SLICE_S or exc.args[0].code() not in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
                    raise

    def result(self, client: Any, future: Future[T], timeout_s: float) -> T:
        """``future.result()`` within ``timeout_s``, ended early by a refused login (``client`` as in :meth:`metadata`).

        Raises:
            KafkaAuthenticationError: the login or TLS handshake was refused.
            TimeoutError: no result within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                return future.result(timeout=max(0.0, min(_SLICE_S, remaining)))
            except TimeoutError:
                client.poll(0)
                self.check()
                if remaining <= _SLICE_S:
                    raise

    def flush(self, client: Any, timeout_s: float) -> int:
        """``client.flush()`` (a producer's) within ``timeout_s``, ended early by a refused login.

        Returns:
            How many messages are still queued.

        Raises:
            KafkaAuthenticationError: the login or TLS handshake was refused.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            left: int = client.flush(max(0.0, min(_SLICE_S, remaining)))
            self.check()
            if not left or remaining <= _SLICE_S:
                return left

    def _describe(self, err: KafkaError) -> str:
        detail = _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", err.str()))
        if err.code() == KafkaError._SSL:
            return f"TLS handshake with Kafka at {self.bootstrap_servers} failed: {detail}"
        if "invalid credentials" in detail:
            detail = "invalid credentials (wrong user name or password)"
        who = f" for user {self.user}" if self.user else ""
        return f"Kafka authentication failed{who} ({self.mechanism}) at {self.bootstrap_servers}: {detail}"
