"""`mistk-rl export RUN_DIR --format torchscript|onnx --out FILE`: a run's acting network,
for use outside mistk-rl.

The agent of a DQN or PPO run (the config's first one, or ``--agent``) is built in this
process from the run's final model (its ``save_path`` in the agent's data dir, else the
checkpoint of the run's last evaluation), exactly as its service builds it. What is exported
is how it acts greedily (eval mode): raw observations [batch, *shape] in, actions [batch]
out (a Box action space: [batch, dims]), with the agent's observation normalisation folded
in. Before the file is kept, the export is run on observations drawn from the observation
space and must give the agent's own actions (a continuous policy: within 1e-5): the figures
are printed. ONNX needs the ``onnx`` package (``pip install 'mistk-rl[export]'``), and is
checked with its reference evaluator.
"""

from __future__ import annotations

import importlib
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import yaml
from gymnasium import spaces

from harness.config import RunConfig, RunConfigError
from harness.run_services import data_dir
from harness.sequence import last_checkpoint, saved_model

FORMATS = ("torchscript", "onnx")
CHECK_ROWS = 256


class _Acting(torch.nn.Module):
    """The agent's greedy acting, as one module: normalise, forward in eval mode, action."""

    def __init__(self, agent: Any) -> None:
        super().__init__()
        self.policy, self.normalizer = agent.policy, agent.normalizer
        self.model = agent.policy.model  # (registered, so tracing sees its parameters)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.normalizer is not None and self.normalizer.norm_obs:
            obs = self.normalizer.obs(obs)
        out = self.policy.eval_mode.forward(obs.float(), None)
        # detached: a Gaussian's mean carries the graph of the parameters, and actions from
        # the exported file should come out as plain tensors (`.numpy()` works on them)
        return out.get("env_action", out["action"]).detach()


def export_run(
    run_dir: Path, fmt: str, out: Path, agent_name: Optional[str] = None, seed: int = 0
) -> dict[str, Any]:
    """Export the run's acting network to `out` (module doc); what was exported and how it
    was checked. RunConfigError for a run that has nothing to export, naming why."""
    if fmt not in FORMATS:
        raise RunConfigError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    with tempfile.TemporaryDirectory(prefix="mistk-export-") as scratch:  # (the agent's files)
        agent, name, model = _load_agent(run_dir, agent_name, Path(scratch))
        return _export(agent, name, model, fmt, out, seed)


def _export(agent: Any, name: str, model: str, fmt: str, out: Path, seed: int) -> dict[str, Any]:
    space = agent.policy.observation_space
    if not isinstance(space, spaces.Box):
        raise RunConfigError(
            f"agent {name!r} observes {space}: only Box observations export (one tensor in)"
        )
    space.seed(seed)
    # traced on a few observations, checked on others (a batch of another size too): a
    # trace that froze anything of its example would fail the check
    example = torch.as_tensor(_draw(space, 7))
    rows = _draw(space, CHECK_ROWS)
    expected, _ = agent.actor.act(rows, None, mode="eval", env_steps=0, warming_up=False)
    net = _Acting(agent).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp, warnings.catch_warnings():
        # (the encoders' torch.as_tensor on a tensor returns it: nothing is frozen, as the
        # check shows; the tracer warns all the same)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        staged = Path(tmp) / out.name
        run = (_torchscript if fmt == "torchscript" else _onnx)(net, example, staged)
        _check(expected, run(rows), name)
        staged.replace(out)
    return {
        "agent": name,
        "model": model,
        "format": fmt,
        "out": str(out),
        "checked_rows": CHECK_ROWS,
        "observation_shape": list(space.shape),
    }


def _load_agent(run_dir: Path, agent_name: Optional[str], scratch: Path) -> tuple[Any, str, str]:
    """The run's agent, built from its final model: (agent, its name, the model file).
    `scratch`: the agent's data directory (the caller removes it)."""
    try:
        config = RunConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    except OSError as exc:
        raise RunConfigError(
            f"{run_dir} is no run directory of mistk-rl run (no config.yaml)"
        ) from exc
    specs = [a for a in config.agents if a.target and (agent_name in (None, a.name))]
    if not specs:
        raise RunConfigError(
            f"no agent {agent_name!r} started by this run "
            f"(its agents: {', '.join(a.name for a in config.agents)})"
        )
    spec = specs[0]
    where = data_dir(run_dir, spec.name)
    here = {spec.name: where}  # (the run's agent started on this machine)
    model = saved_model(spec, here) or last_checkpoint(config, spec, run_dir, here)
    if model is None:
        raise RunConfigError(
            f"agent {spec.name!r}: no saved model in {where} (no save_path "
            "written, no checkpoint in progress.json)"
        )
    assert spec.target is not None  # (`specs` holds the agents the run started)
    module, _, cls_name = spec.target.partition(":")
    agent = getattr(importlib.import_module(module), cls_name)()
    if not hasattr(agent, "actor"):
        raise RunConfigError(
            f"agent {spec.name!r} ({spec.target}) has no network to export: DQN and PPO agents do"
        )
    agent.data_dir = scratch  # (its config.yaml)
    agent.do_initialize(spec.properties, spec.hyperparameters)
    agent.do_build_model(where / model)
    return agent, spec.name, model


def _draw(space: spaces.Box, n: int) -> np.ndarray:
    return np.stack([space.sample() for _ in range(n)]).astype(np.float32)


def _torchscript(
    net: torch.nn.Module, example: torch.Tensor, path: Path
) -> Callable[[np.ndarray], np.ndarray]:
    """Write the traced module; how to run the written file."""
    torch.jit.trace(net, example).save(str(path))
    loaded = torch.jit.load(str(path))
    return lambda rows: loaded(torch.as_tensor(rows)).numpy()


def _onnx(
    net: torch.nn.Module, example: torch.Tensor, path: Path
) -> Callable[[np.ndarray], np.ndarray]:
    """Write the ONNX model; how to run the written file (onnx's reference evaluator)."""
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError as exc:
        raise RunConfigError(
            "--format onnx needs the onnx package: pip install 'mistk-rl[export]'"
        ) from exc
    with warnings.catch_warnings():  # (the TorchScript-based exporter: no onnxscript needed)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.onnx.export(
            net,
            (example,),
            str(path),
            input_names=["obs"],
            output_names=["action"],
            dynamo=False,
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
        )
    evaluator = ReferenceEvaluator(str(path))
    # (onnx types run's result as dict | list: a dict comes only with intermediate=True)
    return lambda rows: evaluator.run(None, {"obs": rows})[0]  # type: ignore[index]


def _check(expected: np.ndarray, got: np.ndarray, name: str) -> None:
    """The export's actions against the agent's own (RuntimeError naming the difference)."""
    expected, got = np.asarray(expected), np.asarray(got).reshape(np.shape(expected))
    if np.issubdtype(expected.dtype, np.integer):
        wrong = int((expected != got).sum())
    else:
        wrong = int((~np.isclose(expected, got, atol=1e-5, rtol=0)).any(axis=-1).sum())
    if wrong:
        raise RuntimeError(
            f"agent {name!r}: the export acts differently from the agent on "
            f"{wrong} of {len(expected)} observations: not written"
        )
