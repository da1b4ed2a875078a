"""Stopping rules, slot reuse, shared prefill of n samples, generate() and bad input."""

import pytest
from engine_helpers import PROMPTS, make

from reroll.engine import TorchEngine


def free_run(model, tok, text, n=30):
    r = make(tok, text, temperature=0.0, max_new_tokens=n)
    TorchEngine(model, tok, max_batch=2).generate([r])
    return r.response_tokens


def test_stop_token_ends_the_response_at_its_first_occurrence(lm):
    model, tok = lm
    free = free_run(model, tok, "12+34=")
    stop = free[6]
    cut = free.index(stop) + 1  # first occurrence, the stop token itself is kept
    r = make(tok, "12+34=", temperature=0.0, max_new_tokens=30, stop_token_ids=[stop])
    TorchEngine(model, tok, max_batch=2).generate([r])
    assert r.finish == "stop" and r.response_tokens == free[:cut]
    assert r.completion == tok.decode(free[:cut], skip_special_tokens=True)


def test_stop_string_ends_the_response_once_the_text_contains_it(lm):
    model, tok = lm
    free = free_run(model, tok, "hello world ")
    text = tok.decode(free, skip_special_tokens=True)
    target = text[8:10]
    # the shortest prefix of tokens whose text contains the target
    end = next(k for k in range(len(free) + 1)
               if target in tok.decode(free[:k], skip_special_tokens=True))
    assert 2 <= end < len(free)  # the rule really cuts the response short
    r = make(tok, "hello world ", temperature=0.0, max_new_tokens=30, stop_strings=[target])
    TorchEngine(model, tok, max_batch=2).generate([r])
    assert r.finish == "stop" and r.response_tokens == free[:end]
    assert r.completion.endswith(target) and r.completion.count(target) == 1


def test_max_new_tokens_counts_the_whole_response_across_a_resume(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=2)
    r = make(tok, "abc", temperature=1.0, max_new_tokens=7, seed=1)
    eng.add([r])
    eng.step()  # prefill token + one decode token
    eng.abort()
    assert r.response_len == 2
    eng.add([r])
    while eng.pending():
        eng.step()
    assert r.finish == "length" and r.response_len == 7 and r.resume_count == 1
    done = make(tok, "abc", temperature=1.0, max_new_tokens=0)
    assert eng.generate([done])[0].finish == "length" and done.response_len == 0


def test_many_more_requests_than_slots_reuse_the_same_cache_tensors(lm):
    model, tok = lm
    lengths = [(3 * i) % 17 + 1 for i in range(40)]  # 1..17 tokens, shuffled
    rs = [make(tok, PROMPTS[i % len(PROMPTS)], gid=str(i), temperature=0.0, max_new_tokens=n)
          for i, n in enumerate(lengths)]
    eng = TorchEngine(model, tok, max_batch=4)
    eng.add(rs[:1])
    eng.step()
    ptrs, nbytes = eng.cache.data_ptrs(), eng.stats()["kv_cache_bytes"]
    eng.add(rs[1:])
    while eng.pending():
        assert len(eng.rows) <= 4
        eng.step()
    assert eng.cache.data_ptrs() == ptrs and eng.stats()["kv_cache_bytes"] == nbytes
    # 4 layers x (K and V) x 4 slots x 2 kv heads x max_seq_len 256 x 16 dims x 4 bytes
    assert nbytes == 4 * 2 * 4 * 2 * 256 * 16 * 4
    assert [r.response_len for r in rs] == lengths
    # slots were compacted and reused many times: outputs equal a roomy engine's
    for r in rs[::7]:
        assert r.response_tokens == free_run(model, tok, r.prompt_id, 30)[: r.response_len]


def test_samples_of_one_prompt_share_one_prefill(lm):
    model, tok = lm
    prompt = "sort: 9 1 5 3 -> "
    group = [make(tok, prompt, gid="g", temperature=1.0, max_new_tokens=10, seed=s)
             for s in range(4)]
    eng = TorchEngine(model, tok, max_batch=8)
    eng.generate(group)
    n = len(tok.encode(prompt))
    assert eng.stats()["prefill_tokens"] == n  # computed once ...
    assert eng.stats()["prefill_tokens_shared"] == 3 * n  # ... and copied into 3 more slots
    assert len({tuple(r.response_tokens) for r in group}) > 1  # seeds differ, samples differ
    single = make(tok, prompt, temperature=1.0, max_new_tokens=10, seed=2)
    TorchEngine(model, tok, max_batch=1).generate([single])
    assert group[2].response_tokens == single.response_tokens


def test_generate_returns_its_own_requests_in_order_and_keeps_the_others_for_step(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=4)
    early = make(tok, "z", temperature=0.0, max_new_tokens=2)
    eng.add([early])
    mine = [make(tok, p, temperature=0.0, max_new_tokens=n) for p, n in [("abc", 9), ("7*8=", 3)]]
    out = eng.generate(mine)
    assert out == mine and all(r.finish == "length" for r in out)
    assert eng.step() == [early]  # finished during generate(), handed out by the next step


def test_bad_requests_raise_errors_that_name_the_rollout_and_the_field(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=2, max_seq_len=32)
    bad = make(tok, "abc", top_p=0.0)
    with pytest.raises(ValueError, match=f"{bad.sample_id}.*top_p"):
        eng.add([bad])
    with pytest.raises(ValueError, match="temperature"):
        eng.add([make(tok, "abc", temperature=-1.0)])
    with pytest.raises(ValueError, match="max_seq_len=32"):
        eng.add([make(tok, "x" * 40)])
    oov = make(tok, "abc")
    oov.tokens[1] = 10_000
    with pytest.raises(ValueError, match="outside the model vocabulary"):
        eng.add([oov])
    ok = make(tok, "abc")
    eng.add([ok])
    with pytest.raises(ValueError, match="already in the engine"):
        eng.add([ok])
    assert eng.pending() == 1  # a rejected batch adds nothing


def test_stats_count_steps_rows_and_tokens(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=2)
    a = make(tok, "abc", temperature=0.0, max_new_tokens=3)
    b = make(tok, "7*8=", temperature=0.0, max_new_tokens=5)
    eng.generate([a, b])
    s = eng.stats()
    # step 1: prefill gives each its 1st token, decode its 2nd (2 rows); step 2: a's 3rd and
    # b's 3rd (2 rows), a done; steps 3-4: b alone (1 row each) -> 4 steps, 6 rows, 8 tokens
    assert (s["decode_steps"], s["decode_rows"], s["tokens_generated"]) == (4, 6, 8)
    assert s["mean_batch"] == 1.5 and s["mean_occupancy"] == 0.75
    assert s["prefill_tokens"] == 3 + 4 and s["prefill_forwards"] == 1


def test_aborting_a_request_that_never_ran_is_not_a_resume(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=1)
    running = make(tok, "abc", temperature=0.0, max_new_tokens=4)
    queued = make(tok, "z", temperature=0.0, max_new_tokens=4)
    eng.add([running, queued])
    eng.step()  # one slot: only `running` is prefilled
    out = eng.abort()
    assert {r.sample_id for r in out} == {running.sample_id, queued.sample_id}
    assert eng.pending() == 0 and all(r.finish == "abort" for r in out)
    assert queued.response_len == 0 and running.response_len == 2
    eng.generate(out)
    assert running.resume_count == 1 and queued.resume_count == 0
    assert running.response_len == queued.response_len == 4


def test_resumed_tokens_count_the_prompt_and_prefix_each_resume_prefills_again(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=2)
    a = make(tok, "abc", gid="a", temperature=1.0, max_new_tokens=9, seed=1)
    b = make(tok, "12+34=", gid="b", temperature=1.0, max_new_tokens=9, seed=2)
    eng.add([a, b])
    eng.step()  # prefill token + one decode token each
    eng.abort()
    eng.add([a, b])
    eng.step()  # both re-prefilled: prompt + 2 tokens each; then 2 more tokens each
    eng.abort()
    eng.add([a])
    eng.step()  # a alone: prompt + 4 tokens
    s = eng.stats()
    assert s["requests_resumed"] == 3
    assert s["resumed_tokens"] == (a.prompt_len + 2) + (b.prompt_len + 2) + (a.prompt_len + 4)
