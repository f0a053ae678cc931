/** Running episodes of CartPole copies against the registered agent (the loop of
 * orchestrators/gym_orchestrator.py): episodeStarted, then rounds of one step request for
 * the ready copies (carrying their last steps' outcomes) and one env step each, then the
 * last outcomes and episodeStopped. A cancelled task (stopEpisode, reset) ends the loop. */

import type { components } from "../generated/orchestrator";
import type { Task } from "../lib/lifecycle";
import type { AgentClient } from "./agentClient";
import { CartPole } from "./cartpole";
import { ColumnStepper, EntityStepper, type Outcome, type Stepper } from "./steppers";

export type EpisodeConfig = components["schemas"]["EpisodeConfig"];
export type EpisodeResult = components["schemas"]["EpisodeResult"];

export interface Agent {
  name: string;
  client: AgentClient;
  capabilities: string[];
  skipTrain: boolean;
}

export interface Book {
  results: EpisodeResult[];
  envSteps: number;
  report(progress: Record<string, unknown>, everyS: number): void;
}

interface Running {
  env: CartPole;
  seed: number | null;
  obs: number[];
  return: number;
  length: number;
  finished: number;
}

/** Episodes each copy plays: `limit` split evenly, the remainder to the first copies. */
export function quotas(limit: number | null, n: number): number[] {
  if (limit === null) return new Array(n).fill(Infinity);
  return Array.from({ length: n }, (_, i) => Math.floor(limit / n) + (i < limit % n ? 1 : 0));
}

/** (mode, learn) of the agent in this call: its `agents` entry over the call's train. */
export function playSettings(config: EpisodeConfig, agent: Agent): [string, boolean] {
  const own = config.agents?.[agent.name];
  const train = (own?.train ?? config.train ?? true) && !agent.skipTrain;
  const mode = own?.mode ?? (train ? "collect" : "eval");
  return [mode, train && mode === "collect"];
}

function stepperFor(agent: Agent, n: number): Stepper {
  if (agent.capabilities.includes("columns")) return new ColumnStepper(agent.client);
  return new EntityStepper(agent.client, agent.name, n, agent.capabilities.includes("step"));
}

export async function runEpisodes(task: Task, config: EpisodeConfig, agent: Agent, book: Book, maxSteps: number): Promise<void> {
  const n = config.numEnvs ?? 1;
  const [mode, learn] = playSettings(config, agent);
  const seedOf = (i: number) => (config.seed == null ? null : config.seed + i);
  const copies: Running[] = Array.from({ length: n }, (_, i) => {
    const env = new CartPole(seedOf(i), maxSteps);
    return { env, seed: seedOf(i), obs: env.reset(), return: 0, length: 0, finished: 0 };
  });
  const quota = quotas(config.numEpisodes ?? (config.numSteps != null ? null : 1), n);
  const active = new Set(copies.flatMap((_, i) => (quota[i] > 0 ? [i] : [])));
  const stepper = stepperFor(agent, n);
  const entity = (i: number) => (n === 1 ? agent.name : `${agent.name}:${i}`);
  await agent.client.episodeStarted({
    obs: Object.fromEntries([...active].map((i) => [entity(i), copies[i].obs])),
    mode: mode as "collect" | "eval",
    episode: book.results.length,
    ...(config.agents?.[agent.name]?.epsilon != null ? { epsilon: config.agents[agent.name].epsilon } : {}),
  });
  const start = book.envSteps;
  let outcomes = new Map<number, Outcome>();
  try {
    while (active.size && !task.cancelled) {
      const ready = new Map([...active].map((i) => [i, copies[i].obs]));
      const actions = await stepper.step(ready, outcomes);
      outcomes = new Map();
      for (const [i, action] of actions) {
        const ts = tookStep(copies[i], action, config, book, agent.name, i, learn);
        if (learn) outcomes.set(i, ts);
        if (ts.terminated || ts.truncated) {
          const spent = config.numSteps != null && book.envSteps - start >= config.numSteps;
          if (spent || copies[i].finished >= quota[i]) active.delete(i);
        }
      }
      book.report({ envSteps: book.envSteps }, 1);
    }
    await stepper.step(new Map(), outcomes);
    if (task.cancelled) recordCancelled(copies, active, book, agent.name, learn);
  } finally {
    book.report({ envSteps: book.envSteps }, 0);
    await agent.client.episodeStopped();
  }
}

/** One env step of copy `i`: counted, and its episode recorded (and the copy reset) when
 * it ends; the outcome as the agent hears it (maxSteps counts as a truncation). */
function tookStep(copy: Running, action: number, config: EpisodeConfig, book: Book, agent: string, i: number, learn: boolean): Outcome {
  const ts = copy.env.step(action);
  copy.return += ts.reward;
  copy.length += 1;
  book.envSteps += 1;
  const capped = config.maxSteps != null && copy.length >= config.maxSteps && !ts.terminated;
  const outcome = { ...ts, truncated: ts.truncated || capped };
  copy.obs = ts.obs;
  if (outcome.terminated || outcome.truncated) {
    record(book, agent, copy, { terminated: outcome.terminated, truncated: outcome.truncated, cancelled: false, train: learn, envIndex: i });
    copy.finished += 1;
    copy.seed = null; // (its later episodes continue the copy's random stream)
    copy.obs = copy.env.reset();
    copy.return = 0;
    copy.length = 0;
  }
  return outcome;
}

function record(book: Book, agent: string, copy: Running, extra: Partial<EpisodeResult>): void {
  const result: EpisodeResult = { episode: book.results.length, agent, return: copy.return, length: copy.length, envSteps: book.envSteps, seed: copy.seed, ...extra };
  book.results.push(result);
  book.report({ episodesDone: book.results.length, lastEpisode: result }, 1);
}

function recordCancelled(copies: Running[], active: Set<number>, book: Book, agent: string, learn: boolean): void {
  for (const i of [...active].sort((a, b) => a - b)) {
    if (copies[i].length) record(book, agent, copies[i], { cancelled: true, train: learn, envIndex: i });
  }
}
