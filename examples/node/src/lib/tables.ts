/** The agent and orchestrator lifecycles: mistk_rl/lifecycle/tables.py, row for row
 * (tests/test_node_examples.py checks that both give the same allowed operations and
 * moves in every state). A public operation fires its trigger into a busy state; when its
 * work ends, `finish` moves on (some rows only when a fact holds); a failure fires `fail`. */

export interface Row {
  trigger: string;
  source: string[];
  dest: string;
  when?: string; // a fact that must hold (passed when `finish` fires)
}

export interface OperationSpec {
  name: string; // the trigger (snake_case, as tables.py names it)
  background?: boolean; // 202 and run the work after the answer
  preempts?: boolean; // legal while busy: cancels the running work first
}

export interface Table {
  role: "agent" | "orchestrator";
  initial: string;
  states: string[];
  rows: Row[];
  operations: Map<string, OperationSpec>;
  busy: Set<string>;
}

function t(trigger: string, source: string | string[], dest: string, when?: string): Row {
  return { trigger, source: Array.isArray(source) ? source : [source], dest, when };
}

function build(role: Table["role"], initial: string, resting: string[], busy: string[], rows: Row[], ops: OperationSpec[]): Table {
  const states = [...resting, ...busy, "failed", "terminating", "terminated"];
  const live = states.filter((s) => s !== "terminating" && s !== "terminated");
  const common = [t("fail", live, "failed"), t("reset", live, "resetting"), t("terminate", live, "terminating"), t("finish", "terminating", "terminated")];
  const all = [...ops, { name: "reset", background: true, preempts: true }, { name: "terminate", preempts: true }];
  return {
    role,
    initial,
    states,
    rows: [...rows, ...common],
    operations: new Map(all.map((o) => [o.name, o])),
    busy: new Set([...busy, "terminating"]),
  };
}

export const AGENT = build(
  "agent",
  "started",
  ["started", "initialized", "ready", "in_episode"],
  [
    "initializing", "building_model", "building_model_ready", "saving_model_initialized", "saving_model_ready",
    "agent_registering", "episode_starting", "getting_action", "replaying_action", "stepping", "episode_stopping", "resetting",
  ],
  [
    t("initialize", "started", "initializing"),
    t("finish", "initializing", "initialized"),
    t("build_model", "initialized", "building_model"),
    t("finish", "building_model", "initialized"),
    t("build_model", "ready", "building_model_ready"),
    t("finish", "building_model_ready", "ready"),
    t("save_model", "initialized", "saving_model_initialized"),
    t("save_model", "ready", "saving_model_ready"),
    t("finish", "saving_model_initialized", "initialized"),
    t("finish", "saving_model_ready", "ready"),
    t("agent_registered", "initialized", "agent_registering"),
    t("finish", "agent_registering", "ready"),
    t("agent_registered", "ready", "agent_registering"),
    t("episode_started", "ready", "episode_starting"),
    t("finish", "episode_starting", "in_episode"),
    t("get_action", "in_episode", "getting_action"),
    t("finish", "getting_action", "in_episode"),
    t("replay_action", "in_episode", "replaying_action"),
    t("finish", "replaying_action", "in_episode"),
    t("step", "in_episode", "stepping"),
    t("finish", "stepping", "in_episode"),
    t("episode_stopped", "in_episode", "episode_stopping"),
    t("finish", "episode_stopping", "ready"),
    t("finish", "resetting", "initialized", "keep_model"),
    t("finish", "resetting", "started"),
  ],
  [
    { name: "initialize", background: true },
    { name: "build_model", background: true },
    { name: "save_model", background: true },
    { name: "agent_registered" },
    { name: "episode_started" },
    { name: "get_action" },
    { name: "replay_action" },
    { name: "step" },
    { name: "episode_stopped" },
  ],
);

export const ORCHESTRATOR = build(
  "orchestrator",
  "uninitialized",
  ["uninitialized", "waiting_for_agents", "ready", "completed_episode"],
  ["initializing", "registering_agent", "running", "saving_episode", "stopping_episode", "resetting"],
  [
    t("initialize", "uninitialized", "initializing"),
    t("finish", "initializing", "waiting_for_agents"),
    t("register_agent", "waiting_for_agents", "registering_agent"),
    t("finish", "registering_agent", "ready", "all_agents_registered"),
    t("finish", "registering_agent", "waiting_for_agents"),
    t("start_episode", "ready", "running"),
    t("finish", "running", "completed_episode"),
    t("save_episode", "completed_episode", "saving_episode"),
    t("finish", "saving_episode", "completed_episode"),
    t("stop_episode", ["running", "completed_episode"], "stopping_episode"),
    t("finish", "stopping_episode", "ready"),
    t("finish", "resetting", "uninitialized"),
  ],
  [
    { name: "initialize", background: true },
    { name: "register_agent" },
    { name: "start_episode", background: true },
    { name: "save_episode" },
    { name: "stop_episode", preempts: true },
  ],
);

/** build_model -> buildModel: the spec's name of the operation a trigger belongs to. */
export function apiName(trigger: string): string {
  const [head, ...rest] = trigger.split("_");
  return head + rest.map((w) => w[0].toUpperCase() + w.slice(1)).join("");
}

/** The public operations legal in `state` (trigger names, in the table's order). */
export function allowedIn(table: Table, state: string): string[] {
  return [...table.operations.keys()].filter((op) => table.rows.some((r) => r.trigger === op && r.source.includes(state)));
}

/** Where `trigger` moves from `state`: the first row that applies, or undefined. */
export function destination(table: Table, state: string, trigger: string, facts: Record<string, boolean> = {}): string | undefined {
  return table.rows.find((r) => r.trigger === trigger && r.source.includes(state) && (!r.when || facts[r.when]))?.dest;
}
