"""The ``jsonl`` and ``parquet`` tasks: prompt/answer datasets read from local files.

Owns reading rows, checking them, turning them into Examples and splitting them. A row that
cannot be used is a TaskError naming the file, the row (1-based line for JSONL, 1-based row
for Parquet) and what is wrong; nothing is skipped silently except blank JSONL lines.
Without ``test_path`` the split is a seeded hash of each row's id, so it is deterministic
and disjoint; with ``test_path``, train rows whose prompt also appears in the test file are
dropped (with a warning). Must not know verifiers beyond the name put in the reward spec.
pyarrow is imported only when a Parquet file is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from reroll.rollout import Example
from reroll.tasks.base import TASKS, Task, TaskError, require, seeded_unit

Rows = Iterator[tuple[int, Any]]  # (1-based row number, decoded row)


def read_jsonl(path: str) -> Rows:
    try:
        with open(path, encoding="utf-8-sig") as f:  # a leading BOM (Windows editors) is dropped
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path}: line {lineno}: invalid JSON ({e.msg} at "
                                    f"column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_parquet(path: str) -> Rows:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise TaskError(f"{path}: cannot read as Parquet ({e})") from None
    yield from enumerate(table.to_pylist(), start=1)


READERS: dict[str, tuple[Callable[[str], Rows], str]] = {
    "jsonl": (read_jsonl, "line"),  # the reader and what its row numbers count
    "parquet": (read_parquet, "row"),
}


def _text(value: Any, what: str, where: str, numbers_ok: bool) -> str:
    if isinstance(value, str):
        return value
    if numbers_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    kind = "a string or a number" if numbers_ok else "a string"
    raise TaskError(f"{where}: {what} must be {kind}, got {type(value).__name__} {value!r:.60}")


def _example(row: Any, where: str, *, prompt_field: str, answer_field: str, demo_field: str,
             id_field: str, prompt_template: str) -> tuple[Example, str]:
    """The Example of one row and its split key (the id field's value, else the prompt)."""
    if not isinstance(row, dict):
        raise TaskError(f"{where}: expected an object, got {type(row).__name__}")
    for name in (prompt_field, answer_field, demo_field, id_field):
        if name and name not in row:
            raise TaskError(f"{where}: missing field {name!r} (has: {', '.join(map(str, row))})")
    prompt = _text(row[prompt_field], f"field {prompt_field!r}", where, numbers_ok=False)
    if not prompt.strip():
        raise TaskError(f"{where}: field {prompt_field!r} is empty")
    answer = _text(row[answer_field], f"field {answer_field!r}", where, numbers_ok=True)
    demo = None
    if demo_field and row[demo_field] is not None:
        demo = _text(row[demo_field], f"field {demo_field!r}", where, numbers_ok=True)
    key = _text(row[id_field], f"field {id_field!r}", where, numbers_ok=True) if id_field \
        else prompt
    try:
        text = prompt_template.format_map({**row, "prompt": prompt})
    except (KeyError, IndexError, ValueError) as e:
        raise TaskError(f"{where}: prompt_template {prompt_template!r} cannot be filled "
                        f"({type(e).__name__}: {e})") from None
    used = {prompt_field, answer_field, demo_field, id_field}
    extra = {k: v for k, v in row.items() if k not in used}
    pid = key if id_field else hashlib.sha1(prompt.encode()).hexdigest()[:16]
    return Example(prompt_id=pid, prompt=text, answer=answer, demo=demo, fields=extra), key


def load_examples(path: str, kind: str, **spec: str) -> list[tuple[Example, str]]:
    """(Example, split key) for every row of ``path``; ids made unique; bad rows raise."""
    reader, unit = READERS[kind]
    if not path:
        raise TaskError("a data file path is required (task.args.path)")
    if os.path.isdir(path):
        raise TaskError(f"data file {path} is a directory; name the file in it")
    if not os.path.isfile(path):
        raise TaskError(f"data file not found: {path}")
    out, first_row, counts = [], {}, {}
    for rownum, row in reader(path):
        where = f"{path}: {unit} {rownum}"
        ex, key = _example(row, where, **spec)
        if spec["id_field"] and ex.prompt_id in first_row:
            raise TaskError(f"{where}: duplicate id {ex.prompt_id!r} (first at row "
                            f"{first_row[ex.prompt_id]})")
        first_row.setdefault(ex.prompt_id, rownum)
        counts[ex.prompt_id] = counts.get(ex.prompt_id, 0) + 1
        if counts[ex.prompt_id] > 1:  # a repeated prompt: same split side, distinct id
            ex.prompt_id = f"{ex.prompt_id}-{counts[ex.prompt_id]}"
        out.append((ex, key))
    if not out:
        raise TaskError(f"{path}: no rows")
    return out


def build(seed: int, name: str, *, path: str, test_path: str, test_fraction: float,
          verifier: str, **spec: str) -> Task:
    """Load, check and split; shared by the ``jsonl`` and ``parquet`` tasks."""
    rows = load_examples(path, name, **spec)
    if test_path:
        test = [ex for ex, _ in load_examples(test_path, name, **spec)]
        test_prompts = {ex.prompt for ex in test}
        train = [ex for ex, _ in rows if ex.prompt not in test_prompts]
        if len(train) < len(rows):
            warnings.warn(f"{path}: dropped {len(rows) - len(train)} train rows whose prompt "
                          f"is also in {test_path}", stacklevel=3)
    else:
        require(0.0 < test_fraction < 1.0, name,
                f"test_fraction must be in (0, 1) when test_path is empty, got {test_fraction}")
        train = [ex for ex, key in rows if seeded_unit(seed, key) >= test_fraction]
        test = [ex for ex, key in rows if seeded_unit(seed, key) < test_fraction]
    for split, items in (("train", train), ("test", test)):
        if not items:
            raise TaskError(f"task {name!r}: the {split} split of {path} is empty "
                            f"({len(rows)} rows, test_fraction={test_fraction}, "
                            f"test_path={test_path!r})")
    return Task(name=name, train=train, test=test, verifier={"name": verifier, "args": {}})


@TASKS.register("jsonl", ranges={"test_fraction": "[0, 1)"})
def jsonl(seed: int, *, path: str, prompt_field: str = "prompt", answer_field: str = "answer",
          demo_field: str = "", id_field: str = "", test_path: str = "",
          test_fraction: float = 0.1, verifier: str = "math",
          prompt_template: str = "{prompt}") -> Task:
    """Examples from a JSON-lines file, one object per line. Columns other than the named
    fields go to ``Example.fields``; ``prompt_template`` may use any column by name."""
    return build(seed, "jsonl", path=path, test_path=test_path, test_fraction=test_fraction,
                 verifier=verifier, prompt_field=prompt_field, answer_field=answer_field,
                 demo_field=demo_field, id_field=id_field, prompt_template=prompt_template)


@TASKS.register("parquet", ranges={"test_fraction": "[0, 1)"})
def parquet(seed: int, *, path: str, prompt_field: str = "prompt", answer_field: str = "answer",
            demo_field: str = "", id_field: str = "", test_path: str = "",
            test_fraction: float = 0.1, verifier: str = "math",
            prompt_template: str = "{prompt}") -> Task:
    """Examples from a Parquet file (read with pyarrow); same options as ``jsonl``."""
    return build(seed, "parquet", path=path, test_path=test_path,
                 test_fraction=test_fraction, verifier=verifier, prompt_field=prompt_field,
                 answer_field=answer_field, demo_field=demo_field, id_field=id_field,
                 prompt_template=prompt_template)
