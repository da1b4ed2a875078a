"""The ``code`` verifier: run the completion's program against test cases in the sandbox.

Owns turning ``example.fields["tests"]`` into sandbox runs and a pass fraction. Must not
know how the sandbox isolates (see ``reroll.verifiers.sandbox``).

The program is the last fenced block (```python, ```py or a bare ```), else the whole
completion. Test formats accepted in ``fields["tests"]``:

- a list of ``{"input": str, "output": str}``: stdin/expected-stdout pairs; outputs are
  compared token by token (whitespace-insensitive);
- a dict ``{"inputs": [...], "outputs": [...]}``: the same, as two parallel lists;
- a list of strings: assert-style statements (``"assert add(1, 2) == 3"``), each appended
  to the program and run on its own. A test passes when the process exits 0 *and* prints
  a per-run random token placed after the asserts, so an early ``sys.exit(0)`` does not
  pass. (A program that reads its own source could still find the token.)

Score = passed / total, with ``info["tests"]`` giving each test's pass flag and reason. A
program that fails or breaks limits is a low score, not an error; an error means the
tests are malformed or the sandbox could not run.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from reroll.rollout import Example, Rollout, Score
from reroll.verifiers.base import VERIFIERS, Verifier, judged, need_field
from reroll.verifiers.sandbox import Limits, RunResult, run_python

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_program(text: str) -> str:
    """The last fenced code block, else the whole completion (stripped)."""
    blocks = _FENCE.findall(text)
    return (blocks[-1] if blocks else text).strip()


def normalize_tests(name: str, example: Example) -> list[tuple[str, str | None, str | None]]:
    """[(kind, stdin or assert source, expected stdout)] with kind "io" or "assert"."""
    tests = need_field(name, example, "tests")
    where = f"verifier {name!r}: example {example.prompt_id!r} fields['tests']"
    if isinstance(tests, dict):
        ins, outs = tests.get("inputs"), tests.get("outputs")
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise ValueError(f"{where}: a dict needs 'inputs' and 'outputs' lists of equal "
                             f"length, got keys {sorted(tests)}")
        tests = [{"input": i, "output": o} for i, o in zip(ins, outs, strict=True)]
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{where}: expected a non-empty list of tests, got {type(tests).__name__}")
    out: list[tuple[str, str | None, str | None]] = []
    for i, t in enumerate(tests):
        if isinstance(t, str):
            out.append(("assert", t, None))
        elif isinstance(t, dict) and "input" in t and "output" in t:
            out.append(("io", str(t["input"]), str(t["output"])))
        else:
            raise ValueError(f"{where}[{i}]: expected an assert string or "
                             f"{{'input', 'output'}}, got {t!r:.80}")
    return out


def _judge_io(res: RunResult, expected: str) -> tuple[bool, str]:
    if not res.ok:
        return False, res.reason
    if res.stdout.split() == expected.split():
        return True, "output matches"
    got = res.stdout.strip()[:80]
    return False, f"wrong output: got {got!r}, expected {expected.strip()[:80]!r}"


def _judge_assert(res: RunResult, token: str) -> tuple[bool, str]:
    if not res.ok:
        return False, res.reason
    last = res.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    if last != token:
        return False, "program exited before the test ran (completion token not printed)"
    return True, "assertion holds"


@dataclass
class CodeVerifier:
    limits: Limits
    name: str = "code"

    def __call__(self, rollout: Rollout, example: Example) -> Score:
        tests = normalize_tests(self.name, example)
        program = extract_program(rollout.completion)
        if not program:
            return judged(self.name, 0.0, "no program found", parsed=None, tests=[])
        results = []
        for kind, src, expected in tests:
            if kind == "io":
                res = run_python(program, stdin=src or "", limits=self.limits)
                ok, why = _judge_io(res, expected or "")
            else:
                token = secrets.token_hex(8)
                res = run_python(f"{program}\n\n{src}\nprint({token!r})", limits=self.limits)
                ok, why = _judge_assert(res, token)
            results.append({"passed": ok, "reason": why})
        passed = sum(r["passed"] for r in results)
        first_fail = next((r["reason"] for r in results if not r["passed"]), None)
        reason = f"{passed}/{len(results)} tests passed" + (
            f"; first failure: {first_fail}" if first_fail else "")
        return judged(self.name, passed / len(results), reason, parsed=program[:2000],
                      tests=results)


@VERIFIERS.register("code", ranges={"cpu_s": "[1, inf)", "wall_s": "(0, inf)",
                                    "memory_mb": "[16, inf)", "file_mb": "[0, inf)",
                                    "nproc": "[1, inf)"})
def code(*, cpu_s: int = 2, wall_s: float = 4.0, memory_mb: int = 512, file_mb: int = 8,
         nproc: int = 32) -> Verifier:
    """Fraction of ``fields["tests"]`` the completion's program passes, each test run in a
    fresh sandbox with these limits (see ``reroll.verifiers.sandbox``). Keep the scoring
    pool's ``timeout_s`` above ``wall_s`` times the number of tests."""
    for key, v in (("cpu_s", cpu_s), ("wall_s", wall_s), ("memory_mb", memory_mb),
                   ("file_mb", file_mb), ("nproc", nproc)):
        if v <= 0:
            raise ValueError(f"verifier 'code': {key} must be > 0, got {v}")
    return CodeVerifier(Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb,
                               file_mb=file_mb, nproc=nproc))


code.needs_sandbox = True  # read when a run starts: the sandbox's isolation is checked
