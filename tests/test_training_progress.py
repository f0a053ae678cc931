"""What `mistk-rl run` shows while training, and the learning curve it leaves."""

from __future__ import annotations

import io

import harness.progress as progress_module
from harness.progress import TrainingProgress
from harness.training import write_curve


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    out = io.StringIO()
    shown = TrainingProgress(1000, stream=out)
    shown.update(500)
    shown.evaluated(12.5)
    shown.update(600)
    shown.write("  eval line")
    shown.close()
    lines = out.getvalue().splitlines()
    assert "500/1,000 env steps (50.0%)" in lines[0] and "last eval none yet" in lines[0]
    assert "600/1,000" in lines[1] and "last eval 12.50" in lines[1]
    assert lines[2] == "  eval line" and "\r" not in out.getvalue()


def test_a_bar_on_a_terminal():
    out = Terminal()
    shown = TrainingProgress(1000, done_steps=200, stream=out)  # a resumed run starts there
    shown.update(700)
    shown.evaluated(99.0)
    shown.write("  eval line")
    shown.close()
    text = out.getvalue()
    assert "training" in text and "700/1" in text and "last eval 99.00" in text
    assert "  eval line" in text


def test_quiet_shows_nothing(monkeypatch):
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    out = Terminal()
    shown = TrainingProgress(10, stream=out, quiet=True)
    shown.update(5)
    shown.write("x")
    shown.close()
    assert out.getvalue() == ""


def test_learning_curve_with_training_returns_and_stop_value(tmp_path):
    evals = [
        {"env_steps": s, "wall_s": s / 100, "mean_return": m, "std_return": 5.0}
        for s, m in ((100, 20.0), (200, 60.0))
    ]
    train = [[10 * i, float(i)] for i in range(1, 30)]
    write_curve(evals, tmp_path, stop_value=50.0, train_returns=train, title="t")
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    assert (tmp_path / "evals.csv").read_text().splitlines()[1].startswith("100,")
