/** A random agent as a mistk-rl agent service: every operation of agent.yaml, with the
 * AGENT lifecycle; its actions are uniform samples of the registered action space (within
 * the action masks). Its "model" is its seed, saved as JSON. */

import { existsSync, readFileSync } from "node:fs";
import type { components } from "../generated/agent";
import { atomicWrite } from "../lib/files";
import { HttpError, invalid } from "../lib/problem";
import { Rng } from "../lib/rng";
import { type Answer, type Handler, json } from "../lib/server";
import { Service } from "../lib/service";
import { readSpace, sample } from "../lib/spaces";
import { AGENT } from "../lib/tables";
import { type Masks, type Spaces, checkMasks, checkObservations, checkReplay } from "./checks";
import { readStep } from "./stepColumns";
import { StepIds } from "./steps";

type S = components["schemas"];
const PROGRESS_EVERY_S = 1;

export class RandomAgentService extends Service {
  readonly capabilities = ["step", "columns"];
  private seed: number | null = null;
  private rng = new Rng();
  private initialized = false;
  private spaces: Spaces = {};
  private name = "";
  private keepsSteps = true;
  private actionsTaken = 0;
  private readonly steps = new StepIds();

  constructor(dataDir: string) {
    super("agent", AGENT, dataDir);
  }

  handlers(): Record<string, Handler> {
    const run = (op: string, work: () => unknown) => this.lifecycle.run(op, work);
    return {
      initialize: (r) => this.initialize(r.body),
      buildModel: (r) => this.buildModel(r.query.modelPath),
      saveModel: (r) => this.accepted("save_model", () => this.save(this.resolve(r.query.modelPath))),
      agentRegistered: (r) => this.agentRegistered(r.body),
      episodeStarted: (r) => this.episodeStarted(r.body),
      getAction: async (r) => json(200, { actions: await run("get_action", this.acting(r.body)) }),
      replayAction: async (r) => {
        checkReplay(this.spaces, r.body);
        await run("replay_action", () => undefined);
        return this.done();
      },
      step: async (r) => {
        if (r.body.replay) checkReplay(this.spaces, r.body.replay, "replay.");
        return json(200, { actions: await run("step", this.acting(r.body)) });
      },
      stepColumns: async (r) => json(200, await run("step", this.columns(r.body))),
      episodeStopped: async () => {
        await run("episode_stopped", () => undefined);
        return this.done();
      },
      reset: (r) => this.reset(r.query.unloadModel),
      terminate: async () => {
        await run("terminate", () => undefined);
        return this.done();
      },
      getPolicy: () => this.noLocalInference(),
      replayColumns: () => this.noLocalInference(),
      stepStream: () => {
        throw new HttpError(426, "Upgrade Required", "open the step stream with 'Connection: Upgrade' and 'Upgrade: mistk-steps'; this agent lists no capability 'stream': use stepColumns", {}, { upgrade: "mistk-steps" });
      },
    };
  }

  private async accepted(op: string, work: () => void, facts?: () => Record<string, boolean>): Promise<Answer> {
    return { status: 202, body: await this.lifecycle.run(op, work, facts) };
  }

  private initialize(body: S["AgentInitParams"]): Promise<Answer> {
    const seed = (body.hyperparameters ?? {}).seed;
    if (seed !== undefined && seed !== null && !(Number.isInteger(seed) && (seed as number) >= 0)) {
      throw invalid(`hyperparameters.seed must be a non-negative integer, not ${JSON.stringify(seed)}`, "hyperparameters.seed");
    }
    return this.accepted("initialize", () => {
      this.seed = (seed as number | undefined) ?? null;
      this.initialized = true;
    });
  }

  private buildModel(modelPath?: string): Promise<Answer> {
    const file = modelPath ? this.resolve(modelPath) : undefined;
    if (file && !existsSync(file)) throw invalid(`modelPath ${JSON.stringify(modelPath)} does not exist in the data dir`, "modelPath");
    return this.accepted("build_model", () => {
      if (file) this.seed = JSON.parse(readFileSync(file, "utf8")).seed ?? this.seed;
      this.rng = new Rng(this.seed);
      this.actionsTaken = 0;
    });
  }

  private save(file: string): void {
    atomicWrite(file, JSON.stringify({ agent: "RandomAgent (node)", name: this.name, seed: this.seed, actionsTaken: this.actionsTaken }));
  }

  private async agentRegistered(body: S["AgentConfig"]): Promise<Answer> {
    const obs = body.observationSpace && readSpace(body.observationSpace, "observationSpace");
    const action = body.actionSpace && readSpace(body.actionSpace, "actionSpace");
    this.lifecycle.check("agent_registered");
    if (!action) throw invalid("the random agent needs an actionSpace at registration", "actionSpace");
    await this.lifecycle.run("agent_registered", () => {
      this.name = body.name;
      this.spaces = { obs, action };
      this.rng = new Rng(this.seed);
    });
    return this.done();
  }

  private async episodeStarted(body: S["EpisodeStart"]): Promise<Answer> {
    checkObservations(this.spaces, body.obs, "obs");
    if (body.actionMask) checkMasks(this.spaces, body.actionMask, body.obs, "actionMask", true);
    if (body.epsilon !== undefined && body.epsilon !== null) throw invalid("epsilon: the random agent has no epsilon-greedy exploration to set", "epsilon");
    await this.lifecycle.run("episode_started", () => {
      this.keepsSteps = (body.mode ?? "collect") !== "eval";
    });
    return this.done();
  }

  /** The entity form's work: checked now, acting when the lifecycle runs it. */
  private acting(body: S["ActionRequest"]): () => Record<string, unknown> {
    checkObservations(this.spaces, body.obs, "obs");
    const masks: Masks = checkMasks(this.spaces, body.actionMask, body.obs, "actionMask", true);
    return () => {
      const actions = Object.fromEntries(Object.keys(body.obs).map((e) => [e, this.sample(masks?.[e])]));
      this.progress(Object.keys(actions).length);
      return actions;
    };
  }

  /** stepColumns' work: checked now (unknown step ids included), answered when run. */
  private columns(body: S["StepColumns"]): () => S["ColumnActions"] {
    const step = readStep(body, this.spaces);
    this.steps.check(step.reported);
    return () => {
      this.steps.release(step.reported);
      const actions = step.acting.map((_, k) => this.sample(step.masks?.[k]));
      const stepIds = this.keepsSteps ? this.steps.put(actions.length) : actions.map(() => -1);
      this.progress(actions.length);
      return { actions, stepIds };
    };
  }

  private sample(mask?: number[]): unknown {
    return sample(this.spaces.action!, this.rng, mask);
  }

  private progress(n: number): void {
    this.actionsTaken += n;
    this.lifecycle.updatePayload({ actionsTaken: this.actionsTaken }, PROGRESS_EVERY_S);
  }

  private reset(unloadModel: boolean): Promise<Answer> {
    return this.accepted(
      "reset",
      () => {
        this.steps.clear();
        this.spaces = {};
        this.initialized = this.initialized && !unloadModel;
      },
      () => ({ keep_model: this.initialized }),
    );
  }

  private noLocalInference(): never {
    throw invalid("the random agent offers no local inference (no capability 'local')");
  }
}
