"""A LoRA publish in adapter form through the Ray engine pool: an actor updated in place and
one restarted after a crash both hold the last full publish (the bases, then the adapter
merged over them by `reroll.engine.lora_apply`) with the latest adapter merged instead."""

import pytest
import torch

ray = pytest.importorskip("ray")

from reroll.lora import merge_weight  # noqa: E402

pytestmark = pytest.mark.ray  # `ray_session`: conftest.py

Q = "model.layers.0.self_attn.q_proj"  # the tiny model's: 128 x 128


def _adapter(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {Q + ".lora_A": torch.randn(4, 128, generator=g) * 0.1,
            Q + ".lora_B": torch.randn(128, 4, generator=g) * 0.1,
            Q + ".lora_scale": torch.tensor(2.0, dtype=torch.float64)}


def test_a_restarted_actor_holds_the_last_full_publish_and_the_latest_adapter(
        ray_session, tiny_dir, device):
    from reroll.models import load
    from reroll.runtime.ray import RayEnginePool

    base = load(tiny_dir, "float32")[0].state_dict()
    full = {k: v + 1 if v.is_floating_point() else v for k, v in base.items()}
    first, latest = _adapter(1), _adapter(2)
    # W = base + 2 B A, with the latest adapter over the base the full publish sent
    want = dict(full, **{Q + ".weight": merge_weight(
        full[Q + ".weight"], latest[Q + ".lora_A"], latest[Q + ".lora_B"], 2.0, False)})
    assert not torch.equal(want[Q + ".weight"], full[Q + ".weight"])
    pool = RayEnginePool(tiny_dir, workers=1, max_batch=4, device=str(device))

    def held():
        return ray.get(pool.actors[0].__ray_call__.remote(lambda a: (a.engine.version, {
            k: v.cpu() for k, v in a.engine.model.state_dict().items()})))

    pool.update_weights(dict(full, **first), 1)
    pool.update_weights(latest, 2)
    for restarted in (False, True):  # the actor updated in place, then one started afresh
        if restarted:
            pool.kill_worker(0)
            while pool.restarts == 0:  # the kill lands soon after: the first call to find
                pool.abort()  # the actor dead starts a new one
        version, got = held()
        assert version == 2 and got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert pool.stats()["restarts"] == 1
    assert pool.stats()["lora_base_bytes"] == 128 * 128 * 4  # one float32 base kept
    pool.shutdown()
