"""The explorer's HTTP server: read-only pages over the index and the log, on the standard library's threaded server.

``http.server`` is enough for one user's browser and keeps ``make setup`` free of a web framework (the metrics
endpoints use the standard library's WSGI server the same way, ``monitor/prometheus.py``). Only GET and HEAD exist.
Bound to a loopback address it needs no login; bound anywhere else it refuses to start without a token, and then
every request must carry it (``?token=`` once, which sets a cookie, or ``Authorization: Bearer``).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import re
import threading
from collections.abc import Callable
from functools import lru_cache
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from distrl_stream.config import KafkaConfig
from distrl_stream.errors import ConfigError, DistrlError, EventDecodeError, KafkaClientError, ScreenshotError
from distrl_stream.events import TrajectoryEvent, epoch_ms
from distrl_stream.events.screenshots import read_screenshot
from distrl_stream.explorer import pages
from distrl_stream.explorer.index import PAGE_SIZE, Filters, Index
from distrl_stream.explorer.tailer import Tailer, read_record
from distrl_stream.kafka.registry import use_schemas

log = logging.getLogger(__name__)

COOKIE = "distrl_explorer_token"
# No inline script or style anywhere: an injected <script> would not run even if escaping ever failed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Explorer:
    """The index, the thread that fills it, and the HTTP server in front of them.

    Args:
        kafka: cluster address and client properties.
        run: the run to explore.
        index_path: the SQLite index (created, or rebuilt when it does not match the topics).
        host: address to bind.
        port: port to bind (0: a free one).
        token: required of every request when set; must be set when ``host`` is not a loopback address.
        first_chunk: records of each trajectories partition indexed before anything else (the newest).
        timeout_s: bound on each request to the cluster.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        run: str,
        index_path: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        token: str | None = None,
        first_chunk: int = PAGE_SIZE,
        timeout_s: float = 10.0,
    ) -> None:
        if not is_loopback(host) and not token:
            raise ConfigError(
                "--token",
                f"required when binding {host} (not a loopback address): anyone who reaches it could read the run",
            )
        self.kafka = kafka
        self.run = run
        self.host = host
        self.port = port
        self.token = token
        self.index = Index(index_path, {"run": run, "bootstrap_servers": kafka.bootstrap_servers})
        self.tailer = Tailer(kafka, run, self.index, first_chunk=first_chunk, timeout_s=timeout_s)
        self._serde = use_schemas(kafka)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.read_episode = lru_cache(maxsize=32)(self._read_episode)

    @property
    def url(self) -> str:
        """Where the pages are (with the bound port)."""
        port = self._server.server_port if self._server is not None else self.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}/"

    def start(self) -> str:
        """Bind the port, open the topics, start indexing and serving; returns :attr:`url`.

        Raises:
            ConfigError: the port is in use (or the address cannot be bound).
            KafkaClientError: the run's topics do not exist or the cluster does not answer.
        """
        try:
            self._server = _Server((self.host, self.port), _handler(self))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    "--port", f"{self.port} is in use on {self.host}; choose another (0: any free one)"
                ) from None
            raise ConfigError("--host", f"cannot bind {self.host}:{self.port}: {exc.strerror or exc}") from None
        try:
            self.tailer.open()
        except BaseException:
            self._server.server_close()
            raise
        self.tailer.start()
        self._thread = threading.Thread(target=self._server.serve_forever, name="explorer-http", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and indexing."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.tailer.stop()

    def _read_episode(self, partition: int, offset: int) -> TrajectoryEvent:
        """The trajectory at ``partition``/``offset``; KeyError when there is none (not cached: it may come)."""
        msg = read_record(self.kafka, self.tailer.topics.trajectories, partition, offset)
        if msg is None:
            raise KeyError(f"no episode at partition {partition}, offset {offset}")
        return self._serde.decode(msg.value(), TrajectoryEvent)

    def authorised(self, handler: BaseHTTPRequestHandler, query: dict[str, str]) -> bool:
        """Whether the request carries the token (always, without one)."""
        if not self.token:
            return True
        cookie = SimpleCookie(handler.headers.get("Cookie", ""))
        bearer = handler.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        offered = [query.get("token", ""), bearer, cookie[COOKIE].value if COOKIE in cookie else ""]
        return any(hmac.compare_digest(o.encode(), self.token.encode()) for o in offered if o)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Off, so that a second explorer on the same port fails at once instead of sharing it.
    allow_reuse_address = False


Route = Callable[["_Request", re.Match[str]], None]


class _Request:
    """One request's parsed URL and the ways to answer it."""

    def __init__(self, explorer: Explorer, handler: BaseHTTPRequestHandler) -> None:
        self.explorer = explorer
        self.handler = handler
        url = urlsplit(handler.path)
        self.path = url.path
        self.query = dict(parse_qsl(url.query))
        self.partial = handler.headers.get("X-Explorer-Partial") == "1"

    def send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        h = self.handler
        h.send_response(status)
        for name, value in {**SECURITY_HEADERS, "Content-Type": content_type, **(headers or {})}.items():
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def html(self, title: str, fixed: str, live: str, *, follow: bool = True, status: int = 200) -> None:
        text = live if self.partial else pages.page(self.explorer.run, title, fixed, live, follow=follow)
        self.send(status, text.encode(), "text/html; charset=utf-8")

    def error(self, status: int, message: str) -> None:
        self.send(status, pages.error_page(self.explorer.run, message).encode(), "text/html; charset=utf-8")

    def status_line(self) -> str:
        t = self.explorer.tailer
        return pages.status(t.coverage(), t.undecodable, t.error)


def _overview(req: _Request, _m: re.Match[str]) -> None:
    index = req.explorer.index
    body = pages.overview(index.versions(), index.success_by_version(), index.success_over_time())
    req.html("overview", "", req.status_line() + body)


def _episodes(req: _Request, _m: re.Match[str]) -> None:
    try:
        filters = Filters.parse(req.query)
    except ConfigError as exc:
        req.error(HTTPStatus.BAD_REQUEST, str(exc))
        return
    index = req.explorer.index
    rows, total = index.episodes(filters)
    live = req.status_line() + pages.choices(index.choices()) + pages.episode_table(rows, total, filters, req.query)
    req.html("episodes", pages.filter_form(filters, req.query), live)


def _episode(req: _Request, m: re.Match[str]) -> None:
    partition, offset = int(m["partition"]), int(m["offset"])
    explorer = req.explorer
    try:
        event = explorer.read_episode(partition, offset)
    except KeyError as exc:
        req.error(HTTPStatus.NOT_FOUND, exc.args[0])
        return
    except EventDecodeError as exc:
        req.error(HTTPStatus.UNPROCESSABLE_ENTITY, f"{partition} @ {offset} does not decode: {exc}")
        return
    except KafkaClientError as exc:
        req.error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
        return
    # A list, not varargs: a sync round's attempt that failed before its first step has no steps.
    newest = max([explorer.index.newest_version_at(epoch_ms(event.ended_at)), *(s.policy_version for s in event.steps)])
    screenshots = {
        i: _screenshot_problem(s.screenshot_uri, s.screenshot_sha256)
        for i, s in enumerate(event.steps)
        if s.screenshot_uri is not None
    }
    body = pages.episode(event, partition, offset, newest, screenshots)
    req.html(f"episode {event.episode_id[:8]} · {event.task_template}", "", body, follow=False)


def _screenshot_problem(uri: str, sha256: str | None) -> str | None:
    try:
        read_screenshot(uri, sha256 or "")
    except ScreenshotError as exc:
        return str(exc)
    return None


def _screenshot(req: _Request, m: re.Match[str]) -> None:
    try:
        event = req.explorer.read_episode(int(m["partition"]), int(m["offset"]))
        step = int(m["step"])
        if step >= len(event.steps) or event.steps[step].screenshot_uri is None:
            req.error(HTTPStatus.NOT_FOUND, "no such screenshot")
            return
        s = event.steps[step]
        png = read_screenshot(s.screenshot_uri or "", s.screenshot_sha256 or "")
    except KeyError as exc:
        req.error(HTTPStatus.NOT_FOUND, exc.args[0])
        return
    except DistrlError as exc:
        req.error(HTTPStatus.NOT_FOUND, str(exc))
        return
    req.send(HTTPStatus.OK, png, "image/png")


def _dead_letters(req: _Request, _m: re.Match[str]) -> None:
    try:
        page_no = max(1, int(req.query.get("page", "1")))
    except ValueError:
        req.error(HTTPStatus.BAD_REQUEST, f"page: {req.query['page']!r} is not a whole number")
        return
    rows, total = req.explorer.index.dead_letters(page_no)
    body = pages.dead_letters(rows, total, page_no, req.explorer.tailer.topics.trajectories)
    req.html("dead letters", "", req.status_line() + body)


def _static(req: _Request, m: re.Match[str]) -> None:
    if m["name"] == "explorer.js":
        req.send(HTTPStatus.OK, pages.SCRIPT.encode(), "text/javascript; charset=utf-8")
    else:
        req.send(HTTPStatus.OK, pages.STYLE.encode(), "text/css; charset=utf-8")


ROUTES: list[tuple[re.Pattern[str], Route]] = [
    (re.compile(r"/"), _overview),
    (re.compile(r"/episodes"), _episodes),
    (re.compile(r"/episode/(?P<partition>\d{1,6})/(?P<offset>\d{1,19})"), _episode),
    (re.compile(r"/screenshot/(?P<partition>\d{1,6})/(?P<offset>\d{1,19})/(?P<step>\d{1,6})"), _screenshot),
    (re.compile(r"/dead-letters"), _dead_letters),
    (re.compile(r"/static/(?P<name>explorer\.js|explorer\.css)"), _static),
]


def _handler(explorer: Explorer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "distrl-explorer"

        def do_GET(self) -> None:
            req = _Request(explorer, self)
            if not explorer.authorised(self, req.query):
                req.error(HTTPStatus.UNAUTHORIZED, "this explorer needs its token: open it with ?token=TOKEN")
                return
            if "token" in req.query:
                # Trade the token in the URL for a cookie, so it leaves the address bar and the history.
                rest = {k: v for k, v in req.query.items() if k != "token"}
                target = req.path + (f"?{urlencode(rest)}" if rest else "")
                cookie = f"{COOKIE}={explorer.token}; HttpOnly; SameSite=Strict; Path=/"
                req.send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": target, "Set-Cookie": cookie})
                return
            for pattern, route in ROUTES:
                match = pattern.fullmatch(req.path)
                if match:
                    try:
                        route(req, match)
                    except Exception:
                        log.exception("explorer: %s failed", self.path)
                        req.error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (see the explorer's log)")
                    return
            req.error(HTTPStatus.NOT_FOUND, f"no page at {req.path}")

        do_HEAD = do_GET

        def do_POST(self) -> None:
            _Request(explorer, self).error(HTTPStatus.METHOD_NOT_ALLOWED, "the explorer is read-only")

        do_PUT = do_DELETE = do_PATCH = do_POST

        def log_message(self, format: str, *args: object) -> None:
            log.debug("explorer %s: " + format, self.address_string(), *args)

    return Handler
