"""The lifecycle tables drawn as state diagrams (Mermaid, by `transitions`' GraphMachine), for
`docs/lifecycle.md`: `python -m mistk_rl.lifecycle.diagram > docs/lifecycle.md`. A test keeps
the file equal to what the tables draw now.

The rows every state shares (``fail``, ``reset``, ``terminate`` from everywhere) are left out
of the pictures and said once in the text: drawn, they would hide the rows that differ."""
from __future__ import annotations

from transitions.extensions import GraphMachine

from mistk_rl.lifecycle.tables import AGENT, ORCHESTRATOR, Table

SHARED_TRIGGERS = ("fail", "reset", "terminate")


def mermaid(table: Table) -> str:
    """`table`'s resting and busy states and their own rows, as a Mermaid state diagram."""
    rows, facts = [], {}
    for row in table.transitions:
        if row["trigger"] in SHARED_TRIGGERS:
            continue
        drawn = {k: row[k] for k in ("trigger", "source", "dest")}
        if row.get("conditions"):  # _t's `when`: the fact the runner passes with finish
            fact = row["conditions"][0].__defaults__[0]
            drawn["conditions"], facts[fact] = [fact], staticmethod(lambda: True)
        rows.append(drawn)
    states = [s for s in table.states if s != "failed"]
    # the model only has to name the facts: a condition is drawn by its name
    model = type("Facts", (), facts)()
    machine = GraphMachine(model=model, states=states, transitions=rows,
                           initial=table.initial, graph_engine="mermaid",
                           auto_transitions=False, show_conditions=True,
                           title=f"{table.role} lifecycle")
    lines = machine.get_graph().draw(None).splitlines()
    # the initial state is drawn as "active" (red): a picture of the table has no state now
    return "\n".join(line.replace(f"Class {table.initial} s_active",
                                  f"Class {table.initial} s_default") for line in lines)


def document() -> str:
    parts = ["# Lifecycles", "",
             "Generated from `mistk_rl/lifecycle/tables.py` by "
             "`python -m mistk_rl.lifecycle.diagram > docs/lifecycle.md` (a test keeps it "
             "current). Each operation moves a resting state into a busy one; `finish` "
             "leaves the busy state when the implementation's hook returns (a label in "
             "brackets is the fact that picks between two `finish` rows). Not drawn, "
             "because every state has them: `fail` (a hook raised) to `failed` from every "
             "state but `terminating`/`terminated`; `reset` to `resetting` and `terminate` "
             "to `terminating` from the same states, `failed` included; `finish` from "
             "`terminating` to `terminated`. A call that is illegal now gets 409.", ""]
    for table in (AGENT, ORCHESTRATOR):
        parts += [f"## {table.role.capitalize()}", "", "```mermaid", mermaid(table), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(document(), end="")
