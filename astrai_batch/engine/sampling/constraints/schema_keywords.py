"""What JSON Schema itself says about its keywords, whatever backend enforces them
(torch-free): which ones only annotate, which apply to which JSON type, which hold
subschemas, and which values or missing partners make a keyword a no-op.

`schema_support` walks a schema with this vocabulary to find what a backend would not enforce.
"""

from __future__ import annotations

from collections.abc import Mapping

from astrai_batch.engine.sampling.constraints.schema_disjoint import value_types

# Keywords that never constrain a value (annotations, identifiers, vocabulary), and the
# containers of named subschemas (walked on their own, wherever they are).
ANNOTATIONS = frozenset(
    [
        "title",
        "description",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$vocabulary",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    ]
)
DEFINITIONS = ("$defs", "definitions")

# The keywords that constrain values of one JSON type and are no-ops for every other type.
TYPE_KEYWORDS: Mapping[str, frozenset[str]] = {
    "string": frozenset(["minLength", "maxLength", "pattern", "format"]),
    "number": frozenset(
        ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]
    ),
    "object": frozenset(
        [
            "properties",
            "required",
            "additionalProperties",
            "patternProperties",
            "propertyNames",
            "minProperties",
            "maxProperties",
            "dependentRequired",
            "dependentSchemas",
            "dependencies",
            "unevaluatedProperties",
        ]
    ),
    "array": frozenset(
        [
            "items",
            "prefixItems",
            "additionalItems",
            "unevaluatedItems",
            "contains",
            "minContains",
            "maxContains",
            "minItems",
            "maxItems",
            "uniqueItems",
        ]
    ),
}
# Keywords for values of any type (besides `type` and the combinators of `SchemaSupport.alone`).
GENERAL_KEYWORDS = frozenset({"not", "if", "then", "else", "$dynamicRef", "$recursiveRef"})
# Subschema-valued keywords: a single schema, a list of them, or a map of named ones.
ONE_SCHEMA = (
    "additionalProperties", "unevaluatedProperties", "propertyNames", "items",
    "additionalItems", "unevaluatedItems", "contains", "not", "if", "then", "else",
)  # fmt: skip
SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")


def is_no_op(node: dict, key: str) -> bool:
    """Keywords whose value, or whose missing partner, makes them change nothing."""
    if key == "uniqueItems":
        return node[key] is False
    if key == "if":
        return "then" not in node and "else" not in node
    if key in ("then", "else"):
        return "if" not in node
    if key in ("minContains", "maxContains"):
        return "contains" not in node
    if key == "additionalItems":  # only beside the tuple form of `items` (draft 7)
        return not isinstance(node.get("items"), list)
    return False


def values_typed(node: dict) -> bool:
    """True when every `const` / `enum` value has the schema's `type` (then `type` adds
    nothing: the backend generates only those values)."""
    declared = node.get("type")
    listed = declared if isinstance(declared, list) else [declared]
    names = {name for name in listed if isinstance(name, str)}
    values = [node["const"]] if "const" in node else node.get("enum")
    if not isinstance(values, list):
        return False
    return all(value_types(value) & names for value in values)


def type_keywords(type_name: str) -> frozenset[str]:
    """The keywords that apply to a JSON type (integers take the number keywords)."""
    return TYPE_KEYWORDS.get("number" if type_name == "integer" else type_name, frozenset())


def escape_pointer(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")
