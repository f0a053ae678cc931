"""The players of a ladder (`harness.ladder`), gathered from run directories and the
built-in opponents into the ladder's own run config."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.config import AgentSpec, RunConfig, RunConfigError, load_config
from harness.run_services import data_dir
from harness.sequence import last_checkpoint, saved_model

LADDER_MODEL = "ladder-model.pt"  # where a player's model is copied, in its data dir
GAME_ORCHESTRATOR = "orchestrators.game_orchestrator:GameOrchestrator"


def ladder_config(
    runs: Sequence[str],
    opponents: Sequence[str],
    out: Path,
    *,
    agent: Optional[str] = None,
    snapshots: int = 0,
    checkpoints: bool = False,
    anchor: Optional[str] = None,
    games_per_seat: int = 100,
    mode: str = "sampled",
    game: Optional[str] = None,
    groups: Optional[dict[str, list[str]]] = None,
) -> RunConfig:
    """The ladder's run config (`harness.ladder`'s module doc: who plays; `checkpoints`:
    each run's evaluation checkpoints in place of its final model), the players' models
    copied into their data dirs under `out` (so the run can be started again from
    its config.yaml). `game`: the game's id, which the runs must play too."""
    from mistk_rl.games.opponents import OPPONENTS

    agents: list[dict[str, Any]] = []
    games: set[str] = set()
    for given in runs:
        label, _, where = given.rpartition("=")
        run_dir = Path(where)
        config = load_config(run_dir / "config.yaml")
        games.add(str(config.orchestrator.env.id))
        spec = evaluated_agent(config, agent, run_dir)
        name = _name(label or run_dir.resolve().name)
        if checkpoints:
            for steps, path in _checkpoints(run_dir, spec.name):
                agents.append(as_player(spec, _name(f"{name}:step-{steps}"), path, out))
        else:
            agents.append(as_player(spec, name, final_model(config, spec, run_dir), out))
        for player_id, path in _snapshots(run_dir, spec.name, snapshots):
            agents.append(as_player(spec, _name(f"{name}:{player_id}"), path, out))
    for k, opponent in enumerate(opponents):
        if opponent not in OPPONENTS:
            raise RunConfigError(
                f"--opponents: {opponent!r} is not a built-in opponent "
                f"(one of {', '.join(OPPONENTS)})"
            )
        kind = "SearchOpponentAgent" if OPPONENTS[opponent].searches else "OpponentAgent"
        agents.append(
            {
                "name": opponent,
                "target": f"agents.opponent_agents:{kind}",
                "train": False,
                "hyperparameters": {"opponent": opponent, "seed": 1000 + k},
            }
        )
    if game:
        games.add(game)
    if len(games) != 1:
        raise RunConfigError(
            "a ladder is of one game: "
            + (f"its players play {', '.join(sorted(games))}" if games else "give --game ID")
        )
    players = [a["name"] for a in agents]
    if len(set(players)) != len(players):
        raise RunConfigError(f"two players have one name: {players} (label them LABEL=RUN_DIR)")
    return RunConfig.model_validate(
        {
            "name": "ladder",
            "orchestrator": {"target": GAME_ORCHESTRATOR, "env": {"id": games.pop()}},
            "agents": agents,
            "ladder": {
                "players": players,
                "anchor": anchor or (opponents[0] if opponents else players[0]),
                "games_per_seat": games_per_seat,
                "mode": mode,
                "groups": groups or {},
            },
        }
    )


def evaluated_agent(config: RunConfig, agent: Optional[str], run_dir: Path) -> AgentSpec:
    """The run's agent named `agent`, else its evaluated one, else its first."""
    name = agent or (config.evaluation.agent if config.evaluation else config.agents[0].name)
    for spec in config.agents:
        if spec.name == name:
            return spec
    raise RunConfigError(f"{run_dir}: no agent {name!r} in its config")


def final_model(config: RunConfig, spec: AgentSpec, run_dir: Path) -> Path:
    """The model the agent saved, else its last evaluation's checkpoint."""
    where = {spec.name: data_dir(run_dir, spec.name)}
    model = saved_model(spec, where) or last_checkpoint(config, spec, run_dir, where)
    if model is None:
        raise RunConfigError(
            f"{run_dir}: agent {spec.name} left no model (no save_path file, no checkpoint "
            "in progress.json)"
        )
    return where[spec.name] / model


def _checkpoints(run_dir: Path, agent: str) -> list[tuple[int, Path]]:
    """The agent's kept evaluation checkpoints (``checkpoints/step-N.pt``), by moves."""
    kept = sorted(
        (int(path.stem.removeprefix("step-")), path)
        for path in (data_dir(run_dir, agent) / "checkpoints").glob("step-*.pt")
    )
    if not kept:
        raise RunConfigError(f"--checkpoints: {run_dir} kept no checkpoint of {agent}")
    return kept


def _snapshots(run_dir: Path, player: str, last: int) -> list[tuple[str, Path]]:
    """A league run's last `last` snapshots of `player`: (snapshot id, checkpoint file)."""
    if last <= 0:
        return []
    orchestrator = data_dir(run_dir, "orchestrator")
    state = orchestrator / "league" / "league.json"
    if not state.is_file():
        raise RunConfigError(f"--snapshots: {run_dir} is not a league run (no league.json)")
    historical = json.loads(state.read_text())["historical"]
    mine = [h for h in historical if h.get("parent_id") == player and h.get("checkpoint_path")]
    mine.sort(key=lambda h: h["total_agent_step"])
    return [(h["player_id"], orchestrator / h["checkpoint_path"]) for h in mine[-last:]]


def as_player(spec: AgentSpec, name: str, model: Path, out: Path) -> dict[str, Any]:
    """The agent `spec` as a ladder player: its model copied into its data dir, loaded at
    buildModel, never trained, saving nothing."""
    if not model.is_file():
        raise RunConfigError(f"player {name}: {model} is not a file")
    where = data_dir(out, name)
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, where / LADDER_MODEL)
    frozen = spec.model_dump(exclude={"seats", "save_path", "local_inference"})
    return {**frozen, "name": name, "train": False, "model_path": LADDER_MODEL}


def _name(text: str) -> str:
    """A player's name as agent names go (letters, digits, ``_.:-``; 64 at most)."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", text)[-64:]
