"""`mistk-rl bench parity`: our agents over HTTP against Stable-Baselines3 in-process, with the
same hyperparameters and the same evaluation protocol, on a suite of tasks.

Each suite entry is one training config under ``configs/suite/`` (rl-baselines3-zoo's tuned
values; each file says where a value has no equivalent here). Per entry and seed, the config
runs as ``mistk-rl run CONFIG --seed N`` would (services on loopback), then SB3 runs from the
same file (`sb3.sb3_setup` maps the keys), one right after the other so both meet the
same machine: on shared machines the speed drifts by 2x within an hour, so only figures from
one sitting compare. Each side reports env steps and seconds to its first evaluation >=
stop_value and its final evaluation mean; an entry without a stop value (Pendulum) runs its
whole budget and compares final means. An entry our agent cannot take yet (a config key or
an action space it does not support) is reported as such and skipped, not fatal.

`bench learning-dqn|learning-ppo` are the CartPole entries of the classic suite. Needs the
`bench` extra.
"""

from __future__ import annotations

import statistics
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from harness.config import RunConfig, load_config, with_seed

if TYPE_CHECKING:
    from harness.bench.sb3 import Sb3Setup

SUITE_DIR = Path(__file__).resolve().parents[2] / "configs" / "suite"
SUITES = {
    "classic": [
        "ppo_cartpole",
        "dqn_cartpole",
        "ppo_acrobot",
        "dqn_acrobot",
        "dqn_mountaincar",
        "ppo_pendulum",
    ],
    "extended": ["ppo_lunarlander", "dqn_lunarlander"],
}
DEFAULT_SEEDS = {"classic": [0, 1, 2], "extended": [0]}
# issue 10's bar for the classic entries: ours / SB3
TARGETS = {"steps_ratio": 1.25, "wall_ratio": 1.5, "final_within": 0.10, "slowest_ratio": 3.0}


def entry_path(name: str) -> Path:
    return SUITE_DIR / f"{name}.yaml"


def outcome(evals: list[dict], stop_value: Optional[float]) -> dict:
    """Env steps and seconds to the first evaluation >= stop_value (None if never), and the
    last evaluation's mean."""
    hit = next(
        (e for e in evals if stop_value is not None and e["mean_return"] >= stop_value), None
    )
    return {
        "env_steps": hit and hit["env_steps"],
        "wall_s": hit and hit["wall_s"],
        "final_mean": evals[-1]["mean_return"] if evals else None,
        "evals": len(evals),
    }


def compare(records: list[dict], budget: Optional[int] = None) -> dict:
    """Per-seed ratios and the means over seeds (steps and seconds only where both reached
    the stop), final means over the seeds both finished. With the `budget` of a thresholded
    entry, also the spread (`spread`): a seed that never reached the stop counts at the
    budget, the ratio of means gets a 95% bootstrap interval, and the slowest seeds are
    compared (issue 25's bar: no seed of ours beyond 3x SB3's slowest)."""
    both = [r for r in records if r["ours"]["wall_s"] and r["sb3"]["wall_s"]]
    ratios = [r["ours"]["wall_s"] / r["sb3"]["wall_s"] for r in both]
    summary: dict[str, Any] = {
        "seeds": len(records),
        "both_reached": len(both),
        "ours_reached": sum(r["ours"]["wall_s"] is not None for r in records),
        "sb3_reached": sum(r["sb3"]["wall_s"] is not None for r in records),
    }
    if both:
        ours = statistics.fmean(r["ours"]["wall_s"] for r in both)
        sb3 = statistics.fmean(r["sb3"]["wall_s"] for r in both)
        ours_steps = statistics.fmean(r["ours"]["env_steps"] for r in both)
        sb3_steps = statistics.fmean(r["sb3"]["env_steps"] for r in both)
        summary.update(
            ours_mean_s=round(ours, 2),
            sb3_mean_s=round(sb3, 2),
            ratio_of_means=round(ours / sb3, 2),
            max_seed_ratio=round(max(ratios), 2),
            ours_mean_steps=ours_steps,
            sb3_mean_steps=sb3_steps,
            steps_ratio=round(ours_steps / sb3_steps, 2),
        )
    if budget is not None and records:
        summary["spread"] = spread(
            [r["ours"]["env_steps"] for r in records],
            [r["sb3"]["env_steps"] for r in records],
            budget,
        )
    finals = [
        r
        for r in records
        if r["ours"]["final_mean"] is not None and r["sb3"]["final_mean"] is not None
    ]
    if finals:
        summary.update(
            ours_final_mean=round(statistics.fmean(r["ours"]["final_mean"] for r in finals), 2),
            sb3_final_mean=round(statistics.fmean(r["sb3"]["final_mean"] for r in finals), 2),
        )
    return summary


def spread(
    ours: list[Optional[int]], sb3: list[Optional[int]], budget: int, resamples: int = 10_000
) -> dict:
    """Env steps to the stop over seeds, a seed that never got there counted at `budget`:
    each side's mean and range, the ratio of the means with a 95% bootstrap interval (the
    two sides' seeds resampled apart: their runs share a seed, not a trajectory), and the
    ratio of the slowest seeds."""
    a = np.array([budget if x is None else x for x in ours], float)
    b = np.array([budget if x is None else x for x in sb3], float)
    rng = np.random.default_rng(0)
    draws = a[rng.integers(0, len(a), (resamples, len(a)))].mean(axis=1) / b[
        rng.integers(0, len(b), (resamples, len(b)))
    ].mean(axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return {
        "budget": budget,
        "ours_mean": round(float(a.mean())),
        "sb3_mean": round(float(b.mean())),
        "ours_range": [int(a.min()), int(a.max())],
        "sb3_range": [int(b.min()), int(b.max())],
        "ratio": round(float(a.mean() / b.mean()), 2),
        "ratio_interval": [round(float(low), 2), round(float(high), 2)],
        "slowest_ratio": round(float(a.max() / b.max()), 2),
    }


def resummarize(records: list[dict]) -> list[dict]:
    """Summaries of saved records (`--json` files of several runs, e.g. seed batches run
    apart), one per entry, as `bench_parity` makes them."""
    summaries = []
    for name in dict.fromkeys(r["entry"] for r in records):
        mine = [r for r in records if r["entry"] == name and r["status"] == "ok"]
        by_seed: dict[int, dict] = {}
        for r in mine:
            by_seed.setdefault(r["seed"], {"seed": r["seed"]})[r["system"]] = outcome(
                r["evals"], r["threshold"]
            )
        pairs = [p for _, p in sorted(by_seed.items()) if "ours" in p and "sb3" in p]
        thresholded = bool(mine) and mine[0]["threshold"] is not None
        summary = {
            "entry": name,
            "algo": mine[0]["algo"] if mine else None,
            "env": mine[0]["env"] if mine else None,
            "status": "ok",
            **compare(pairs, mine[0]["budget"] if thresholded else None),
        }
        summary["meets_targets"] = meets_targets(summary, thresholded)
        summaries.append(summary)
    return summaries


def meets_targets(summary: dict, thresholded: bool) -> Optional[bool]:
    """Issue 10's bar (`TARGETS`), and issue 25's on the slowest seed; None when there is
    nothing to judge."""
    if thresholded:
        if summary["ours_reached"] < summary["sb3_reached"]:
            return False
        if not summary["both_reached"]:
            return None if not summary["sb3_reached"] else False
        slowest = summary.get("spread", {}).get("slowest_ratio", 0.0)
        return (
            summary["steps_ratio"] <= TARGETS["steps_ratio"]
            and summary["ratio_of_means"] <= TARGETS["wall_ratio"]
            and slowest <= TARGETS["slowest_ratio"]
        )
    if "ours_final_mean" not in summary:
        return None
    ours, sb3 = summary["ours_final_mean"], summary["sb3_final_mean"]
    return ours >= sb3 - TARGETS["final_within"] * abs(sb3)


def preflight(config: RunConfig) -> Optional[str]:
    """Why our agent cannot run this config yet (None when it can): a key its config does
    not know, or a policy that refuses the env's spaces. Builds the policy in-process, which
    takes well under a second, instead of starting services to find out."""
    import gymnasium as gym

    from harness.bench.sb3 import merged_agent_config, trained_agent_class

    merged, pending = merged_agent_config(config)
    if pending:
        return pending
    env_spec = config.orchestrator.env
    env = gym.make(env_spec.id, **env_spec.kwargs)
    try:
        trained_agent_class(config).policy_cls(
            merged["policy"], env.observation_space, env.action_space, seed=0
        )
    except (ValueError, TypeError, NotImplementedError) as exc:
        return f"our agent cannot take {env_spec.id} yet: {exc}"
    finally:
        env.close()
    return None


def _records(
    name: str,
    config: RunConfig,
    algo: str,
    seed: int,
    system: str,
    result: dict,
    status: str = "ok",
    reason: Optional[str] = None,
) -> dict:
    """One JSON record: `{algo, env, seed, system, env_steps_to_threshold,
    wall_s_to_threshold, final_eval, budget}` plus the entry, status and the evaluations."""
    spec = config.training
    assert spec is not None  # (`run_entry` refuses a config without one)
    o = outcome(result.get("evals", []), spec.stop_value)
    record = {
        "entry": name,
        "algo": algo,
        "env": config.orchestrator.env.id,
        "seed": seed,
        "system": system,
        "env_steps_to_threshold": o["env_steps"],
        "wall_s_to_threshold": o["wall_s"],
        "final_eval": o["final_mean"],
        "budget": spec.env_steps,
        "threshold": spec.stop_value,
        "status": status,
    }
    if reason:
        record["reason"] = reason
    record["evals"] = [
        {k: e[k] for k in ("env_steps", "wall_s", "mean_return")} for e in result.get("evals", [])
    ]
    return record


def with_local_inference(config: RunConfig) -> RunConfig:
    """The config with every agent acting through a policy copy in the orchestrator that
    sends its experience once per learning cycle (DQN: train_freq env steps; PPO: n_steps):
    the copy acts with fixed weights for a cycle and the agent learns from it at once, as
    SB3 collects and then trains."""
    data = config.model_dump()
    for agent in data["agents"]:
        train = agent["hyperparameters"].get("train") or {}
        agent["local_inference"] = {
            "sync_every": 1,
            "batch_steps": int(train.get("train_freq") or train.get("n_steps") or 64),
        }
    return RunConfig.model_validate(data)


def run_entry(
    name: str, seeds: list[int], config_path: Optional[Path] = None, local_inference: bool = False
) -> tuple[list[dict], dict]:
    """Both sides of one entry, seed by seed; returns its records and its summary.
    `local_inference`: ours acts through policy copies (`with_local_inference`)."""
    from harness.bench.sb3 import Unmappable, sb3_setup

    config = load_config(config_path or entry_path(name))
    if local_inference:
        config = with_local_inference(config)
    spec = config.training
    if spec is None:
        raise SystemExit(f"{config_path or entry_path(name)} has no training section")
    env_id = config.orchestrator.env.id
    print(
        f"\n== {name}: {env_id}, budget {spec.env_steps} env steps, threshold {spec.stop_value}",
        flush=True,
    )
    try:
        setup = sb3_setup(config)
    except Unmappable as exc:  # e.g. a key our agent gained that the mapping does not know
        reason = f"SB3 cannot take the same config: {exc}"
        print(f"   cannot run: {reason}", flush=True)
        return [], {"entry": name, "status": "cannot_run_yet", "reason": reason}
    pending = preflight(config)
    if pending:
        print(f"   cannot run yet: {pending}", flush=True)
        records = [
            _records(name, config, setup.algo, seed, system, {}, "cannot_run_yet", pending)
            for seed in seeds
            for system in ("ours", "sb3")
        ]
        return records, {"entry": name, "status": "cannot_run_yet", "reason": pending}
    records, pairs = _run_seeds(name, config, setup, seeds)
    summary = {
        "entry": name,
        "algo": setup.algo,
        "env": env_id,
        "status": "ok",
        **compare(pairs, spec.env_steps if spec.stop_value is not None else None),
    }
    summary["meets_targets"] = meets_targets(summary, spec.stop_value is not None)
    return records, summary


def _run_seeds(
    name: str, config: RunConfig, setup: Sb3Setup, seeds: list[int]
) -> tuple[list[dict], list[dict]]:
    """Ours, then SB3, at each seed in turn (one right after the other: module doc), a row
    printed per seed; the records and each seed's pair of outcomes."""
    spec = config.training
    assert spec is not None  # (`run_entry` refuses a config without one)
    records, pairs = [], []
    print(
        f"   {'seed':>4}  {'ours: steps':>11} {'s':>7} {'final':>8}   "
        f"{'sb3: steps':>10} {'s':>7} {'final':>8}   s ratio",
        flush=True,
    )
    for seed in seeds:
        pair: dict[str, Any] = {}
        for system in ("ours", "sb3"):
            record, result = _run_side(name, config, setup, seed, system)
            records.append(record)
            pair[system] = outcome(result.get("evals", []), spec.stop_value)
        pair["seed"] = seed
        pairs.append(pair)
        print("   " + _row(pair), flush=True)
    return records, pairs


def _run_side(
    name: str, config: RunConfig, setup: Sb3Setup, seed: int, system: str
) -> tuple[dict, dict]:
    """One side's run at one seed (ours as `mistk-rl run --seed` would, in a scratch run
    dir; or SB3's): its record and its results, {} when it failed (reported in the record:
    one failed run must not lose the rest)."""
    from harness.bench.sb3 import run_sb3
    from harness.run import run

    try:
        if system == "ours":
            with tempfile.TemporaryDirectory(prefix="mistk-parity-") as tmp:
                result = run(with_seed(config, seed), Path(tmp), say=lambda _m: None, quiet=True)
        else:
            result = run_sb3(config, seed, setup)
        return _records(name, config, setup.algo, seed, system, result), result
    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the rest
        print(f"   {system} seed {seed} failed: {exc}", flush=True)
        traceback.print_exc()
        failed = f"{type(exc).__name__}: {exc}"
        return _records(name, config, setup.algo, seed, system, {}, "failed", failed), {}


def bench_parity(
    entries: list[str],
    seeds: list[int],
    config_path: Optional[Path] = None,
    local_inference: bool = False,
) -> tuple[list[dict], list[dict]]:
    """Every entry in turn (or the one config at `config_path`); prints a row per seed and a
    summary table; returns (records, summaries)."""
    records, summaries = [], []
    for name in entries:
        entry_records, summary = run_entry(name, seeds, config_path, local_inference)
        summary["local_inference"] = local_inference
        records += entry_records
        summaries.append(summary)
    print("\n" + summary_table(summaries), flush=True)
    return records, summaries


def summary_table(summaries: list[dict]) -> str:
    """One line per entry: seeds reaching the threshold, ours / SB3 in env steps and in wall
    time (ratio of means over the seeds both reached it), final eval means, issue 10's bar."""
    head = (
        f"{'entry':<16} {'reached':>9} {'steps ours/sb3':>22} {'steps':>5} "
        f"{'wall s ours/sb3':>17} {'wall':>5} {'final ours/sb3':>17}  bar"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        if s["status"] != "ok":
            lines.append(f"{s['entry']:<16} cannot run yet: {s['reason'][:90]}")
            continue

        def num(key: str, fmt: str = "{:.0f}") -> str:
            return "-" if s.get(key) is None else fmt.format(s[key])

        reached = f"{s['ours_reached']}/{s['sb3_reached']} of {s['seeds']}"
        steps = f"{num('ours_mean_steps')}/{num('sb3_mean_steps')}"
        wall = f"{num('ours_mean_s', '{:.1f}')}/{num('sb3_mean_s', '{:.1f}')}"
        final = f"{num('ours_final_mean', '{:.1f}')}/{num('sb3_final_mean', '{:.1f}')}"
        bar = {True: "met", False: "MISSED", None: "-"}[s["meets_targets"]]
        lines.append(
            f"{s['entry']:<16} {reached:>9} {steps:>22} "
            f"{num('steps_ratio', '{:.2f}'):>5} {wall:>17} "
            f"{num('ratio_of_means', '{:.2f}'):>5} {final:>17}  {bar}"
        )
        if "spread" in s:
            lines.append("  " + spread_line(s["spread"]))
    return "\n".join(lines)


def spread_line(sp: dict) -> str:
    """`spread` in words: every seed, one that never reached the stop at the budget."""
    return (
        f"every seed (one not reaching the stop counted at {sp['budget']:,}): ours "
        f"{sp['ours_mean']:,} ({sp['ours_range'][0]:,}-{sp['ours_range'][1]:,}), SB3 "
        f"{sp['sb3_mean']:,} ({sp['sb3_range'][0]:,}-{sp['sb3_range'][1]:,}); ratio "
        f"{sp['ratio']:.2f}, 95% interval {sp['ratio_interval'][0]:.2f}-"
        f"{sp['ratio_interval'][1]:.2f}; slowest seeds {sp['slowest_ratio']:.2f}x"
    )


def _row(pair: dict) -> str:
    def side(o: dict) -> str:
        steps = "-" if o["env_steps"] is None else str(o["env_steps"])
        secs = "-" if o["wall_s"] is None else f"{o['wall_s']:.1f}"
        final = "-" if o["final_mean"] is None else f"{o['final_mean']:.1f}"
        return f"{steps:>11} {secs:>7} {final:>8}"

    ours, sb3 = pair["ours"], pair["sb3"]
    ratio = f"{ours['wall_s'] / sb3['wall_s']:.2f}" if ours["wall_s"] and sb3["wall_s"] else "-"
    return f"{pair['seed']:>4}  {side(ours)}   {side(sb3)[1:]}   {ratio:>5}"
