"""Chat templates: with ``task.chat = true`` prompts are rendered by the tokenizer's chat
template (the tiny tokenizer ships one: ``<role>content`` lines, ``<assistant>`` as the
generation prompt), environment turns are rendered as tool messages followed by the
generation prompt, and the stored ids are exactly those renderings (token in, token out)."""

import asyncio

from reroll import build, build_rollout
from reroll.config_checks import load_checked
from reroll.engine import EngineService, TorchEngine
from reroll.envs import StepResult
from reroll.rollout import Example, Group, SamplingParams, new_group
from reroll.runlog import read_rollouts
from reroll.runtime import train
from reroll.workflows import WORKFLOWS, EnvReward, EpisodeContext


def test_prompts_and_observations_are_rendered_by_the_chat_template(tiny):
    model, tok = tiny
    encode = build_rollout.encode_prompt(tok, chat=True)
    assert tok.decode(encode("12+7=")) == "<user>12+7=\n<assistant>"
    obs = build_rollout.encode_observation(tok, chat=True)
    assert tok.decode(obs("<res>19</res>")) == "<tool><res>19</res>\n<assistant>"

    class Once:
        stop_strings = ["!"]

        def __init__(self):
            self.n = 0

        def reset(self, ex):
            return ""

        def step(self, action):
            self.n += 1
            return StepResult("ok", 1.0, self.n >= 2, {})

    async def main():
        engine = EngineService(TorchEngine(model, tok, max_batch=2))
        ctx = EpisodeContext(engine=engine, scorer=EnvReward(), decode=build_rollout.decoder(tok),
                             encode_observation=obs, make_env=Once, max_turns=2,
                             max_new_tokens=3)
        sp = SamplingParams(temperature=0.0, max_new_tokens=3, stop_token_ids=[])
        g = new_group(Example("p", "12+7=", "19"), 1, encode("12+7="), sp, 0)
        await WORKFLOWS.get("multi_turn")(ctx, g)
        await engine.close()
        return g.rollouts[0]

    r = asyncio.run(main())
    text = tok.decode(r.tokens)
    first = tok.decode(r.tokens[r.prompt_len:r.prompt_len + 3])
    assert text.startswith("<user>12+7=\n<assistant>" + first + "<tool>ok\n<assistant>")
    env = [t for t, m in zip(r.tokens[r.prompt_len:], r.loss_mask[r.prompt_len:]) if not m]
    assert tok.decode(env) == "<tool>ok\n<assistant>"


def test_a_chat_run_trains_on_template_rendered_prompts(tmp_path, device):
    cfg = load_checked(None, ["model.max_position=48", "task.args.digits=1",
                              "task.args.n_train=40", "task.args.n_test=8", "task.chat=true",
                              "rollout.group_size=2", "rollout.batch_groups=2",
                              "rollout.max_new_tokens=3", "reward.workers=0", "log_every=1",
                              "runtime.threads=1", "train.steps=2", f"out_dir={tmp_path}",
                              f"model.device={device}"])
    train(cfg, progress=False)
    tok = build.load_tokenizer(tmp_path / "init")
    groups = [Group.from_dict(g) for _, g in read_rollouts(tmp_path)]
    assert len(groups) == 4  # 2 steps x 2 groups
    for g in groups:
        for r in g.rollouts:
            assert tok.decode(r.prompt_tokens) == f"<user>{g.example.prompt}\n<assistant>"
