"""Which config changes a resume accepts: where engine servers are (they move between a stop
and a resume) is not what shapes a run; the algorithm is."""

from reroll.runlog import config_diff


def test_a_resume_accepts_moved_servers_and_refuses_a_changed_algorithm():
    old = {"engine": {"name": "openai", "base_url": "http://a:1", "api_key": "x",
                      "timeout_s": 30.0, "weights_dir": "/tmp/a"},
           "algo": {"advantage": "grpo"}}
    new = {"engine": {"name": "openai", "base_url": ["http://b:2", "http://c:3"],
                      "api_key": "y", "timeout_s": 60.0, "weights_dir": "/tmp/b"},
           "algo": {"advantage": "grpo"}}
    assert config_diff(old, new) == []
    new["algo"]["advantage"] = "rloo"
    new["engine"]["name"] = "torch"
    assert config_diff(old, new) == ["algo.advantage: 'grpo' -> 'rloo'",
                                     "engine.name: 'openai' -> 'torch'"]
