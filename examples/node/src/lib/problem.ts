/** Errors a handler throws, each answered as RFC 9457 `application/problem+json`. */

export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly title: string,
    readonly detail: string,
    readonly extra: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(detail);
  }

  body(): Record<string, unknown> {
    return { type: "about:blank", title: this.title, status: this.status, detail: this.detail, ...this.extra };
  }
}

/** 400: the request is malformed or not allowed; nothing changed. */
export function invalid(detail: string, field?: string): HttpError {
  return new HttpError(400, "Invalid request", detail, field === undefined ? {} : { field });
}

/** 409: illegal in the current lifecycle state (or busy); carries `state` and `allowed`. */
export function illegalState(operation: string, state: string, allowed: string[], busy: boolean, detail?: string): HttpError {
  const why = busy ? "the service is busy" : "not allowed";
  return new HttpError(
    409,
    "Illegal in the current state",
    detail ?? `${operation}: ${why} in state '${state}'; allowed now: ${allowed.join(", ") || "nothing but status"}`,
    { state, allowed },
  );
}

export function notFound(detail: string): HttpError {
  return new HttpError(404, "Not found", detail);
}
