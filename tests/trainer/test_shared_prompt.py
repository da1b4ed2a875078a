"""Each prompt forwarded once (`train.share_prompt`): the packing worked out by hand, the
log-probs and entropies of every response token equal the padded batch's, and every
optimiser step's gradients are the same, with groups split across micro-batches, separate
proximal and reference passes, and eager attention."""

import copy

import pytest
import torch
from float_bounds import assert_reordered_close, assert_steps_close

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.rollout import Example, SamplingParams, Score, new_group
from reroll.trainer.batch import collate
from reroll.trainer.options import TrainerOptions
from reroll.trainer.shared_prompt import pack, packed_positions, pays
from reroll.trainer.step import Trainer


def test_packing_by_hand():
    # samples 0 and 2 share the prompt [2, 5, 6]; sample 1 has its own, [2, 4]
    rows = [[2, 5, 6, 7, 8], [2, 4, 9, 0], [2, 5, 6, 3]]
    pk = pack(rows, lengths=[5, 3, 4], prompt_lens=[3, 2, 3], prompt_ids=[0, 1, 0])
    # row 0: prompt 2 5 6 | response of 0: 7 8 | response of 2: 3; row 1: 2 4 | 9, padded
    assert pk.input_ids.tolist() == [[2, 5, 6, 7, 8, 3], [2, 4, 9, 2, 2, 2]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 0, 0, 0]]
    a = pk.allowed[0, 0].int().tolist()
    assert a == [[1, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0],
                 [1, 1, 1, 0, 0, 0],
                 [1, 1, 1, 1, 0, 0],  # 7: the prompt and itself
                 [1, 1, 1, 1, 1, 0],  # 8: the prompt, 7 and itself
                 [1, 1, 1, 0, 0, 1]]  # 3 (sample 2): the prompt and itself, not 7 8
    # padding queries see the prompt and padding up to themselves (never an empty row)
    assert pk.allowed[1, 0, 4].int().tolist() == [1, 1, 0, 1, 1, 0]
    # targets: 7 from the prompt's last position, 8 from 7's; 3 from the prompt's last;
    # 9 from row 1's prompt end; each into column prompt_len - 1 + j of its sample
    assert pk.targets.tolist() == [7, 8, 3, 9]
    assert list(zip(pk.src_row.tolist(), pk.src_col.tolist())) == [(0, 2), (0, 3), (0, 2),
                                                                   (1, 1)]
    assert list(zip(pk.dst_row.tolist(), pk.dst_col.tolist())) == [(0, 2), (0, 3), (2, 2),
                                                                   (1, 1)]
    assert pk.positions == 12
    # the same count without packing: rows x the longest packed row, real tokens 6 + 3
    assert packed_positions([5, 3, 4], [3, 2, 3], [0, 1, 0]) == (12, 9)


def group(prompt, lengths, reward_of=lambda j: float(j % 2)):
    g = new_group(Example("p", "q", "a"), len(lengths), list(prompt), SamplingParams(), 0)
    for j, (r, n) in enumerate(zip(g.rollouts, lengths)):
        for k in range(n):
            r.append(7 + (3 * j + k) % 6, -2.0 - 0.1 * k, 0)
        rew = reward_of(j)
        r.finish, r.scores, r.reward = "stop", [Score("exact", value=rew)], rew
    return g


# prompts of 6, 3 and 8 tokens; groups of 4, 3 and 2 samples of varied response lengths
GROUPS = [((2, 5, 6, 7, 8, 9), [3, 1, 4, 2]), ((2, 11, 12), [2, 5, 1]),
          ((2, 5, 9, 10, 11, 12, 13, 14), [1, 3])]


def batches():
    return [group(p, n) for p, n in GROUPS]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_log_probs_and_entropies_equal_the_padded_batch(tiny, attn, device):
    model, _ = tiny
    model.to(device)
    model.config._attn_implementation = attn
    b = collate([r for g in batches() for r in g.rollouts], pad_id=0).to(device)
    plain = Trainer(model, build_objective(AlgoConfig()), TrainerOptions(pad_id=0, lr=0.0))
    shared = Trainer(model, build_objective(AlgoConfig()),
                     TrainerOptions(pad_id=0, lr=0.0, share_prompt=True))
    with torch.no_grad():
        lp, ent = plain._forward(model, b, entropy=True)
        lp_s, ent_s = shared._forward(model, b, entropy=True)
    m = b.mask
    assert int(m.sum()) == sum(sum(n) for _, n in GROUPS)
    # packed rows vs padded ones: other matmul and attention shapes, sums in another order;
    # the tiny model's longest sums are its MLP's (intermediate_size = 256 terms)
    assert_reordered_close(lp_s * m, lp * m, 256, msg="logprobs")
    assert_reordered_close(ent_s * m, ent * m, 256, msg="entropy")
    assert (lp_s[m == 0] == 0).all()  # prompt and padding columns are not computed


def run(model, start, algo, steps=2, **kw):
    """Gradients at every optimiser step and the metrics. lr 1e-4: AdamW moves a parameter
    whose gradient is pure rounding noise (a key bias) by ~lr whatever the noise, so the
    second step's gradients differ by that much more than the first's (1e-8 here)."""
    model.load_state_dict(start)
    ref = copy.deepcopy(model) if algo.kl_coef > 0 else None
    t = Trainer(model, build_objective(algo),
                TrainerOptions(pad_id=0, lr=1e-4, **kw), ref_model=ref)
    grads = []
    t.opt.register_step_pre_hook(lambda *_: grads.append(
        [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    metrics = [t.step(batches()) for _ in range(steps)]
    return grads, metrics


@pytest.mark.parametrize("algo, kw", [
    (AlgoConfig(), {}),
    (AlgoConfig(), {"micro_batch": 3}),  # groups split across micro-batches
    (AlgoConfig(correction="tis_token"), {"reuse_prox": False}),  # a separate proximal pass
    (AlgoConfig(kl_coef=0.05), {"minibatches": 2}),  # reference and proximal passes
    (AlgoConfig(), {"micro_batch_tokens": 24}),  # a token budget: packed by prompt unit
])
def test_the_update_is_the_padded_batchs(tiny, algo, kw, device):
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    plain = run(model, start, algo, **kw)
    shared = run(model, start, algo, share_prompt=True, **kw)
    assert len(plain[0]) == len(shared[0]) == 2 * kw.get("minibatches", 1)
    for g_a in plain[0]:
        assert max(float(x.abs().max()) for x in g_a) > 1e-2
    # packed vs padded: other shapes, sums in another order (`float_bounds`); the tiny
    # model's longest sums are its MLP's (intermediate_size = 256 terms)
    assert_steps_close(plain[0], shared[0], 256)
    for m_a, m_b in zip(plain[1], shared[1]):
        assert m_b["loss/policy"] == pytest.approx(m_a["loss/policy"], abs=1e-6)


def test_packing_forwards_fewer_positions(tiny, device):
    """Sequences of 6 + [3, 1, 4, 2], 3 + [2, 5, 1], 8 + [1, 3] tokens: padded, 9 rows x 11;
    packed, one row per prompt: 6 + 10, 3 + 8, 8 + 4 -> 3 rows x 16."""
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    real = 6 * 4 + 10 + 3 * 3 + 8 + 8 * 2 + 4
    m = run(model, start, AlgoConfig(), steps=1)[1][0]
    assert m["train/padding_share"] == pytest.approx(1 - real / (9 * 11))
    assert m["train/positions"] == 9 * 11
    m = run(model, start, AlgoConfig(), steps=1, share_prompt=True)[1][0]
    assert m["train/padding_share"] == pytest.approx(1 - (16 + 11 + 12) / (3 * 16))
    assert m["train/positions"] == 3 * 16


def test_models_a_packed_row_would_misrepresent_are_refused(tiny):
    """flash-attention's kernels take no 4D mask; a 4D mask would override sliding windows;
    ALiBi models (Bloom) derive positions from the mask."""
    from transformers import BloomConfig, BloomForCausalLM, Qwen2Config, Qwen2ForCausalLM

    def refused(model, why):
        with pytest.raises(ValueError, match=r"share_prompt cannot run on this model: " + why):
            Trainer(model, build_objective(AlgoConfig()),
                    TrainerOptions(pad_id=0, lr=0.0, share_prompt=True))

    model, _ = tiny
    model.config._attn_implementation = "flash_attention_2"
    refused(model, r"its attention \('flash_attention_2'\) does not take a 4D mask")
    small = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1)
    window = Qwen2ForCausalLM(Qwen2Config(**small, use_sliding_window=True, sliding_window=4,
                                          max_window_layers=0))
    refused(window, "it has sliding-window layers")
    bloom = BloomForCausalLM(BloomConfig(vocab_size=32, hidden_size=16, n_layer=1, n_head=2))
    refused(bloom, "model type 'bloom' is not one whose layers are all full attention")


def test_packing_is_used_only_where_it_costs_fewer_flops(tiny, device):
    # hand-worked at H = 2, I = 2: a position costs 2 (4 H^2 + 3 H I) = 56, a pair 4 H = 8.
    # two 5-token samples behind one 3-token prompt: packed 7 x 56 + 49 x 8 = 784 against
    # padded 2 x 5 x 56 + 2 x 25 x 8 = 960; with 20-token responses 17,200 against 11,040
    assert pays([5, 5], [3, 3], [0, 0], hidden=2, intermediate=2)
    assert not pays([23, 23], [3, 3], [0, 0], hidden=2, intermediate=2)
    model, _ = tiny
    model.to(device)
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=0.0, share_prompt=True))
    short = collate([r for g in batches() for r in g.rollouts], pad_id=0).to(device)
    long = collate(group((2, 5, 6), [40, 40, 40, 40]).rollouts, pad_id=0).to(device)
    assert t._packing(short) is not None
    assert t._packing(long) is None  # goes padded


def test_the_config_key_reaches_the_trainer(tiny_dir, device):
    from reroll import build
    from reroll.config_checks import load_checked

    on = f"model.device={device}"
    assert build.build_trainer(load_checked(None, ["train.share_prompt=true", on]),
                               tiny_dir).options.share_prompt
    assert not build.build_trainer(load_checked(None, [on]), tiny_dir).options.share_prompt


def test_a_token_budget_keeps_each_prompts_samples_in_one_packed_row(tiny, device):
    """Sequences 6 + [3, 1, 4, 2] (prompt A), 3 + [2, 5, 1] (B), 8 + [1, 3] (C), budget 40.
    Units by their longest member, C (11), A (10), B (8); members longest first:
    C 11 9 | A 10 9 8 7 | B 8 5 4. The budget counts the positions of the layout a pass runs
    in (at hidden 128 the attention term is too small to matter: packed wherever it has fewer
    positions). [C 11] alone: 11 either way. + C 9: C's row 8 + 3 + 1 = 12 < 2 x 11 padded.
    + A 10, 9, 8, 7: rows C 12 and A 6 + 4 + 3 + 2 + 1 = 16 -> 2 x 16 = 32 (padded 6 x 11).
    + B 8 would make 3 rows x 16 = 48 > 40: a new run, [B 8, 5, 4] -> 3 + 5 + 2 + 1 = 11.
    So 32 + 11 = 43 positions in 2 passes. Counting padded positions instead, the runs were
    [C 11, C 9, A 10] (3 x 11 = 33), [A 9, A 8, A 7, B 8] (4 x 9), [B 5, B 4]: packed 2 x 12 +
    2 x 12 + 6 = 54 in 3 passes; sorted by sample, [C 11, A 10, A 9], [C 9, A 8, B 8, A 7],
    [B 5, B 4]: A and C split over two runs each, 2 x 13 + 3 x 9 + 6 = 59."""
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    m = run(model, start, AlgoConfig(), steps=1, share_prompt=True, micro_batch_tokens=40)
    assert m[1][0]["train/positions"] == 2 * 16 + 1 * 11
