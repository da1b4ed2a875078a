from reroll.control.prompts import PromptStream
from reroll.rollout import Example


def exs(n):
    return [Example(f"p{i}", f"{i}", str(i)) for i in range(n)]


def test_each_epoch_is_a_permutation_and_cursor_resumes():
    s = PromptStream(exs(5), seed=1)
    first = [s.next().prompt_id for _ in range(10)]
    assert sorted(first[:5]) == sorted(first[5:]) == [f"p{i}" for i in range(5)]
    s2 = PromptStream(exs(5), seed=1, cursor=3)
    assert [s2.next().prompt_id for _ in range(7)] == first[3:10]


def test_retried_prompts_come_first_and_survive_checkpoint():
    s = PromptStream(exs(4), seed=0)
    a = s.next()
    s.push_front(a)
    state = s.state()
    s2 = PromptStream(exs(4), seed=0, **state)
    assert s2.next().prompt_id == a.prompt_id == s.next().prompt_id
    assert [s2.next().prompt_id for _ in range(3)] == [s.next().prompt_id for _ in range(3)]
