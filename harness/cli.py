"""The `mistk-rl` command: serve, run, eval, export, compare, ladder, exploit, bench.

The top of the driver layer: `serve` is the framework's (`mistk_rl.service.cli`, also
`python -m mistk_rl serve`, which is how the harness starts services), `run` and `eval` the
harness's (`harness.run`), `compare` reads run directories (`harness.compare`), `bench` the
benchmarks' (`harness.bench`)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Optional, Sequence

from mistk_rl import API_VERSION, __version__
from mistk_rl.service.cli import add_serve_arguments
from mistk_rl.wire.spin import spin_from_env


def _run(args: argparse.Namespace) -> int:
    from harness.run import run_from_file

    if args.config is None and args.resume is None:
        print("mistk-rl run: give CONFIG, or --resume RUN_DIR", file=sys.stderr)
        return 2
    return run_from_file(
        Path(args.config) if args.config else None,
        out=Path(args.out) if args.out else None,
        quiet=args.quiet,
        seed=args.seed,
        resume=Path(args.resume) if args.resume else None,
        cluster=args.cluster,
        max_restarts=args.max_restarts,
        dashboard_port=args.dashboard,
    )


def _eval(args: argparse.Namespace) -> int:
    from harness.run import run_from_file

    return run_from_file(
        Path(args.config),
        out=Path(args.run) if args.run else None,
        quiet=args.quiet,
        evaluate_only=True,
        eval_episodes=args.episodes,
    )


def _export(args: argparse.Namespace) -> int:
    from harness.config import RunConfigError
    from harness.export import export_run

    try:
        done = export_run(Path(args.run), args.format, Path(args.out), args.agent)
    except (RunConfigError, RuntimeError) as exc:
        print(f"mistk-rl export: {exc}", file=sys.stderr)
        return 1
    print(
        f"exported agent {done['agent']} ({done['model']}) as {done['format']} to "
        f"{done['out']}: obs [batch, {', '.join(map(str, done['observation_shape']))}] -> "
        f"actions; it gives the agent's own greedy actions on {done['checked_rows']} "
        "observations drawn from the observation space"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from harness.compare import compare
    from harness.config import RunConfigError

    try:
        print(compare(args.runs, Path(args.json) if args.json else None))
    except RunConfigError as exc:
        print(f"mistk-rl compare: {exc}", file=sys.stderr)
        return 1
    return 0


def _ladder(args: argparse.Namespace) -> int:
    from datetime import datetime

    import yaml

    from harness.config import RunConfigError
    from harness.ladder_players import ladder_config
    from harness.run import run_from_file

    if len(args.runs) + len((args.opponents or "").split(",")) < 2:
        print("mistk-rl ladder: give two players or more (RUN_DIRs, --opponents)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / f"ladder-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        config = ladder_config(
            args.runs,
            args.opponents.split(",") if args.opponents else [],
            out,
            agent=args.agent,
            snapshots=args.snapshots,
            checkpoints=args.checkpoints,
            anchor=args.anchor,
            games_per_seat=args.games_per_seat,
            mode=args.mode,
            game=args.game,
            groups=_groups(args.group),
        )
    except (RunConfigError, ValueError) as exc:
        print(f"mistk-rl ladder: {exc}", file=sys.stderr)
        return 1
    # (its config.yaml, which `mistk-rl run` plays again; the run writes it there anyway)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config.model_dump(), sort_keys=False))
    return run_from_file(out / "config.yaml", out=out, quiet=args.quiet)


def _exploit(args: argparse.Namespace) -> int:
    from harness.config import RunConfigError
    from harness.exploit import exploit, report
    from harness.run import run_from_file

    def run_one(config: Optional[Path], run_dir: Path, resume: bool) -> int:
        if resume:
            return run_from_file(None, quiet=args.quiet, resume=run_dir)
        return run_from_file(config, out=run_dir, quiet=args.quiet)

    try:
        result = exploit(
            args.runs,
            Path(args.out),
            args.seeds or [0, 1, 2],
            args.moves,
            run_one,
            args.games_per_seat,
            args.agent,
            _groups(args.group),
        )
    except (RunConfigError, ValueError) as exc:
        print(f"mistk-rl exploit: {exc}", file=sys.stderr)
        return 1
    print(report(result))
    print(f"(every seed's run, and exploit.json: {args.out})")
    return 0


def seed_list(text: str) -> list[int]:
    """Seeds as the command line gives them: ``0,1,2``, ``0..9`` (both ends) or a mix."""
    seeds: list[int] = []
    for part in text.split(","):
        first, dots, last = part.strip().partition("..")
        try:
            seeds += list(range(int(first), int(last) + 1)) if dots else [int(first)]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a seed or a range A..B of seeds"
            ) from None
        if dots and int(last) < int(first):
            raise argparse.ArgumentTypeError(f"{part!r}: the range ends before it starts")
    return seeds


def _bench(args: argparse.Namespace) -> int:
    from harness.bench import run_bench

    counts = [int(x) for x in args.envs.split(",")] if args.envs else None
    return run_bench(
        args.what,
        n=args.n,
        json_out=Path(args.json) if args.json else None,
        seed=args.seed,
        eval_every=args.eval_every,
        env_counts=counts,
        steps=args.steps,
        seeds=args.seeds,
        config=Path(args.config) if args.config else None,
        suite=args.suite,
        entries=args.entries.split(",") if args.entries else None,
        behaviour=args.behaviour,
        local_inference=args.local_inference,
        saved=[Path(f) for f in args.from_json.split(",")] if args.from_json else None,
        arms=args.arms.split(",") if args.arms else None,
        awake=args.awake,
        spin_us=args.spin,
        minutes=args.minutes,
        baseline=Path(args.baseline) if args.baseline else None,
    )


# What each benchmark measures: `bench`'s choices and its help, in this order.
BENCHES = {
    "getaction": "round-trip time of getAction to a local agent, and the machine's floor "
    "under it (a bare echo, the server stack answering a constant)",
    "longpolls": "reset/terminate latency with 64 status long-polls waiting",
    "transport": "env steps/s in-process vs over HTTP (and at 1 env the ratio the floor allows)",
    "envs": "env managers vs gymnasium's vector envs",
    "faults": "how fast a run ends, and what it leaves, when a service dies, restarts or hangs",
    "sb3-dqn": "Stable-Baselines3 alone, in-process, on a training config (default "
    "configs/suite/dqn_cartpole.yaml) with our eval protocol",
    "sb3-ppo": "as sb3-dqn, for PPO (default configs/suite/ppo_cartpole.yaml)",
    "parity": "per suite entry (configs/suite/), our agent over HTTP and SB3 with the same "
    "hyperparameters, back to back per seed",
    "learning-dqn": "parity on the CartPole entry",
    "learning-ppo": "parity on the CartPole entry",
    "games": "tic-tac-toe moves/s of the game orchestrator with its agent in-process vs over "
    "HTTP (--envs: game copies, default 1,16,64; --steps: moves timed)",
    "thinker-planner": "the scripted planner's solve rate on the puzzle (perfect model; --n "
    "episodes, default 3000)",
    "thinker-ppo": "PPO on the raw and the Thinker puzzle, --seeds each, solve-rate curves "
    "in one plot",
    "thinker-model": "the learned model trained over --n real steps (default 20000) while "
    "--behaviour acts: held-out losses, finiteness, time per augmented step",
    "thinker-agent": "the Thinker PPO agent (tree readout) against PPO on the raw puzzle, "
    "in-process, --n real steps (default 200000) per --seeds (default 0-4), each evaluated "
    "on the whole level pool, with the difference's 95%% interval",
    "cluster": "on a local Ray cluster (needs mistk-rl[ray]), the tic-tac-toe league's "
    "main-player moves/s without Ray and with its workers on 1 and 2 nodes (--n moves, "
    "default 10000), and transport's http-binary steps/s with the agent placed by Ray "
    "(--envs, default 1,64)",
    "dm-env-rpc": "CartPole steps/s in process and through the dm_env_rpc bridge, bare and "
    "as the gym orchestrator's env source at 1 and 8 copies (--steps each, default 20000)",
    "gymnasium": "SB3's PPO (rl-zoo's CartPole settings) through the gymnasium facade over a "
    "gym orchestrator against the same PPO in process, --seeds (default 0,1,2): env steps and "
    "training wall time to a mean eval return of 475 (--n: step budget, default 100000)",
    "cluster-loss": "the tic-tac-toe league to its targets on a local cluster, its workers "
    "on two nodes, one removed after the first evaluation and another joining",
    "burst": "status latency (p50, max) while another caller floods the agent with 1.5 MB of "
    "tiny requests it never reads the answers of: on a step stream and as pipelined HTTP "
    "(--n runs of each, default 3)",
    "versus": "the step path (HTTP and stream, --envs, default 1,64) of this checkout's "
    "services against --baseline DIR's, running side by side in blocks taking turns (--n "
    "rounds, default 20): the ratio with a 95%% interval, and each side's service CPU time "
    "per env step",
    "soak": "long runs side by side (--config, comma-separated; default configs/soak/'s "
    "gym at 64 copies, tic-tac-toe league and Thinker PPO) for --minutes, the memory of "
    "every service sampled: at the start, the middle and the end",
}

# `bench`'s options: (flag, argparse keywords), each naming the benchmarks it applies to.
BENCH_OPTIONS: list[tuple[str, dict]] = [
    (
        "--n",
        dict(
            type=int,
            default=None,
            help="getaction: calls to time (default 2000); thinker-planner: episodes "
            "(default 3000); thinker-agent: real steps a seed; versus: rounds (default 20)",
        ),
    ),
    ("--seed", dict(type=int, default=0, help="sb3-*: training seed")),
    (
        "--suite",
        dict(
            default="classic",
            choices=["classic", "extended"],
            help="parity: which entries (classic: CartPole, Acrobot, MountainCar, "
            "Pendulum; extended: LunarLander, needs box2d)",
        ),
    ),
    (
        "--entries",
        dict(default=None, help="parity: only these entries, comma-separated (e.g. dqn_cartpole)"),
    ),
    (
        "--envs",
        dict(
            default=None, help="transport/envs: env counts, comma-separated (default 1,16,64,256)"
        ),
    ),
    (
        "--steps",
        dict(type=int, default=20000, help="transport/envs: env steps timed per configuration"),
    ),
    (
        "--eval-every",
        dict(
            type=int,
            default=None,
            help="sb3-*: env steps between evaluations (default: the config's)",
        ),
    ),
    (
        "--seeds",
        dict(
            default=None,
            type=seed_list,
            help="parity, learning-*: seeds, comma-separated, a range A..B taking "
            "both ends (0..9), or both (0..4,7) (default 0,1,2; extended suite 0)",
        ),
    ),
    (
        "--config",
        dict(
            default=None,
            help="parity, learning-*, sb3-*: run this training "
            "config instead of the suite's entries (SB3 takes the same "
            "hyperparameters); soak: the configs, comma-separated",
        ),
    ),
    (
        "--behaviour",
        dict(
            default="solver",
            choices=["solver", "random"],
            help="thinker-model: who takes the real steps (solver: a shortest "
            "solution's next move, a random one 30%% of the time; random: "
            "uniform moves, which solve too rarely to learn rewards from)",
        ),
    ),
    (
        "--local-inference",
        dict(
            action="store_true",
            help="parity, learning-*: our agents act with a policy copy "
            "in the orchestrator (local inference), sending experience "
            "once per learning cycle (DQN train_freq, PPO n_steps env "
            "steps)",
        ),
    ),
    (
        "--from",
        dict(
            dest="from_json",
            default=None,
            help="parity: run nothing; summarize the records of these --json files "
            "together (comma-separated: seed batches run apart)",
        ),
    ),
    (
        "--arms",
        dict(
            default=None,
            help="thinker-agent: which, comma-separated, of raw, thinker (the perfect "
            "model), thinker-learned (the learned model, wrapper_type 0), thinker-vp (the "
            "perfect model with its value-policy net trained) and planner (the scripted "
            "planner on the same levels); default raw,thinker",
        ),
    ),
    (
        "--awake",
        dict(
            action="store_true",
            help="getaction, transport: run with every CPU kept from idling (a "
            "spinner per CPU at SCHED_IDLE, Linux), as on a machine whose idle CPUs "
            "poll instead of halting: a virtual machine's halted vCPU takes tens of "
            "us to wake, twice a round trip",
        ),
    ),
    (
        "--spin",
        dict(
            type=float,
            default=None,
            metavar="US",
            help="getaction, transport: MISTK_RL_SPIN_US=US for the bench, as a user "
            "would set it: its clients wait for each answer awake (polling, not "
            "sleeping) for up to US microseconds, and the services it starts wait so "
            "for the next request after each answer; default: as MISTK_RL_SPIN_US "
            "says, else clients and services wait so for up to 1 ms (with two CPUs "
            "or more)",
        ),
    ),
    (
        "--minutes",
        dict(type=float, default=30.0, help="soak: how long the runs go (default 30)"),
    ),
    (
        "--baseline",
        dict(
            default=None,
            metavar="DIR",
            help="versus: the other checkout (e.g. `git worktree add DIR COMMIT`)",
        ),
    ),
    ("--json", dict(default=None, help="also write the figures here")),
]


def build_parser() -> argparse.ArgumentParser:
    """The `mistk-rl` command line: a subcommand each, declared by its own function."""
    parser = argparse.ArgumentParser(prog="mistk-rl", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version", action="version", version=f"mistk-rl {__version__} (HTTP API {API_VERSION})"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(
        sub.add_parser(
            "serve",
            help="run an agent or orchestrator class as a service "
            "(`serve dm-env-rpc --env ID`: an env over dm_env_rpc)",
        )
    )
    for add in (
        _add_run,
        _add_eval,
        _add_export,
        _add_compare,
        _add_ladder,
        _add_exploit,
        _add_bench,
        _add_conformance,
        _add_dashboard,
    ):
        add(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="drive agents and an orchestrator from a YAML config")
    run.add_argument(
        "config",
        nargs="?",
        help="the run's YAML config (with --resume: "
        "optional, checked against the run's saved config)",
    )
    run.add_argument("--out", default=None, help="run directory (default runs/NAME-TIME)")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument(
        "--dashboard",
        type=int,
        nargs="?",
        const=8050,
        default=None,
        metavar="PORT",
        help="serve the run's live dashboard on 127.0.0.1:PORT (default 8050; 0: a free "
        "port) while it goes; its URL is printed",
    )
    run.add_argument(
        "--seed",
        type=int,
        default=None,
        help="one seed for the run: every agent's hyperparameters.seed, "
        "training.seed and each episode block's seed (evaluation seeds stay "
        "fixed)",
    )
    run.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the training run in RUN_DIR (crashed or stopped) from its "
        "last checkpoint, with the config saved there (a finished run: says so, "
        "changes nothing)",
    )
    run.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="place the services the run starts on a Ray cluster (needs "
        "mistk-rl[ray]): 'auto' joins the cluster of this machine, HOST:PORT or "
        "ray://HOST:PORT one elsewhere, 'local' starts a one-node cluster for "
        "the run (overrides the config's cluster address)",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="N",
        help="on a cluster: when services of the run are lost (a node is lost), "
        "start them again and resume from the last checkpoint, at most N times "
        "(default 3; 0 without --cluster)",
    )
    run.set_defaults(func=_run)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    evaluate = sub.add_parser(
        "eval",
        help="evaluate a trained run: games against the "
        "config's opponents in every seat; single-agent training "
        "greedy on the fixed evaluation seeds",
    )
    evaluate.add_argument(
        "config",
        help="the run's YAML config (its 'evaluation' block, or "
        "its 'training' block's eval_episodes, eval_seed)",
    )
    evaluate.add_argument(
        "--run",
        default=None,
        metavar="RUN_DIR",
        help="the run directory of a `mistk-rl run` of this config: its "
        "agents start on their data dirs there and load the model each "
        "saved (save_path, else the checkpoint of the last evaluation); "
        "evaluation.json is written there (default: a new "
        "runs/NAME-TIME, agents from model_path)",
    )
    evaluate.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="single-agent runs: this many episodes (default the config's eval_episodes)",
    )
    evaluate.add_argument("--quiet", action="store_true", help="no progress output")
    evaluate.set_defaults(func=_eval)


def _add_export(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export",
        help="write a DQN or PPO run's acting network as "
        "TorchScript or ONNX, checked against the agent",
    )
    export.add_argument("run", metavar="RUN_DIR", help="the run directory of a mistk-rl run")
    export.add_argument("--format", choices=["torchscript", "onnx"], default="torchscript")
    export.add_argument("--out", required=True, help="the file to write")
    export.add_argument(
        "--agent", default=None, help="the agent to export (default the config's first)"
    )
    export.set_defaults(func=_export)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser(
        "compare",
        help="runs as distributions over their seeds: at "
        "each evaluation point, the mean and range of every evaluated "
        "figure",
    )
    compare.add_argument(
        "runs",
        nargs="+",
        metavar="[LABEL=]RUN_DIR",
        help="run directories of mistk-rl run, grouped by their config's name, or by LABEL",
    )
    compare.add_argument("--json", default=None, help="also write the summary here")
    compare.set_defaults(func=_compare)


def _groups(given: Optional[list[str]]) -> dict[str, list[str]]:
    """``--group NAME=PLAYER,PLAYER`` flags as {NAME: [PLAYER, ...]}."""
    groups: dict[str, list[str]] = {}
    for text in given or []:
        name, sep, members = text.partition("=")
        if not sep or not name or name in groups:
            raise ValueError(f"--group {text!r}: NAME=PLAYER,PLAYER,... with a name of its own")
        groups[name] = [m for m in members.split(",") if m]
    return groups


def _add_ladder(sub: argparse._SubParsersAction) -> None:
    ladder = sub.add_parser(
        "ladder",
        help="a round robin of trained players and built-in opponents, rated (Elo scale, "
        "bootstrap intervals, anchored to one player)",
        description="Every pair plays --games-per-seat games in each seat order; "
        "Bradley-Terry ratings with a first-seat advantage are fitted to all the games, "
        "with 95%% bootstrap intervals. Writes a run directory: ladder.json, ladder.csv, "
        "ratings.png, headtohead.png, and a config.yaml that `mistk-rl run` plays again.",
    )
    ladder.add_argument(
        "runs",
        nargs="*",
        metavar="[LABEL=]RUN_DIR",
        help="game or league runs: each one's evaluated agent (its saved model, else its "
        "last evaluation's checkpoint), named LABEL or by the run directory",
    )
    ladder.add_argument(
        "--opponents",
        default=None,
        help="built-in opponents, comma-separated (e.g. connect4_winblock,connect4_mcts200)",
    )
    ladder.add_argument(
        "--agent", default=None, help="the runs' agent to take (default their evaluated one)"
    )
    ladder.add_argument(
        "--snapshots",
        type=int,
        default=0,
        metavar="K",
        help="also each league run's last K snapshots of that agent",
    )
    ladder.add_argument(
        "--checkpoints",
        action="store_true",
        help="each run's kept evaluation checkpoints as players (LABEL:step-N) in place of "
        "its final model: ratings over moves (ratings_over_moves.png)",
    )
    ladder.add_argument(
        "--anchor",
        default=None,
        help="the player rated 0 (default the first of --opponents, else the first player)",
    )
    ladder.add_argument(
        "--games-per-seat", type=int, default=100, help="games per pair and seat order"
    )
    ladder.add_argument(
        "--mode",
        choices=["sampled", "greedy"],
        default="sampled",
        help="learned players sample from their policy (default) or act greedily",
    )
    ladder.add_argument(
        "--group",
        action="append",
        metavar="NAME=PLAYER,...",
        help="players compared as a whole (twice or more; e.g. one config's seeds): each pair "
        "of groups' mean score over all their pairings, with a 95%% interval resampling both "
        "groups' members and the games",
    )
    ladder.add_argument("--game", default=None, help="the game's id, when no run names it")
    ladder.add_argument("--out", default=None, help="its run directory (default runs/ladder-TIME)")
    ladder.add_argument("--quiet", action="store_true", help="no progress output")
    ladder.set_defaults(func=_ladder)


def _add_exploit(sub: argparse._SubParsersAction) -> None:
    exploit = sub.add_parser(
        "exploit",
        help="exploitability: a fresh learner trained against a run's frozen player for a "
        "fixed budget, and its final win rate against it (lower is harder to exploit)",
        description="For each run and seed, a game-training run (OUT/LABEL/seed-S) of a "
        "fresh copy of the player's learner against the frozen player (sampling from its "
        "policy), seats alternating, for --moves of the learner's moves; the last "
        "evaluation's win rate over both seats is the figure. Prints each seed's with its "
        "Wilson interval, the mean over seeds with its t interval, and each run's "
        "difference from the first (Welch). Run again, it reads finished seeds and resumes "
        "stopped ones.",
    )
    exploit.add_argument("runs", nargs="+", metavar="[LABEL=]RUN_DIR", help="game or league runs")
    exploit.add_argument(
        "--agent", default=None, help="the runs' player to exploit (default their evaluated one)"
    )
    exploit.add_argument(
        "--moves", type=int, required=True, help="the exploiter's budget: its moves"
    )
    exploit.add_argument(
        "--seeds", type=seed_list, default=None, help="the exploiter's seeds (default 0,1,2)"
    )
    exploit.add_argument(
        "--games-per-seat", type=int, default=500, help="games per seat in the last evaluation"
    )
    exploit.add_argument(
        "--group",
        action="append",
        metavar="NAME=LABEL,...",
        help="runs compared as a whole (twice or more; e.g. one config's seeds): each "
        "group's figures pooled, each group after the first against the first (Welch)",
    )
    exploit.add_argument("--out", required=True, help="where the seeds' runs and exploit.json go")
    exploit.add_argument("--quiet", action="store_true", help="no progress output")
    exploit.set_defaults(func=_exploit)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure the services")
    bench.add_argument(
        "what",
        choices=list(BENCHES),
        help="; ".join(f"{name}: {what}" for name, what in BENCHES.items()),
    )
    for flag, options in BENCH_OPTIONS:
        bench.add_argument(flag, **options)
    bench.set_defaults(func=_bench)


def _add_dashboard(sub: argparse._SubParsersAction) -> None:
    page = sub.add_parser(
        "dashboard",
        help="a live web page of runs: return curves, evaluations, a league, the services",
        description="Serve a web page (offline: its scripts are packaged) for the runs "
        "in RUN_DIR...: training and evaluation curves (runs of one config as bands "
        "over their seeds), a league's payoff heatmap and ratings over time, and the "
        "services of a run still going with their state and rates. It updates every "
        "two seconds while the runs go on; Ctrl-C stops it.",
    )
    page.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    page.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    page.add_argument("--port", type=int, default=8050, help="port (default 8050; 0: a free one)")
    page.set_defaults(func=_dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    from harness.dashboard import Dashboard

    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        print(f"mistk-rl dashboard: no run directory {', '.join(missing)}", file=sys.stderr)
        return 2
    with Dashboard([Path(d) for d in args.run_dirs], args.host, args.port) as page:
        print(f"mistk-rl dashboard: {page.url} (Ctrl-C stops it)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


def _add_conformance(sub: argparse._SubParsersAction) -> None:
    kit = sub.add_parser(
        "conformance",
        help="check a running service, in any language, against the contract",
        description="Walk a service through its lifecycle and check every answer against "
        "the packaged contract (mistk_rl.conformance). Exit 0 only if every check passes.",
    )
    kit.add_argument("role", choices=["agent", "orchestrator"], help="what the service is")
    kit.add_argument("url", help="its root (http://127.0.0.1:8081) or base path")
    kit.add_argument("--token", default=None, help="its bearer token (default: MISTK_RL_TOKEN)")
    kit.add_argument(
        "--env",
        default="CartPole-v1",
        help="agent: the gymnasium env the kit plays; orchestrator: the env id it initializes",
    )
    kit.add_argument(
        "--agent-url",
        default=None,
        help="orchestrator: an agent it can reach (default: the kit serves one on loopback)",
    )
    kit.add_argument("--junit", default=None, metavar="FILE", help="also write JUnit XML here")
    kit.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    kit.add_argument("--wait", type=float, default=120.0, help="seconds background work may take")
    kit.add_argument(
        "--keep-alive", action="store_true", help="do not terminate the service at the end"
    )
    kit.add_argument("-v", "--verbose", action="store_true", help="a line per check")
    kit.set_defaults(func=_conformance)


def _conformance(args: argparse.Namespace) -> int:
    from mistk_rl.conformance import check_agent, check_orchestrator

    options: dict = {
        "token": args.token or os.environ.get("MISTK_RL_TOKEN") or None,
        "env": args.env,
        "timeout": args.timeout,
        "wait": args.wait,
        "terminate": not args.keep_alive,
    }
    if args.role == "agent":
        report = check_agent(args.url, **options)
    else:
        report = check_orchestrator(args.url, agent_url=args.agent_url, **options)
    print(report.text(verbose=args.verbose))
    if args.junit:
        report.write_junit(Path(args.junit))
    return 0 if report.passed else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["serve", "dm-env-rpc"]:  # an env over gRPC: its own options
        from mistk_rl.bridges import dm_env_rpc_server  # (needs the dm_env_rpc extra)

        return dm_env_rpc_server.main(argv[2:])
    args = build_parser().parse_args(argv)
    try:
        spin_from_env()  # (refused here, not at the first request of a run)
    except ValueError as exc:
        print(f"mistk-rl: {exc}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
