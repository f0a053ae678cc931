"""`mistk-rl bench learning-dqn|learning-ppo`: time to the stop value, our agent over HTTP
against Stable-Baselines3 in-process, side by side.

Per seed, the training config runs as ``mistk-rl run CONFIG --seed N`` would (services on
loopback), then SB3 runs with rl-baselines3-zoo's hyperparameters under the same evaluation
protocol (`bench_sb3`), one right after the other so both meet the same machine: on shared
machines the speed drifts by 2x within an hour, so only figures from one sitting compare.
Each side reports env steps and seconds to its first evaluation >= stop_value and its final
evaluation mean; the ratio is ours / SB3 in seconds. Needs the `bench` extra.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Optional

from harness.config import load_config, with_seed


def outcome(evals: list[dict], stop_value: Optional[float]) -> dict:
    """Env steps and seconds to the first evaluation >= stop_value (None if never), and the
    last evaluation's mean."""
    hit = next((e for e in evals if stop_value is not None and e["mean_return"] >= stop_value),
               None)
    return {"env_steps": hit and hit["env_steps"], "wall_s": hit and hit["wall_s"],
            "final_mean": evals[-1]["mean_return"] if evals else None, "evals": len(evals)}


def compare(records: list[dict]) -> dict:
    """Per-seed ratios and the means over seeds (seconds only where both reached the stop)."""
    both = [r for r in records if r["ours"]["wall_s"] and r["sb3"]["wall_s"]]
    ratios = [r["ours"]["wall_s"] / r["sb3"]["wall_s"] for r in both]
    summary = {"seeds": len(records), "both_reached": len(both),
               "ours_reached": sum(r["ours"]["wall_s"] is not None for r in records),
               "sb3_reached": sum(r["sb3"]["wall_s"] is not None for r in records)}
    if both:
        ours = statistics.fmean(r["ours"]["wall_s"] for r in both)
        sb3 = statistics.fmean(r["sb3"]["wall_s"] for r in both)
        summary.update(ours_mean_s=round(ours, 2), sb3_mean_s=round(sb3, 2),
                       ratio_of_means=round(ours / sb3, 2), max_seed_ratio=round(max(ratios), 2),
                       ours_mean_steps=statistics.fmean(r["ours"]["env_steps"] for r in both),
                       sb3_mean_steps=statistics.fmean(r["sb3"]["env_steps"] for r in both))
    return summary


def bench_learning(algo: str, seeds: list[int], config_path: Path) -> list[dict]:
    from harness.run import run
    from mistk_rl.bench_sb3 import run_sb3

    config = load_config(config_path)
    spec = config.training
    if spec is None:
        raise SystemExit(f"{config_path} has no training section")
    records = []
    print(f"{'seed':>4}  {'ours: steps':>11} {'s':>6} {'final':>6}   "
          f"{'sb3: steps':>10} {'s':>6} {'final':>6}   ratio")
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="mistk-bench-") as tmp:
            ours = run(with_seed(config, seed), Path(tmp), say=lambda _msg: None)
        sb3 = run_sb3(algo, seed=seed, eval_every=spec.eval_every,
                      eval_episodes=spec.eval_episodes, eval_seed=spec.eval_seed,
                      stop_value=spec.stop_value, env_steps=spec.env_steps)
        record = {"bench": f"learning_{algo}", "seed": seed,
                  "ours": outcome(ours["evals"], spec.stop_value),
                  "sb3": outcome(sb3["evals"], spec.stop_value)}
        records.append(record)
        print(_row(record), flush=True)
    summary = compare(records)
    records.append({"bench": f"learning_{algo}", "summary": summary})
    print("  ".join(f"{k}={v}" for k, v in summary.items()))
    return records


def _row(record: dict) -> str:
    def side(o: dict) -> str:
        steps = "-" if o["env_steps"] is None else str(o["env_steps"])
        secs = "-" if o["wall_s"] is None else f"{o['wall_s']:.1f}"
        final = "-" if o["final_mean"] is None else f"{o['final_mean']:.1f}"
        return f"{steps:>11} {secs:>6} {final:>6}"

    ours, sb3 = record["ours"], record["sb3"]
    ratio = (f"{ours['wall_s'] / sb3['wall_s']:.2f}" if ours["wall_s"] and sb3["wall_s"]
             else "-")
    return f"{record['seed']:>4}  {side(ours)}   {side(sb3)[1:]}   {ratio:>5}"
