/** The orchestrator's side of the agent contract: one typed call per operation it uses,
 * over Node's fetch (keep-alive); a problem answer becomes an `AgentError`. */

import type { components } from "../generated/agent";

type S = components["schemas"];

export class AgentError extends Error {
  constructor(readonly status: number, readonly problem: Record<string, any>, what: string) {
    super(`${what}: HTTP ${status} ${problem.detail ?? problem.title ?? ""}`.trim());
  }
}

export class AgentClient {
  readonly base: string;

  constructor(url: string, private readonly token?: string, private readonly timeoutMs = 20_000) {
    this.base = url.replace(/\/+$/, "") + "/v1/mistk/agent";
  }

  apiVersion(): Promise<S["ApiVersion"]> {
    return this.call("GET", "/apiVersion");
  }

  agentRegistered(config: S["AgentConfig"]): Promise<S["Status"]> {
    return this.call("POST", "/agentRegistered", config);
  }

  episodeStarted(start: S["EpisodeStart"]): Promise<S["Status"]> {
    return this.call("POST", "/episodeStarted", start);
  }

  getAction(request: S["ActionRequest"]): Promise<S["ActionResponse"]> {
    return this.call("POST", "/getAction", request);
  }

  replayAction(replay: S["Replay"]): Promise<S["Status"]> {
    return this.call("POST", "/replayAction", replay);
  }

  step(request: S["StepRequest"]): Promise<S["ActionResponse"]> {
    return this.call("POST", "/step", request);
  }

  stepColumns(body: S["StepColumns"]): Promise<{ actions: unknown[]; stepIds: number[] }> {
    return this.call("POST", "/stepColumns", body);
  }

  episodeStopped(): Promise<S["Status"]> {
    return this.call("POST", "/episodeStopped");
  }

  reset(unloadModel: boolean): Promise<S["Status"]> {
    return this.call("POST", `/reset?unloadModel=${unloadModel}`);
  }

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = {};
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const response = await fetch(this.base + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
    const text = await response.text();
    let parsed: any;
    try {
      parsed = text ? JSON.parse(text) : {};
    } catch {
      throw new AgentError(response.status, {}, `${method} ${path} answered no JSON`);
    }
    if (!response.ok) throw new AgentError(response.status, parsed, `${method} ${path}`);
    return parsed as T;
  }
}
