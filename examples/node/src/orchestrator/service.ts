/** A CartPole orchestrator as a mistk-rl orchestrator service: every operation of
 * orchestrator.yaml with the ORCHESTRATOR lifecycle, its env a port of CartPole-v1
 * (`cartpole.ts`), its agent any service of the agent contract, reached over HTTP. */

import type { components } from "../generated/orchestrator";
import { atomicWrite } from "../lib/files";
import { illegalState, invalid, notFound } from "../lib/problem";
import { type Answer, type Handler, json } from "../lib/server";
import { Service } from "../lib/service";
import { ORCHESTRATOR } from "../lib/tables";
import { AgentClient, AgentError } from "./agentClient";
import { ENV_IDS, MAX_EPISODE_STEPS, actionSpace, observationSpace } from "./cartpole";
import { type Agent, type EpisodeConfig, type EpisodeResult, runEpisodes } from "./episodes";

type S = components["schemas"];
const OPTIONS = ["numEpisodes", "numSteps", "seed", "maxSteps", "train", "numEnvs", "agents"];
const MAX_ENVS = 256;
const AGENT_STATES = new Set(["started", "initialized", "ready", "in_episode", "failed", "terminating", "terminated"]);

/** 400 naming the first key with a value that `known` does not hold (nulls: "not set"). */
function refuseUnknown(given: Record<string, unknown>, known: string[], what: string): void {
  const unknown = Object.keys(given).find((k) => !known.includes(k) && given[k] !== null && given[k] !== undefined);
  if (unknown) throw invalid(`${what}: ${JSON.stringify(unknown)} is not an option of the Node CartPole orchestrator (its options: ${known.join(", ")})`, unknown);
}

/** An agent URL must be http(s) on a loopback host. */
function checkAgentUrl(url: string): void {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw invalid(`agentUrl ${JSON.stringify(url)} is not a valid URL`, "agentUrl");
  }
  if (!["http:", "https:"].includes(parsed.protocol) || !parsed.hostname) throw invalid(`agentUrl ${JSON.stringify(url)} is not an http(s) URL`, "agentUrl");
  const host = parsed.hostname.toLowerCase();
  if (!(host === "localhost" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host))) {
    throw invalid(`agentUrl host ${JSON.stringify(host)} is not allowed: use a loopback address`, "agentUrl");
  }
}

export class CartPoleOrchestratorService extends Service {
  readonly capabilities: string[] = [];
  private agents = new Map<string, Agent>();
  private agentsNeeded = 1;
  private maxSteps = MAX_EPISODE_STEPS;
  private results: EpisodeResult[] = [];
  private envSteps = 0;

  constructor(dataDir: string, private readonly agentToken?: string) {
    super("orchestrator", ORCHESTRATOR, dataDir);
  }

  handlers(): Record<string, Handler> {
    return {
      initialize: (r) => this.initialize(r.body),
      registerAgent: (r) => this.registerAgent(r.query),
      startEpisode: (r) => this.startEpisode(r.body),
      saveEpisode: (r) => this.foreground("save_episode", () => atomicWrite(this.resolve(r.query.path), JSON.stringify({ episodes: this.results }))),
      stopEpisode: () => this.foreground("stop_episode", () => undefined),
      getResults: (r) => {
        const since = r.query.since as number;
        const limit = r.query.limit as number | undefined;
        return json(200, { episodes: this.results.slice(since, limit === undefined ? undefined : since + limit) });
      },
      reset: (r) => this.reset(r.query.resetAgents),
      terminate: () => this.foreground("terminate", () => undefined),
      getLeague: () => {
        throw notFound("the Node CartPole orchestrator runs no league");
      },
      addLeagueWorker: () => {
        throw notFound("the Node CartPole orchestrator runs no league: no workers to join");
      },
    };
  }

  private async foreground(op: string, work: () => void): Promise<Answer> {
    await this.lifecycle.run(op, work);
    return this.done();
  }

  private async initialize(body: S["OrchestratorInitParams"]): Promise<Answer> {
    refuseUnknown(body.env, ["id", "kwargs"], "env");
    if (!ENV_IDS.includes(body.env.id)) throw invalid(`env.id ${JSON.stringify(body.env.id)}: this orchestrator has ${ENV_IDS.join(" (and its alias ")})`, "env.id");
    const kwargs = body.env.kwargs ?? {};
    refuseUnknown(kwargs, ["max_episode_steps"], "env.kwargs");
    const cap = kwargs.max_episode_steps ?? MAX_EPISODE_STEPS;
    if (!Number.isInteger(cap) || (cap as number) < 1) throw invalid("env.kwargs.max_episode_steps: an integer >= 1", "env.kwargs");
    if ((body.agentsNeeded ?? 1) !== 1) throw invalid("agentsNeeded: CartPole has one agent", "agentsNeeded");
    return {
      status: 202,
      body: await this.lifecycle.run("initialize", () => {
        this.maxSteps = cap as number;
        this.results = [];
        this.envSteps = 0;
      }),
    };
  }

  private async registerAgent(q: Record<string, any>): Promise<Answer> {
    checkAgentUrl(q.agentUrl);
    if (this.agents.has(q.agentName)) throw invalid(`an agent named ${JSON.stringify(q.agentName)} is registered already`, "agentName");
    if (q.seats) throw invalid("the Node CartPole orchestrator has no seats: registerAgent takes seats only for games", "seats");
    if (q.localInference) throw invalid("localInference: the Node CartPole orchestrator does not run policy copies", "localInference");
    this.lifecycle.check("register_agent");
    const client = new AgentClient(q.agentUrl, this.agentToken);
    const capabilities = await this.handshake(client, q.agentName, q.agentUrl, q.skipTrain);
    await this.lifecycle.run(
      "register_agent",
      () => void this.agents.set(q.agentName, { name: q.agentName, client, capabilities, skipTrain: q.skipTrain }),
      () => ({ all_agents_registered: this.agents.size >= this.agentsNeeded }),
    );
    return this.done();
  }

  /** apiVersion (a mistk-rl agent?) then agentRegistered with CartPole's spaces; only
   * status codes and our own words go back to the caller. */
  private async handshake(client: AgentClient, name: string, url: string, skipTrain: boolean): Promise<string[]> {
    const where = `agent ${JSON.stringify(name)} at ${url}`;
    let version;
    try {
      version = await client.apiVersion();
    } catch (err) {
      throw invalid(err instanceof AgentError ? `${where} does not answer apiVersion as a mistk-rl agent (HTTP ${err.status})` : `${where} cannot be reached`, "agentUrl");
    }
    if (version.role !== "agent") throw invalid(`${where} is a mistk-rl ${version.role}, not an agent`, "agentUrl");
    try {
      await client.agentRegistered({ name, train: !skipTrain, observationSpace, actionSpace, properties: {} });
    } catch (err) {
      if (err instanceof AgentError && err.status === 409) {
        const agentState = AGENT_STATES.has(err.problem.state) ? err.problem.state : "unknown";
        const e = illegalState("registerAgent", this.lifecycle.state, this.lifecycle.allowedApi(), false, `${where} cannot be registered in its state '${agentState}': initialize it (and buildModel) or reset it first`);
        e.extra.agentState = agentState;
        throw e;
      }
      throw invalid(`${where} refused registration (${err instanceof AgentError ? `HTTP ${err.status}` : "no answer"})`, "agentUrl");
    }
    return version.capabilities ?? [];
  }

  private async startEpisode(body: EpisodeConfig): Promise<Answer> {
    refuseUnknown(body as Record<string, unknown>, OPTIONS, "startEpisode");
    if ((body.numEnvs ?? 1) > MAX_ENVS) throw invalid(`numEnvs ${body.numEnvs}: at most ${MAX_ENVS}`, "numEnvs");
    this.lifecycle.check("start_episode");
    for (const [name, own] of Object.entries(body.agents ?? {})) {
      if (!this.agents.has(name)) throw invalid(`agents: ${JSON.stringify(name)} is not registered (registered: ${[...this.agents.keys()].join(", ")})`, "agents");
      if (own.mode === "eval" && own.train) throw invalid(`agents[${JSON.stringify(name)}]: mode eval never learns; train needs mode collect`, "agents");
      if (own.localInference != null) throw invalid(`agents[${JSON.stringify(name)}].localInference: this orchestrator does not run policy copies`, "agents");
    }
    const [agent] = this.agents.values();
    const book = this.book();
    const work = async (task: Parameters<typeof runEpisodes>[0]) => {
      await runEpisodes(task, body, agent, book, this.maxSteps);
      this.envSteps = book.envSteps;
    };
    return { status: 202, body: await this.lifecycle.run("start_episode", work) };
  }

  /** Where a run writes its episodes and progress (this service's results and status). */
  private book() {
    const self = this;
    return {
      results: this.results,
      get envSteps() {
        return self.envSteps;
      },
      set envSteps(v: number) {
        self.envSteps = v;
      },
      report: (progress: Record<string, unknown>, everyS: number) => this.lifecycle.updatePayload(progress, everyS),
    };
  }

  private async reset(resetAgents: boolean): Promise<Answer> {
    const work = async () => {
      const agents = [...this.agents.values()];
      this.agents.clear();
      this.results = [];
      this.envSteps = 0;
      if (!resetAgents) return;
      const failures = await Promise.allSettled(agents.map((a) => a.client.reset(false)));
      failures.forEach((f, k) => f.status === "rejected" && console.warn(`orchestrator reset: agent ${agents[k].name}: ${f.reason}`));
    };
    return { status: 202, body: await this.lifecycle.run("reset", work) };
  }
}

