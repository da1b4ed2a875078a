"""Per-step metrics of consumed groups (reward, accuracy, lengths, staleness, throughput and
the wall-time split). Pure summaries; no training logic. The progress display is
`reroll.trainer.progress`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from reroll.rollout import Group
from reroll.trainer.progress import progress_bar  # noqa: F401  (the loop imports it from here)

if TYPE_CHECKING:
    from reroll.trainer.batch import Batch


def accuracy(groups: Sequence[Group]) -> float:
    """Share of generated rollouts (`Group.generated`: no replayed or reused copies) whose
    first reward component
    is 1 (the task's correctness check)."""
    vals = [r.scores[0].value for g in groups for r in g.generated()
            if r.scores and r.scores[0].ok]
    return sum(v >= 1.0 - 1e-9 for v in vals) / max(1, len(vals))


def env_metrics(rollouts: Sequence, prefix: str = "env/") -> dict[str, float]:
    """Episode diagnostics of environment-rewarded rollouts (the "env" score's per-step
    ``info``): ``turns`` per episode, and for every numeric or boolean info key the mean over
    episodes of its sum over steps (e.g. tool calls per episode, well-formed calls)."""
    infos = [r.scores[0].info for r in rollouts
             if r.scores and r.scores[0].name == "env" and r.scores[0].ok]
    if not infos:
        return {}
    out = {f"{prefix}turns": statistics.fmean(i.get("turns", 0) for i in infos)}
    keys = {k for i in infos for st in i.get("steps", []) for k, v in st.items()
            if isinstance(v, (bool, int, float)) and k not in ("done",)}
    for k in sorted(keys):
        out[f"{prefix}{k}"] = statistics.fmean(
            sum(float(st.get(k, 0)) for st in i.get("steps", [])
                if isinstance(st.get(k, 0), (bool, int, float))) for i in infos)
    return out


def tree_metrics(rollouts: Sequence) -> dict[str, float]:
    """LATR trees (``rollout.tree_branch = "entropy"``, ``control["tree"]["role"]``): the
    share of members the branching rule spawned, and of spares sampled independently
    because the rule did not fire often enough to use them."""
    roles = [r.control["tree"]["role"] for r in rollouts
             if r.control.get("tree", {}).get("mode") == "entropy"]
    if not roles:
        return {}
    return {"tree/branched_share": roles.count("branch") / len(roles),
            "tree/spares_independent_share": roles.count("spare") / len(roles)}


ENGINE_COUNTERS = ("failovers", "server_failures", "servers_alive", "weight_pushes",
                   "requests_resumed", "resumed_tokens", "draft_tokens_proposed",
                   "draft_tokens_accepted", "fork_children", "fork_tokens_shared",
                   "branch_children", "branch_spares_independent", "branch_pruned",
                   "redraft_steps", "redraft_tokens_proposed", "redraft_tokens_accepted")
"""Engine counters logged as ``engine/<name>`` (cumulative) where the engine keeps them:
failover and server health of `OpenAIEngine`, resumes (requests, and the prompt and prefix
tokens they prefilled again), drafts (at admission and DAS's re-drafts in decode), forks and
LATR branches."""


def _engine_s(s: dict) -> float:
    return s.get("time_prefill_s", 0.0) + s.get("time_decode_s", 0.0)


def batch_metrics(groups: Sequence[Group], before: dict, after: dict, *, wait_s: float,
                  train_s: float, step_s: float) -> dict[str, float]:
    """``before`` / ``after``: the rollout source's stats around the step (engine counters,
    pipeline counters, score errors)."""
    rollouts = [r for g in groups for r in g.rollouts]
    # reward and length describe the current policy: replayed or reused copies left out
    fresh = [r for g in groups for r in g.generated()] or rollouts
    lens = [r.n_sampled for r in fresh]  # policy tokens (environment tokens not counted)
    rewards = [r.reward for r in fresh if r.reward is not None]
    s0, s1 = before["engine"], after["engine"]
    counters, errors = after["counters"], after["score_errors"]
    gen_s = _engine_s(s1) - _engine_s(s0)
    new_tok = s1.get("tokens_generated", 0) - s0.get("tokens_generated", 0)
    out = {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/accuracy": accuracy(groups),
        "length/mean": statistics.fmean(lens),
        "length/max": float(max(lens)),
        "length/clipped_share": sum(r.finish == "length" for r in fresh) / len(fresh),
        "time/step_s": step_s,
        "time/wait_for_rollouts_s": wait_s,
        "time/train_s": train_s,
        "time/generate_s": gen_s,
        "time/score_latency_s": statistics.fmean(
            [r.timings.get("score_done", 0) - r.timings.get("score_submit", 0)
             for r in rollouts]),
        "throughput/gen_tokens_per_s": new_tok / gen_s if gen_s > 0 else 0.0,
        "throughput/trajectories_per_s": len(rollouts) / step_s if step_s > 0 else 0.0,
        "pipeline/started": counters["started"],
        "pipeline/groups_in_batch": float(len(groups)),
        "pipeline/samples_in_batch": float(len(rollouts)),
        "pipeline/consumed": counters["consumed"],
        "pipeline/resumed_share": sum(r.resume_count > 0 for r in rollouts) / len(rollouts),
        "engine/occupancy": s1.get("mean_occupancy", 0.0),
    }
    for reason, n in counters["dropped"].items():
        out[f"pipeline/dropped_{reason}"] = n
    for name, n in errors.items():
        out[f"score_errors/{name}"] = n
    sizes = [len(g.rollouts) for g in groups]
    out["control/group_size_mean"] = statistics.fmean(sizes)
    out["control/group_size_max"] = float(max(sizes))
    out["control/rounds_mean"] = statistics.fmean(
        1 + max(r.group_round for r in g.rollouts) for g in groups)
    out["pipeline/tokens_generated"] = float(s1.get("tokens_generated", 0))  # cumulative
    out.update({f"engine/{k}": float(s1[k]) for k in ENGINE_COUNTERS if k in s1})
    out.update(after.get("control", {}))
    out.update(after.get("replay", {}))
    if after.get("replay"):
        out["replay/samples_in_batch"] = float(sum(r.reused for r in rollouts))
    out.update(env_metrics(rollouts))
    out.update(tree_metrics(rollouts))
    shaped = [r for r in fresh if r.shaping]
    if shaped:  # a control rule changed these rewards (e.g. DOT's cuts: Rollout.shaping)
        out["shaping/shaped_share"] = len(shaped) / len(fresh)
    lags = [r.min_version for r in rollouts]
    if lags:
        out["staleness/oldest_version_in_batch"] = float(min(lags))
    return out


def version_lag_metrics(batch: Batch, version: int) -> dict[str, float]:
    """Share of trained tokens per version lag (trainer version - token version)."""
    m = batch.mask.bool()
    if not m.any():
        return {}
    lag = (version - batch.versions[m]).clamp(min=0)
    out = {"staleness/max_lag": float(lag.max()), "staleness/mean_lag": float(lag.float().mean())}
    for k in range(int(lag.max()) + 1):
        out[f"staleness/token_share_lag{k}"] = float((lag == k).float().mean())
    return out
