"""The explorer's HTML, rendered on the server: every value from the log goes through :func:`esc`.

Screen text, instructions, candidates, actions and error messages come from web pages, apps and models: untrusted.
Nothing from a record is ever written into a page unescaped, into a script, or into a URL without quoting; the
Content-Security-Policy the server sends (no inline script) is a second wall behind that one.

A page is a fixed part (title, navigation, the filter form) and a live part, ``<div id="live">``, which the page's
script fetches again every few seconds (same URL, header ``X-Explorer-Partial``) and swaps in: how new episodes,
versions and dead letters appear without a reload.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlencode

from distrl_stream.events import Step, TrajectoryEvent, from_epoch_ms
from distrl_stream.explorer.index import (
    PAGE_SIZE,
    TERMINATIONS,
    Coverage,
    DeadLetterRow,
    EpisodeRow,
    Filters,
    VersionRow,
)

LIVE_SECONDS = 2

SCRIPT = f"""\
// Refresh the live part of the page from the same URL (the server renders it, escaped), every {LIVE_SECONDS} s.
(function () {{
  var live = document.getElementById("live");
  if (!live || live.dataset.live !== "1") return;
  function refresh() {{
    fetch(location.href, {{headers: {{"X-Explorer-Partial": "1"}}, credentials: "same-origin"}})
      .then(function (r) {{ if (!r.ok) throw new Error(r.status); return r.text(); }})
      .then(function (text) {{
        document.body.classList.remove("offline");
        if (text !== live.dataset.last) {{ live.innerHTML = text; live.dataset.last = text; }}
      }})
      .catch(function () {{ document.body.classList.add("offline"); }})
      .finally(function () {{ setTimeout(refresh, {LIVE_SECONDS * 1000}); }});
  }}
  setTimeout(refresh, {LIVE_SECONDS * 1000});
}})();
"""

STYLE = """\
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 24px; align-items: baseline; }
header a { color: #cfe0ff; text-decoration: none; } header strong { font-size: 16px; }
main { padding: 12px 16px; } h2 { font-size: 16px; margin: 16px 0 8px; } h3 { font-size: 14px; margin: 0 0 6px; }
table { border-collapse: collapse; background: #fff; margin-bottom: 12px; }
th, td { border: 1px solid #dde1e7; padding: 3px 8px; text-align: left; vertical-align: top; }
th a { color: inherit; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.episodes td { white-space: nowrap; } table.episodes td.task { white-space: normal; max-width: 360px; }
.ok { color: #0a7d32; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; }
.status { color: #555; margin: 4px 0 10px; } .error { color: #b3261e; }
body.offline .status::after { content: " (not updating: the explorer does not answer)"; color: #b3261e; }
form.filters { display: flex; flex-wrap: wrap; gap: 8px 12px; align-items: end; margin-bottom: 8px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: #555; }
form.filters input { width: 90px; } form.filters input.wide { width: 150px; }
.step { background: #fff; border: 1px solid #dde1e7; padding: 10px; margin-bottom: 10px; }
.cols { display: flex; gap: 16px; align-items: flex-start; } .cols > div { flex: 1; min-width: 0; }
figure { margin: 0; } figure img { max-width: 320px; border: 1px solid #ccc; display: block; }
figure .missing { width: 240px; padding: 24px 8px; background: #eee; color: #666; font-size: 12px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f2f3f5; padding: 6px; margin: 0 0 8px;
      max-height: 240px; overflow: auto; }
ol.candidates { margin: 0 0 8px; padding-left: 28px; } ol.candidates li { font-family: monospace; }
ol.candidates li.chosen { background: #e3f3e6; font-weight: 600; }
ol.candidates li.chosen::after { content: "  ← chosen"; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; }
dt { color: #555; } dd { margin: 0; font-family: monospace; word-break: break-all; }
.pager a, .pager span { margin-right: 12px; }
"""


def esc(value: object) -> str:
    """``value`` as text safe in HTML content and in quoted attributes."""
    return html.escape(str(value), quote=True)


def when(ms: int) -> str:
    """Epoch milliseconds as UTC time to the second."""
    return from_epoch_ms(ms).strftime("%Y-%m-%d %H:%M:%S")


def page(run: str, title: str, fixed: str, live: str, *, follow: bool = True) -> str:
    """A whole page: navigation, the fixed part, and the live part (refreshed in place when ``follow``)."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · {esc(run)}</title>
<link rel="stylesheet" href="/static/explorer.css"><script src="/static/explorer.js" defer></script></head>
<body><header><strong>run {esc(run)}</strong><a href="/">overview</a><a href="/episodes">episodes</a>
<a href="/dead-letters">dead letters</a></header>
<main><h2>{esc(title)}</h2>{fixed}<div id="live" data-live="{int(follow)}">{live}</div></main></body></html>
"""


def status(coverage: Coverage, undecodable: int, error: str | None) -> str:
    """The line saying how much of the topic is indexed and whether the tailer is in trouble."""
    parts = [f"{coverage.indexed:,} of {coverage.total:,} records of the topic indexed"]
    if not coverage.complete:
        parts.append("reading the history back: counts and filters cover what is indexed so far")
    if undecodable:
        parts.append(f"{undecodable} records that do not decode skipped")
    line = f'<p class="status">{esc("; ".join(parts))}</p>'
    if error:
        line += f'<p class="status error">{esc(error)}</p>'
    return line


def overview(
    versions: Sequence[VersionRow],
    by_version: Sequence[tuple[str, int, int, int]],
    over_time: tuple[Sequence[int], Sequence[tuple[str, int, int, int]]],
) -> str:
    """Weight versions, and success per template by acting version and over time."""
    out = ["<h2>weight versions</h2>"]
    if versions:
        out.append(
            "<table><tr><th>version</th><th>published</th><th>learner step</th><th>episodes consumed</th>"
            "<th>sha256</th><th>size</th><th>metrics</th></tr>"
        )
        for v in versions:
            metrics = ", ".join(f"{k} {x:.4g}" for k, x in sorted(v.metrics.items()))
            out.append(
                f'<tr><td class="num"><a href="/episodes?{esc(urlencode({"version": v.version}))}">{v.version}</a>'
                f"</td><td>{esc(when(v.created_ms))}</td><td class='num'>{v.learner_step}</td>"
                f"<td class='num'>{v.trajectories_consumed}</td><td title='{esc(v.sha256)}'>{esc(v.sha256[:12])}…</td>"
                f"<td class='num'>{v.size_bytes / 1e6:.2f} MB</td><td>{esc(metrics)}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>no version published yet</p>")
    out.append("<h2>success by task and acting version</h2>")
    out.append(_success_table(by_version, header=lambda v: f"v{v}", link="version"))
    starts, rows = over_time
    out.append("<h2>success by task over time (episode end, UTC)</h2>")
    out.append(_success_table(rows, header=lambda i: when(starts[i])[5:16] if i < len(starts) else str(i)))
    return "".join(out)


def _success_table(rows: Iterable[tuple[str, int, int, int]], *, header: object, link: str | None = None) -> str:
    cells: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    for template, column, episodes, successes in rows:
        cells[template][column] = (episodes, successes)
    if not cells:
        return "<p>no episodes indexed yet</p>"
    columns = sorted({c for by in cells.values() for c in by})
    label = header if callable(header) else str
    head = "".join(
        f'<th><a href="/episodes?{esc(urlencode({link: c}))}">{esc(label(c))}</a></th>'
        if link
        else f"<th>{esc(label(c))}</th>"
        for c in columns
    )
    body = []
    for template, by in sorted(cells.items()):
        tds = []
        for c in columns:
            n, s = by.get(c, (0, 0))
            tds.append(f'<td class="num">{100 * s / n:.0f}% <small>({n})</small></td>' if n else "<td></td>")
        link_t = f'<a href="/episodes?{esc(urlencode({"template": template}))}">{esc(template)}</a>'
        body.append(f"<tr><td>{link_t}</td>{''.join(tds)}</tr>")
    return f"<table><tr><th>task</th>{head}</tr>{''.join(body)}</table>"


def filter_form(filters: Filters, query: Mapping[str, str]) -> str:
    """The episode table's filters, as a GET form (its URL is the view's link). Templates and collectors are typed,
    with the values seen so far offered by :func:`choices` (in the live part, so they follow the index)."""

    def select(name: str, label: str, options: Sequence[str]) -> str:
        chosen = query.get(name, "")
        opts = "".join(
            f'<option value="{esc(o)}"{" selected" if o == chosen else ""}>{esc(o or "any")}</option>'
            for o in ("", *options)
        )
        return f'<label>{esc(label)}<select name="{name}">{opts}</select></label>'

    def field(name: str, label: str, css: str = "", options: str = "") -> str:
        value = esc(query.get(name, ""))
        extra = (f' class="{css}"' if css else "") + (f' list="{options}"' if options else "")
        return f'<label>{esc(label)}<input name="{name}" value="{value}"{extra}></label>'

    return (
        '<form class="filters" method="get" action="/episodes">'
        + field("template", "task template", "wide", "templates")
        + field("task", "task id contains", "wide")
        + select("success", "success", ["yes", "no"])
        + select("termination", "termination", list(TERMINATIONS))
        + field("collector", "collector", "wide", "collectors")
        + field("version", "version")
        + field("min_lag", "lag ≥")
        + field("max_lag", "lag ≤")
        + field("min_length", "length ≥")
        + field("max_length", "length ≤")
        + field("since", "published since", "wide")
        + field("until", "until", "wide")
        + f'<input type="hidden" name="sort" value="{esc(filters.sort)}">'
        + f'<input type="hidden" name="order" value="{"desc" if filters.descending else "asc"}">'
        + '<button type="submit">filter</button> <a href="/episodes">clear</a></form>'
    )


def choices(values: Mapping[str, list[str]]) -> str:
    """The template and collector values the filter form offers, as data lists."""
    return "".join(
        f'<datalist id="{name}">'
        + "".join(f'<option value="{esc(v)}">' for v in values.get(column, []))
        + "</datalist>"
        for name, column in (("templates", "task_template"), ("collectors", "collector_id"))
    )


_HEADERS = (
    ("episode", None),
    ("published", "published"),
    ("task", "template"),
    ("collector", "collector"),
    ("termination", "termination"),
    ("success", "success"),
    ("reward", "reward"),
    ("length", "length"),
    ("versions", "version"),
    ("lag", "lag"),
    ("duration", "duration"),
)


def episode_table(rows: Sequence[EpisodeRow], total: int, filters: Filters, query: Mapping[str, str]) -> str:
    """One page of episodes with sortable headers and a pager; every link keeps the filters."""

    def link(**changes: object) -> str:
        params = {k: v for k, v in query.items() if v and k != "page"}
        params.update({k: str(v) for k, v in changes.items()})
        return "/episodes?" + urlencode(params)

    heads = []
    for label, key in _HEADERS:
        if key is None:
            heads.append(f"<th>{label}</th>")
            continue
        order = "asc" if filters.sort == key and filters.descending else "desc"
        mark = (" ▼" if filters.descending else " ▲") if filters.sort == key else ""
        heads.append(f'<th><a href="{esc(link(sort=key, order=order))}">{label}{mark}</a></th>')
    body = [
        f'<tr><td><a href="{esc(episode_url(r.partition, r.offset))}" title="{esc(r.episode_id)}">'
        f"{esc(r.episode_id[:8])}</a></td><td>{esc(when(r.published_ms))}</td>"
        f'<td class="task" title="{esc(r.instruction)}">{esc(r.task_template)}<br><small>{esc(r.task_id)}</small></td>'
        f"<td>{esc(r.collector_id)}</td><td>{esc(r.termination)}</td>"
        f'<td class="{"ok" if r.success else "bad"}">{"yes" if r.success else "no"}</td>'
        f'<td class="num">{r.total_reward:g}</td><td class="num">{r.length}</td>'
        f'<td class="num">{_versions(r)}</td><td class="num">{r.lag}</td><td class="num">{r.duration_s:.1f} s</td></tr>'
        for r in rows
    ]
    pages = max(1, -(-total // PAGE_SIZE))
    pager = [f"<span>{total:,} episodes · page {filters.page} of {pages}</span>"]
    if filters.page > 1:
        pager.append(f'<a href="{esc(link(page=filters.page - 1))}">← previous</a>')
    if filters.page < pages:
        pager.append(f'<a href="{esc(link(page=filters.page + 1))}">next →</a>')
    table = f"<table class='episodes'><tr>{''.join(heads)}</tr>{''.join(body)}</table>" if rows else ""
    return f'<p class="pager">{"".join(pager)}</p>{table or "<p>no episode matches</p>"}'


def _versions(r: EpisodeRow) -> str:
    return str(r.min_version) if r.min_version == r.max_version else f"{r.min_version}–{r.max_version}"


def episode_url(partition: int, offset: int) -> str:
    """The episode's link: its position on the log, which never changes."""
    return f"/episode/{partition}/{offset}"


def episode(
    event: TrajectoryEvent,
    partition: int,
    offset: int,
    newest: int,
    screenshots: Mapping[int, str | None],
) -> str:
    """An episode step by step.

    Args:
        event: the trajectory as read from the log.
        partition: where it is.
        offset: where it is.
        newest: the newest version that existed when it ended (each step's lag is measured against it).
        screenshots: step index -> None when its screenshot reads and verifies, else why not (steps without one are
            left out).
    """
    duration = (event.ended_at - event.started_at).total_seconds()
    facts = [
        ("episode", event.episode_id),
        ("position", f"{partition} @ {offset}"),
        ("task", f"{event.task_template} · {event.task_id} ({event.env_kind}, {event.split}, {event.mode})"),
        ("instruction", event.instruction),
        (
            "outcome",
            f"{'succeeded' if event.success else 'failed'} ({event.termination}), reward {event.total_reward:g}",
        ),
        ("collector", event.collector_id),
        ("base model", event.base_model),
        ("time", f"{event.started_at:%Y-%m-%d %H:%M:%S} → {event.ended_at:%H:%M:%S} UTC ({duration:.1f} s)"),
        ("newest version at its end", str(newest)),
    ]
    out = [_dl(facts)]
    for i, step in enumerate(event.steps):
        out.append(_step(i, step, partition, offset, newest, screenshots))
    if event.final_observation is not None:
        out.append(
            f'<section class="step"><h3>after the last step</h3><pre>{esc(event.final_observation)}</pre></section>'
        )
    return "".join(out)


def _step(i: int, step: Step, partition: int, offset: int, newest: int, screenshots: Mapping[int, str | None]) -> str:
    lag = max(0, newest - step.policy_version)
    if step.screenshot_uri is None:
        figure = '<div class="missing">no screenshot recorded</div>'
    elif screenshots.get(i) is None:
        figure = f'<img src="/screenshot/{partition}/{offset}/{i}" alt="screenshot of step {i}">'
    else:
        figure = f'<div class="missing">{esc(screenshots[i])}</div>'
    candidates = "".join(
        f'<li class="chosen">{esc(c)}</li>' if c == step.action else f"<li>{esc(c)}</li>" for c in step.candidates
    )
    facts = [
        # Step.mode (TrajectoryEvent v4): a choice-mode screen without candidates is asked in free mode.
        *([("asked in", f"{step.mode} mode")] if step.mode is not None else []),
        ("action text", step.action_text),
        ("parsed", step.action if step.valid else f"invalid: {step.invalid_reason or 'no reason recorded'}"),
        ("reward", f"{step.reward:g}{' (done)' if step.done else ''}"),
        ("behaviour log-prob", f"{step.behaviour_logprob:.4f}"),
        ("version", f"{step.policy_version} (lag {lag})"),
        ("latency", f"inference {1000 * step.inference_latency_s:.0f} ms, env {1000 * step.env_latency_s:.0f} ms"),
        ("server", step.server or "-"),
        ("adapter sha256", step.adapter_sha256 or "-"),
    ]
    return (
        f'<section class="step" id="step-{i}"><h3>step {i}</h3><div class="cols"><figure>{figure}</figure><div>'
        f"<h3>observation</h3><pre>{esc(step.observation)}</pre>"
        + (f'<h3>candidates</h3><ol class="candidates" start="0">{candidates}</ol>' if step.candidates else "")
        + _dl(facts)
        + "</div></div></section>"
    )


def _dl(facts: Iterable[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts) + "</dl>"


def dead_letters(rows: Sequence[DeadLetterRow], total: int, page_no: int, trajectories: str) -> str:
    """Dead letters, newest first, each linked to its source record when that is a trajectory."""
    if not rows:
        return "<p>no dead letters: every record was usable</p>"
    body = []
    for d in rows:
        source = f"{d.topic}[{d.source_partition}]@{d.source_offset}"
        if d.topic == trajectories:
            source = f'<a href="{esc(episode_url(d.source_partition, d.source_offset))}">{esc(source)}</a>'
        else:
            source = esc(source)
        body.append(
            f"<tr><td>{esc(when(d.published_ms))}</td><td>{source}</td><td>{esc(d.error_class)}</td>"
            f"<td>{esc(d.error_message)}</td><td>{esc(d.consumer)}</td></tr>"
        )
    pages = max(1, -(-total // PAGE_SIZE))
    pager = f'<p class="pager"><span>{total:,} dead letters · page {page_no} of {pages}</span>'
    if page_no < pages:
        pager += f'<a href="/dead-letters?page={page_no + 1}">next →</a>'
    pager += "</p>"
    return (
        pager + "<table><tr><th>dead-lettered</th><th>source record</th><th>error</th><th>reason</th>"
        "<th>consumer</th></tr>" + "".join(body) + "</table>"
    )


def error_page(run: str, message: str) -> str:
    """A page saying, in one line, why the request could not be answered."""
    return page(run, "error", f'<p class="error">{esc(message)}</p>', "", follow=False)
