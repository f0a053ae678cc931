/** The step ids stepColumns answers: every action gets one, and a later request reports
 * the step's outcome under it (mistk_rl/service/steps.py). A random agent learns nothing,
 * so only the ids are kept, to refuse an outcome for a step it never answered. */

import { invalid } from "../lib/problem";

export class StepIds {
  private next = 0;
  private waiting = new Set<number>();

  constructor(private readonly max = 1 << 20) {}

  /** `n` new ids, each waiting for its outcome (the oldest dropped past `max`). */
  put(n: number): number[] {
    const ids = Array.from({ length: n }, () => this.next++);
    for (const id of ids) this.waiting.add(id);
    for (const old of this.waiting) {
      if (this.waiting.size <= this.max) break;
      this.waiting.delete(old);
    }
    return ids;
  }

  /** 400 naming the first id not waiting (never answered, reported already, or too old);
   * changes nothing. */
  check(ids: number[], field = "stepIds"): void {
    const seen = new Set<number>();
    ids.forEach((id, i) => {
      if (!this.waiting.has(id) || seen.has(id)) {
        throw invalid(`${field}[${i}]: step id ${id} is not one this agent is waiting on (never answered, reported already, or too old)`, field);
      }
      seen.add(id);
    });
  }

  release(ids: number[]): void {
    for (const id of ids) this.waiting.delete(id);
  }

  /** Reset: nothing waits any more (ids keep counting, so they stay unique). */
  clear(): void {
    this.waiting.clear();
  }
}
