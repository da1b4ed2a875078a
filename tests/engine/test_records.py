"""What the engine writes into a Rollout: behaviour log-probs, versions, spans, seeds,
abort and resume across a weight update."""

import pytest
import torch
from engine_helpers import PROMPTS, full_logprobs, make, spread

from reroll.engine import Engine, EngineCore, EngineService, TorchEngine


def test_torch_engine_is_a_core_and_the_service_is_an_engine(lm):
    core = TorchEngine(*lm, max_batch=2)
    assert isinstance(core, EngineCore) and isinstance(EngineService(core), Engine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_full_forward_pass(lm, temperature):
    model, tok = lm
    rs = [make(tok, p, temperature=temperature, max_new_tokens=30, seed=i)
          for i, p in enumerate(PROMPTS)]
    TorchEngine(model, tok, max_batch=4).generate(rs)
    for r in rs:
        ref = full_logprobs(model, r.tokens, temperature)[r.prompt_len - 1:]
        got = torch.tensor(r.logprobs[r.prompt_len:])
        assert (got - ref).abs().max() < 1e-4
        assert r.loss_mask == [False] * r.prompt_len + [True] * 30
        assert r.versions == [-1] * r.prompt_len + [0] * 30


def test_top_k_logprobs_are_renormalised_over_the_kept_tokens(lm):
    model, tok = lm
    r = make(tok, "12+34=", temperature=1.0, top_k=5, max_new_tokens=12, seed=3)
    TorchEngine(model, tok, max_batch=2).generate([r])
    ids = torch.tensor([r.tokens], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, r.prompt_len - 1:-1]
    top = logits.topk(5, dim=-1)
    for t, (vals, idx) in enumerate(zip(top.values, top.indices, strict=True)):
        tok_t = r.tokens[r.prompt_len + t]
        assert tok_t in idx.tolist()  # never a token outside the top 5
        want = torch.log_softmax(vals, -1)[idx.tolist().index(tok_t)]
        assert abs(r.logprobs[r.prompt_len + t] - float(want)) < 1e-4


def test_seeded_request_samples_the_same_tokens_whatever_its_batch_companions(lm):
    model, tok = lm
    alone = make(tok, "7*8=", temperature=1.0, max_new_tokens=25, seed=1234)
    TorchEngine(model, tok, max_batch=8).generate([alone])
    mix = zip(PROMPTS[:5], [1.0, 0.0, 0.5, 1.2, 1.0], [1.0, 1.0, 0.9, 1.0, 0.5], strict=True)
    crowd = [make(tok, p, temperature=t, top_p=tp, max_new_tokens=25 + i, seed=i)
             for i, (p, t, tp) in enumerate(mix)]
    again = make(tok, "7*8=", temperature=1.0, max_new_tokens=25, seed=1234)
    eng = TorchEngine(model, tok, max_batch=3)
    eng.add(crowd[:3])
    eng.step()
    eng.add([again] + crowd[3:])
    while eng.pending():
        eng.step()
    assert again.response_tokens == alone.response_tokens
    assert max(abs(a - b) for a, b in zip(again.logprobs, alone.logprobs, strict=True)) < 1e-4
    other = make(tok, "7*8=", temperature=1.0, max_new_tokens=25, seed=99)
    TorchEngine(model, tok, max_batch=2).generate([other])
    assert other.response_tokens != alone.response_tokens


def test_abort_then_resume_under_new_weights_gives_one_consistent_record(lm, device):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=4)
    r = make(tok, "hello world ", temperature=1.0, max_new_tokens=20, seed=5)
    other = make(tok, "abc", temperature=1.0, max_new_tokens=20, seed=6)
    eng.add([r, other])
    for _ in range(3):  # step 1: prefill token + decode token; then one each: 4 tokens
        eng.step()
    [back] = eng.abort([r.sample_id])
    assert back is r and r.finish == "abort" and eng.pending() == 1
    assert r.response_len == 4
    old_state = {k: v.clone() for k, v in model.state_dict().items()}
    new_model = type(model)(model.config)
    spread(new_model, seed=11)
    new_model.to(device)
    eng.update_weights(new_model.state_dict(), version=1)
    eng.add([r])
    assert r.finish == "running" and r.resume_count == 0
    eng.step()  # the re-prefill of prompt + 4 kept tokens is the resume
    assert r.resume_count == 1
    while eng.pending():
        eng.step()
    P = r.prompt_len
    assert r.finish == "length" and r.response_len == 20  # max_new_tokens over both parts
    assert len(r.tokens) == len(r.logprobs) == len(r.versions) == len(r.loss_mask) == P + 20
    assert r.versions == [-1] * P + [0] * 4 + [1] * 16
    assert [(s.start, s.end, s.source, s.version) for s in r.spans] == [
        (0, P, "prompt", -1), (P, P + 4, "sampled", 0), (P + 4, P + 20, "sampled", 1)]
    new_lp = full_logprobs(new_model, r.tokens)[P + 3:]  # targets P+4 .. P+19
    assert (torch.tensor(r.logprobs[P + 4:]) - new_lp).abs().max() < 1e-4
    old_model = type(model)(model.config).to(device)
    old_model.load_state_dict(old_state)
    old_lp = full_logprobs(old_model, r.tokens)[P - 1:P + 3]  # targets P .. P+3
    assert (torch.tensor(r.logprobs[P:P + 4]) - old_lp).abs().max() < 1e-4
    # the companion was never aborted: its cache stays old, its later tokens say version 1
    assert other.finish == "length" and other.resume_count == 0
    assert other.versions[other.prompt_len:] == [0] * 4 + [1] * 16


def test_update_weights_rejects_a_state_dict_of_another_model(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=2)
    with pytest.raises(ValueError, match="version=3"):
        eng.update_weights({"nope": torch.zeros(1)}, version=3)
    assert eng.version == 0


def test_a_partial_record_restored_from_a_checkpoint_counts_as_a_resume(lm):
    from reroll.rollout import Rollout

    model, tok = lm
    r = make(tok, "hello world ", temperature=1.0, max_new_tokens=10, seed=5)
    TorchEngine(model, tok, max_batch=2).generate([r])
    # what a checkpoint holds for a rollout cut after 4 tokens: finish "running", prefix kept
    d = r.to_dict()
    P = r.prompt_len
    for k in ("tokens", "loss_mask", "logprobs", "versions"):
        d[k] = d[k][: P + 4]
    d["spans"] = [{"start": 0, "end": P, "source": "prompt", "version": -1},
                  {"start": P, "end": P + 4, "source": "sampled", "version": 0}]
    d["finish"], d["resume_count"] = "running", 0
    cut = Rollout.from_dict(d)
    TorchEngine(model, tok, max_batch=2).generate([cut])
    assert cut.resume_count == 1 and cut.response_len == 10
    assert cut.tokens == r.tokens  # seeded by position: the same continuation
