"""JSON schemas using a feature xgrammar would not enforce are refused in their own row, naming
the feature and where it is.

The reason for each refusal is checked against code that is not ours: xgrammar's own matcher,
over the grammar it compiles from the schema (strict mode, as our backend compiles it),
accepts an instance that the `jsonschema` library rejects. The same pair of libraries shows
that what we do accept is enforced: xgrammar rejects what `jsonschema` rejects.
"""

from __future__ import annotations

import json

import pytest
import xgrammar
from jsonschema import Draft7Validator, Draft202012Validator, FormatChecker
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from astrai_batch.engine.sampling.constraints import Constraint
from astrai_batch.engine.sampling.constraints.backend import ConstraintCompileError
from astrai_batch.engine.sampling.constraints.grammar_cache import GrammarCache
from astrai_batch.engine.sampling.constraints.schema_disjoint import provably_disjoint
from astrai_batch.engine.sampling.constraints.schema_keywords import ANNOTATIONS
from astrai_batch.engine.sampling.constraints.schema_support import (
    SchemaSupport,
    Unenforced,
    find_unenforced,
)
from astrai_batch.engine.sampling.constraints.xgrammar_backend import (
    XGRAMMAR_SCHEMA_SUPPORT,
    XGrammarBackend,
)

S, INT, N = "string", "integer", "number"
REMOTE = "https://example.com/person.json"


def obj(**properties):
    return {"type": "object", "properties": properties}


# (id, schema, message, an instance xgrammar accepts and jsonschema rejects)
UNENFORCED = [
    ("not", obj(name={"type": S, "not": {"const": "a"}}),
     '"not" at /properties/name', {"name": "a"}),
    ("if-then", {"type": INT, "if": {"minimum": 5}, "then": {"maximum": 7}},
     '"if" at the top level', 9),
    ("dependentRequired",
     {**obj(a={"type": INT}, b={"type": INT}), "dependentRequired": {"a": ["b"]}},
     '"dependentRequired" at the top level', {"a": 1}),
    ("dependentSchemas",
     {**obj(a={"type": INT}, b={"type": INT}), "dependentSchemas": {"a": {"required": ["b"]}}},
     '"dependentSchemas" at the top level', {"a": 1}),
    ("dependencies", {**obj(a={"type": INT}, b={"type": INT}), "dependencies": {"a": ["b"]}},
     '"dependencies" at the top level', {"a": 1}),
    ("uniqueItems", obj(tags={"type": "array", "items": {"type": S}, "uniqueItems": True}),
     '"uniqueItems" at /properties/tags', {"tags": ["x", "x"]}),
    ("contains", {"type": "array", "items": {"type": INT}, "contains": {"const": 3}},
     '"contains" at the top level', [1]),
    ("multipleOf-number", {"type": N, "multipleOf": 0.5},
     '"multipleOf" at the top level', 0.3),
    ("remote-ref", {**obj(p={"$ref": REMOTE}), "required": ["p"]},
     f'the $ref "{REMOTE}" (only "#/..." references are) at /properties/p', {"p": 12}),
    ("anchor-ref", {"$defs": {"x": {"$anchor": "X", "type": S}}, "$ref": "#X"},
     'the $ref "#X" (only "#/..." references are) at the top level', 12),
    ("beside-ref", {"$defs": {"a": {"type": INT}}, "$ref": "#/$defs/a", "maximum": 3},
     '"maximum" beside "$ref" at the top level', 5),
    ("beside-anyOf", {"anyOf": [{"type": INT}, {"type": N}], "minimum": 0},
     '"minimum" beside "anyOf" at the top level', -1),
    ("beside-enum", {"type": S, "enum": ["a", 1]},
     '"type" beside "enum" at the top level', 1),
    ("allOf", {"allOf": [{"type": INT}, {"type": INT, "minimum": 3}]},
     '"allOf" with 2 schemas at the top level', 1),
    ("untyped", obj(n={"minimum": 1}),
     '"minimum" without "type" at /properties/n', {"n": 0}),
    ("format", {"type": S, "format": "regex"},
     'format "regex" at the top level', "("),
    ("pattern-beside-format", {"type": S, "format": "date", "pattern": "^2024"},
     '"pattern" beside "format" at the top level', "2023-01-01"),
    ("maxLength-beside-pattern", {"type": S, "pattern": "^a+$", "maxLength": 2},
     '"maxLength" beside "pattern" at the top level', "aaaa"),
    ("oneOf-overlap", {"oneOf": [{"type": INT, "minimum": 0}, {"type": INT, "maximum": 10}]},
     '"oneOf" over schemas that may overlap at the top level', 5),
    ("multipleOf-large", {"type": INT, "multipleOf": 2048},
     '"multipleOf" 2048 (only whole numbers up to 1024 are) at the top level', 5),
    ("multipleOf-fraction", {"type": INT, "multipleOf": 1.5},
     '"multipleOf" 1.5 (only whole numbers up to 1024 are) at the top level', 5),
    ("multipleOf-wide", {"type": INT, "multipleOf": 7, "minimum": 0, "maximum": 10000},
     '"multipleOf" with one bound, or bounds holding more than 10000 integers at the top level',
     5),
    ("multipleOf-one-bound", {"type": INT, "multipleOf": 7, "exclusiveMinimum": -1},
     '"multipleOf" with one bound, or bounds holding more than 10000 integers at the top level',
     5),
    ("required-unlisted", {**obj(a={"type": INT}), "required": ["a", "b"]},
     'the required property "b" without a schema in "properties" at the top level', {"a": 1}),
    ("unknown-format", obj(mail={"type": S, "format": "idn-email"}),
     'format "idn-email" at /properties/mail', {"mail": "nope"}),
    ("beside-const", {"const": "a", "type": INT}, '"type" beside "const" at the top level', "a"),
]  # fmt: skip
CASES = [case[0] for case in UNENFORCED]

# Schemas we accept (annotations, no-ops and enforced keywords), each with an instance
# `jsonschema` rejects, which xgrammar rejects too.
ENFORCED = [
    ({"type": "object", "title": "P", "description": "d", "examples": [{}], "$comment": "c",
      "properties": {"a": {"type": INT, "default": 1, "deprecated": True}}, "required": ["a"]},
     {"a": "x"}),
    ({"$defs": {"n": {"type": INT, "minimum": 0}}, "type": "object",
      "properties": {"a": {"$ref": "#/$defs/n", "description": "refs may have annotations"}}},
     {"a": -1}),
    ({"anyOf": [{"type": S, "maxLength": 2}, {"type": "null"}], "default": None}, "abc"),
    ({"type": S, "enum": ["a", "b"], "title": "typed enum"}, "c"),
    ({"type": "array", "items": {"type": INT}, "minItems": 1, "maxItems": 2, "uniqueItems": False},
     [1, 2, 3]),
    ({"type": "array", "prefixItems": [{"type": INT}], "items": False}, [1, 2]),
    ({"type": S, "format": "date"}, "2024-13-01"),
    ({"type": S, "pattern": "^[a-z]+$"}, "A"),
    ({"type": S, "minLength": 2, "maxLength": 3}, "a"),
    ({"type": INT, "exclusiveMaximum": 3, "minimum": 0}, 3),
    ({"type": INT, "multipleOf": 3}, 4),
    ({"type": INT, "multipleOf": 7, "minimum": 0, "maximum": 9999}, 5),
    ({"type": "object", "patternProperties": {"^n_": {"type": INT}}}, {"n_a": "x"}),
    ({"type": "object", "propertyNames": {"maxLength": 2}, "additionalProperties": {"type": INT}},
     {"abc": 1}),
    ({"type": "object", "additionalProperties": {"type": INT}, "minProperties": 2,
      "maxProperties": 3}, {"a": 1}),
    ({"type": "object", "properties": {"a": {"type": INT}}, "unevaluatedProperties": False},
     {"a": 1, "b": 2}),
    ({"type": "array", "prefixItems": [{"type": INT}], "unevaluatedItems": False}, [1, 2]),
    ({"type": S, "format": "email"}, "nope"),
    ({"type": [S, INT], "minLength": 3, "minimum": 3}, 1),
    ({"type": "array", "items": {"type": INT}, "minContains": 1}, ["x"]),  # no `contains`: no-op
    ({"type": N, "minimum": 1.5}, 1.0),
    ({"type": [S, "null"]}, 1),
    ({"type": "object", "additionalProperties": {"type": INT}}, {"a": "x"}),
    ({"type": "object", "properties": {"a": {"type": INT}}, "additionalProperties": False},
     {"a": 1, "b": 1}),
    ({"allOf": [{"type": INT, "maximum": 3}]}, 4),
    ({"type": INT, "then": {"maximum": 1}}, "x"),  # `then` without `if` is a no-op
    ({"$defs": {"A": {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": INT}},
                       "required": ["k", "x"]},
                 "B": {"type": "object", "properties": {"k": {"const": "b"}, "y": {"type": S}},
                       "required": ["k", "y"]}},
      "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]},
     {"k": "a", "y": "s"}),
    ({"oneOf": [{"type": INT}, {"type": S}, {"const": None}]}, True),
]  # fmt: skip


@pytest.fixture(scope="module")
def backend(tiny_tokenizer):
    return XGrammarBackend(tiny_tokenizer, vocab_size=len(tiny_tokenizer), eos_token_ids=[2])


def xgrammar_accepts(schema, instance) -> bool:
    """xgrammar's own matcher over the grammar it compiles from `schema` (strict mode)."""
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]), cache_enabled=False)
    compiled = compiler.compile_json_schema(json.dumps(schema), strict_mode=True)
    matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(json.dumps(instance)) and matcher.is_terminated()


def jsonschema_accepts(schema, instance, case: str = "") -> bool:
    validator = Draft7Validator if case == "dependencies" else Draft202012Validator
    # the remote document, served locally: `jsonschema` resolves it, xgrammar does not
    registry = Registry().with_resource(REMOTE, DRAFT202012.create_resource({"type": S}))
    checker = validator(schema, format_checker=FormatChecker(), registry=registry)
    return checker.is_valid(instance)


@pytest.mark.parametrize(("case", "schema", "what", "instance"), UNENFORCED, ids=CASES)
def test_each_unenforced_feature_fails_its_row_naming_it(backend, case, schema, what, instance):
    message = f"json_schema uses {what}, which structured outputs cannot enforce"
    cache = GrammarCache(backend)
    for _ in range(2):  # refused once, remembered
        with pytest.raises(ConstraintCompileError) as caught:
            cache.get(Constraint.json_schema(schema))
        assert str(caught.value) == message
    assert cache.compiled == 1


@pytest.mark.parametrize(("case", "schema", "what", "instance"), UNENFORCED, ids=CASES)
def test_xgrammar_alone_accepts_what_jsonschema_rejects(case, schema, what, instance):
    """Why each feature is refused: compiled anyway, it lets through an invalid instance."""
    assert not jsonschema_accepts(schema, instance, case)
    assert xgrammar_accepts(schema, instance)


@pytest.mark.parametrize(("schema", "invalid"), ENFORCED)
def test_accepted_schemas_are_enforced(backend, schema, invalid):
    backend.check(Constraint.json_schema(schema))
    backend.compile(Constraint.json_schema(schema))
    assert not jsonschema_accepts(schema, invalid)
    assert not xgrammar_accepts(schema, invalid)


def test_the_first_problem_in_document_order_is_named():
    schema = obj(
        a={"type": "array", "items": {"type": S, "not": {"const": ""}}, "contains": {}},
        b={"type": S, "format": "regex"},
    )
    problem = find_unenforced(schema, XGRAMMAR_SCHEMA_SUPPORT)
    assert problem == Unenforced('"contains"', "/properties/a")
    pointer = find_unenforced({"$defs": {"a/b~c": {"not": {}}}}, XGRAMMAR_SCHEMA_SUPPORT)
    assert pointer == Unenforced('"not"', "/$defs/a~1b~0c")


def test_other_constraint_kinds_and_unparsable_schemas_are_left_to_compile(backend):
    backend.check(Constraint("regex", "(a"))
    backend.check(Constraint("json_schema", "{not json"))


def test_a_support_table_names_only_keywords_of_its_types():
    with pytest.raises(ValueError, match=r"^string cannot enforce minimum$"):
        SchemaSupport(types={"string": frozenset({"minimum"})})
    with pytest.raises(ValueError, match=r"^unknown JSON type\(s\): text$"):
        SchemaSupport(types={"text": frozenset()})


@pytest.mark.parametrize(
    ("branches", "disjoint"),
    [
        ([{"type": INT}, {"type": S}], True),
        ([{"type": INT}, {"type": N}], False),  # every integer is a number
        ([{"const": 1}, {"const": 1.0}], False),  # equal JSON values
        ([{"const": True}, {"const": 1}], True),  # true is not 1
        ([{"enum": ["a", "b"]}, {"enum": ["c"]}, {"type": "null"}], True),
        ([{"enum": ["a", 2]}, {"type": N, "title": "annotations are fine"}], False),
        ([{"type": INT, "minimum": 0}, {"type": S}], False),  # not a bare type: not shown
        ([{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}], True),
        ([{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/missing"}], False),
        (
            [
                {"type": "object", "properties": {"t": {"const": "x"}}, "required": ["t"]},
                {"type": "object", "properties": {"t": {"enum": ["y", "z"]}}, "required": ["t"]},
            ],
            True,
        ),
        (
            [  # not an object schema: a string satisfies both branches
                {"properties": {"t": {"const": "x"}}, "required": ["t"]},
                {"type": "object", "properties": {"t": {"const": "y"}}, "required": ["t"]},
            ],
            False,
        ),
        (
            [  # the tag is not required in the second branch
                {"type": "object", "properties": {"t": {"const": "x"}}, "required": ["t"]},
                {"type": "object", "properties": {"t": {"const": "y"}}},
            ],
            False,
        ),
    ],
)
def test_one_of_branches_are_shown_disjoint_only_when_they_are(branches, disjoint):
    root = {"$defs": {"a": {"const": "a"}, "b": {"type": "object"}}, "oneOf": branches}
    assert provably_disjoint(branches, root, ANNOTATIONS) is disjoint
