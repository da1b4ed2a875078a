"""reroll's GRPO update equals TRL's GRPOTrainer's on the same samples from the same weights
(benchmarks/grad_vs_trl.py; benchmarks/docs/vs_trl.md, "Is the update the same?").

configs/reasoning.toml's objective (grpo advantages, ppo_clip, tis_token with the behaviour
log-probs the policy's own, token_mean, share_prompt, a token budget that splits the batch
into micro-batches, zero-advantage samples skipped; a gradient clip that acts) on a tiny Qwen2 against TRL's loss_type
"dapo", scale_rewards "group", beta 0, epsilon 0.2, one update per batch, through TRL's own
`_compute_loss` and optimiser. reroll's advantage eps is set to TRL's 1e-4 (its default is
1e-6), so what is left is float rounding. Skipped without trl (a benchmark-only dependency).
"""

import math
from pathlib import Path

import pytest
import torch
from float_bounds import EPS32, reorder_atol

from reroll import build
from reroll.config_checks import load_checked
from reroll.models.tiny import build_tiny
from reroll.rollout import Example, SamplingParams, new_group

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4",
        "model.num_kv_heads=2", "model.intermediate_size=64", "model.max_position=64",
        "rollout.group_size=4", "rollout.max_new_tokens=16",
        "train.micro_batch_tokens=48", "algo.advantage_args.eps=1e-4",
        "train.grad_clip=0.5"]  # below this batch's gradient norm (0.75): the clip acts
REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]]
PROMPTS = ["3 5 7 1", "12 4 8", "6 6 2 9 1"]
# completion lengths; a row ending in EOS is marked True, the others stop at the limit
LENGTHS = [[(3, True), (9, False), (5, True), (12, True)], [(4, True), (2, True), (7, False),
           (6, True)], [(11, True), (1, True), (8, True), (10, False)]]


@pytest.fixture(scope="module")
def vs():
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(ROOT / "benchmarks"))
    import grad_vs_trl as module

    yield module
    mp.undo()


def _groups(tok, cfg):
    """Three groups of four samples with the rewards and lengths above; completion tokens
    drawn from the characters (never a special id), EOS appended where marked."""
    gen = torch.Generator().manual_seed(0)
    groups = []
    for i, (prompt, rewards, lengths) in enumerate(zip(PROMPTS, REWARDS, LENGTHS)):
        ids = [tok.bos_token_id] + tok(prompt, add_special_tokens=False).input_ids
        g = new_group(Example(f"p{i}", prompt, "0"), cfg.rollout.group_size, ids,
                      SamplingParams(), 0)
        for r, reward, (n, eos) in zip(g.rollouts, rewards, lengths):
            comp = torch.randint(4, len(tok), (n - eos,), generator=gen).tolist()
            comp += [tok.eos_token_id] * eos
            r.tokens += comp
            r.loss_mask += [True] * n
            r.logprobs += [0.0] * n
            r.versions += [0] * n
            r.finish, r.reward = ("stop" if eos else "length"), reward
        groups.append(g)
    return groups


def test_reroll_step_equals_trl_grpo_step(vs, tmp_path):
    cfg = load_checked(str(ROOT / "configs" / "reasoning.toml"), TINY)
    model_dir = build_tiny(cfg.model, tmp_path / "m")
    trainer = build.build_trainer(cfg, model_dir)
    tok = trainer.tokenizer
    groups = _groups(tok, cfg)
    vs.own_behaviour(trainer.model, groups, tok.pad_token_id)
    trl = vs.build_trl(model_dir, tok, k=4, groups=3, max_new=16, lr=cfg.train.lr, clip=0.2,
                        grad_clip=cfg.train.grad_clip)
    # TRL's generation samples as reroll's engine does: temperature 1, no top-k / top-p,
    # no repetition penalty (the model's generation_config sets none of them)
    gc, sp = trl.generation_config, SamplingParams()
    assert (gc.do_sample, gc.temperature, gc.top_k, gc.top_p, gc.repetition_penalty,
            gc.min_p) == (True, cfg.rollout.temperature, sp.top_k, sp.top_p, 1.0, None)
    assert trl.eos_token_ids == [tok.eos_token_id]
    x = vs.trl_update(trl, groups, tok.pad_token_id)
    r = vs.reroll_update(trainer, groups)

    # advantages by hand: (R - group mean) / (Bessel std + 1e-4), 0 in the all-zero group
    def hand(rs):
        m = sum(rs) / len(rs)
        s = math.sqrt(sum((v - m) ** 2 for v in rs) / (len(rs) - 1))
        return [(v - m) / (s + 1e-4) for v in rs]

    want = torch.tensor([a for rs in REWARDS for a in hand(rs)])
    assert want[0] == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-4))  # group 0: +-0.8659
    torch.testing.assert_close(r["adv"], want, rtol=0, atol=4 * EPS32)
    torch.testing.assert_close(x["adv"], want, rtol=0, atol=4 * EPS32)
    assert r["skipped"] == pytest.approx(4 / 12)  # the all-zero group never goes through

    # the same trainable tokens: every completion token, its EOS included, up to the limit
    inp = x["inputs"]
    n_tok = sum(n for row in LENGTHS for n, _ in row)
    assert int(inp["num_items_in_batch"]) == n_tok == 78
    assert inp["completion_mask"].sum(-1).tolist() == [n for row in LENGTHS for n, _ in row]

    # loss and gradient: the same sums in other orders (reroll packs each prompt once and
    # splits the batch into micro-batches; TRL pads prompts on the left). Each gradient entry
    # is a sum over the batch's tokens of chains through the layers: n_tok terms, depth
    # layers + 2 (embedding and head), at the scale of the largest entry (float_bounds)
    depth = cfg.model.num_layers + 2
    assert r["loss"] == pytest.approx(x["loss"], rel=0, abs=reorder_atol(n_tok, x["loss"], depth))
    atol_g = reorder_atol(n_tok, x["grad"], depth)
    torch.testing.assert_close(r["grad"], x["grad"], rtol=0, atol=atol_g)
    torch.testing.assert_close(r["clipped"], x["clipped"], rtol=0,
                               atol=reorder_atol(n_tok, x["clipped"], depth))
    assert r["grad_norm"] == pytest.approx(x["grad_norm"], rel=n_tok * depth * EPS32)
    assert x["grad_norm"] > cfg.train.grad_clip  # the clipped gradients are the scaled ones
    # torch scales by clip / (norm + 1e-6); a norm is a sum of every entry's square
    clipped = cfg.train.grad_clip * x["grad_norm"] / (x["grad_norm"] + 1e-6)
    assert float(x["clipped"].norm()) == pytest.approx(clipped, rel=len(x["grad"]) * EPS32)

    # one AdamW step (the same lr, betas, eps 1e-8, no weight decay on either side): the
    # first step is w - lr g / (|g| + eps) (bias-corrected moments g and g^2), whose
    # derivative in g is lr eps / (|g| + eps)^2; so gradients atol_g apart give steps at most
    # lr eps atol_g / (|g| - atol_g)^2 apart, plus a few roundings of w. Entries whose
    # gradient is within rounding of 0 may step either way (at most lr each).
    assert r["before"].equal(x["before"])
    lr, g, w = cfg.train.lr, x["clipped"].abs(), x["weights"].abs()
    sure = g > 2 * atol_g
    assert sure.float().mean() > 0.5  # most entries are far from 0
    bound = lr * 1e-8 * atol_g / (g[sure] - atol_g) ** 2 + 4 * EPS32 * (w[sure] + lr)
    diff = (r["weights"] - x["weights"]).abs()
    assert (diff[sure] <= bound).all(), float((diff[sure] - bound).max())
    assert (diff[~sure] <= 2 * lr + 4 * EPS32 * w[~sure]).all()
