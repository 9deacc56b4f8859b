"""Whether the schemas of a `oneOf` are provably pairwise disjoint (no value is valid under
two of them): the case where a backend that generates `oneOf` as `anyOf` still enforces it.

Two sufficient proofs, both conservative (False means "not shown", not "they overlap"):
- finite values and bare types: every branch is a `const` / `enum`, or has nothing but
  `type` (and annotations); no value or type is shared (integers are numbers too);
- a discriminator: one property that every branch, an object schema, requires, with `const`
  / `enum` values that differ between every two branches (the shape of tagged unions, e.g.
  pydantic's). Anything else a branch says only narrows it, so the proof stays sound.
Local `$ref`s (`#/...`) among the branches are followed.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

_MAX_REF_HOPS = 32


def provably_disjoint(branches: list[Any], root: Any, annotations: Collection[str]) -> bool:
    resolved = [_resolve(branch, root) for branch in branches]
    if any(branch is None for branch in resolved):
        return False
    schemas: list[dict] = resolved  # type: ignore[assignment]
    return _by_values_or_types(schemas, annotations) or _by_discriminator(schemas, root)


def value_types(value: Any) -> set[str]:
    """The JSON Schema types a JSON value has (an integral number is also an integer)."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def _resolve(schema: Any, root: Any) -> dict | None:
    for _ in range(_MAX_REF_HOPS):
        if not isinstance(schema, dict):
            return None
        ref = schema.get("$ref")
        if ref is None:
            return schema
        schema = _at_pointer(root, ref)
    return None


def _at_pointer(root: Any, ref: Any) -> Any:
    if ref == "#":
        return root
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _finite_values(schema: dict) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    values = schema.get("enum")
    return values if isinstance(values, list) and values else None


def _bare_types(schema: dict, annotations: Collection[str]) -> set[str] | None:
    if {key for key in schema if key not in annotations} != {"type"}:
        return None
    declared = schema["type"]
    names = {declared} if isinstance(declared, str) else declared
    if not isinstance(names, (set, list)) or not names:
        return None
    names = set(names)
    if names & {"integer", "number"}:
        names |= {"integer", "number"}
    return names


def _by_values_or_types(schemas: list[dict], annotations: Collection[str]) -> bool:
    branches: list[tuple[list[Any] | None, set[str] | None]] = []
    for schema in schemas:
        values = _finite_values(schema)
        types = None if values is not None else _bare_types(schema, annotations)
        if values is None and types is None:
            return False
        branches.append((values, types))
    for i, (values_i, types_i) in enumerate(branches):
        for values_j, types_j in branches[i + 1 :]:
            if values_i is not None and values_j is not None:
                if _values_overlap(values_i, values_j):
                    return False
            elif values_i is None and values_j is None:
                if types_i & types_j:  # type: ignore[operator]
                    return False
            else:
                values = values_i if values_i is not None else values_j
                types = types_j if values_i is not None else types_i
                if any(value_types(value) & types for value in values):  # type: ignore[operator]
                    return False
    return True


def _by_discriminator(schemas: list[dict], root: Any) -> bool:
    first = schemas[0]
    required = first.get("required")
    if not isinstance(required, list):
        return False
    for key in required:
        tags = [_tag_values(schema, key, root) for schema in schemas]
        if any(values is None for values in tags):
            continue
        if all(
            not _values_overlap(tags[i], tags[j])  # type: ignore[arg-type]
            for i in range(len(tags))
            for j in range(i + 1, len(tags))
        ):
            return True
    return False


def _tag_values(schema: dict, key: Any, root: Any) -> list[Any] | None:
    """The values the object schema allows for its required property `key`, when finite."""
    if schema.get("type") != "object" or key not in (schema.get("required") or ()):
        return None
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    tag = _resolve(properties.get(key), root)
    return None if tag is None else _finite_values(tag)


def _values_overlap(left: list[Any], right: list[Any]) -> bool:
    return any(_same_value(a, b) for a in left for b in right)


def _same_value(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, true does not equal 1."""
    numeric = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)]
    if all(numeric):
        return a == b
    if any(numeric):
        return False
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
