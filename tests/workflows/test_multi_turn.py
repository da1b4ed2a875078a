"""The multi-turn workflow on a tiny model with scripted environments: the stored tokens
decode to the transcript, environment tokens never carry loss and never count toward the
turn or episode limits, step rewards add up, a failing environment is an error score, and a
weight update in the middle of an episode resumes the turn being sampled."""

import asyncio

import pytest

from reroll import build, build_rollout
from reroll.config_checks import load_checked
from reroll.engine import EngineService, TorchEngine
from reroll.envs import StepResult
from reroll.rollout import Example, SamplingParams, new_group
from reroll.workflows import WORKFLOWS, EnvReward, EpisodeContext


class Scripted:
    """Answers every turn with a fixed observation; done after `turns` steps."""

    stop_strings = ["!"]

    def __init__(self, turns=3, reward=0.25, obs="<ok>", fail_at=None):
        self.turns, self.reward, self.obs, self.fail_at = turns, reward, obs, fail_at
        self.actions, self.observations = [], []

    def reset(self, example):
        self.observations.append("[go]")
        return "[go]"

    def step(self, action):
        self.actions.append(action)
        if self.fail_at == len(self.actions):
            raise KeyError("tool table missing")
        done = len(self.actions) >= self.turns
        obs = "" if done else f"{self.obs}{len(self.actions)}"
        self.observations.append(obs)
        return StepResult(obs, self.reward, done, {"n": len(self.actions)})


def run_group(tiny, env_factory, n=2, per_turn=3, episode=0, turns=4, temperature=1.0):
    model, tok = tiny
    envs = []

    def make_env():
        envs.append(env_factory())
        return envs[-1]

    async def main():
        engine = EngineService(TorchEngine(model, tok, max_batch=4))
        ctx = EpisodeContext(engine=engine, scorer=EnvReward(), decode=build_rollout.decoder(tok),
                             encode_observation=build_rollout.encode_observation(tok),
                             make_env=make_env, max_turns=turns, max_new_tokens=per_turn,
                             max_episode_tokens=episode)
        sp = SamplingParams(temperature=temperature, max_new_tokens=per_turn,
                            stop_token_ids=[tok.eos_token_id])
        g = new_group(Example("p0", "12+7=", "19"), n, build_rollout.encode_prompt(tok)("12+7="), sp, 0)
        for r in g.rollouts:
            r.sampling.seed = 10 + r.index_in_group
        await WORKFLOWS.get("multi_turn")(ctx, g)
        await engine.close()
        return g

    return asyncio.run(main()), envs, tok


def test_stored_tokens_decode_to_the_transcript_and_env_tokens_carry_no_loss(tiny):
    g, envs, tok = run_group(tiny, lambda: Scripted(turns=3))
    for r, env in zip(g.rollouts, envs):
        text = "12+7=" + env.observations[0]
        for i, (a, o) in enumerate(zip(env.actions, env.observations[1:])):
            last = i == len(env.actions) - 1  # an episode ended by EOS shows no reply
            text += a + (o if not last or not r.loss_mask[-1] else "")
        assert tok.decode(r.tokens, skip_special_tokens=True) == text
        env_spans = [s for s in r.spans if s.source == "env"]
        shown = [o for o in env.observations if o]
        assert [tok.decode(r.tokens[s.start:s.end]) for s in env_spans] == \
            shown[: len(env_spans)] and len(env_spans) >= len(shown) - 1
        for s in r.spans:  # loss exactly on what the policy sampled, and nowhere else
            assert all(r.loss_mask[t] == (s.source == "sampled") for t in range(s.start, s.end))
            assert all((r.versions[t] == -1) == (s.source != "sampled")
                       for t in range(s.start, s.end))
        assert r.scores[0].name == "env" and r.reward == pytest.approx(0.25 * len(env.actions))
        assert r.scores[0].info["turns"] == len(env.actions)
        assert [s["n"] for s in r.scores[0].info["steps"]] == list(range(1, len(env.actions) + 1))


def test_turn_and_episode_limits_count_policy_tokens_only(tiny):
    # 3 tokens a turn, 7 a episode; observations of 5+ tokens never count
    g, envs, _ = run_group(tiny, lambda: Scripted(turns=10, obs="<long-observation>"),
                           per_turn=3, episode=7, turns=10, temperature=0.0)
    for r, env in zip(g.rollouts, envs):
        per_turn, run = [], 0  # runs of policy tokens: one per turn (env tokens between)
        for m in r.loss_mask[r.prompt_len:] + [False]:
            if m:
                run += 1
            elif run:
                per_turn, run = per_turn + [run], 0
        assert r.n_sampled <= 7 and all(n <= 3 for n in per_turn)
        assert sum(1 for m in r.loss_mask if not m) > r.prompt_len  # env tokens are there
        if "!" not in "".join(env.actions) and tiny[1].eos_token_id not in r.tokens:
            assert r.n_sampled == 7 and r.finish == "length"  # 3 + 3 + 1: the budget ended it


def test_a_failing_environment_is_an_error_score_not_a_zero(tiny):
    g, _, _ = run_group(tiny, lambda: Scripted(turns=3, fail_at=2), temperature=0.0)
    for r in g.rollouts:
        assert r.failed and r.reward is None and r.finish == "error"
        assert "KeyError" in r.scores[0].error and "tool table missing" in r.scores[0].error


def test_a_weight_update_mid_episode_resumes_the_turn_under_the_new_weights(tiny):
    import torch

    model, tok = tiny
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}

    async def main():
        engine = EngineService(TorchEngine(model, tok, max_batch=4), max_steps_per_call=1)
        ctx = EpisodeContext(engine=engine, scorer=EnvReward(), decode=build_rollout.decoder(tok),
                             encode_observation=build_rollout.encode_observation(tok),
                             make_env=lambda: Scripted(turns=3), max_turns=3,
                             max_new_tokens=6)
        sp = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=[])
        g = new_group(Example("p0", "1+1=", "2"), 1, build_rollout.encode_prompt(tok)("1+1="), sp, 0)
        g.rollouts[0].sampling.seed = 3
        task = asyncio.ensure_future(WORKFLOWS.get("multi_turn")(ctx, g))
        while engine.stats()["tokens_generated"] < 8:  # inside the second turn
            await asyncio.sleep(0.001)
        await engine.update_weights(new, 1, interrupt=True)
        await task
        await engine.close()
        return g.rollouts[0]

    r = asyncio.run(main())
    vs = [v for v, m in zip(r.versions, r.loss_mask) if m]
    assert vs[0] == 0 and vs[-1] == 1 and sorted(vs) == vs  # old tokens, then new ones
    assert r.resume_count == 1 and r.reward == pytest.approx(0.75)


def test_single_turn_as_a_one_turn_environment_equals_the_single_turn_workflow(tmp_path,
                                                                               device):
    from safetensors.torch import load_file

    from reroll.runtime import train

    small = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
             "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
             "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
             "runtime.threads=1", "train.steps=3", "ckpt_every=3", f"model.device={device}"]
    spec = '{name="format", args={pattern="[0-9]", fullmatch=false}}'
    a, b = tmp_path / "single", tmp_path / "env"
    train(load_checked(None, small + [f"out_dir={a}", f"reward.verifiers=[{spec}]"]),
          progress=False)
    train(load_checked(None, small + [f"out_dir={b}", "rollout.workflow=multi_turn",
                                      "rollout.env=verifier", "rollout.max_turns=1",
                                      f"rollout.env_args={{verifiers=[{spec}]}}"]),
          progress=False)
    wa, wb = (load_file(str(p / "checkpoints/step_000003/model/model.safetensors"))
              for p in (a, b))
    w0 = load_file(str(a / "init" / "model.safetensors"))
    assert any(not (w0[k] == wa[k]).all() for k in wa)  # training moved the weights
    assert all((wa[k] == wb[k]).all() for k in wa)  # bitwise the same run


def test_length_shaping_measures_policy_tokens_against_the_episode_limit(tiny):
    """Overlong shaping of a multi-turn sample: policy tokens only, against the episode's
    limit (max_episode_tokens, else max_turns * max_new_tokens), not one turn's."""
    g, _, _ = run_group(tiny, lambda: Scripted(turns=10, obs="<long-observation>"),
                        per_turn=3, episode=7, turns=10, temperature=0.0)
    r = max(g.rollouts, key=lambda x: x.n_sampled)
    assert len(r.tokens) - r.prompt_len > r.n_sampled  # environment tokens are in the record
    assert r.n_sampled > 4  # long enough to be penalised
    cfg = load_checked(None, ["rollout.workflow=multi_turn", "rollout.env=guess",
                              "rollout.max_new_tokens=3", "rollout.max_episode_tokens=8",
                              "rollout.max_turns=10", "algo.overlong_buffer=4"])
    assert cfg.rollout.policy_token_limit == 8
    # expected limit 8 - 4 = 4; penalty -(n_sampled - 4) / 4, clamped to [-1, 0]
    want = -min(max(r.n_sampled - 4, 0), 4) / 4
    assert build_rollout.build_shaping(cfg)(r) == pytest.approx(want)
    # the episode limit (turns x per turn when max_episode_tokens is 0) admits a buffer
    # longer than one turn, which the old per-turn check refused
    cfg = load_checked(None, ["rollout.workflow=multi_turn", "rollout.env=guess",
                              "rollout.max_new_tokens=3", "rollout.max_turns=4",
                              "algo.overlong_buffer=10"])
    assert cfg.rollout.policy_token_limit == 12
    assert build_rollout.build_shaping(cfg)(r) == pytest.approx(-min(max(r.n_sampled - 2, 0), 10) / 10)


def test_every_recorded_rollout_of_a_real_multi_turn_run_replays_to_its_transcript(tmp_path):
    """A real `train` run on the guess environment: every recorded rollout, replayed
    through a fresh environment turn by turn (each policy turn decoded from the stored
    tokens), gives back exactly the stored observation tokens; no environment token carries
    loss, a version or a log-prob, and the policy tokens respect the turn and episode limits."""
    from reroll.envs import ENVIRONMENTS
    from reroll.runtime import train

    cfg = load_checked("configs/guess.toml", [
        f"out_dir={tmp_path}", "train.steps=2", "record_every=1", "eval.every=0",
        "rollout.batch_groups=4", "rollout.group_size=4", "task.args.n_train=40",
        "task.args.n_test=8", "ckpt_every=2", "log_every=1"])
    train(cfg, progress=False)
    tok = build.load_tokenizer(tmp_path / "init")
    from reroll.recording.store import RolloutStore

    groups = [g for _, g in RolloutStore(tmp_path).groups()]
    assert len(groups) == 8
    n_env_turns = 0
    for g in groups:
        for r in g.rollouts:
            env = ENVIRONMENTS.get("guess")(**cfg.rollout.env_args)
            assert env.reset(g.example) == ""
            spans = [s for s in r.spans if s.end > r.prompt_len]
            turns = [s for s in spans if s.source == "sampled"]
            assert len(turns) <= cfg.rollout.max_turns
            assert all(s.end - s.start <= cfg.rollout.max_new_tokens for s in turns)
            assert r.n_sampled <= cfg.rollout.policy_token_limit
            expect_env: list[int] = []
            for s in turns:
                res = env.step(tok.decode(r.tokens[s.start:s.end], skip_special_tokens=True))
                eos = r.tokens[s.end - 1] == tok.eos_token_id  # the policy ended the episode
                if not res.done and not eos:
                    expect_env += build_rollout.encode_observation(tok)(res.observation)
            env_tokens = [t for s in spans if s.source == "env" for t in r.tokens[s.start:s.end]]
            assert env_tokens == expect_env
            n_env_turns += len([s for s in spans if s.source == "env"])
            for s in spans:
                if s.source == "env":
                    idx = range(s.start, s.end)
                    assert not any(r.loss_mask[t] for t in idx)
                    assert all(r.versions[t] == -1 and r.logprobs[t] == 0.0 for t in idx)
    assert n_env_turns > 0  # the run did interleave observations
