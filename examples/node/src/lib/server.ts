/** One HTTP server for a contract: routes from the spec, then for every operation the same
 * rules in the same order as the Python services (mistk_rl/service/pipeline.py): the bearer
 * token (401), the query parameters (400), the body's size (413), type (415), JSON (400)
 * and schema (400), then the handler; every failure answered as problem+json. */

import * as http from "node:http";
import { timingSafeEqual } from "node:crypto";
import { HttpError, invalid } from "./problem";
import { type Operation, Spec, bodyError, queryValue } from "./spec";

export interface Request {
  query: Record<string, any>;
  body: any; // parsed JSON, a Buffer for file bodies, undefined without one
  headers: http.IncomingHttpHeaders;
}

export interface Answer {
  status: number;
  body: unknown; // JSON, or a Buffer (application/octet-stream)
  headers?: Record<string, string>;
}

export type Handler = (request: Request) => Answer | Promise<Answer>;

export interface ServeOptions {
  token?: string;
  instance: string;
  maxBodyBytes?: number;
  maxFileBytes?: number;
}

const JSON_TYPE = "application/json";
const OCTET_TYPE = "application/octet-stream";
const TENSORS_TYPE = "application/vnd.mistk.tensors";

export function json(status: number, body: unknown): Answer {
  return { status, body };
}

export function createServer(spec: Spec, handlers: Record<string, Handler>, options: ServeOptions): http.Server {
  const routes = new Map<string, Operation>();
  const allow = new Map<string, string[]>();
  for (const op of spec.operations) {
    if (!handlers[op.id]) throw new Error(`no handler for the contract's operation ${op.id}`);
    routes.set(`${op.method} ${spec.basePath}${op.path}`, op);
    allow.set(spec.basePath + op.path, [...(allow.get(spec.basePath + op.path) ?? []), op.method]);
  }
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://service");
    const op = routes.get(`${req.method} ${url.pathname}`);
    const done = (answer: Answer) => send(res, answer, options.instance);
    if (!op) {
      const methods = allow.get(url.pathname);
      req.resume();
      return done(
        problemAnswer(
          methods
            ? new HttpError(405, "Method Not Allowed", `${req.method} is not allowed here: ${methods.join(", ")}`, {}, { allow: methods.join(", ") })
            : new HttpError(404, "Not Found", `no operation at ${url.pathname}`),
        ),
      );
    }
    serve(op, req, url, handlers[op.id], options).then(done, (err) => {
      req.resume();
      done(failure(op, err));
    });
  });
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 70_000;
  return server;
}

async function serve(op: Operation, req: http.IncomingMessage, url: URL, handler: Handler, options: ServeOptions): Promise<Answer> {
  if (op.secured && options.token && !authorized(req.headers.authorization, options.token)) {
    throw new HttpError(401, "Unauthorized", "No authorization token provided, or it is not valid", {}, { "www-authenticate": "Bearer" });
  }
  const query = readQuery(op, url.searchParams);
  let body: unknown;
  if (op.body) {
    const limit = op.body.raw ? options.maxFileBytes ?? 1 << 30 : options.maxBodyBytes ?? 16 << 20;
    const raw = await readBody(req, limit);
    if (raw.length || op.body.required) body = decode(op, req.headers["content-type"], raw);
  } else {
    req.resume();
  }
  return handler({ query, body, headers: req.headers });
}

function readQuery(op: Operation, params: URLSearchParams): Record<string, any> {
  const out: Record<string, any> = {};
  for (const param of op.params) {
    const text = params.get(param.name);
    if (text === null) {
      if (param.required) throw invalid(`query parameter ${param.name} is required`, param.name);
      if (param.schema.default !== undefined) out[param.name] = param.schema.default;
      continue;
    }
    out[param.name] = queryValue(param, text);
  }
  return out;
}

function readBody(req: http.IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > limit) return Promise.reject(tooLarge(limit));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.removeAllListeners("data");
        reject(tooLarge(limit));
      } else chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", () => reject(invalid("the client went away mid-body")));
  });
}

function decode(op: Operation, header: string | undefined, raw: Buffer): unknown {
  const type = (header ?? "").split(";")[0].trim().toLowerCase();
  const body = op.body!;
  if (body.raw) {
    if (type !== OCTET_TYPE) throw unsupported(type, OCTET_TYPE);
    return raw;
  }
  if (type === TENSORS_TYPE && body.binary) {
    throw new HttpError(415, "Unsupported Media Type", `this service does not speak ${TENSORS_TYPE} (it lists no capability 'tensors'): use ${JSON_TYPE}`);
  }
  if (type !== JSON_TYPE && !(raw.length === 0 && body.required)) throw unsupported(type, JSON_TYPE);
  let value: unknown;
  try {
    value = JSON.parse(raw.toString("utf8"));
  } catch (err) {
    throw invalid(`the body is not JSON: ${(err as Error).message}`);
  }
  if (body.check && !body.check(value)) throw bodyError(body.check);
  return value;
}

function unsupported(type: string, wanted: string): HttpError {
  return new HttpError(415, "Unsupported Media Type", `Content-Type ${JSON.stringify(type || "(none)")} is not accepted here: use ${wanted}`);
}

function tooLarge(limit: number): HttpError {
  return new HttpError(413, "Payload Too Large", `request body is larger than ${limit} bytes`, {}, { connection: "close" });
}

function authorized(header: string | undefined, token: string): boolean {
  const [scheme, ...rest] = (header ?? "").split(" ");
  const given = Buffer.from(rest.join(" ").trim(), "utf8");
  const wanted = Buffer.from(token, "utf8");
  return scheme.toLowerCase() === "bearer" && given.length === wanted.length && timingSafeEqual(given, wanted);
}

function failure(op: Operation, err: unknown): Answer {
  if (err instanceof HttpError) return problemAnswer(err);
  console.error(`${op.id}:`, err);
  return problemAnswer(new HttpError(500, "Internal Server Error", `${op.id}: ${(err as Error)?.message ?? err}`));
}

function problemAnswer(err: HttpError): Answer {
  return { status: err.status, body: err.body(), headers: { "content-type": "application/problem+json", ...err.headers } };
}

function send(res: http.ServerResponse, answer: Answer, instance: string): void {
  const isFile = Buffer.isBuffer(answer.body);
  const payload = isFile ? (answer.body as Buffer) : Buffer.from(JSON.stringify(answer.body));
  res.writeHead(answer.status, {
    "content-type": isFile ? OCTET_TYPE : JSON_TYPE,
    "content-length": payload.length,
    "mistk-instance": instance,
    ...answer.headers,
  });
  res.end(payload);
}
