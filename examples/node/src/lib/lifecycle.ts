/** The runner of a lifecycle table (as mistk_rl/lifecycle/machine.py): state, version,
 * payload and the running task; `run` fires an operation's trigger, runs its work, then
 * fires `finish` (or `fail`). Node runs one thing at a time, so every move is atomic; work
 * that awaits (an episode over HTTP) can be cancelled through its `Task`. */

import { randomBytes } from "node:crypto";
import { HttpError, illegalState } from "./problem";
import { type Table, allowedIn, apiName, destination } from "./tables";

export interface Status {
  state: string;
  resourceVersion: number;
  payload: Record<string, unknown>;
  reason: string | null;
  allowed: string[];
  instance: string;
}

export class Task {
  cancelled = false;
  finished = false;
  private resolveDone!: () => void;
  readonly done = new Promise<void>((resolve) => (this.resolveDone = resolve));
  private onCancel: (() => void)[] = [];

  constructor(readonly operation: string, readonly origin: string) {}

  cancel(): void {
    this.cancelled = true;
    for (const wake of this.onCancel.splice(0)) wake();
  }

  /** Resolves after `ms`, or at once when cancelled (a wait inside work that must stop soon). */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.cancelled) return resolve();
      const timer = setTimeout(resolve, ms);
      this.onCancel.push(() => (clearTimeout(timer), resolve()));
    });
  }

  finish(): void {
    this.finished = true;
    this.resolveDone();
  }
}

/** Thrown by work to refuse the request after all: the state goes back to where it was. */
export class Rejected extends HttpError {}

export class Lifecycle {
  state: string;
  version = 0;
  payload: Record<string, unknown> = {};
  reason: string | null = null;
  readonly instance = randomBytes(8).toString("hex");
  private task?: Task;
  private watchers = new Set<() => void>();
  private nextWake = 0;

  constructor(readonly table: Table, readonly preemptGraceMs = 5000) {
    this.state = table.initial;
  }

  allowed(): string[] {
    return allowedIn(this.table, this.state);
  }

  allowedApi(): string[] {
    return this.allowed().map(apiName);
  }

  status(): Status {
    return {
      state: this.state,
      resourceVersion: this.version,
      payload: { ...this.payload },
      reason: this.reason,
      allowed: this.allowedApi(),
      instance: this.instance,
    };
  }

  /** 409 unless `operation` is legal now; changes nothing. */
  check(operation: string): void {
    if (!this.allowed().includes(operation)) {
      throw illegalState(apiName(operation), this.state, this.allowedApi(), this.table.busy.has(this.state));
    }
  }

  /** Run `operation`: a background one answers the status at once (the busy state) and
   * does its work after the answer; a foreground one answers the work's result. */
  async run<T>(operation: string, work: (task: Task) => T | Promise<T>, facts?: () => Record<string, boolean>): Promise<T | Status> {
    const op = this.table.operations.get(operation)!;
    if (operation === "terminate" && (this.state === "terminating" || this.state === "terminated")) return this.status();
    this.check(operation);
    const previous = this.task;
    const task = new Task(operation, this.state);
    this.task = task;
    this.fire(operation);
    const accepted = op.background ? this.status() : undefined;
    if (op.preempts && previous && !previous.finished) {
      previous.cancel();
      await Promise.race([previous.done, new Promise((r) => setTimeout(r, this.preemptGraceMs))]);
    }
    if (accepted) {
      setImmediate(() => void this.execute(task, work, facts, true));
      return accepted;
    }
    return this.execute(task, work, facts, false);
  }

  private async execute<T>(task: Task, work: (task: Task) => T | Promise<T>, facts: (() => Record<string, boolean>) | undefined, background: boolean): Promise<T> {
    let result: T;
    try {
      result = await work(task);
    } catch (err) {
      task.finish();
      if (this.task === task) this.failed(task, err);
      if (background) return undefined as T;
      if (err instanceof Rejected) throw err;
      throw new HttpError(500, "Implementation failed", `${this.reason ?? String(err)}; the service is now '${this.state}'`, { state: this.state });
    }
    task.finish();
    if (this.task === task) {
      if (task.operation === "reset") {
        this.reason = null;
        this.payload = {};
      }
      this.fire("finish", facts ? facts() : {});
    }
    return result;
  }

  private failed(task: Task, err: unknown): void {
    if (err instanceof Rejected) {
      this.state = task.origin;
      this.task = undefined;
      this.bump();
      return;
    }
    this.reason = `${apiName(task.operation)} raised ${(err as Error)?.name ?? "Error"}: ${(err as Error)?.message ?? err}`;
    console.error(`${this.table.role}: ${this.reason}`);
    this.fire(this.state === "terminating" ? "finish" : "fail");
  }

  /** Merge progress into the payload; wake long-polls at most once every `everyS` s. */
  updatePayload(progress: Record<string, unknown>, everyS = 0): void {
    Object.assign(this.payload, progress);
    const now = Date.now();
    if (everyS <= 0 || now >= this.nextWake) {
      if (everyS > 0) this.nextWake = now + everyS * 1000;
      this.bump();
    }
  }

  /** The status once the version is past `after` (at once if it is, or if `after` is ahead
   * of this instance's version: the caller saw another one), else after `timeoutS`. */
  waitFor(after: number, timeoutS: number): Promise<Status> {
    if (after > this.version || this.version > after) return Promise.resolve(this.status());
    return new Promise((resolve) => {
      const wake = () => {
        if (this.version <= after) return;
        clearTimeout(timer);
        this.watchers.delete(wake);
        resolve(this.status());
      };
      const timer = setTimeout(() => {
        this.watchers.delete(wake);
        resolve(this.status());
      }, Math.max(0, timeoutS) * 1000);
      this.watchers.add(wake);
    });
  }

  get waiting(): number {
    return this.watchers.size;
  }

  private fire(trigger: string, facts: Record<string, boolean> = {}): void {
    const dest = destination(this.table, this.state, trigger, facts);
    if (dest === undefined) throw new Error(`${this.table.role}: no move for ${trigger} from ${this.state}`);
    this.state = dest;
    this.bump();
  }

  private bump(): void {
    this.version += 1;
    for (const wake of [...this.watchers]) wake();
  }
}
