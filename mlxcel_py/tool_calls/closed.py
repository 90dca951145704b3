"""Closed objects by default: a JSON schema object that lists its `properties` and says nothing
of others admits no others, as llama.cpp's json-schema-to-grammar and OpenAI's strict mode read
it. JSON Schema itself leaves such an object open, and a grammar built that way lets a small
model invent keys (`{"input": 3, "exclusiveMaximum": 1000, ...}`) until max_tokens.

`closed_schema` adds `additionalProperties: false` where it is missing; `closed_parameters`
does the same for a tool's parameters, where an object without properties means no arguments.
Neither changes a schema that says what it wants: `additionalProperties` (true, false or a
schema), `patternProperties` or `unevaluatedProperties` present leave that object as written.

Objects assembled from parts are left open, since closing a part would forbid its siblings'
keys (llguidance intersects them): the branches of an `allOf` with several parts, an object
whose `allOf`/`anyOf`/`oneOf` branches or `$ref` bring keys of their own, and the branches of
an object that lists properties of its own (with the `$defs` those branches name by `$ref`).
Values (`const`, `enum`, `default`, `examples`) and `x-guidance` are data, never rewritten.
"""

from __future__ import annotations

from typing import Any

# Keywords whose value is a schema, a list of schemas, or a name -> schema map.
ONE = ("additionalProperties", "items", "additionalItems", "contains", "unevaluatedItems")
MANY = ("prefixItems", "items", "anyOf", "oneOf", "allOf")
NAMED = ("properties", "$defs", "definitions")
BRANCHES = ("allOf", "anyOf", "oneOf")
OPEN_SAYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# A root with none of these describes no arguments (e.g. `{}` or `{"type": "object"}`).
SHAPED = ("properties", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "not", "if", "items", "prefixItems",
          *OPEN_SAYS)
DEF_REFS = ("#/$defs/", "#/definitions/")


def closed_schema(schema: Any) -> Any:
    """A copy of `schema` with every object that lists `properties` closed; the input is not changed."""
    return _walk(schema, False, _open_defs(schema))


def closed_parameters(parameters: Any) -> Any:
    """A tool's parameters, closed; a root that names no properties (`{}`, `{"type": "object"}`,
    `{"type": "object", "properties": {}}`) admits exactly `{}`: a tool without arguments."""
    if isinstance(parameters, dict) and parameters.get("type", "object") == "object" and \
            not any(k in parameters for k in SHAPED):
        return {**parameters, "type": "object", "properties": {}, "additionalProperties": False}
    return closed_schema(parameters)


def _walk(schema: Any, open_here: bool, open_defs: frozenset[str]) -> Any:
    """The closed copy of one schema; `open_here`: it is a part of a larger object."""
    if not isinstance(schema, dict):
        return schema  # a boolean schema, or something llguidance will refuse as it is
    out = dict(schema)
    parts = _parts_stay_open(schema)
    for key in ONE:
        if isinstance(schema.get(key), dict):
            out[key] = _walk(schema[key], False, open_defs)
    for key in MANY:
        if isinstance(schema.get(key), list):
            out[key] = [_walk(s, parts and key in BRANCHES, open_defs) for s in schema[key]]
    for key in NAMED:
        if isinstance(schema.get(key), dict):
            out[key] = {name: _walk(s, key != "properties" and name in open_defs, open_defs)
                        for name, s in schema[key].items()}
    if "properties" in schema and not open_here and not _composed(schema) and \
            not any(k in schema for k in OPEN_SAYS):
        out["additionalProperties"] = False
    return out


def _composed(schema: dict) -> bool:
    """The object's keys come partly from elsewhere: a $ref beside its own keys, or a branch that
    lists keys of its own (a branch that only says `required` leaves the keys to this object)."""
    keyed = ("properties", "$ref", *BRANCHES)
    branches = [b for k in BRANCHES if isinstance(schema.get(k), list) for b in schema[k]]
    return "$ref" in schema or any(isinstance(b, dict) and any(k in b for k in keyed) for b in branches)


def _parts_stay_open(schema: dict) -> bool:
    """Whether this schema's allOf/anyOf/oneOf branches describe parts of one object."""
    return len(schema.get("allOf") or ()) > 1 or "properties" in schema


def _subschemas(schema: dict) -> list:
    """Every schema directly inside `schema` (not its values: const, enum, default, x-guidance...)."""
    found = [schema[k] for k in ONE if isinstance(schema.get(k), dict)]
    found += [s for k in MANY if isinstance(schema.get(k), list) for s in schema[k]]
    found += [s for k in NAMED if isinstance(schema.get(k), dict) for s in schema[k].values()]
    return found


def _def_name(schema: Any) -> str | None:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith(DEF_REFS):
        return ref.split("/", 2)[2]
    return None


def _open_defs(schema: Any) -> frozenset[str]:
    """Names of the `$defs`/`definitions` that a part of a larger object refers to: closing the
    definition would close the part."""
    found: set[str] = set()
    pending = [schema]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        if _parts_stay_open(node):
            parts = [node, *(p for k in BRANCHES if isinstance(node.get(k), list) for p in node[k])]
            found.update(n for n in map(_def_name, parts) if n is not None)
        pending.extend(_subschemas(node))
    return frozenset(found)
