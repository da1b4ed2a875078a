"""Optional Weights & Biases logging (``log.wandb = true``, offline mode): every metrics row
goes to the run's W&B log beside metrics.jsonl, stdout is untouched, a resume continues the
same W&B run, and without the package the config is refused when it loads."""

import importlib.util
import json
import time

import pytest

from reroll.config_checks import load_checked
from reroll.errors import ConfigError


def test_wandb_offline_logs_every_row_and_resume_keeps_the_run(small_run, tmp_path, capfd):
    pytest.importorskip("wandb")
    from reroll.runtime import train

    out = tmp_path / "run"
    on = ["log.wandb=true", "log.wandb_mode=offline", "ckpt_every=2"]
    train(small_run(out, "train.steps=2", *on), progress=False)
    run_id = (out / "wandb_id").read_text().strip()
    train(small_run(out, "train.steps=3", *on), resume=True, progress=False)
    assert capfd.readouterr().out == ""  # wandb's console capture is off
    assert (out / "wandb_id").read_text().strip() == run_id
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    values = [json.dumps(r["reward/mean"]).encode() for r in rows]
    deadline = time.monotonic() + 30  # wandb's service may still be writing its log
    while True:
        logs = sorted(out.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))
        data = b"".join(p.read_bytes() for p in logs)
        if all(v in data for v in values) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(logs) == 2  # the first run and its resume, one W&B run id
    for v in values:  # the W&B records hold each row's values (protobuf keeps them as text)
        assert v in data, (v, [(p.name, p.stat().st_size) for p in logs])
    assert b"reward/mean" in data and b"pipeline/started" in data


def test_wandb_settings_are_checked_when_the_config_loads(monkeypatch):
    with pytest.raises(ConfigError, match="log.wandb_mode must be one of online, offline, disabled, got 'cloud'"):
        load_checked(None, ["log.wandb_mode=cloud"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the wandb package: pip install 'reroll\[wandb\]'"):
        load_checked(None, ["log.wandb=true"])
