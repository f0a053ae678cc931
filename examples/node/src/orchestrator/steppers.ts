/** The orchestrator's side of the step path (as mistk_rl/sdk/stepping.py): the copies that
 * must act and what their last steps led to, turned into requests. `ColumnStepper` (the
 * agent lists `columns`): one stepColumns request, each outcome reported under the step
 * id its action came with. `EntityStepper`: the entity-keyed step (capability `step`), or
 * replayAction then getAction, each copy an entity `name:i` (`name` for one copy). */

import type { components } from "../generated/agent";
import type { AgentClient } from "./agentClient";
import type { Timestep } from "./cartpole";

type Obs = number[];
export type Outcome = Timestep;

export interface Stepper {
  /** Report `outcomes` (copy -> what its action in flight led to), and answer an action
   * for each `ready` copy (copy -> what it acts on). Nothing ready: only report. */
  step(ready: Map<number, Obs>, outcomes: Map<number, Outcome>): Promise<Map<number, number>>;
}

const done = (o: Outcome) => o.terminated || o.truncated;

export class ColumnStepper implements Stepper {
  private stepIds = new Map<number, number>(); // copy -> the step id of its action in flight

  constructor(private readonly client: AgentClient) {}

  async step(ready: Map<number, Obs>, outcomes: Map<number, Outcome>): Promise<Map<number, number>> {
    if (!ready.size && !outcomes.size) return new Map();
    const reporting = [...outcomes.keys()];
    const rows = [...reporting, ...[...ready.keys()].filter((i) => !outcomes.has(i))];
    const body: components["schemas"]["StepColumns"] = {
      envs: rows,
      obs: rows.map((i) => (outcomes.has(i) ? outcomes.get(i)!.obs : ready.get(i)!)),
    };
    if (reporting.length) {
      const pad = rows.length - reporting.length;
      const column = <T>(f: (o: Outcome) => T, empty: T) => [...reporting.map((i) => f(outcomes.get(i)!)), ...new Array(pad).fill(empty)];
      body.stepIds = rows.map((i, r) => (r < reporting.length ? this.stepIds.get(i) ?? -1 : -1));
      body.rewards = column((o) => o.reward, 0);
      body.terminated = column((o) => o.terminated, false);
      body.truncated = column((o) => o.truncated, false);
      for (const i of reporting) this.stepIds.delete(i);
    }
    const reset = reporting.flatMap((i, r) => (done(outcomes.get(i)!) && ready.has(i) ? [r] : []));
    if (reset.length) body.reset = { rows: reset, obs: reset.map((r) => ready.get(rows[r])!) };
    const acts = rows.map((i) => ready.has(i));
    if (!acts.every(Boolean)) body.act = acts;
    const answer = await this.client.stepColumns(body);
    const acting = rows.filter((i) => ready.has(i));
    acting.forEach((i, k) => answer.stepIds[k] >= 0 && this.stepIds.set(i, answer.stepIds[k]));
    return new Map(acting.map((i, k) => [i, answer.actions[k] as number]));
  }
}

export class EntityStepper implements Stepper {
  private sent = new Map<number, [Obs, number]>(); // copy -> (obs, action) in flight

  constructor(private readonly client: AgentClient, private readonly name: string, private readonly numEnvs: number, private readonly oneCall: boolean) {}

  entity(i: number): string {
    return this.numEnvs === 1 ? this.name : `${this.name}:${i}`;
  }

  async step(ready: Map<number, Obs>, outcomes: Map<number, Outcome>): Promise<Map<number, number>> {
    const replay = outcomes.size ? this.replay(outcomes) : undefined;
    if (!ready.size) {
      if (replay) await this.client.replayAction(replay);
      return new Map();
    }
    const obs = Object.fromEntries([...ready].map(([i, o]) => [this.entity(i), o]));
    let answer;
    if (this.oneCall) answer = await this.client.step({ obs, ...(replay ? { replay } : {}) });
    else {
      if (replay) await this.client.replayAction(replay);
      answer = await this.client.getAction({ obs });
    }
    const actions = new Map([...ready.keys()].map((i) => [i, answer.actions[this.entity(i)] as number]));
    for (const [i, a] of actions) this.sent.set(i, [ready.get(i)!, a]);
    return actions;
  }

  private replay(outcomes: Map<number, Outcome>): components["schemas"]["Replay"] {
    const r: components["schemas"]["Replay"] = { prevObs: {}, actions: {}, rewards: {}, newObs: {}, terminated: {}, truncated: {} };
    for (const [i, o] of outcomes) {
      const e = this.entity(i);
      const [obs, action] = this.sent.get(i)!;
      this.sent.delete(i);
      r.prevObs[e] = obs;
      r.actions[e] = action;
      r.rewards[e] = o.reward;
      r.newObs[e] = o.obs;
      r.terminated[e] = o.terminated;
      r.truncated![e] = o.truncated;
    }
    return r;
  }
}
