"""The tiny character tokenizer survives save_pretrained + AutoTokenizer.from_pretrained for
every tiny architecture: each CHARSET character (space and newline included) round-trips to
itself with its original id, and the chat template renders the exact expected text."""

import pytest
from transformers import AutoTokenizer

from reroll.config import ModelConfig
from reroll.models import build_tiny, build_tokenizer
from reroll.models.tiny import CHARSET


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def loaded(request, tmp_path_factory):
    """(arch, tokenizer loaded back from a build_tiny directory)."""
    cfg = ModelConfig(arch=request.param, hidden_size=16, num_layers=1, num_heads=2,
                      num_kv_heads=1, intermediate_size=16)
    out = build_tiny(cfg, tmp_path_factory.mktemp(request.param), seed=0)
    return request.param, AutoTokenizer.from_pretrained(out)


def test_every_charset_character_round_trips_after_loading(loaded):
    arch, tok = loaded
    lost = [ch for ch in CHARSET if tok.decode(tok.encode(ch)) != ch]
    assert lost == [], f"{arch}: {lost!r} do not round-trip"
    # one token per character, and the ids are the ones the in-memory tokenizer gives:
    # 4 specials (pad, eos, bos, unk) then CHARSET in order, so "0" is 4 and " " is 4 + 62 = 66
    fresh = build_tokenizer()
    for i, ch in enumerate(CHARSET):
        assert tok.encode(ch) == fresh.encode(ch) == [4 + i], (arch, ch)
    assert tok.encode(" ") == [66]
    assert tok.encode("\n") == [4 + CHARSET.index("\n")] == [98]


@pytest.mark.parametrize("text", [
    "3 5 7->15:",
    "3 5 7->15:\n(3*5)",
    "  two leading spaces, two trailing  ",
    "a\n\nb \n c",
    CHARSET,
])
def test_mixed_strings_round_trip_after_loading(loaded, text):
    arch, tok = loaded
    ids = tok.encode(text)
    assert len(ids) == len(text), arch  # one token per character, none dropped
    assert tok.decode(ids) == text, arch


def test_countdown_prompts_stay_distinct_after_loading(loaded):
    # the bug this guards: "3 5 7" and "35 7" decoded alike once spaces were lost
    _, tok = loaded
    assert tok.decode(tok.encode("3 5 7->15:")) != tok.decode(tok.encode("35 7->15:"))
    assert tok.encode("3 5") == [7, 66, 9]  # "3" = 4 + 3, " " = 66, "5" = 4 + 5


def test_chat_template_renders_exact_text_after_loading(loaded):
    arch, tok = loaded
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "3 5 7->15:"},
        {"role": "assistant", "content": "3*5"},
        {"role": "tool", "content": "15"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<system>Be brief.\n<user>3 5 7->15:\n<assistant>3*5\n<tool>15\n<assistant>"
    no_prompt = tok.apply_chat_template(messages[:2], tokenize=False)
    assert no_prompt == "<system>Be brief.\n<user>3 5 7->15:\n"
    assert set(text) <= set(CHARSET), arch
    assert tok.decode(tok.encode(text)) == text, arch


def test_chat_template_rejects_unknown_role(loaded):
    _, tok = loaded
    with pytest.raises(Exception, match="role must be one of system, user, assistant, tool"):
        tok.apply_chat_template([{"role": "bot", "content": "x"}], tokenize=False)
