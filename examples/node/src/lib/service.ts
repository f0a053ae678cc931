/** What both services share (as mistk_rl/service/handlers/common.py): status with its
 * long-poll, apiVersion, terminate, the data dir's files, and the command line. */

import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { atomicWrite, resolveIn, written } from "./files";
import { Lifecycle } from "./lifecycle";
import { HttpError, illegalState, notFound } from "./problem";
import { type Answer, type Handler, type Request, createServer, json } from "./server";
import { Spec, specPath } from "./spec";
import type { Table } from "./tables";

export const MAX_LONG_POLL_S = 60;
export const MAX_LONG_POLLS = 1024;

export interface Options {
  port: number;
  host: string;
  dataDir: string;
  token?: string;
}

/** --port N (0: a free one), --host (default loopback), --data-dir, --token (default
 * $MISTK_RL_TOKEN, as `mistk-rl serve` reads it). */
export function parseArgs(argv: string[], defaultPort: number): Options {
  const options: Options = { port: defaultPort, host: "127.0.0.1", dataDir: "data", token: process.env.MISTK_RL_TOKEN || undefined };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === "--port") options.port = Number(value);
    else if (flag === "--host") options.host = value;
    else if (flag === "--data-dir") options.dataDir = value;
    else if (flag === "--token") options.token = value;
    else throw new Error(`unknown option ${flag} (options: --port, --host, --data-dir, --token)`);
  }
  if (!Number.isInteger(options.port) || options.port < 0 || options.port > 65535) throw new Error(`--port ${options.port}: 0..65535`);
  return options;
}

export abstract class Service {
  readonly spec: Spec;
  readonly lifecycle: Lifecycle;
  abstract readonly capabilities: string[];

  constructor(readonly role: "agent" | "orchestrator", table: Table, readonly dataDir: string) {
    this.spec = new Spec(specPath(role));
    this.lifecycle = new Lifecycle(table);
    mkdirSync(dataDir, { recursive: true });
  }

  /** The handlers of this role's operations, by operationId. */
  abstract handlers(): Record<string, Handler>;

  common(): Record<string, Handler> {
    return {
      status: (r) => this.status(r),
      apiVersion: () => json(200, { version: this.spec.version, role: this.role, capabilities: this.capabilities }),
      getFile: (r) => this.getFile(r.query.path),
      putFile: (r) => this.putFile(r.query.path, r.body ?? Buffer.alloc(0)),
    };
  }

  done(): Answer {
    return json(200, this.lifecycle.status());
  }

  private async status(r: Request): Promise<Answer> {
    const after = r.query.resourceVersion;
    if (after === undefined) return this.done();
    if (this.lifecycle.waiting >= MAX_LONG_POLLS) {
      throw new HttpError(429, "Too Many Requests", `${MAX_LONG_POLLS} status long-polls are waiting already; retry later or poll without resourceVersion`, { retryAfter: 1 }, { "retry-after": "1" });
    }
    return json(200, await this.lifecycle.waitFor(after, Math.min(r.query.timeout, MAX_LONG_POLL_S)));
  }

  private getFile(name: string): Answer {
    const file = resolveIn(this.dataDir, name);
    if (!existsSync(file)) throw notFound(`no file at ${JSON.stringify(name)}`);
    return { status: 200, body: readFileSync(file) };
  }

  private putFile(name: string, body: Buffer): Answer {
    if (this.lifecycle.state === "terminated") throw illegalState("putFile", "terminated", this.lifecycle.allowedApi(), false);
    atomicWrite(resolveIn(this.dataDir, name), body);
    return json(200, written(name, body));
  }

  /** Listen on `options`' address; prints the base URL once it does. */
  listen(options: Options): void {
    const server = createServer(this.spec, { ...this.common(), ...this.handlers() }, { token: options.token, instance: this.lifecycle.instance });
    server.listen(options.port, options.host, () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : options.port;
      console.log(`mistk-rl node ${this.role} listening on http://${options.host}:${port}${this.spec.basePath}`);
    });
    const stop = () => {
      server.close(() => process.exit(0));
      server.closeAllConnections();
    };
    process.on("SIGTERM", stop);
    process.on("SIGINT", stop);
  }

  resolve(name: string): string {
    return resolveIn(this.dataDir, name);
  }
}

