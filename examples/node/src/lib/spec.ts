/** The packaged OpenAPI contract, read at start: the routes, their parameters and the JSON
 * schemas requests are checked against all come from it, so the services and the contract
 * cannot drift (the TypeScript types come from the same file, by openapi-typescript). */

import { readFileSync } from "node:fs";
import * as path from "node:path";
import Ajv, { type ValidateFunction } from "ajv";
import { parse } from "yaml";
import { HttpError, invalid } from "./problem";

type Json = Record<string, any>;

export interface Parameter {
  name: string;
  required: boolean;
  schema: Json;
  check: ValidateFunction;
}

export interface Operation {
  id: string;
  method: string;
  path: string;
  secured: boolean;
  params: Parameter[];
  body?: { required: boolean; check?: ValidateFunction; raw: boolean; binary: boolean };
}

/** Where the contracts are: $MISTK_RL_OPENAPI_DIR, else the repository's mistk_rl/openapi. */
export function specPath(role: "agent" | "orchestrator"): string {
  const dir = process.env.MISTK_RL_OPENAPI_DIR ?? path.resolve(__dirname, "../../../../mistk_rl/openapi");
  return path.join(dir, `${role}.yaml`);
}

export class Spec {
  readonly doc: Json;
  readonly basePath: string;
  readonly version: string;
  readonly operations: Operation[];
  private readonly ajv: Ajv;

  constructor(file: string) {
    this.doc = parse(readFileSync(file, "utf8"));
    this.basePath = this.doc.servers[0].url;
    this.version = this.doc.info.version;
    // OpenAPI 3.0's schemas are JSON Schema plus `nullable` (which ajv knows) and x-
    // extensions (which strict: false lets through); formats are the contract's own words
    this.ajv = new Ajv({ strict: false, allErrors: false, validateFormats: false, validateSchema: false });
    this.ajv.addSchema(this.doc, "spec");
    this.operations = this.readOperations();
  }

  schema(ref: string): ValidateFunction {
    const check = this.ajv.getSchema(`spec${ref}`);
    if (!check) throw new Error(`no schema ${ref} in the contract`);
    return check;
  }

  private readOperations(): Operation[] {
    const out: Operation[] = [];
    for (const [route, methods] of Object.entries<Json>(this.doc.paths)) {
      for (const [method, op] of Object.entries<Json>(methods)) {
        out.push({
          id: op.operationId,
          method: method.toUpperCase(),
          path: route,
          secured: !(Array.isArray(op.security) && op.security.length === 0),
          params: (op.parameters ?? []).map((p: Json) => this.parameter(p)),
          body: op.requestBody ? this.body(op.requestBody) : undefined,
        });
      }
    }
    return out;
  }

  private parameter(p: Json): Parameter {
    const ref = p.$ref as string | undefined;
    const param = ref ? this.doc.components.parameters[ref.split("/").pop()!] : p;
    return { name: param.name, required: !!param.required, schema: param.schema, check: this.ajv.compile(param.schema) };
  }

  private body(b: Json): Operation["body"] {
    const content: Json = b.content;
    const json = content["application/json"];
    return {
      required: !!b.required,
      check: json ? this.schema(json.schema.$ref) : undefined,
      raw: "application/octet-stream" in content,
      binary: "application/vnd.mistk.tensors" in content,
    };
  }
}

/** A query value converted as its schema types it, then checked against the schema. */
export function queryValue(param: Parameter, text: string): unknown {
  const type = param.schema.type;
  let value: unknown = text;
  if (type === "integer" || type === "number") {
    const number = text.trim() === "" ? NaN : Number(text);
    if (!Number.isFinite(number) || (type === "integer" && !Number.isInteger(number))) {
      throw invalid(`query parameter ${param.name}: ${JSON.stringify(text)} is not ${type === "integer" ? "an integer" : "a number"}`, param.name);
    }
    value = number;
  } else if (type === "boolean") {
    if (text !== "true" && text !== "false") throw invalid(`query parameter ${param.name}: true or false, not ${JSON.stringify(text)}`, param.name);
    value = text === "true";
  }
  if (!param.check(value)) throw invalid(`query parameter ${param.name}: ${describe(param.check)}`, param.name);
  return value;
}

/** The first schema error, readably. */
export function describe(check: ValidateFunction, where = ""): string {
  const e = check.errors?.[0];
  if (!e) return "invalid";
  const at = `${where}${e.instancePath}` || "the body";
  const extra = e.keyword === "additionalProperties" ? ` (${(e.params as Json).additionalProperty})` : "";
  return `${at} ${e.message ?? "is invalid"}${extra}`;
}

export function bodyError(check: ValidateFunction): HttpError {
  return invalid(`request body: ${describe(check)}`);
}
