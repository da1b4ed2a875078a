"""The rollout store: every consumed rollout of a run, append-only, in Parquet (pyarrow).

Layout: ``RUN/rollouts/step_000000123.parquet`` holds the groups consumed by step 123, one
row per rollout, in the order the trainer saw them. Each file is written to a hidden
temporary name and renamed, so a reader (a notebook, `reroll replay`, a dashboard) listing
the directory while the run writes only ever opens whole files, and a kill mid-write leaves
no torn file. A resumed run drops the files of steps after its checkpoint (`truncate`) and
writes them again.

Columns are derived from the record's dataclasses (`reroll.rollout`), so a field added to
`Rollout` or `Group` is stored without an edit here: ints, floats, bools and strings are
typed columns (``list[int]`` as ``list<int32>``: token ids and versions), lists of records
(``scores``, ``spans``) and records (``sampling``, ``group.example``) are lists of structs
and structs, and anything else (dicts such as ``timings``, ``shaping``, ``Score.info``) is a
JSON string. Group fields are columns named ``group.<field>``; ``step``, ``batch_group``
(the group's position in the step's batch) and ``batch_row`` (the rollout's position in the
trainer's flattened batch) say where the row was consumed. A `Group` read back equals the
one written (floats are float64, JSON keeps Python's float repr).

Owns the file format and the reader API. Knows nothing of training, the loop or the run
directory's other files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reroll.errors import ConfigError
from reroll.rollout import Group, Rollout

_FILE = re.compile(r"^step_(\d{9})\.parquet$")
_POSITION = [("step", pa.int64()), ("batch_group", pa.int32()), ("batch_row", pa.int32())]


# ---- codecs: one per dataclass field, from its type hint ------------------------------

@dataclasses.dataclass(frozen=True)
class _Codec:
    type: pa.DataType
    encode: Callable[[Any], Any]  # Python value -> what pyarrow takes
    decode: Callable[[Any], Any]  # what pyarrow gives back -> the value `from_dict` takes


def _same(x: Any) -> Any:
    return x


_JSON = _Codec(pa.string(), lambda x: json.dumps(x, separators=(",", ":")),
               lambda s: None if s is None else json.loads(s))
_SCALARS = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}
_ELEMENTS = {int: pa.int32(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}


def _codec(hint: Any) -> _Codec:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:  # X | None: X's column, nullable
            inner = _codec(rest[0])
            return _Codec(inner.type, lambda x: None if x is None else inner.encode(x),
                          lambda x: None if x is None else inner.decode(x))
        return _JSON
    if origin is typing.Literal and all(isinstance(a, str) for a in args):
        return _Codec(pa.string(), _same, _same)
    if hint in _SCALARS:
        return _Codec(_SCALARS[hint], _same, _same)
    if origin is list and len(args) == 1:
        if args[0] in _ELEMENTS:
            return _Codec(pa.list_(_ELEMENTS[args[0]]), _same, _same)
        if dataclasses.is_dataclass(args[0]):
            item = _record(args[0])
            return _Codec(pa.list_(item.type), lambda xs: [item.encode(x) for x in xs],
                          lambda xs: [item.decode(x) for x in xs])
    if dataclasses.is_dataclass(hint):
        return _record(hint)
    return _JSON


def _record(cls: type) -> _Codec:
    """A dataclass as a struct of its fields (given as a dict, read back as a dict)."""
    codecs = _field_codecs(cls)
    struct = pa.struct([pa.field(n, c.type) for n, c in codecs.items()])

    def encode(x: Any) -> dict:
        d = x if isinstance(x, dict) else {f.name: getattr(x, f.name)
                                           for f in dataclasses.fields(x)}
        return {n: c.encode(d[n]) for n, c in codecs.items()}

    def decode(d: dict) -> dict:
        return {n: c.decode(d[n]) for n, c in codecs.items() if n in d}

    return _Codec(struct, encode, decode)


def _field_codecs(cls: type, skip: tuple[str, ...] = ()) -> dict[str, _Codec]:
    hints = typing.get_type_hints(cls)
    return {f.name: _codec(hints[f.name]) for f in dataclasses.fields(cls) if f.name not in skip}


_ROLLOUT = _field_codecs(Rollout)
_GROUP = {f"group.{n}": c for n, c in _field_codecs(Group, skip=("rollouts",)).items()}
SCHEMA = pa.schema([pa.field(n, t) for n, t in _POSITION]
                   + [pa.field(n, c.type) for n, c in {**_GROUP, **_ROLLOUT}.items()])


def to_table(step: int, groups: Iterable[Group]) -> pa.Table:
    """One step's consumed groups as rows (one per rollout, in batch order)."""
    cols: dict[str, list] = {n: [] for n in SCHEMA.names}
    row = 0
    for gi, g in enumerate(groups):
        if not g.rollouts:
            raise ValueError(f"rollout store: group {g.group_id} of step {step} has no "
                             f"rollouts (a row is a rollout; an empty group cannot be stored)")
        gvals = {f"group.{f.name}": getattr(g, f.name) for f in dataclasses.fields(g)}
        for r in g.rollouts:
            cols["step"].append(step)
            cols["batch_group"].append(gi)
            cols["batch_row"].append(row)
            row += 1
            for n, c in _GROUP.items():
                cols[n].append(c.encode(gvals[n]))
            for n, c in _ROLLOUT.items():
                cols[n].append(c.encode(getattr(r, n)))
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def from_table(table: pa.Table) -> Iterator[tuple[int, Group]]:
    """(step, Group) per group of ``table``, in (step, batch position) order."""
    names = set(table.column_names)
    groups: dict[tuple[int, int], Group] = {}
    rows = sorted(table.to_pylist(), key=lambda x: (x["step"], x["batch_row"]))
    for x in rows:
        key = (x["step"], x["batch_group"])
        if key not in groups:
            g = {n[len("group."):]: c.decode(x[n]) for n, c in _GROUP.items() if n in names}
            groups[key] = Group.from_dict({**g, "rollouts": []})
        r = {n: c.decode(x[n]) for n, c in _ROLLOUT.items() if n in names}
        groups[key].rollouts.append(Rollout.from_dict(r))
    for (step, _), g in groups.items():
        yield step, g


# ---- the store -------------------------------------------------------------------------

class RolloutStore:
    """The rollouts of one run: ``RolloutStore(RUN_DIR)`` (or ``RUN_DIR/rollouts``).

    Writing: `append` (one file per step, atomic), `truncate` (on resume). Reading, also
    while the run writes: `steps`, `batch(step)` (the step's groups in training order),
    `groups` (an iterator of (step, Group)), `table` (pyarrow, for analysis)."""

    def __init__(self, path: str | Path):
        p = Path(path)
        self.path = p if p.name == "rollouts" and not (p / "rollouts").exists() else p / "rollouts"

    def _file(self, step: int) -> Path:
        return self.path / f"step_{step:09d}.parquet"

    # ---- writing -----------------------------------------------------------------------
    def append(self, step: int, groups: Iterable[Group]) -> Path:
        """Store the groups consumed by ``step``; a step written again (after a resume)
        replaces its file."""
        if step < 0:
            raise ValueError(f"rollout store {self.path}: step {step} < 0")
        table = to_table(step, groups)
        self.path.mkdir(parents=True, exist_ok=True)
        final = self._file(step)
        tmp = self.path / f".{final.name}.tmp"
        try:
            pq.write_table(table, tmp, compression="zstd")
        except OSError as e:  # a full disk, say: the path named, no half-written file left
            tmp.unlink(missing_ok=True)
            raise OSError(e.errno, f"rollout store: could not write step {step} to {final}: "
                          f"{e.strerror or e}") from e
        os.replace(tmp, final)  # atomic: readers see the whole file or none
        return final

    def truncate(self, step: int) -> None:
        """Forget the records of steps after ``step`` (a resume from the checkpoint at
        ``step`` redoes them), and any file a kill left half-written."""
        if not self.path.is_dir():
            return
        for p in self.path.iterdir():
            m = _FILE.match(p.name)
            if (m and int(m.group(1)) > step) or (p.name.startswith(".")
                                                  and p.name.endswith(".tmp")):
                p.unlink(missing_ok=True)

    # ---- reading -----------------------------------------------------------------------
    def steps(self) -> list[int]:
        """The recorded steps, ascending (the files complete at the moment of the call)."""
        if not self.path.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.path.iterdir() if (m := _FILE.match(p.name)))

    def table(self, steps: Iterable[int] | None = None,
              columns: list[str] | None = None) -> pa.Table:
        """The rows of ``steps`` (default: every recorded step) as one pyarrow table."""
        chosen = self.steps() if steps is None else list(steps)
        parts = [self._read(s, columns) for s in chosen]
        if not parts:
            return SCHEMA.empty_table() if columns is None else pa.schema(
                [SCHEMA.field(c) for c in columns]).empty_table()
        return pa.concat_tables(parts, promote_options="default")

    def batch(self, step: int) -> list[Group]:
        """The groups consumed by ``step``, in the order the trainer took them."""
        return [g for _, g in from_table(self._read(step))]

    def groups(self, steps: Iterable[int] | None = None) -> Iterator[tuple[int, Group]]:
        """(step, Group) for every recorded group, step by step (one file in memory)."""
        for s in self.steps() if steps is None else steps:
            for g in self.batch(s):
                yield s, g

    def _read(self, step: int, columns: list[str] | None = None) -> pa.Table:
        p = self._file(step)
        if not p.is_file():
            have = self.steps()
            raise FileNotFoundError(
                f"rollout store {self.path}: no record of step {step} (recorded: "
                f"{_ranges(have) or 'none'})")
        try:
            return pq.read_table(p, columns=columns)
        except (pa.ArrowInvalid, OSError) as e:  # a truncated or overwritten file
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"rollout store: {p} cannot be read, the file is damaged "
                              f"({first.split(': ')[-1]})") from None


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out: list[str] = []
    for s in steps:
        if out and s == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)
