"""DOTS's prediction for unseen prompts (reroll.control.embedding, the dots selector's
predict = "attention"): hashed n-gram embeddings and attention over the reference set,
against values computed by hand."""

import math
import subprocess
import sys

import numpy as np
import pytest

from reroll.control.embedding import attention_predict, hashed_ngrams, shape
from reroll.control.selectors import SELECTORS
from reroll.control.stats import PromptStats
from reroll.rollout import Example


def test_shape_writes_digits_and_letters_as_classes():
    assert shape("37-45+12=") == "00-00+00="
    assert shape("Sum 3 and x!") == "aaa 0 aaa a!"


def test_an_embedding_has_unit_length_and_counts_its_grams():
    v = hashed_ngrams("ab", dim=4096, orders=(1,))
    # grams t:a, t:b, s:a, s:a (the shape of "ab" is "aa"): 4 grams, s:a twice, so with no
    # collisions the squared counts are 1 + 1 + 4 = 6
    nz = np.sort(np.abs(v[v != 0]))
    assert nz == pytest.approx(np.sort([1, 1, 2]) / math.sqrt(6), abs=1e-6)
    assert float(np.linalg.norm(v)) == pytest.approx(1.0, abs=1e-6)
    assert not hashed_ngrams("", dim=8).any()


def test_an_embedding_is_the_same_in_another_process():
    here = hashed_ngrams("12+345=", dim=64).tolist()
    code = ("from reroll.control.embedding import hashed_ngrams; "
            "print(hashed_ngrams('12+345=', dim=64).tolist())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert eval(there) == here  # noqa: S307 - our own printed list of floats


def test_prompts_of_one_shape_are_closer_than_prompts_of_another():
    a, b, c = (hashed_ngrams(t) for t in ("37-45+12=", "81-26+93=", "4+5="))
    assert float(a @ b) > float(a @ c) + 0.2


def test_attention_is_a_softmax_weighted_mean_of_the_reference_rates():
    keys = np.array([[1.0, 0.0], [0.0, 1.0]])
    rates = np.array([0.0, 1.0])
    got = attention_predict(np.array([[1.0, 0.0], [0.6, 0.8]]), keys, rates, temperature=1.0)
    # query 1: softmax([1, 0]) = [0.7311, 0.2689] -> 0.2689; query 2: softmax([0.6, 0.8])
    # = [0.4502, 0.5498] -> 0.5498
    assert got == pytest.approx([1 / (1 + math.e), 1 / (1 + math.exp(-0.2))], abs=1e-6)
    # a cold temperature takes the nearest reference prompt's rate
    assert attention_predict(np.array([[0.6, 0.8]]), keys, rates, temperature=1e-3)[0] == \
        pytest.approx(1.0)
    with pytest.raises(ValueError, match="temperature"):
        attention_predict(keys, keys, rates, temperature=0.0)
    with pytest.raises(ValueError, match="R >= 1"):
        attention_predict(keys, keys[:0], rates[:0], temperature=1.0)


def test_dots_predicts_unseen_prompts_from_similar_observed_ones():
    # two shapes: one-digit sums (always solved) and three-digit differences (half solved)
    easy = [Example(f"e{i}", f"{i}+{i}=", str(2 * i)) for i in range(1, 6)]
    mid = [Example(f"m{i}", f"{100 + i}-{200 + 3 * i}=", "0") for i in range(5)]
    st = PromptStats()
    for e in easy[:3]:
        st.observe(e.prompt_id, 8, 8, 0)
    for e in mid[:3]:
        st.observe(e.prompt_id, 4, 8, 0)
    sel = SELECTORS.get("dots")(easy + mid, 0, 2, pool=0, predict="attention")
    unseen = [easy[3], easy[4], mid[3], mid[4]]
    p = sel.predictions(unseen, st)
    assert p[0] > 0.9 and p[1] > 0.9 and abs(p[2] - 0.5) < 0.05 and abs(p[3] - 0.5) < 0.05
    # the value itself: the softmax over the six reference prompts' cosines, by hand
    e = {x.prompt_id: hashed_ngrams(x.prompt) for x in easy + mid}
    ref = [x.prompt_id for x in easy[:3] + mid[:3]]
    logit = np.array([e["m3"] @ e[r] for r in ref]) / 0.05
    w = np.exp(logit - logit.max())
    assert p[2] == pytest.approx(float(w @ np.array([1, 1, 1, .5, .5, .5]) / w.sum()))
    # a round of 2 from the 4 unseen and the 6 seen takes prompts predicted near 0.5, and
    # with predict = "rate" the unseen ones all count as 0.5
    picked = {sel.pick(0, st).prompt_id, sel.pick(1, st).prompt_id}
    assert picked <= {"m0", "m1", "m2", "m3", "m4"}
    plain = SELECTORS.get("dots")(easy + mid, 0, 2, pool=0)
    assert plain.predictions(unseen, st).tolist() == [0.5] * 4


def test_the_reference_set_is_the_most_recently_observed_prompts():
    exs = [Example(f"p{i}", f"{i}=", str(i)) for i in range(5)]
    st = PromptStats()
    for i, step in enumerate([3, 1, 3, 2]):
        st.observe(f"p{i}", i, 4, step)
    sel = SELECTORS.get("dots")(exs, 0, 1, predict="attention", ref_size=3)
    assert sel.reference(st) == [("p0", 0.0), ("p2", 0.5), ("p3", 0.75)]
    with pytest.raises(ValueError, match="predict"):
        SELECTORS.get("dots")(exs, 0, 1, predict="embedding")
