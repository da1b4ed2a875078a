"""The sample-rollouts table of the run report: recorded rollouts with their scores, each
response drawn span by span, coloured by how many policy versions its tokens lag the
trained policy (version of the step's update minus the span's version), environment
observations, replayed and forced (branch) tokens marked by source, turns numbered.

Decoding a span's tokens needs the run's tokenizer (``decode``); without one the recorded
completion text is shown whole, coloured by its oldest version. Plain HTML; no plotting.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from reroll.report_data import Run, sample_groups

LAG_COLOURS = ["#b7e4c7", "#ffe8a3", "#ffc58a", "#ff9a8a", "#e26d6d"]  # lag 0, 1, 2, 3, 4+
SOURCE_STYLE = {"env": "background:#dde3ea;font-style:italic",
                "replayed": "background:#e4d9f5;text-decoration:underline dashed",
                "draft": "background:#d6ecf7", "inherited": "background:#e8f5e0",
                "forced": "background:#fde2c8;font-weight:bold"}

Decode = Callable[[list[int]], str]

CSS = """
table.samples {border-collapse:collapse;font:13px system-ui,sans-serif;width:100%}
table.samples th, table.samples td {border:1px solid #ccc;padding:3px 6px;vertical-align:top}
table.samples td.text {font-family:ui-monospace,monospace;white-space:pre-wrap;max-width:38em}
span.tok {border-radius:3px;padding:0 1px}
.legend span.tok {margin-right:.8em;padding:1px 5px;white-space:nowrap}
"""


def lag_colour(lag: int) -> str:
    return LAG_COLOURS[min(max(lag, 0), len(LAG_COLOURS) - 1)]


def response_spans(r: dict) -> list[dict]:
    """The spans after the prompt (a record without spans: one sampled span)."""
    spans = [s for s in r.get("spans", []) if s["source"] != "prompt"]
    if spans:
        return spans
    versions = [v for v, m in zip(r.get("versions", []), r.get("loss_mask", [])) if m]
    return [{"start": r["prompt_len"], "end": len(r["tokens"]), "source": "sampled",
             "version": min(versions) if versions else -1}]


def render_response(r: dict, step: int, decode: Decode | None) -> str:
    """The response as coloured spans: tooltip = source, version, lag and turn."""
    spans = response_spans(r)
    trained = step - 1  # the update of `step` starts from policy version step - 1
    if decode is None:  # whole text, coloured by the oldest policy version
        v = min((s["version"] for s in spans if s["source"] != "env"), default=-1)
        spans = [{"text": r.get("completion", ""), "source": "sampled", "version": v}]
    out, turn = [], 0
    for s in spans:
        text = s["text"] if "text" in s else decode(r["tokens"][s["start"]:s["end"]])
        if s["source"] == "env":
            style, tip = SOURCE_STYLE["env"], "environment"
        else:
            if s["source"] == "sampled":
                turn += 1
            lag = trained - s["version"]
            style = f"background:{lag_colour(lag)}"
            style += ";" + SOURCE_STYLE[s["source"]] if s["source"] in SOURCE_STYLE else ""
            tip = f"{s['source']}, version {s['version']}, lag {lag}, turn {max(turn, 1)}"
        out.append(f'<span class="tok" style="{style}" title="{html.escape(tip)}">'
                   f"{html.escape(text)}</span>")
    return "".join(out)


def _scores(r: dict) -> str:
    parts = []
    for s in r.get("scores", []):
        val = f"{s['value']:.3g}" if s.get("value") is not None else f"error: {s.get('error')}"
        parts.append(f"{s['name']} {val}")
    return html.escape(", ".join(parts))


def legend() -> str:
    items = [f'<span class="tok" style="background:{c}">lag {i}{"+" if i == len(LAG_COLOURS) - 1 else ""}'
             f"{' (on-policy)' if i == 0 else ''}</span>" for i, c in enumerate(LAG_COLOURS)]
    items += [f'<span class="tok" style="{SOURCE_STYLE[k]}">{name}</span>'
              for k, name in (("env", "environment"), ("replayed", "replayed"),
                              ("forced", "forced (a branch token chosen, not sampled)"))]
    return ('<p class="legend">Response tokens by policy lag (versions behind the policy '
            'being trained at that step; hover for version and turn): ' + "".join(items) + "</p>")


def samples_table(runs: list[Run], decoders: dict[str, Decode | None], n_steps: int = 4,
                  max_rows: int = 40) -> str:
    """The table's HTML, or a note when no run recorded rollouts."""
    rows = []
    for run in runs:
        for step, g in sample_groups(run, n_steps):
            for r in g["rollouts"]:
                reward = "" if r.get("reward") is None else f"{r['reward']:.3g}"
                rows.append(
                    f"<tr><td>{html.escape(run.name)}</td><td>{step}</td>"
                    f'<td class="text">{html.escape(g["example"]["prompt"])}</td>'
                    f'<td class="text">{render_response(r, step, decoders.get(run.name))}</td>'
                    f"<td>{reward}</td><td>{_scores(r)}</td>"
                    f"<td>{html.escape(str(r.get('finish')))}</td></tr>")
    if not rows:
        return '<p class="missing">Sample rollouts: not recorded in this run (record_every = 0).</p>'
    head = ("<tr><th>run</th><th>step</th><th>prompt</th><th>response</th><th>reward</th>"
            "<th>scores</th><th>finish</th></tr>")
    return (legend() + f'<table class="samples">{head}{"".join(rows[:max_rows])}</table>')
