import sys
import textwrap

import pytest

REWARDS = textwrap.dedent('''
    import os, sys, time

    def length(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    def uses_fields(prompts, completions, answer, prompt_id, level, **kw):
        # 1.0 when the completion equals the answer, scaled by the example's level field
        return [float(c == a) * lv for c, a, lv in zip(completions, answer, level)]

    def not_applicable(prompts, completions, **kw):
        return [None]

    def boom(prompts, completions, **kw):
        raise RuntimeError("boom in reward")

    def wrong_length(prompts, completions, **kw):
        return [1.0, 2.0]

    def nan(prompts, completions, **kw):
        return [float("nan")]

    def hang(prompts, completions, **kw):
        time.sleep(600)
        return [1.0]

    def die(prompts, completions, **kw):
        os._exit(7)

    def segfault(prompts, completions, **kw):
        import ctypes
        ctypes.string_at(0)

    def hostile(prompts, completions, **kw):
        # behaves according to the completion: ok, raise, hang, die, segv
        c = completions[0]
        if c == "raise":
            raise RuntimeError("asked to raise")
        if c == "hang":
            time.sleep(600)
        if c == "die":
            os._exit(7)
        if c == "segv":
            import ctypes
            ctypes.string_at(0)
        return [1.0]

    def has_torch(prompts, completions, **kw):
        return [float("torch" in sys.modules)]

    def noisy(prompts, completions, **kw):
        print("this print must not corrupt the worker protocol")
        return [2.0]
''')


@pytest.fixture(scope="session")
def rewards_module(tmp_path_factory):
    """An importable module `reroll_test_rewards` of well-behaved and hostile functions."""
    d = tmp_path_factory.mktemp("rewards")
    (d / "reroll_test_rewards.py").write_text(REWARDS)
    sys.path.insert(0, str(d))
    yield "reroll_test_rewards"
    sys.path.remove(str(d))
