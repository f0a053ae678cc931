/** The entity-keyed bodies (getAction, step, replayAction, episodeStarted) checked against
 * the registered spaces before anything changes. */

import type { components } from "../generated/agent";
import { invalid } from "../lib/problem";
import { type Space, check, checkMask } from "../lib/spaces";

type Replay = components["schemas"]["Replay"];
export type Masks = Record<string, number[]> | undefined;

export interface Spaces {
  obs?: Space;
  action?: Space;
}

export function checkObservations(spaces: Spaces, obs: Record<string, unknown>, field: string): void {
  if (!spaces.obs) return;
  for (const [entity, value] of Object.entries(obs)) check(spaces.obs, value, `${field}[${JSON.stringify(entity)}]`, false);
}

/** The masks, one per entity of `obs` (`now`: each must allow an action). */
export function checkMasks(spaces: Spaces, masks: Record<string, unknown> | undefined, obs: Record<string, unknown>, field: string, now: boolean): Masks {
  if (!masks || Object.keys(masks).length === 0) return undefined;
  const names = Object.keys(obs).sort();
  const given = Object.keys(masks).sort();
  if (names.join("\0") !== given.join("\0")) throw invalid(`${field} names entities [${given}], obs names [${names}]: one mask per entity`, field);
  if (!spaces.action) throw invalid(`${field}: no action space registered`, field);
  return Object.fromEntries(Object.entries(masks).map(([e, m]) => [e, checkMask(spaces.action!, m, `${field}[${JSON.stringify(e)}]`, now)]));
}

/** A Replay: every field names the same entities, every value in its space. */
export function checkReplay(spaces: Spaces, replay: Replay, prefix = ""): void {
  const entities = Object.keys(replay.actions).sort().join("\0");
  for (const key of ["prevObs", "rewards", "newObs", "terminated", "truncated", "newActionMask"] as const) {
    const value = replay[key];
    if (value && key !== "truncated" && Object.keys(value).sort().join("\0") !== entities) {
      throw invalid(`${prefix}${key} names entities [${Object.keys(value)}], ${prefix}actions names [${Object.keys(replay.actions)}]`, prefix + key);
    }
  }
  checkObservations(spaces, replay.prevObs, `${prefix}prevObs`);
  checkObservations(spaces, replay.newObs, `${prefix}newObs`);
  if (spaces.action) {
    for (const [e, a] of Object.entries(replay.actions)) check(spaces.action, a, `${prefix}actions[${JSON.stringify(e)}]`, true);
  }
  if (replay.newActionMask) checkMasks(spaces, replay.newActionMask, replay.actions, `${prefix}newActionMask`, false);
}
