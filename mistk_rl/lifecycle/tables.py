"""The agent and orchestrator lifecycles as declarative transition tables.

Each public operation fires its own trigger to move from a resting state into a *busy* state;
when the implementation's hook returns, the runner fires the internal trigger ``finish``,
whose destination depends on the busy state (and, for a few, on a fact the runner passes).
An exception in a hook fires ``fail``. This is MISTK's gaming state machine with its holes
closed: ``failed`` is reachable from everywhere and left only by ``reset`` (or ``terminate``),
``terminate`` is legal everywhere, and a running episode can be stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Operation:
    """A caller-visible operation: which trigger it fires and how the runner treats it."""

    name: str
    background: bool = False  # 202 and run the hook in a worker thread
    preempts: bool = False  # legal while busy: cancels the running task first


@dataclass(frozen=True)
class Table:
    """States, transitions (in `transitions`' dict form) and operations of one role."""

    role: str
    initial: str
    states: tuple[str, ...]
    transitions: tuple[dict, ...]
    operations: dict[str, Operation] = field(default_factory=dict)
    busy_states: frozenset[str] = frozenset()


def _t(trigger: str, source: str | list[str], dest: str, when: str | None = None) -> dict:
    """One transition; `when` names a fact that must be true (passed when ``finish`` fires)."""
    row: dict = {"trigger": trigger, "source": source, "dest": dest}
    if when is not None:
        row["conditions"] = [lambda event, _fact=when: bool(event.kwargs.get(_fact, False))]
    return row


def _build(
    role: str,
    initial: str,
    resting: list[str],
    busy: list[str],
    rows: list[dict],
    ops: list[Operation],
) -> Table:
    states = tuple(resting + busy + ["failed", "terminating", "terminated"])
    everywhere_but_end = [s for s in states if s not in ("terminating", "terminated")]
    common = [
        _t("fail", everywhere_but_end, "failed"),
        _t("reset", everywhere_but_end, "resetting"),
        _t("terminate", everywhere_but_end, "terminating"),
        _t("finish", "terminating", "terminated"),
    ]
    ops = ops + [
        Operation("reset", background=True, preempts=True),
        Operation("terminate", preempts=True),
    ]
    return Table(
        role=role,
        initial=initial,
        states=states,
        transitions=tuple(rows + common),
        operations={o.name: o for o in ops},
        busy_states=frozenset(busy + ["terminating"]),
    )


AGENT = _build(
    role="agent",
    initial="started",
    resting=["started", "initialized", "ready", "in_episode"],
    busy=[
        "initializing",
        "building_model",
        "building_model_ready",
        "saving_model_initialized",
        "saving_model_ready",
        "agent_registering",
        "episode_starting",
        "getting_action",
        "replaying_action",
        "stepping",
        "episode_stopping",
        "resetting",
    ],
    rows=[
        _t("initialize", "started", "initializing"),
        _t("finish", "initializing", "initialized"),
        _t("build_model", "initialized", "building_model"),
        _t("finish", "building_model", "initialized"),
        # a registered agent may load other weights (a league's frozen opponents swap
        # checkpoints, a reset player reloads its initial ones) and stays registered
        _t("build_model", "ready", "building_model_ready"),
        _t("finish", "building_model_ready", "ready"),
        _t("save_model", "initialized", "saving_model_initialized"),
        _t("save_model", "ready", "saving_model_ready"),
        _t("finish", "saving_model_initialized", "initialized"),
        _t("finish", "saving_model_ready", "ready"),
        _t("agent_registered", "initialized", "agent_registering"),
        _t("finish", "agent_registering", "ready"),
        # registered again, by another orchestrator (a league's game workers all drive the
        # same agents): told the spaces again, which must match its model
        _t("agent_registered", "ready", "agent_registering"),
        _t("episode_started", "ready", "episode_starting"),
        _t("finish", "episode_starting", "in_episode"),
        _t("get_action", "in_episode", "getting_action"),
        _t("finish", "getting_action", "in_episode"),
        _t("replay_action", "in_episode", "replaying_action"),
        _t("finish", "replaying_action", "in_episode"),
        _t("step", "in_episode", "stepping"),  # replay_action + get_action in one call
        _t("finish", "stepping", "in_episode"),
        _t("episode_stopped", "in_episode", "episode_stopping"),
        _t("finish", "episode_stopping", "ready"),
        # reset keeps the model (-> initialized) only when asked to and one was initialized
        _t("finish", "resetting", "initialized", when="keep_model"),
        _t("finish", "resetting", "started"),
    ],
    ops=[
        Operation("initialize", background=True),
        Operation("build_model", background=True),
        Operation("save_model", background=True),
        Operation("agent_registered"),
        Operation("episode_started"),
        Operation("get_action"),
        Operation("replay_action"),
        Operation("step"),
        Operation("episode_stopped"),
    ],
)

ORCHESTRATOR = _build(
    role="orchestrator",
    initial="uninitialized",
    resting=["uninitialized", "waiting_for_agents", "ready", "completed_episode"],
    busy=[
        "initializing",
        "registering_agent",
        "running",
        "saving_episode",
        "stopping_episode",
        "resetting",
    ],
    rows=[
        _t("initialize", "uninitialized", "initializing"),
        _t("finish", "initializing", "waiting_for_agents"),
        _t("register_agent", "waiting_for_agents", "registering_agent"),
        _t("finish", "registering_agent", "ready", when="all_agents_registered"),
        _t("finish", "registering_agent", "waiting_for_agents"),
        _t("start_episode", "ready", "running"),
        _t("finish", "running", "completed_episode"),
        _t("save_episode", "completed_episode", "saving_episode"),
        _t("finish", "saving_episode", "completed_episode"),
        # stopping a running episode cancels it; stopping a finished one just tidies up
        _t("stop_episode", ["running", "completed_episode"], "stopping_episode"),
        _t("finish", "stopping_episode", "ready"),
        _t("finish", "resetting", "uninitialized"),
    ],
    ops=[
        Operation("initialize", background=True),
        Operation("register_agent"),
        Operation("start_episode", background=True),
        Operation("save_episode"),
        Operation("stop_episode", preempts=True),
    ],
)
