"""The jsonl and parquet tasks: fields, templates, seeded disjoint splits, row-level errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reroll.tasks import TASKS, TaskError

ROWS = [{"question": f"What is {i} + {i}?", "answer": 2 * i, "level": i % 3, "uid": f"q{i}"}
        for i in range(40)]


def write_jsonl(path, rows, raw_lines=()):
    lines = [json.dumps(r) for r in rows] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def load(kind, seed=0, **kw):
    return TASKS.get(kind)(seed, **kw)


@pytest.fixture(params=["jsonl", "parquet"])
def kind_and_path(request, tmp_path):
    writer = write_jsonl if request.param == "jsonl" else write_parquet
    return request.param, writer(tmp_path / f"data.{request.param}", ROWS)


def test_fields_template_and_extra_columns(kind_and_path):
    kind, path = kind_and_path
    task = load(kind, path=path, prompt_field="question", id_field="uid", test_fraction=0.25,
                prompt_template="Q{level}: {prompt} A:", verifier="numeric")
    by_id = {e.prompt_id: e for e in task.train + task.test}
    ex = by_id["q7"]
    assert ex.prompt == "Q1: What is 7 + 7? A:"  # level = 7 % 3 = 1
    assert ex.answer == "14"  # an integer answer column becomes its decimal text
    assert ex.demo is None
    assert ex.fields == {"level": 1}  # question, answer and uid are the named fields
    assert task.verifier == {"name": "numeric", "args": {}}
    assert task.name == kind


def test_split_is_seeded_disjoint_and_complete(kind_and_path):
    kind, path = kind_and_path
    a, b, c = (load(kind, s, path=path, prompt_field="question", test_fraction=0.3)
               for s in (0, 0, 1))
    assert a.train == b.train and a.test == b.test
    train, test = {e.prompt for e in a.train}, {e.prompt for e in a.test}
    assert not train & test
    assert train | test == {r["question"] for r in ROWS}
    assert {e.prompt for e in c.test} != test


def test_jsonl_and_parquet_give_identical_tasks(tmp_path):
    kw = dict(prompt_field="question", demo_field="uid", test_fraction=0.2)
    j = load("jsonl", path=write_jsonl(tmp_path / "d.jsonl", ROWS), **kw)
    p = load("parquet", path=write_parquet(tmp_path / "d.parquet", ROWS), **kw)
    assert j.train == p.train and j.test == p.test
    assert {e.prompt: e.demo for e in j.train + j.test} == {r["question"]: r["uid"] for r in ROWS}


def test_repeated_prompts_get_distinct_ids_and_the_same_side(tmp_path):
    rows = ROWS + [{"question": "What is 3 + 3?", "answer": 6, "level": 0, "uid": "dup"}]
    task = load("jsonl", path=write_jsonl(tmp_path / "d.jsonl", rows), prompt_field="question",
                test_fraction=0.3)
    same = [e for e in task.train + task.test if e.prompt == "What is 3 + 3?"]
    assert len(same) == 2 and same[0].prompt_id != same[1].prompt_id
    assert (same[0] in task.test) == (same[1] in task.test)


def test_test_path_is_used_and_overlapping_train_rows_dropped(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS[:10])
    test = write_jsonl(tmp_path / "test.jsonl", ROWS[8:12])  # rows 8 and 9 overlap
    with pytest.warns(UserWarning, match="dropped 2 train rows"):
        task = load("jsonl", path=train, test_path=test, prompt_field="question")
    assert [e.fields["level"] for e in task.test] == [8 % 3, 9 % 3, 10 % 3, 11 % 3]
    assert len(task.train) == 8
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.test}


def test_blank_lines_are_skipped_but_counted(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n')
    with pytest.raises(TaskError, match=r"d\.jsonl: line 3: missing field 'answer'"):
        load("jsonl", path=str(path))


BAD_JSONL = [
    ('{"prompt": "x", "answer": "1"', "invalid JSON"),
    ('["x", "1"]', "expected an object, got list"),
    ('{"answer": "1"}', "missing field 'prompt'"),
    ('{"prompt": 5, "answer": "1"}', "field 'prompt' must be a string, got int"),
    ('{"prompt": "  ", "answer": "1"}', "field 'prompt' is empty"),
    ('{"prompt": "x", "answer": [1]}', "field 'answer' must be a string or a number, got list"),
    ('{"prompt": "x", "answer": null}', "field 'answer' must be a string or a number"),
]


@pytest.mark.parametrize("line, what", BAD_JSONL)
def test_malformed_jsonl_row_names_file_line_and_problem(tmp_path, line, what):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "answer": "1"}] * 2, [line])
    with pytest.raises(TaskError) as err:
        load("jsonl", path=path)
    assert f"{path}: line 3: " in str(err.value) and what in str(err.value)


def test_malformed_parquet_row_names_file_row_and_problem(tmp_path):
    rows = [{"prompt": "ok", "answer": "1"}, {"prompt": None, "answer": "2"}]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(TaskError, match=r"bad\.parquet: row 2: field 'prompt' must be a string"):
        load("parquet", path=path)
    path = write_parquet(tmp_path / "cols.parquet", [{"text": "x", "answer": "1"}])
    with pytest.raises(TaskError, match=r"row 1: missing field 'prompt' \(has: text, answer\)"):
        load("parquet", path=path)


def test_unreadable_or_missing_files_name_the_path(tmp_path):
    with pytest.raises(TaskError, match="data file not found: .*nope.jsonl"):
        load("jsonl", path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(TaskError, match=r"junk\.parquet: cannot read as Parquet"):
        load("parquet", path=str(tmp_path / "junk.parquet"))
    (tmp_path / "latin.jsonl").write_bytes(b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(TaskError, match=r"latin\.jsonl: not UTF-8"):
        load("jsonl", path=str(tmp_path / "latin.jsonl"))
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(TaskError, match="data file not found: .*missing_test.jsonl"):
        load("jsonl", path=path, prompt_field="question",
             test_path=str(tmp_path / "missing_test.jsonl"))


def test_duplicate_ids_template_errors_and_empty_splits(tmp_path):
    rows = [{"prompt": "a", "answer": "1", "id": 1}, {"prompt": "b", "answer": "2", "id": 1}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(TaskError, match=r"line 2: duplicate id '1' \(first at row 1\)"):
        load("jsonl", path=path, id_field="id")
    with pytest.raises(TaskError, match=r"line 1: prompt_template .*KeyError"):
        load("jsonl", path=path, prompt_template="{prompt} {nothing}")
    one = write_jsonl(tmp_path / "one.jsonl", rows[:1])
    with pytest.raises(TaskError, match="split of .*one.jsonl is empty"):
        load("jsonl", path=one)
    with pytest.raises(TaskError, match="test_fraction must be in"):
        load("jsonl", path=path, test_fraction=1.0)
