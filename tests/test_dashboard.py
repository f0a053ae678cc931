"""The dashboard in a real browser (Debian's chromium over the DevTools protocol,
tests/browser.py): the page draws the runs' numbers (two seeds of a gym config as one band,
a league's payoff heatmap and ratings, a real agent service's state from its /metrics)
and follows them as the files and the service change. Its bands, unit-tested apart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.dashboard import Dashboard
from harness.dashboard.view import SERVICES, _band, _train_band
from mistk_rl.files import atomic_write_json
from tests.browser import CHROMIUM, Browser
from tests.conftest import RANDOM_AGENT

IDS = ["main", "main_exploiter", "main_0_0"]


def _gym_run(root: Path, seed: int, evals: list[tuple[int, float]]) -> Path:
    run = root / f"gym-{seed}"
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump({"name": "dash_gym", "training": {"seed": seed, "stop_value": 475}})
    )
    _progress(run, evals)
    return run


def _progress(run: Path, evals: list[tuple[int, float]]) -> None:
    atomic_write_json(
        run / "progress.json",
        {
            "evals": [{"env_steps": x, "mean_return": m, "std_return": 2.0} for x, m in evals],
            "train_returns": [[10 * i, float(i % 50)] for i in range(1, 400)],
        },
    )


def _league_run(root: Path) -> Path:
    run = root / "league"
    run.mkdir()
    (run / "config.yaml").write_text(
        yaml.safe_dump({"name": "dash_league", "game_training": {"seed": 0}})
    )
    players = [
        {"id": p, "kind": k, "steps": s, "exposure": e, "elo": 1200.0}
        for p, k, s, e in zip(
            IDS, ["MainPlayer", "MainExploiter", "HistoricalPlayer"], [900, 800, 400], [3, 2, 1]
        )
    ]
    evaluation = {
        "random": {"seats": {"player_1": {"win": 0.75}, "player_2": {"win": 0.5}}},
        "winblock": {"trained_against": True, "seats": {"player_1": {"win": 0.25}}},
    }
    atomic_write_json(
        run / "results.json",
        {
            "evals": [
                {
                    "agent_steps": at,
                    "evaluation": evaluation,
                    "league": [{**p, "exposure": p["exposure"] * at / 900} for p in players],
                }
                for at in (300, 900)
            ],
            "league": {
                "players": players,
                "payoff": {
                    "ids": IDS,
                    "winRate": [[0.5, 0.625, 0.9], [0.375, 0.5, 0.5], [0.1, 0.5, 0.5]],
                    "games": [[0, 64, 32], [64, 0, 0], [32, 0, 0]],
                },
            },
        },
    )
    return run


def _in(page, group: str, figure: str, series: str, attribute: str) -> str:
    return (
        f'document.querySelector(\'section.group[data-name="{group}"] figure.{figure} '
        f'g[data-name="{series}"]\')?.dataset.{attribute}'
    )


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs chromium (Debian's package; .ci/run installs it)"
)
def test_the_page_draws_the_runs_and_follows_them(tmp_path, launch):
    seed0 = _gym_run(tmp_path, 0, [(1000, 20.0), (2000, 60.0)])
    seed1 = _gym_run(tmp_path, 1, [(1000, 30.0), (2000, 80.0)])
    league = _league_run(tmp_path)
    agent = launch("agent", RANDOM_AGENT)
    atomic_write_json(seed0 / SERVICES, {"player": {"role": "agent", "url": agent.url}})
    with Dashboard([seed0, seed1, league]) as dashboard, Browser() as browser:
        page = browser.open(dashboard.url)
        page.wait_for("Number(document.getElementById('updated').dataset.polls) >= 1")
        # two seeds of one config: one group, the evaluations' mean over them
        assert page.evaluate("document.querySelectorAll('section.group').length") == 2
        assert float(page.evaluate(_in(page, "dash_gym", "evals", "mean return", "last"))) == 70.0
        assert page.evaluate(_in(page, "dash_gym", "evals", "mean return", "n")) == "2"
        assert (
            int(
                page.evaluate(
                    _in(page, "dash_gym", "returns", "training episodes (mean of 2 runs)", "n")
                )
            )
            > 50
        )
        # games: win rate per opponent and seat
        assert (
            float(page.evaluate(_in(page, "dash_league", "evals", "random / player_1", "last")))
            == 0.75
        )
        # an opponent it trains against is marked so
        marked = _in(page, "dash_league", "evals", "winblock (trained against) / player_1", "last")
        assert float(page.evaluate(marked)) == 0.25
        # the league: a 3 x 3 heatmap with the games played, ratings for every player
        assert page.evaluate("document.querySelectorAll('#payoff rect').length") == 9
        cell = (
            'document.querySelector(\'#payoff rect[data-row="main"][data-col="main_exploiter"]\')'
        )
        assert page.evaluate(f"{cell}.dataset.games") == "64"
        assert page.evaluate(f"{cell}.dataset.rate") == "0.625"
        assert page.evaluate("document.querySelector('#ratings svg').dataset.series") == "3"
        # the service: its lifecycle state, read from its /metrics
        row = "document.querySelector('#services tr[data-key=\"0/player\"]')"
        assert page.evaluate(f"{row}.dataset.up") == "true"
        before = agent.client().status().state
        assert page.evaluate(f"{row}.dataset.state") == before

        # the run goes on: a third evaluation, and the agent moves on in its lifecycle
        _progress(seed0, [(1000, 20.0), (2000, 60.0), (3000, 100.0)])
        _progress(seed1, [(1000, 30.0), (2000, 80.0), (3000, 140.0)])
        agent.client().initialize({}, {})
        after = agent.client().status().state
        assert after != before
        page.wait_for(f"{_in(page, 'dash_gym', 'evals', 'mean return', 'last')} === '120'")
        page.wait_for(f"{row}.dataset.state === '{after}'")
        agent.stop()  # a service gone is shown down, not dropped
        page.wait_for(f"{row}.dataset.up === 'false'")
        assert "down" in page.evaluate(f"{row}.textContent")


def test_bands_over_seeds_and_within_a_run():
    one = _band([[{"x": 1, "mean": 10.0, "std": 2.0}]])
    assert one == [{"x": 1, "mean": 10.0, "lo": 8.0, "hi": 12.0}]
    two = _band(
        [
            [{"x": 1, "mean": 10.0, "std": 0}],
            [{"x": 1, "mean": 30.0, "std": 0}, {"x": 2, "mean": 5, "std": 0}],
        ]
    )
    assert two == [{"x": 1, "mean": 20.0, "lo": 10.0, "hi": 30.0}]  # x=2: one run only
    steps = np.arange(1, 1001, dtype=float)
    run = np.column_stack((steps, steps % 10))
    binned = _train_band([run])
    assert len(binned) == 120 and all(b["lo"] <= b["mean"] <= b["hi"] for b in binned)
    assert binned[-1]["x"] == pytest.approx(1000 - 1000 / 240)
    pair = _train_band([run, np.column_stack((steps, steps % 10 + 10))])
    assert all(b["hi"] - b["lo"] == pytest.approx(10.0) for b in pair)
    assert json.dumps(binned)  # plain floats
