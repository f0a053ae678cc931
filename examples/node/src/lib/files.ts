/** Paths callers name (modelPath, path) resolved inside the data dir, and atomic writes. */

import { createHash } from "node:crypto";
import { mkdirSync, renameSync, statSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { invalid } from "./problem";

/** `name` as a file inside `root`; 400 when it would escape it or names a directory. */
export function resolveIn(root: string, name: string): string {
  if (name.includes("\0")) throw invalid(`path ${JSON.stringify(name)} contains a NUL character`);
  const base = path.resolve(root);
  const candidate = path.resolve(base, name);
  if (candidate === base || !candidate.startsWith(base + path.sep)) {
    throw invalid(`path ${JSON.stringify(name)} resolves outside the service's data dir`);
  }
  let isDir = false;
  try {
    isDir = statSync(candidate).isDirectory();
  } catch {
    // (not there yet: fine)
  }
  if (isDir) throw invalid(`path ${JSON.stringify(name)} is a directory`);
  return candidate;
}

/** Written beside the target, then renamed over it: a reader never sees half a file. */
export function atomicWrite(target: string, data: Buffer | string): void {
  mkdirSync(path.dirname(target), { recursive: true });
  const tmp = `${target}.${process.pid}.${Date.now()}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, target);
}

export function written(name: string, data: Buffer): { path: string; bytes: number; sha256: string } {
  return { path: name, bytes: data.length, sha256: createHash("sha256").update(data).digest("hex") };
}
