"""Rendering of monitor snapshots: a rich dashboard for the live view, plain text for ``--once``."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from distrl_stream.monitor.state import LEARNER_KEYS, Snapshot


def _num(value: float | int | None, spec: str = ".2f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f} ms"


def _window_name(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _versions_line(s: Snapshot) -> str:
    acting = ", ".join(f"v{v}×{n}" for v, n in s.acting_versions.items()) or "-"
    return (
        f"learner v{_num(s.learner_version, 'd')} ({_num(s.versions_published, 'd')} published)   "
        f"served v{_num(s.served_version, 'd')}   collectors acting {acting}"
    )


def _lag_line(s: Snapshot) -> str:
    lag = s.policy_lag
    ingest = (
        f"mean {_num(lag.get('mean'))} p95 {_num(lag.get('p95'), '.0f')} max {_num(lag.get('max'), '.0f')}"
        if lag
        else "-"
    )
    return (
        f"trajectory version lag {ingest}   learner group lag {_num(s.consumer_lag, 'd')} records   "
        f"DLQ {_num(s.dlq_records, 'd')}"
    )


def _latency_line(s: Snapshot) -> str:
    lat = s.inference_latency
    return (
        f"inference p50 {_ms(lat.get('inference_p50_s'))} p95 {_ms(lat.get('inference_p95_s'))}   "
        f"env step p50 {_ms(lat.get('env_p50_s'))} p95 {_ms(lat.get('env_p95_s'))}"
    )


def _header(s: Snapshot) -> str:
    since = f"data since {s.first_event_at:%H:%M:%S}" if s.first_event_at else "no metric events yet"
    ended = f", run ended: rates as of its last report at {s.rates_at:%H:%M:%S}" if s.rates_at != s.at else ""
    return f"run {s.run}   {s.at:%Y-%m-%d %H:%M:%S} UTC   {s.events_seen} metric events, {since}{ended}"


def plain(s: Snapshot) -> str:
    """The snapshot as plain text (stable labels, one fact per line; for scripts and logs)."""
    lines = [_header(s)]
    for w in s.windows:
        lines.append(
            f"throughput ({_window_name(w.window_s)}): {w.per_min:.2f} trajectories/min, "
            f"success {_pct(w.success)} of {w.episodes:.0f} episodes"
        )
    lines.append(f"episodes total: {s.episodes_total}, success {_pct(s.success_total)}")
    lines.append("versions: " + _versions_line(s))
    lines.append("lag: " + _lag_line(s))
    lines.append("latency: " + _latency_line(s))
    for member, values in s.learners.items():
        shown = "  ".join(f"{k} {_num(values.get(k), '.4g')}" for k in LEARNER_KEYS if k in values)
        lines.append(
            f"learner {member}: updates {_num(values.get('updates'), '.0f')} "
            f"({_num(values.get('updates_per_s'))}/s), ingested {_num(values.get('trajectories_ingested'), '.0f')}  "
            + shown
        )
    lines.append(f"policy servers: {len(s.servers)}")
    for r in s.servers:
        lines.append(
            f"  {r.source_id}: serves v{r.policy_version}, {_num(r.lag, 'd')} behind the learner, "
            f"last {r.last_event or '-'} at {r.last_seen:%H:%M:%S}"
        )
    lines.append(f"collectors: {len(s.collectors)}")
    for c in s.collectors:
        lines.append(
            f"  {c.source_id} {c.status}: {c.episodes} episodes, {c.per_min:.2f}/min, success {_pct(c.success)}, "
            f"v{_num(c.policy_version, 'd')}, in flight {c.in_flight}, inference p50 {_ms(c.inference_p50_s)} "
            f"p95 {_ms(c.inference_p95_s)}, env p50 {_ms(c.env_p50_s)}"
        )
    return "\n".join(lines)


def dashboard(s: Snapshot) -> RenderableType:
    """The live dashboard for ``rich.live.Live``."""
    rates = Table("window", "trajectories/min", "success", "episodes", box=None, pad_edge=False)
    for w in s.windows:
        rates.add_row(_window_name(w.window_s), f"{w.per_min:.2f}", _pct(w.success), f"{w.episodes:.0f}")
    rates.add_row("all", "", _pct(s.success_total), str(s.episodes_total), style="dim")

    facts = Table.grid(padding=(0, 2))
    facts.add_row("[bold]versions[/]", _versions_line(s))
    facts.add_row("[bold]lag[/]", _lag_line(s))
    facts.add_row("[bold]latency[/]", _latency_line(s))

    learner = Table("member", "updates", "/s", "ingested", *LEARNER_KEYS, box=None, pad_edge=False)
    for member, values in s.learners.items():
        learner.add_row(
            member,
            _num(values.get("updates"), ".0f"),
            _num(values.get("updates_per_s")),
            _num(values.get("trajectories_ingested"), ".0f"),
            *(_num(values.get(k), ".3g") for k in LEARNER_KEYS),
        )

    collectors = Table(
        "collector", "status", "episodes", "/min", "success", "version", "in flight", "inf p50", "inf p95", "env p50",
        box=None, pad_edge=False,
    )  # fmt: skip
    colours = {"running": "green", "paused": "yellow", "stale": "red", "stopped": "dim"}
    for c in s.collectors:
        collectors.add_row(
            c.source_id,
            Text(c.status, style=colours.get(c.status, "")),
            str(c.episodes),
            f"{c.per_min:.2f}",
            _pct(c.success),
            f"v{_num(c.policy_version, 'd')}",
            str(c.in_flight),
            _ms(c.inference_p50_s),
            _ms(c.inference_p95_s),
            _ms(c.env_p50_s),
        )
    servers = Table("server", "serves", "behind learner", "last report", box=None, pad_edge=False)
    for r in s.servers:
        servers.add_row(
            r.source_id,
            f"v{r.policy_version}",
            Text(_num(r.lag, "d"), style="green" if r.lag == 0 else "yellow" if r.lag else ""),
            Text(f"{r.last_event or '-'} {r.last_seen:%H:%M:%S}", style="red" if r.last_event == "refused" else ""),
        )
    return Group(
        Panel(Group(rates, Text(""), facts), title=_header(s), title_align="left"),
        Panel(learner if s.learners else Text("no learner metrics yet", style="dim"), title="learner"),
        Panel(
            servers if s.servers else Text("no policy server has reported a loaded version yet", style="dim"),
            title=f"policy servers ({len(s.servers)})",
        ),
        Panel(
            collectors if s.collectors else Text("no collector metrics yet", style="dim"),
            title=f"collectors ({len(s.collectors)})",
        ),
    )
