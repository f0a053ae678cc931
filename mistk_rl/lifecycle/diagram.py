"""The lifecycle tables drawn as state diagrams, two ways.

- Every state and row (Mermaid, by `transitions`' GraphMachine), for
  `docs/lifecycle-tables.md`: `python -m mistk_rl.lifecycle.diagram > docs/lifecycle-tables.md`.
  A test keeps the file equal to what the tables draw now.
- What a caller sees (`svg`: busy states folded into the operations' edges), drawn with
  matplotlib each time the documentation site is built (`docs/hooks.py`).

The rows every state shares (``fail``, ``reset``, ``terminate`` from everywhere) are left out
of the Mermaid pictures and said once in the text, and drawn once from "any state" in the
caller's view: drawn from every state, they would hide the rows that differ."""

from __future__ import annotations

from typing import Any, Optional

from transitions.extensions import GraphMachine

from mistk_rl.lifecycle.tables import AGENT, ORCHESTRATOR, Table

SHARED_TRIGGERS = ("fail", "reset", "terminate")


def _fact(row: dict) -> Optional[str]:
    """The fact a row needs (`tables._t`'s `when`, passed by the runner with finish), if any."""
    return row["conditions"][0].__defaults__[0] if row.get("conditions") else None


def _label(name: str, fact: Optional[str]) -> str:
    return f"{name}\n[{fact}]" if fact else name


def mermaid(table: Table) -> str:
    """`table`'s resting and busy states and their own rows, as a Mermaid state diagram."""
    rows, facts = [], {}
    for row in table.transitions:
        if row["trigger"] in SHARED_TRIGGERS:
            continue
        drawn = {k: row[k] for k in ("trigger", "source", "dest")}
        fact = _fact(row)
        if fact is not None:
            drawn["conditions"], facts[fact] = [fact], staticmethod(lambda: True)
        rows.append(drawn)
    states = [s for s in table.states if s != "failed"]
    # the model only has to name the facts: a condition is drawn by its name
    model = type("Facts", (), facts)()
    machine = GraphMachine(
        model=model,
        states=states,
        transitions=rows,
        initial=table.initial,
        graph_engine="mermaid",
        auto_transitions=False,
        show_conditions=True,
        title=f"{table.role} lifecycle",
    )
    lines = machine.get_graph().draw(None).splitlines()
    # the initial state is drawn as "active" (red): a picture of the table has no state now
    return "\n".join(
        line.replace(f"Class {table.initial} s_active", f"Class {table.initial} s_default")
        for line in lines
    )


def document() -> str:
    parts = [
        "# Lifecycles",
        "",
        "Generated from `mistk_rl/lifecycle/tables.py` by "
        "`python -m mistk_rl.lifecycle.diagram > docs/lifecycle-tables.md` (a test keeps it "
        "current). Each operation moves a resting state into a busy one; `finish` "
        "leaves the busy state when the implementation's hook returns (a label in "
        "brackets is the fact that picks between two `finish` rows). Not drawn, "
        "because every state has them: `fail` (a hook raised) to `failed` from every "
        "state but `terminating`/`terminated`; `reset` to `resetting` and `terminate` "
        "to `terminating` from the same states, `failed` included; `finish` from "
        "`terminating` to `terminated`. A call that is illegal now gets 409.",
        "",
    ]
    for table in (AGENT, ORCHESTRATOR):
        parts += [f"## {table.role.capitalize()}", "", "```mermaid", mermaid(table), "```", ""]
    return "\n".join(parts)


# -- the caller's view, drawn with matplotlib (no Graphviz, no browser script) -------------


def caller_edges(table: Table) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The states a caller sees and the operations between them, as (source, dest, label).

    A busy state is folded into the edge of the operation that enters it (``initialize``
    goes from ``started`` to ``initialized``), unless an operation leaves it while it is
    busy (the orchestrator's ``running``, stopped by ``stop_episode``): then it stays a
    state, left by ``done``. A ``finish`` that needs a fact is labelled with it."""
    finishes: dict[str, list[tuple[str, Optional[str]]]] = {}
    operations = []
    for row in table.transitions:
        sources = [row["source"]] if isinstance(row["source"], str) else list(row["source"])
        fact = _fact(row)
        if row["trigger"] == "finish":
            for source in sources:
                finishes.setdefault(source, []).append((row["dest"], fact))
        elif row["trigger"] not in SHARED_TRIGGERS:
            operations += [(source, row["dest"], row["trigger"]) for source in sources]
    kept = {source for source, _, _ in operations if source in table.busy_states}
    states = [
        s for s in table.states if (s not in table.busy_states or s in kept) and s != "terminating"
    ]
    edges: dict[tuple[str, str], list[str]] = {}
    for source, busy, trigger in operations:
        if busy in kept or busy not in table.busy_states:
            edges.setdefault((source, busy), []).append(trigger)
            continue
        for dest, fact in finishes[busy]:
            edges.setdefault((source, dest), []).append(_label(trigger, fact))
    for busy in kept:
        for dest, fact in finishes[busy]:
            edges.setdefault((busy, dest), []).append(_label("done", fact))
    for dest, fact in finishes["resetting"]:  # reset: from every state, drawn from "any"
        edges.setdefault((ANY_STATE, dest), []).append(_label("reset", fact))
    edges[(ANY_STATE, "failed")] = ["fail (a hook raised)"]
    edges[(ANY_STATE, "terminated")] = ["terminate"]
    return states + [ANY_STATE], [(s, d, "\n".join(labels)) for (s, d), labels in edges.items()]


ANY_STATE = "any state"
SPACING = 3.6  # between resting states, in the units of the box text
Point = tuple[float, float]


def svg(table: Table) -> str:
    """`table` as the caller sees it (`caller_edges`), an SVG picture: the resting states
    left to right in lifecycle order, a busy state a caller can act on below its source,
    and what every state shares (fail, reset, terminate) drawn once from "any state".
    Its text is text (searchable, and a test reads the state names back)."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": table.role}):
        return _draw(table)


def _draw(table: Table) -> str:
    """The picture `svg` describes: where each state goes (`_layout`), the states' boxes,
    then each edge (`_draw_edge`) and the title, saved as SVG text."""
    import io

    from matplotlib.figure import Figure  # no pyplot: the caller's backend stays as it is

    states, edges = caller_edges(table)
    where, resting = _layout(table, states, edges)
    width = SPACING * (resting - 1)
    fig = Figure(figsize=(1.0 + 2.6 * resting, 5.6))
    ax = fig.subplots()
    ax.set_xlim(-1.5, width + 1.5)
    ax.set_ylim(-6.4, 2.4)
    ax.set_aspect("equal")
    ax.axis("off")
    boxes = {state: _draw_state(ax, table, state, at) for state, at in where.items()}
    for source, dest, label in edges:
        _draw_edge(ax, source, dest, label, where, boxes)
    ax.set_title(f"{table.role} lifecycle as a caller sees it (bold: where it starts)", fontsize=11)
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    return out.getvalue()


def _layout(
    table: Table, states: list[str], edges: list[tuple[str, str, str]]
) -> tuple[dict[str, Point], int]:
    """(where each state's box goes, how many resting states the top row holds): the
    resting states left to right; a busy state below, between where it starts and where
    it ends; "any state", failed and terminated along the bottom."""
    resting = [
        s
        for s in states
        if s not in table.busy_states and s not in ("failed", "terminated", ANY_STATE)
    ]
    where = {s: (SPACING * i, 0.0) for i, s in enumerate(resting)}
    for state in states:
        if state in table.busy_states:
            ends = [
                where[a if b == state else b]
                for a, b, _ in edges
                if state in (a, b) and (a if b == state else b) in where
            ]
            where[state] = (sum(x for x, _ in ends) / len(ends), -2.4)
    width = SPACING * (len(resting) - 1)
    where[ANY_STATE] = (0.0, -4.4)
    where["failed"] = (width * 0.5, -4.4)
    where["terminated"] = (width, -4.4)
    return where, len(resting)


def _draw_state(ax: Any, table: Table, state: str, at: Point) -> Any:
    """A state's box (busy states in another colour, the initial one bold); its text."""
    style = dict(
        boxstyle="round,pad=0.4",
        linewidth=1.2,
        facecolor="#eef3fb" if state not in table.busy_states else "#fff4e0",
        edgecolor="#3a5a8c",
        linestyle="--" if state == ANY_STATE else "-",
    )
    if state == table.initial:
        style["linewidth"] = 2.4
    return ax.text(*at, state, ha="center", va="center", fontsize=10, bbox=style, zorder=3)


def _draw_edge(
    ax: Any, source: str, dest: str, label: str, where: dict[str, Point], boxes: dict[str, Any]
) -> None:
    """An arrow from box to box (a loop above a state's own) and its label."""
    from matplotlib.patches import FancyArrowPatch

    posA, posB, rad, label_at = _edge_geometry(source, dest, label, where)
    ax.add_patch(
        FancyArrowPatch(
            posA,
            posB,
            connectionstyle=f"arc3,rad={rad}",
            arrowstyle="-|>",
            mutation_scale=12,
            color="#555555",
            linewidth=1.0,
            linestyle="--" if source == ANY_STATE else "-",
            patchA=None if source == dest else boxes[source].get_bbox_patch(),
            patchB=None if source == dest else boxes[dest].get_bbox_patch(),
            zorder=2,
        )
    )
    ax.text(
        *label_at,
        label,
        ha="center",
        va="center",
        fontsize=8,
        color="#222222",
        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9),
        zorder=4,
    )


def _edge_geometry(
    source: str, dest: str, label: str, where: dict[str, Point]
) -> tuple[Point, Point, float, Point]:
    """(start, end, bend, where the label goes) of an edge."""
    (x1, y1), (x2, y2) = where[source], where[dest]
    if source == dest:  # a loop above the state
        label_at = (x1, y1 + 1.0 + 0.2 * label.count("\n"))
        return (x1 - 0.35, y1 + 0.2), (x1 + 0.35, y1 + 0.2), -2.2, label_at
    # every edge bends to its left, so a way there and the way back do not overlap
    # (along the top row: there over, back under); from "any state" they go straight
    # but to the far end of the bottom row, which bends under the state between
    rad = -0.3
    if source == ANY_STATE:
        rad = 0.2 if dest == "terminated" else 0.0
    label_at = (
        (x1 + x2) / 2 + 0.5 * rad * (y2 - y1),
        (y1 + y2) / 2 - 0.5 * rad * (x2 - x1),
    )
    return (x1, y1), (x2, y2), rad, label_at


if __name__ == "__main__":
    print(document(), end="")
