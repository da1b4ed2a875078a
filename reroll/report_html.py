"""`reroll report RUN_DIR [RUN_DIR ...]`: one self-contained HTML page (plotly.js inline, so
it opens with no network) with a panel per question about the runs, several runs overlaid
in one colour each, and a table of sample rollouts.

Each panel is a `Panel` in ``PANELS``: a title and a function from the runs to plotly
traces; a panel whose metrics no run recorded says so instead of drawing an empty plot.
plotly is imported only here. The numbers come from `reroll.report_data`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reroll import report_data as rd
from reroll.report_samples import CSS, Decode, samples_table

DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    traces: Callable[[list[rd.Run], list[str]], list]
    """(runs, one colour per run) -> plotly traces; [] when nothing was recorded."""
    x_title: str = "step"
    y_title: str = ""
    bar: bool = False


def _lines(keys: list[tuple[str, str]], x: str = "step") -> Callable:
    """Traces of metric ``keys`` ((key, label) pairs) against ``x``, one dash per key."""
    def traces(runs: list[rd.Run], colours: list[str]) -> list:
        import plotly.graph_objects as go

        out = []
        for run, colour in zip(runs, colours):
            for (key, label), dash in zip(keys, DASHES):
                xs, ys = run.series(key, x)
                if xs:
                    out.append(go.Scatter(x=xs, y=ys, mode="lines+markers" if len(xs) < 30
                                          else "lines", name=f"{run.name}: {label}",
                                          line={"color": colour, "dash": dash},
                                          marker={"size": 4}))
        return out
    return traces


def _reward(x: str) -> Callable:
    """The reward curve of `report_data.reward_keys`, against ``x``."""
    def traces(runs: list[rd.Run], colours: list[str]) -> list:
        out = []
        for run, colour in zip(runs, colours):
            out += _lines(rd.reward_keys(run), x)([run], [colour])
        return out
    return traces


def _held_out(x: str) -> Callable:
    def traces(runs: list[rd.Run], colours: list[str]) -> list:
        import plotly.graph_objects as go

        out = []
        for run, colour in zip(runs, colours):
            p = rd.eval_points(run, x)
            if p.x:
                n = sorted(set(p.n))
                out.append(go.Scatter(
                    x=p.x, y=p.acc, mode="lines+markers", line={"color": colour},
                    name=f"{run.name}: greedy (n = {', '.join(map(str, n))})",
                    error_y={"type": "data", "symmetric": False,
                             "array": [h - a for h, a in zip(p.high, p.acc)],
                             "arrayminus": [a - lo for a, lo in zip(p.acc, p.low)]}))
        return out
    return traces


def _lengths(runs: list[rd.Run], colours: list[str]) -> list:
    import plotly.graph_objects as go

    out = []
    for run, colour in zip(runs, colours):
        steps, (p10, p50, p90) = rd.length_quantiles(run)
        if not steps:  # no recorded rollouts: the logged mean and max
            out += _lines([("length/mean", "mean"), ("length/max", "max")])([run], [colour])
            continue
        out.append(go.Scatter(x=steps, y=p90, mode="lines", line={"width": 0, "color": colour},
                              showlegend=False, hoverinfo="skip"))
        out.append(go.Scatter(x=steps, y=p10, mode="lines", fill="tonexty", opacity=0.3,
                              line={"width": 0, "color": colour},
                              name=f"{run.name}: p10-p90"))
        out.append(go.Scatter(x=steps, y=p50, mode="lines", line={"color": colour},
                              name=f"{run.name}: median"))
    return out


def _bars(values: Callable[[rd.Run], dict]) -> Callable:
    """One bar trace per run of ``values(run)`` (label -> number)."""
    def traces(runs: list[rd.Run], colours: list[str]) -> list:
        import plotly.graph_objects as go

        out = []
        for run, colour in zip(runs, colours):
            v = values(run)
            if v:
                out.append(go.Bar(x=[str(k) for k in v], y=list(v.values()), name=run.name,
                                  marker={"color": colour}))
        return out
    return traces


def _dropped(run: rd.Run) -> dict:
    out = {f"dropped: {k}": v for k, v in rd.last_counts(run, "pipeline/dropped_").items()}
    out.update({f"score error: {k}": v for k, v in rd.last_counts(run, "score_errors/").items()})
    return out


PANELS = [
    Panel("reward_step", "Reward vs step", _reward("step"), y_title="mean reward"),
    Panel("heldout_step", "Held-out accuracy vs step (95% Wilson interval)",
          _held_out("step"), y_title="accuracy"),
    Panel("reward_time", "Reward vs wall time", _reward("time"), x_title="seconds",
          y_title="mean reward"),
    Panel("heldout_time", "Held-out accuracy vs wall time (95% Wilson interval)",
          _held_out("time"), x_title="seconds", y_title="accuracy"),
    Panel("length", "Response length of recorded samples (median, p10-p90)", _lengths,
          y_title="policy tokens"),
    Panel("staleness", "Staleness: share of trained tokens by policy lag",
          _bars(rd.lag_shares), x_title="lag (versions)", y_title="token share", bar=True),
    Panel("is", "Importance weights and ESS", _lines(
        [("is/weight_mean", "IS weight mean"), ("is/ess", "ESS / n"),
         ("is/ratio_max", "ratio max"), ("is/ratio_min", "ratio min")])),
    Panel("clip", "Clip fractions", _lines(
        [("clip_frac_low", "clipped low"), ("clip_frac_high", "clipped high"),
         ("is/dropped_frac", "masked by the correction")]), y_title="share of tokens"),
    Panel("kl", "KL", _lines([("kl_ref", "to reference"), ("ppo_kl", "policy vs proximal"),
                              ("is/kl_k3", "proximal vs behaviour (k3)")])),
    Panel("loss", "Loss", _lines([("loss/policy", "policy"), ("loss/kl", "KL term")])),
    Panel("time_split", "Time per step by part (mean over logged steps)",
          _bars(rd.time_split), x_title="", y_title="seconds", bar=True),
    Panel("tokens_per_s", "Generation throughput", _lines(
        [("throughput/gen_tokens_per_s", "tokens/s")]), y_title="tokens/s"),
    Panel("dropped", "Dropped groups and score errors by reason (cumulative)",
          _bars(_dropped), x_title="", y_title="count", bar=True),
]


def panel_html(panel: Panel, runs: list[rd.Run], colours: list[str]) -> str:
    import plotly.graph_objects as go

    traces = panel.traces(runs, colours)
    head = f'<div class="panel" data-panel="{panel.id}" data-plotted="{int(bool(traces))}">'
    if not traces:
        return (f'{head}<h3>{html.escape(panel.title)}</h3><p class="missing">not recorded '
                f'in {"this run" if len(runs) == 1 else "these runs"}</p></div>')
    fig = go.Figure(traces)
    fig.update_layout(title={"text": panel.title, "font": {"size": 14}}, height=340,
                      margin={"l": 50, "r": 10, "t": 40, "b": 40}, template="plotly_white",
                      barmode="group" if panel.bar else None,
                      legend={"orientation": "h", "y": -0.2, "font": {"size": 10}},
                      xaxis_title=panel.x_title, yaxis_title=panel.y_title, showlegend=True)
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{panel.id}",
                       config={"displaylogo": False, "responsive": True})
    return f"{head}{body}</div>"


def summary_table(runs: list[rd.Run]) -> str:
    rows = []
    for run in runs:
        last = run.rows[-1]
        ev = rd.eval_points(run)
        acc = (f"{ev.acc[-1]:.3f} [{ev.low[-1]:.3f}, {ev.high[-1]:.3f}] (n = {ev.n[-1]})"
               if ev.x else "not recorded")
        rows.append(f"<tr><td>{html.escape(run.name)}</td><td>{html.escape(str(run.path))}"
                    f"</td><td>{last.get('step', '')}</td><td>{last.get('time', 0):.0f}</td>"
                    f"<td>{acc}</td></tr>")
    return ('<table class="samples"><tr><th>run</th><th>directory</th><th>last step</th>'
            '<th>wall time (s)</th><th>last held-out accuracy [95% interval]</th></tr>'
            + "".join(rows) + "</table>")


def run_decoder(path: Path) -> Decode | None:
    """The run's tokenizer's decode (latest checkpoint, else its initial model), or None."""
    from reroll.build import load_tokenizer, weights_dir
    from reroll.errors import ConfigError

    for where in (path, path / "init"):
        try:
            tok = load_tokenizer(weights_dir(where))
        except (FileNotFoundError, OSError, ValueError, ConfigError):
            continue
        return lambda ids: tok.decode(ids, skip_special_tokens=False)
    return None


def write_report(paths: list[str | Path], out: str | Path) -> Path:
    import plotly.colors
    import plotly.offline

    runs = rd.load_runs(paths)
    palette = plotly.colors.qualitative.Plotly
    colours = [palette[i % len(palette)] for i in range(len(runs))]
    panels = "".join(panel_html(p, runs, colours) for p in PANELS)
    decoders = {run.name: run_decoder(run.path) for run in runs}
    names = ", ".join(html.escape(r.name) for r in runs)
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>reroll report: {names}</title>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>
<style>body {{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}}
.grid {{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}}
.panel {{border:1px solid #ddd;border-radius:4px;padding:4px;min-height:120px}}
.panel h3 {{font-size:14px;margin:6px}} .missing {{color:#888;margin:6px}}
{CSS}</style></head>
<body><h1>reroll report: {names}</h1>
{summary_table(runs)}
<h2>Curves</h2><div class="grid">{panels}</div>
<h2>Sample rollouts</h2>{samples_table(runs, decoders)}
</body></html>
"""
    out = Path(out)
    out.write_text(page)
    return out
