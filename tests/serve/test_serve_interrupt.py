"""`reroll serve` stopped by Ctrl-C reports the interrupt (exit 130) however the signal came
back out of uvicorn: uvicorn re-raises it after shutting down, but asyncio's runner drops it
when the server's task has already finished, and then `Server.run` just returns."""

import pytest

uvicorn = pytest.importorskip("uvicorn")

from reroll.cli import main  # noqa: E402


def test_a_server_told_to_exit_after_starting_is_reported_as_interrupted(tiny_dir, monkeypatch,
                                                                         capsys):
    def run_then_swallowed_signal(self, sockets=None):  # the race's outcome, made certain
        self.started, self.should_exit = True, True

    monkeypatch.setattr(uvicorn.Server, "run", run_then_swallowed_signal)
    assert main(["serve", str(tiny_dir), "--port", "0"]) == 130
    assert "reroll serve: interrupted" in capsys.readouterr().err


def test_a_server_that_never_started_is_not_an_interrupt(tiny_dir, monkeypatch):
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    assert main(["serve", str(tiny_dir), "--port", "0"]) == 0
