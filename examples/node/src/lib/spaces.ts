/** gymnasium spaces as the contract describes them (the spec's Space): read from a
 * registration, values checked against them, and uniform samples drawn from them. */

import type { components } from "../generated/agent";
import { invalid } from "./problem";
import type { Rng } from "./rng";

export type SpaceDescription = components["schemas"]["Space"];

export type Space =
  | { kind: "Box"; shape: number[]; low: number[]; high: number[]; integer: boolean }
  | { kind: "Discrete"; n: number; start: number }
  | { kind: "MultiDiscrete"; shape: number[]; nvec: number[] }
  | { kind: "MultiBinary"; shape: number[] }
  | { kind: "Dict"; spaces: Record<string, Space> };

const KEY = /^[A-Za-z_][A-Za-z0-9_-]{0,63}$/;
const MAX_ELEMENTS = 1 << 20;
const HUGE = 1e308; // JSON has no infinity: the services send the largest float for it

/** A nested list of numbers (booleans count as 0/1) as its shape and its values in order;
 * 400 naming `field` when it is not a rectangular array of numbers. */
export function flatten(value: unknown, field: string): { shape: number[]; flat: number[] } {
  const flat: number[] = [];
  const walk = (v: unknown, depth: number, shape: number[]): void => {
    if (typeof v === "number" || typeof v === "boolean") {
      if (depth !== shape.length) throw invalid(`${field}: not a rectangular array of numbers`, field);
      flat.push(Number(v));
      return;
    }
    if (!Array.isArray(v)) throw invalid(`${field}: numbers or nested lists of numbers, not ${typeof v}`, field);
    if (depth === shape.length) shape.push(v.length);
    else if (shape[depth] !== v.length) throw invalid(`${field}: not a rectangular array of numbers (ragged)`, field);
    for (const item of v) walk(item, depth + 1, shape);
  };
  const shape: number[] = [];
  if (Array.isArray(value) && value.length > 0) {
    // the shape is read along the first elements, then every element must agree
    let probe: unknown = value;
    while (Array.isArray(probe) && probe.length > 0) {
      shape.push(probe.length);
      probe = probe[0];
    }
    const fixed = [...shape];
    const walkFixed = (v: unknown, depth: number): void => {
      if (depth === fixed.length) {
        if (typeof v !== "number" && typeof v !== "boolean") throw invalid(`${field}: not a rectangular array of numbers`, field);
        flat.push(Number(v));
        return;
      }
      if (!Array.isArray(v) || v.length !== fixed[depth]) throw invalid(`${field}: not a rectangular array of numbers (ragged)`, field);
      for (const item of v) walkFixed(item, depth + 1);
    };
    walkFixed(value, 0);
    return { shape: fixed, flat };
  }
  walk(value, 0, shape);
  return { shape, flat };
}

const size = (shape: number[]) => shape.reduce((a, b) => a * b, 1);
const sameShape = (a: number[], b: number[]) => a.length === b.length && a.every((x, i) => x === b[i]);

/** A space from its description; 400 naming `field` when it is not one the contract allows. */
export function readSpace(d: SpaceDescription, field: string): Space {
  if (d.type === "Dict") {
    const spaces: Record<string, Space> = {};
    for (const [key, sub] of Object.entries((d as components["schemas"]["DictSpace"]).spaces)) {
      if (!KEY.test(key)) throw invalid(`${field}.spaces: key ${JSON.stringify(key)} does not match ${KEY.source}`, field);
      spaces[key] = readSpace(sub, `${field}.spaces.${key}`);
    }
    return { kind: "Dict", spaces };
  }
  const f = d as components["schemas"]["FundamentalSpace"];
  const need = <T>(v: T | undefined, name: string): T => {
    if (v === undefined || v === null) throw invalid(`${field}: a ${f.type} space needs ${name}`, field);
    return v;
  };
  let space: Space;
  if (f.type === "Discrete") space = { kind: "Discrete", n: need(f.n, "n"), start: f.start ?? 0 };
  else if (f.type === "MultiBinary") space = { kind: "MultiBinary", shape: need(f.shape, "shape") };
  else if (f.type === "MultiDiscrete") {
    const { shape, flat } = flatten(need(f.nvec, "nvec"), `${field}.nvec`);
    if (flat.some((n) => !Number.isInteger(n) || n < 1)) throw invalid(`${field}.nvec: integers >= 1`, field);
    space = { kind: "MultiDiscrete", shape, nvec: flat };
  } else {
    const shape = need(f.shape, "shape");
    const bound = (v: unknown, name: string) => {
      const { shape: s, flat } = flatten(need(v, name), `${field}.${name}`);
      if (s.length === 0) return new Array(size(shape)).fill(flat[0]);
      if (!sameShape(s, shape)) throw invalid(`${field}.${name}: shape [${s}], where the space's is [${shape}]`, field);
      return flat;
    };
    const low = bound(f.low, "low");
    const high = bound(f.high, "high");
    if (low.some((l, i) => l > high[i])) throw invalid(`${field}: low > high`, field);
    space = { kind: "Box", shape, low, high, integer: /int/.test(f.dtype ?? "float32") };
  }
  if ("shape" in space && size(space.shape) > MAX_ELEMENTS) throw invalid(`${field}: more than ${MAX_ELEMENTS} elements`, field);
  return space;
}

/** 400 unless `value` belongs to `space` (`bounds`: float Box bounds too; integer ones
 * always). */
export function check(space: Space, value: unknown, field: string, bounds: boolean): void {
  if (space.kind === "Dict") {
    if (typeof value !== "object" || value === null || Array.isArray(value)) throw invalid(`${field}: an object with one value per key of the Dict space`, field);
    const keys = Object.keys(space.spaces);
    const given = Object.keys(value);
    if (given.length !== keys.length || !keys.every((k) => k in value)) {
      throw invalid(`${field}: the keys [${given}], where the Dict space has [${keys}]`, field);
    }
    for (const k of keys) check(space.spaces[k], (value as Record<string, unknown>)[k], `${field}.${k}`, bounds);
    return;
  }
  const { shape, flat } = flatten(value, field);
  const wanted = space.kind === "Discrete" ? [] : space.shape;
  if (!sameShape(shape, wanted)) throw invalid(`${field}: shape [${shape}], where the space's is [${wanted}]`, field);
  const bad = (i: number) => invalid(`${field}: element ${i} (${flat[i]}) is not in the ${space.kind} space`, field);
  for (let i = 0; i < flat.length; i++) {
    const x = flat[i];
    if (space.kind === "Discrete" && !(Number.isInteger(x) && x >= space.start && x < space.start + space.n)) throw bad(i);
    if (space.kind === "MultiDiscrete" && !(Number.isInteger(x) && x >= 0 && x < space.nvec[i])) throw bad(i);
    if (space.kind === "MultiBinary" && x !== 0 && x !== 1) throw bad(i);
    if (space.kind === "Box") {
      if (space.integer && !Number.isInteger(x)) throw bad(i);
      if ((space.integer || bounds) && (x < space.low[i] || x > space.high[i])) throw bad(i);
    }
  }
}

/** 400 unless `mask` is a Discrete space's action mask (n flags); `now`: one must be set
 * (the actions to pick from now; a final observation's mask may allow none). */
export function checkMask(space: Space, mask: unknown, field: string, now: boolean): number[] {
  if (space.kind !== "Discrete") throw invalid(`${field}: action masks are for Discrete action spaces`, field);
  const { shape, flat } = flatten(mask, field);
  if (!sameShape(shape, [space.n]) || flat.some((x) => x !== 0 && x !== 1)) throw invalid(`${field}: ${space.n} flags (0/1 or true/false)`, field);
  if (now && !flat.includes(1)) throw invalid(`${field}: the mask allows no action`, field);
  return flat;
}

function reshape(flat: number[], shape: number[]): unknown {
  if (shape.length === 0) return flat[0];
  const step = size(shape.slice(1));
  return Array.from({ length: shape[0] }, (_, i) => reshape(flat.slice(i * step, (i + 1) * step), shape.slice(1)));
}

function boxElement(rng: Rng, low: number, high: number, integer: boolean): number {
  const lowFinite = low > -HUGE;
  const highFinite = high < HUGE;
  if (integer) return Math.floor(rng.uniform(lowFinite ? low : -(2 ** 31), (highFinite ? high : 2 ** 31 - 1) + 1));
  if (lowFinite && highFinite) return rng.uniform(low, high);
  if (lowFinite) return low + rng.exponential();
  if (highFinite) return high - rng.exponential();
  return rng.normal();
}

/** A uniform sample of `space` (as gymnasium's `Space.sample`), within `mask` (Discrete). */
export function sample(space: Space, rng: Rng, mask?: number[]): unknown {
  switch (space.kind) {
    case "Discrete": {
      if (!mask) return space.start + rng.below(space.n);
      const legal = mask.flatMap((m, i) => (m ? [i] : []));
      return space.start + legal[rng.below(legal.length)];
    }
    case "Box":
      return reshape(space.low.map((l, i) => boxElement(rng, l, space.high[i], space.integer)), space.shape);
    case "MultiDiscrete":
      return reshape(space.nvec.map((n) => rng.below(n)), space.shape);
    case "MultiBinary":
      return reshape(new Array(size(space.shape)).fill(0).map(() => rng.below(2)), space.shape);
    case "Dict":
      return Object.fromEntries(Object.entries(space.spaces).map(([k, s]) => [k, sample(s, rng)]));
  }
}
