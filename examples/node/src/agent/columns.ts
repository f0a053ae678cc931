/** stepColumns' columns read and checked (as mistk_rl/wire/step_columns.py reads them):
 * row i of every column is env copy envs[i]; each field checked against `n` rows and the
 * registered spaces, 400 naming the first field at fault. */

import { invalid } from "../lib/problem";
import { type Space, check, checkMask } from "../lib/spaces";

export function rows(value: unknown, field: string, n: number): unknown[] {
  if (!Array.isArray(value)) throw invalid(`${field}: a column (one row per env copy)`, field);
  if (value.length !== n) throw invalid(`${field}: ${value.length} rows, where envs has ${n}`, field);
  return value;
}

export function readInts(value: unknown, field: string, n: number): number[] {
  const column = rows(value, field, n);
  if (!column.every((x) => typeof x === "number" && Number.isInteger(x))) throw invalid(`${field}: one integer per row`, field);
  return column as number[];
}

export function readFlags(value: unknown, field: string, n: number): boolean[] {
  return rows(value, field, n).map((x) => {
    if (x === true || x === 1) return true;
    if (x === false || x === 0) return false;
    throw invalid(`${field}: one flag (true/false or 0/1) per row`, field);
  });
}

/** One number per row; finite at the rows `at` (where rows report). */
export function readNumbers(value: unknown, field: string, n: number, at: number[]): number[] {
  const column = rows(value, field, n);
  if (!column.every((x) => typeof x === "number")) throw invalid(`${field}: one number per row`, field);
  if (at.some((i) => !Number.isFinite(column[i]))) throw invalid(`${field}: one finite number per row`, field);
  return column as number[];
}

/** Observation rows (a Dict space's column is an object of columns, one per key). */
export function readObs(space: Space | undefined, value: unknown, field: string, n: number): unknown[] {
  if (space?.kind === "Dict") {
    const keys = Object.keys(space.spaces);
    if (typeof value !== "object" || value === null || Array.isArray(value) || Object.keys(value).length !== keys.length || !keys.every((k) => k in value)) {
      throw invalid(`${field}: one column per key of the Dict space [${keys}]`, field);
    }
    const columns = Object.fromEntries(keys.map((k) => [k, rows((value as Record<string, unknown>)[k], `${field}.${k}`, n)]));
    const out = Array.from({ length: n }, (_, i) => Object.fromEntries(keys.map((k) => [k, columns[k][i]])));
    out.forEach((row, i) => check(space, row, `${field}[${i}]`, false));
    return out;
  }
  const column = rows(value, field, n);
  if (space) column.forEach((row, i) => check(space, row, `${field}[${i}]`, false));
  return column;
}

export function readMasks(space: Space, value: unknown, field: string, n: number): number[][] {
  return rows(value, field, n).map((row, i) => checkMask(space, row, `${field}[${i}]`, false));
}
