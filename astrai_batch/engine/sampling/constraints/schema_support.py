"""Which JSON Schema keywords a constraint backend enforces, and the first one a schema uses
that it does not (torch-free: plain dicts in, a message out).

A backend may accept a keyword and generate as if it were absent: xgrammar 0.2.8 compiles
`{"type": "string", "not": {"const": "a"}}` and then lets the model write `"a"`. Such a row
would come back parsing but not validating, so a schema that uses a keyword its backend does
not enforce is refused in its own row instead, naming the keyword and where it is (a JSON
pointer): ``json_schema uses "not" at /properties/name, which structured outputs cannot
enforce``.

The walk knows JSON Schema through `schema_keywords` (which keywords apply to which JSON
types, which ones only annotate, which values make a keyword a no-op); the backend's
`SchemaSupport` says what it enforces. It visits every subschema: properties, items,
combinators, `$defs` / `definitions`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from astrai_batch.engine.sampling.constraints.schema_disjoint import provably_disjoint
from astrai_batch.engine.sampling.constraints.schema_keywords import (
    ANNOTATIONS,
    DEFINITIONS,
    GENERAL_KEYWORDS,
    ONE_SCHEMA,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    TYPE_KEYWORDS,
    escape_pointer,
    is_no_op,
    type_keywords,
    values_typed,
)

_LOWER = ("minimum", "exclusiveMinimum")
_UPPER = ("maximum", "exclusiveMaximum")


@dataclass(frozen=True)
class SchemaSupport:
    """What a backend enforces of JSON Schema; everything else a schema uses is refused.

    - `types`: per JSON type (`string`, `integer`, `number`, `boolean`, `null`, `object`,
      `array`), the type's keywords (`TYPE_KEYWORDS`) the backend enforces;
    - `alone`: keywords that make a schema nothing but themselves, in the backend's order of
      precedence: beside them only annotations are allowed (and `type`, beside `const` /
      `enum` whose values all have that type);
    - `inferred`: the type a schema without `type` gets from one of its keywords (else it
      allows any value, and its type keywords would be ignored);
    - `formats`: the `format` values enforced;
    - `overrides`: keyword -> keywords the backend drops when both are present;
    - `max_all_of`: the most subschemas an `allOf` may have;
    - `multiple_of_max`: the largest integer `multipleOf` enforced (numbers: see `types`);
    - `multiple_of_span`: with bounds, an integer `multipleOf` is enforced only between a
      lower and an upper one holding at most this many integers;
    - `required_in_properties`: a required property must have a schema in `properties`;
    - `local_refs_only`: `$ref` may only point into the same schema (`#` or `#/...`);
    - `one_of_as_any_of`: `oneOf` is generated as `anyOf` (at least one branch matches, not
      exactly one), so only branches provably disjoint are accepted (`schema_disjoint`).
    """

    types: Mapping[str, frozenset[str]]
    alone: tuple[str, ...] = ()
    inferred: Mapping[str, str] = field(default_factory=dict)
    formats: frozenset[str] = frozenset()
    overrides: Mapping[str, frozenset[str]] = field(default_factory=dict)
    max_all_of: int | None = None
    multiple_of_max: int | None = None
    multiple_of_span: int | None = None
    required_in_properties: bool = False
    local_refs_only: bool = True
    one_of_as_any_of: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.types) - {*TYPE_KEYWORDS, "integer", "boolean", "null"})
        if unknown:
            raise ValueError(f"unknown JSON type(s): {', '.join(unknown)}")
        for name, keywords in self.types.items():
            stray = sorted(keywords - type_keywords(name))
            if stray:
                raise ValueError(f"{name} cannot enforce {', '.join(stray)}")


@dataclass(frozen=True)
class Unenforced:
    """A schema feature the backend does not enforce: what it is and where (a JSON pointer)."""

    what: str
    pointer: str

    @property
    def message(self) -> str:
        where = f"at {self.pointer}" if self.pointer else "at the top level"
        return f"json_schema uses {self.what} {where}, which structured outputs cannot enforce"


def find_unenforced(schema: Any, support: SchemaSupport) -> Unenforced | None:
    """The first feature of `schema` that `support` does not enforce, in document order."""
    return next(_problems(schema, "", support, schema), None)


def _problems(
    node: Any, pointer: str, support: SchemaSupport, root: Any, implied: str | None = None
) -> Iterator[Unenforced]:
    """`implied`: the type every value checked here has (property names are strings)."""
    if not isinstance(node, dict):
        return  # `true` / `false`, or a shape error the backend reports itself
    yield from _own_problems(node, pointer, support, root, implied)
    for key in node:
        if is_no_op(node, key):
            continue  # e.g. `then` without `if`: the schema says nothing there
        value = node[key]
        here = f"{pointer}/{escape_pointer(key)}"
        if key in ONE_SCHEMA:
            implied_here = "string" if key == "propertyNames" else None
            yield from _problems(value, here, support, root, implied_here)
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for i, item in enumerate(value):
                yield from _problems(item, f"{here}/{i}", support, root)
        elif (key in SCHEMA_MAPS or key in DEFINITIONS) and isinstance(value, dict):
            for name, item in value.items():
                yield from _problems(item, f"{here}/{escape_pointer(name)}", support, root)


def _own_problems(
    node: dict, pointer: str, support: SchemaSupport, root: Any, implied: str | None
) -> Iterator[Unenforced]:
    """The keywords of this schema object itself (not of its subschemas)."""
    keywords = [k for k in node if k not in ANNOTATIONS and k not in DEFINITIONS]
    keywords = [k for k in keywords if not is_no_op(node, k)]
    sole = next((k for k in support.alone if k in node), None)
    if sole is not None:
        yield from _beside(node, sole, keywords, pointer)
        yield from _sole_problems(node, sole, pointer, support, root)
        return
    for key in keywords:
        if key in GENERAL_KEYWORDS:
            yield Unenforced(f'"{key}"', pointer)
    types = _types(node, support) or ((implied,) if implied else None)
    if types is None:  # any value: every type keyword would be ignored
        for key in keywords:
            if any(key in words for words in TYPE_KEYWORDS.values()):
                yield Unenforced(f'"{key}" without "type"', pointer)
        return
    for key in keywords:
        for name in types:
            if key in type_keywords(name) and key not in support.types.get(name, ()):
                yield Unenforced(f'"{key}"', pointer)
                break
    if "string" in types:
        yield from _string_problems(node, pointer, support)
    if "integer" in types and "multipleOf" in node:
        yield from _multiple_of_problems(node, pointer, support)
    if "object" in types and support.required_in_properties:
        yield from _required_problems(node, pointer)


def _beside(node: dict, sole: str, keywords: list[str], pointer: str) -> Iterator[Unenforced]:
    for key in keywords:
        if key == sole or (key == "type" and sole in ("const", "enum") and values_typed(node)):
            continue
        yield Unenforced(f'"{key}" beside "{sole}"', pointer)


def _sole_problems(
    node: dict, sole: str, pointer: str, support: SchemaSupport, root: Any
) -> Iterator[Unenforced]:
    value = node[sole]
    is_list = isinstance(value, list)
    one_of = sole == "oneOf" and support.one_of_as_any_of and is_list
    if one_of and not provably_disjoint(value, root, ANNOTATIONS):
        yield Unenforced('"oneOf" over schemas that may overlap', pointer)
    remote = isinstance(value, str) and value != "#" and not value.startswith("#/")
    if sole == "$ref" and support.local_refs_only and remote:
        yield Unenforced(f'the $ref "{value}" (only "#/..." references are)', pointer)
    many = is_list and support.max_all_of is not None and len(value) > support.max_all_of
    if sole == "allOf" and many:
        yield Unenforced(f'"allOf" with {len(value)} schemas', pointer)


def _string_problems(node: dict, pointer: str, support: SchemaSupport) -> Iterator[Unenforced]:
    form = node.get("format")
    checked = isinstance(form, str) and "format" in support.types.get("string", ())
    if checked and form not in support.formats:
        yield Unenforced(f'format "{form}"', pointer)
    for key, dropped in support.overrides.items():
        if key in node:
            for other in sorted(dropped & node.keys()):
                yield Unenforced(f'"{other}" beside "{key}"', pointer)


def _multiple_of_problems(node: dict, pointer: str, support: SchemaSupport) -> Iterator[Unenforced]:
    value = node["multipleOf"]
    if "multipleOf" not in support.types.get("integer", ()) or not _is_number(value):
        return  # refused as a keyword already, or a shape error the backend reports itself
    limit = support.multiple_of_max
    if value != int(value) or (limit is not None and value > limit):
        yield Unenforced(f'"multipleOf" {value} (only whole numbers up to {limit} are)', pointer)
        return
    span = support.multiple_of_span
    low = [node[k] + (k == "exclusiveMinimum") for k in _LOWER if _is_number(node.get(k))]
    high = [node[k] - (k == "exclusiveMaximum") for k in _UPPER if _is_number(node.get(k))]
    if span is None or not (low or high):
        return
    if not (low and high) or min(high) - max(low) >= span:
        what = f'"multipleOf" with one bound, or bounds holding more than {span} integers'
        yield Unenforced(what, pointer)


def _required_problems(node: dict, pointer: str) -> Iterator[Unenforced]:
    required = node.get("required")
    properties = node.get("properties")
    listed = properties if isinstance(properties, dict) else {}
    for name in required if isinstance(required, list) else ():
        if isinstance(name, str) and name not in listed:
            yield Unenforced(
                f'the required property "{name}" without a schema in "properties"', pointer
            )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _types(node: dict, support: SchemaSupport) -> tuple[str, ...] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list):
        return tuple(t for t in declared if isinstance(t, str))
    inferred = next((t for k, t in support.inferred.items() if k in node), None)
    return None if inferred is None else (inferred,)
