"""The custom-dataset example of docs/extending.md (its JSONL rows and config) loads as written: the
rows become examples with their answers and SFT demonstrations, split by id."""

import json
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def test_readme_jsonl_example_loads(tmp_path, monkeypatch):
    from reroll import build
    from reroll.config_checks import load_checked

    text = DOC.read_text()
    rows = [json.loads(x) for x in re.search(r"```jsonl\n(.*?)```", text, re.S)[1].splitlines()]
    config = re.search(r"```toml\n# configs/my_data.toml\n(.*?)```", text, re.S)[1]
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "problems.jsonl", "w") as f:  # the doc's rows, 20 ids each
        for i in range(40):
            f.write(json.dumps({**rows[i % 2], "id": f"p{i}"}) + "\n")
    (tmp_path / "my_data.toml").write_text(config)
    monkeypatch.chdir(tmp_path)  # the config's path is relative
    cfg = load_checked("my_data.toml")
    task = build.build_task(cfg)
    assert len(task.train) + len(task.test) == 40 and task.test
    ex = next(e for e in task.train + task.test if e.prompt_id == "p0")
    assert (ex.prompt, ex.answer, ex.demo) == (rows[0]["question"], "27", "13+14=27")
    assert task.verifier == {"name": "numeric", "args": {}}
