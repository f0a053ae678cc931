/** A stepColumns body read as mistk_rl/wire/step_columns.py's `read_step` reads it: which
 * earlier steps it reports (stepIds >= 0, with their rewards and flags), and which rows act
 * on what (`act`; a row in `reset` acts on its new episode's first observation). */

import type { components } from "../generated/agent";
import { invalid } from "../lib/problem";
import { checkMask } from "../lib/spaces";
import type { Spaces } from "./checks";
import { readFlags, readInts, readMasks, readNumbers, readObs } from "./columns";

export const MAX_ROWS = 1024;

export interface ColumnStep {
  reported: number[]; // the step ids whose outcomes came
  acting: number[]; // the rows that act
  masks?: number[][]; // per acting row, its legal actions
}

export function readStep(body: components["schemas"]["StepColumns"], spaces: Spaces): ColumnStep {
  const n = Array.isArray(body.envs) ? body.envs.length : -1;
  const envs = readInts(body.envs, "envs", n);
  if (envs.some((e) => e < 0) || new Set(envs).size !== n) throw invalid("envs: one distinct env copy index (>= 0) per row", "envs");
  if (n > MAX_ROWS) throw invalid(`envs: ${n} rows, more than the ${MAX_ROWS} this agent takes`, "envs");
  readObs(spaces.obs, body.obs, "obs", n);
  let masks = body.actionMask == null ? undefined : readMasks(needAction(spaces, "actionMask"), body.actionMask, "actionMask", n);
  const acts = body.act === undefined ? undefined : readFlags(body.act, "act", n);
  const ids = body.stepIds === undefined ? new Array(n).fill(-1) : readInts(body.stepIds, "stepIds", n);
  const at = ids.flatMap((id, i) => (id >= 0 ? [i] : []));
  if (at.length) {
    readNumbers(body.rewards, "rewards", n, at);
    readFlags(body.terminated, "terminated", n);
    if (body.truncated !== undefined) readFlags(body.truncated, "truncated", n);
  }
  if (body.reset) masks = readReset(body.reset, spaces, n, masks);
  const acting = acts === undefined ? envs.map((_, i) => i) : acts.flatMap((a, i) => (a ? [i] : []));
  const actingMasks = masks && acting.map((i) => checkMask(spaces.action!, masks![i], `actionMask[${i}]`, true));
  return { reported: at.map((i) => ids[i]), acting, masks: actingMasks };
}

/** The reset rows' new observations (checked) and the masks with theirs in place. */
function readReset(reset: NonNullable<components["schemas"]["StepColumns"]["reset"]>, spaces: Spaces, n: number, masks?: number[][]): number[][] | undefined {
  const count = Array.isArray(reset.rows) ? reset.rows.length : -1;
  const rows = readInts(reset.rows, "reset.rows", count);
  if (rows.some((r) => r < 0 || r >= n) || new Set(rows).size !== rows.length) throw invalid(`reset.rows: distinct row indices in [0, ${n})`, "reset.rows");
  readObs(spaces.obs, reset.obs, "reset.obs", rows.length);
  if (!masks) return undefined;
  if (reset.actionMask == null) throw invalid("reset.actionMask: actionMask is given, so the reset rows need theirs", "reset.actionMask");
  const fresh = readMasks(spaces.action!, reset.actionMask, "reset.actionMask", rows.length);
  const out = [...masks];
  rows.forEach((r, k) => (out[r] = fresh[k]));
  return out;
}

function needAction(spaces: Spaces, field: string) {
  if (!spaces.action) throw invalid(`${field}: no action space registered`, field);
  return spaces.action;
}
