"""LoRA publishes after the first through the Ray engine pool, partial (merged tensors) or in
adapter form: an actor updated in place and one restarted after a crash both hold the last
full publish with the latest partial one over it (for adapters: the bases the full publish
sent, with the latest adapter merged by `reroll.engine.lora_apply`)."""

import pytest
import torch

ray = pytest.importorskip("ray")

from reroll.lora import merge_weight  # noqa: E402

pytestmark = pytest.mark.ray  # `ray_session`: conftest.py

Q = "model.layers.0.self_attn.q_proj"  # the tiny model's: 128 x 128


def _holds_in_place_and_restarted(pool, version: int, want: dict) -> None:
    """The pool's one actor holds ``want`` as ``version``, updated in place, then once more
    after it is killed and a new one started from the pool's kept publishes."""

    def held():
        return ray.get(pool.actors[0].__ray_call__.remote(lambda a: (a.engine.version, {
            k: v.cpu() for k, v in a.engine.model.state_dict().items()})))

    for restarted in (False, True):
        if restarted:
            pool.kill_worker(0)
            while pool.restarts == 0:  # the kill lands soon after: the first call to find
                pool.abort()  # the actor dead starts a new one
        got_version, got = held()
        assert got_version == version and got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert pool.stats()["restarts"] == 1


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
    pool.update_weights(dict(full, **first), 1)
    pool.update_weights(latest, 2)
    _holds_in_place_and_restarted(pool, 2, want)
    assert pool.stats()["lora_base_bytes"] == 128 * 128 * 4  # one float32 base kept
    pool.shutdown()


def test_a_partial_publish_updates_its_tensors_alone_and_a_restarted_actor_too(
        ray_session, tiny_dir, device):
    from reroll.models import load
    from reroll.runtime.ray import RayEnginePool

    base = load(tiny_dir, "float32")[0].state_dict()
    full = {k: v + 1 if v.is_floating_point() else v for k, v in base.items()}
    part = {k: base[k] * 2 for k in [Q + ".weight"]}
    pool = RayEnginePool(tiny_dir, workers=1, max_batch=4, device=str(device))
    pool.update_weights(full, 1)
    pool.update_weights(part, 2)
    _holds_in_place_and_restarted(pool, 2, dict(full, **part))
    pool.shutdown()
