"""Is a new version of a contract compatible with the one released before it?

A change breaks callers when something they use goes away or accepts less: an operation, a
parameter, a request content type or a response field removed; a new required parameter or
body field; a type narrowed; an enum value dropped; a bound tightened; an open object closed.
`breaking_changes` lists each such change; `check` allows them only when the major version
moves. Additions (operations, optional fields, statuses, enum values in requests) are
compatible. Requests and answers are compared in opposite directions: a request schema may
only widen, an answer may only add (a caller relies on what it got before).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

Spec = Mapping[str, Any]
METHODS = ("get", "put", "post", "delete", "patch")
# bounds a request may not tighten: (keyword, the direction that accepts less)
LOWER_BOUNDS = ("minimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "maxLength", "maxItems", "maxProperties")


def _operations(spec: Spec) -> dict[str, dict[str, Any]]:
    out = {}
    for path, item in spec.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                out[item[method]["operationId"]] = {
                    **item[method],
                    "_where": f"{method.upper()} {path}",
                }
    return out


class _Compare:
    """Walks the old and new specs side by side, following $refs in both."""

    def __init__(self, old: Spec, new: Spec) -> None:
        self.old, self.new = old, new
        self.found: list[str] = []
        self._seen: set[tuple[str, str, str]] = set()

    def resolve(self, spec: Spec, node: Any) -> Any:
        while isinstance(node, Mapping) and "$ref" in node:
            found: Any = spec
            for part in node["$ref"].removeprefix("#/").split("/"):
                found = found[part]
            node = found
        return node

    def say(self, where: str, what: str) -> None:
        self.found.append(f"{where}: {what}")

    # ---- operations ----------------------------------------------------------------------
    def operations(self) -> None:
        old_ops, new_ops = _operations(self.old), _operations(self.new)
        for op_id, old in old_ops.items():
            new = new_ops.get(op_id)
            if new is None:
                self.say(op_id, f"operation removed ({old['_where']})")
                continue
            if new["_where"] != old["_where"]:
                self.say(op_id, f"moved from {old['_where']} to {new['_where']}")
            self.parameters(op_id, old, new)
            self.request_body(op_id, old, new)
            self.responses(op_id, old, new)

    def parameters(self, op_id: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        def by_name(spec: Spec, op: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
            params = [self.resolve(spec, p) for p in op.get("parameters", [])]
            return {(p["in"], p["name"]): p for p in params}

        before, after = by_name(self.old, old), by_name(self.new, new)
        for key, param in before.items():
            where = f"{op_id} parameter {key[1]}"
            if key not in after:
                self.say(where, "removed")
                continue
            if after[key].get("required") and not param.get("required"):
                self.say(where, "now required")
            self.request_schema(where, param.get("schema", {}), after[key].get("schema", {}))
        for key, param in after.items():
            if key not in before and param.get("required"):
                self.say(f"{op_id} parameter {key[1]}", "new and required")

    def request_body(self, op_id: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        before = self.resolve(self.old, old.get("requestBody", {})).get("content", {})
        after = self.resolve(self.new, new.get("requestBody", {})).get("content", {})
        if not old.get("requestBody") and new.get("requestBody", {}).get("required"):
            self.say(op_id, "now requires a body")
        for media, content in before.items():
            where = f"{op_id} request {media}"
            if media not in after:
                self.say(where, "content type no longer accepted")
                continue
            self.request_schema(where, content.get("schema", {}), after[media].get("schema", {}))

    def responses(self, op_id: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        for status, response in old.get("responses", {}).items():
            after = new.get("responses", {}).get(status)
            if after is None or not str(status).startswith("2"):
                continue  # (a success answer removed is a changed behaviour: see below)
            before = self.resolve(self.old, response).get("content", {})
            now = self.resolve(self.new, after).get("content", {})
            for media, content in before.items():
                where = f"{op_id} {status} {media}"
                if media not in now:
                    self.say(where, "answer content type removed")
                    continue
                self.answer_schema(where, content.get("schema", {}), now[media].get("schema", {}))
        old_ok = {s for s in old.get("responses", {}) if str(s).startswith("2")}
        new_ok = {s for s in new.get("responses", {}) if str(s).startswith("2")}
        for status in sorted(old_ok - new_ok):
            self.say(op_id, f"no longer answers {status}")

    # ---- schemas -------------------------------------------------------------------------
    def _pair(self, where: str, old: Any, new: Any, direction: str) -> Optional[tuple[Any, Any]]:
        """The two schemas resolved; None for a pair of $refs compared already (each named
        schema pair is compared once per direction, which also ends recursive schemas)."""
        if "$ref" in old and "$ref" in new:
            key = (direction, old["$ref"], new["$ref"])
            if key in self._seen:
                return None
            self._seen.add(key)
        return self.resolve(self.old, old), self.resolve(self.new, new)

    def request_schema(self, where: str, old: Any, new: Any) -> None:
        """A request schema may only accept more."""
        pair = self._pair(where, old, new, "request")
        if pair is None:
            return
        old, new = pair
        self._types(where, old, new, request=True)
        for value in set(old.get("enum", [])) - set(new.get("enum", old.get("enum", []))):
            self.say(where, f"enum value {value!r} removed")
        for word in LOWER_BOUNDS:
            if word in new and (word not in old or new[word] > old[word]):
                self.say(where, f"{word} raised to {new[word]} (was {old.get(word)})")
        for word in UPPER_BOUNDS:
            if word in new and (word not in old or new[word] < old[word]):
                self.say(where, f"{word} lowered to {new[word]} (was {old.get(word)})")
        if "pattern" in new and new.get("pattern") != old.get("pattern"):
            self.say(where, f"pattern changed to {new['pattern']!r}")
        if (
            new.get("additionalProperties") is False
            and old.get("additionalProperties") is not False
        ):
            self.say(where, "no longer takes other properties")
        added = set(new.get("required", [])) - set(old.get("required", []))
        for name in sorted(added):
            self.say(where, f"new required field {name!r}")
        closed = new.get("additionalProperties") is False
        for name, schema in old.get("properties", {}).items():
            if name not in new.get("properties", {}):
                if closed:
                    self.say(where, f"field {name!r} removed")
                continue
            self.request_schema(f"{where}.{name}", schema, new["properties"][name])
        self._parts(where, old, new, self.request_schema)

    def answer_schema(self, where: str, old: Any, new: Any) -> None:
        """An answer may only add: every field a caller got (and relied on being there)
        is still given, of the same type."""
        pair = self._pair(where, old, new, "answer")
        if pair is None:
            return
        old, new = pair
        self._types(where, old, new, request=False)
        for name in sorted(set(old.get("required", [])) - set(new.get("required", []))):
            self.say(where, f"field {name!r} no longer always answered")
        for name, schema in old.get("properties", {}).items():
            if name not in new.get("properties", {}):
                self.say(where, f"field {name!r} removed")
                continue
            self.answer_schema(f"{where}.{name}", schema, new["properties"][name])
        self._parts(where, old, new, self.answer_schema)

    def _types(
        self, where: str, old: Mapping[str, Any], new: Mapping[str, Any], request: bool
    ) -> None:
        """A type changed; integer -> number only widens a request (an answer that was
        an integer may not become a fraction)."""
        if "type" in new and new.get("type") != old.get("type"):
            widened = request and old.get("type") == "integer" and new["type"] == "number"
            if not widened:
                self.say(where, f"type changed from {old.get('type')} to {new['type']}")
        if request and old.get("nullable") and not new.get("nullable"):
            self.say(where, "no longer takes null")
        if not request and new.get("nullable") and not old.get("nullable"):
            self.say(where, "may now answer null")

    def _parts(self, where: str, old: Any, new: Any, compare: Any) -> None:
        if isinstance(old.get("items"), Mapping) and isinstance(new.get("items"), Mapping):
            compare(f"{where}[]", old["items"], new["items"])
        old_extra, new_extra = old.get("additionalProperties"), new.get("additionalProperties")
        if isinstance(old_extra, Mapping) and isinstance(new_extra, Mapping):
            compare(f"{where}{{}}", old_extra, new_extra)


def breaking_changes(old: Spec, new: Spec) -> list[str]:
    """Each change from `old` to `new` that breaks a caller of `old`, in words."""
    walk = _Compare(old, new)
    walk.operations()
    return walk.found


def major(spec: Spec) -> int:
    return int(str(spec["info"]["version"]).split(".")[0])


def check(old: Spec, new: Spec) -> list[str]:
    """What stops `new` from being released after `old`: breaking changes without a new
    major version, or a version that went backwards."""
    problems = []
    if major(new) < major(old):
        problems.append(f"version {new['info']['version']} is older than {old['info']['version']}")
    if major(new) == major(old):
        problems += [
            f"{change} (a breaking change: raise the major version past {old['info']['version']})"
            for change in breaking_changes(old, new)
        ]
    return problems
