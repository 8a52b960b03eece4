"""Structured output on the real model: 20 JSON schemas of increasing difficulty, each
through the server (`response_format` json_schema with the `openai` client) and through
`loupe generate --json-schema`, validated by `jsonschema`; `json_object`; the schema-root
rule; invalid schemas failing closed with the keyword and path named.

Greedy decoding: the grammar guarantees the syntax and the schema; the budget is generous so
every output is complete (`finish_reason` "stop"), which the tests check too.
"""

from __future__ import annotations

import json
import subprocess

import jsonschema
import openai
import pytest

from conftest import loupe_bin, model_path

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"], "additionalProperties": False}

# (prompt, schema), simplest first.
CASES: list[tuple[str, dict]] = [
    ("Give me a JSON object.", {"type": "object"}),
    ("Is the sky blue? Answer in JSON.", {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": False}),
    ("What is 2 + 2? Answer in JSON.", {"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"], "additionalProperties": False}),
    ("Name a fruit, in JSON.", {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 30}}, "required": ["fruit"], "additionalProperties": False}),
    ("Describe a person in JSON.", PERSON),
    ("Pick a primary color, in JSON.", {"type": "object", "properties": {"color": {"enum": ["red", "yellow", "blue"]}}, "required": ["color"], "additionalProperties": False}),
    ("Rate this movie from 1 to 5 in JSON.", {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": {"type": "string", "maxLength": 60}}, "required": ["stars"], "additionalProperties": False}),
    ("Give the temperature in Paris as JSON.", {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 50}, "city": {"const": "Paris"}}, "required": ["celsius", "city"], "additionalProperties": False}),
    ("List three colors in JSON.", {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 3, "maxItems": 3}}, "required": ["colors"], "additionalProperties": False}),
    ("List some prime numbers in JSON.", {"type": "object", "properties": {"primes": {"type": "array", "items": {"type": "integer", "minimum": 2, "maximum": 100}, "minItems": 2, "maxItems": 5}}, "required": ["primes"], "additionalProperties": False}),
    ("Give a US zip code in JSON.", {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"], "additionalProperties": False}),
    ("Give a date in JSON.", {"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-([0-2][0-9]|3[01])$"}}, "required": ["date"], "additionalProperties": False}),
    ("Describe a book in JSON.", {"type": "object", "properties": {"title": {"type": "string", "maxLength": 50}, "author": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1400, "maximum": 2030}, "genre": {"enum": ["fiction", "science", "history", "poetry"]}}, "required": ["title", "author", "year"], "additionalProperties": False}),
    ("Describe a city with its country in JSON.", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "code": {"type": "string", "pattern": "^[A-Z]{2}$"}}, "required": ["name", "code"], "additionalProperties": False}}, "required": ["city", "country"], "additionalProperties": False}),
    ("Either an error or a result, in JSON.", {"anyOf": [{"type": "object", "properties": {"error": {"type": "string", "maxLength": 40}}, "required": ["error"], "additionalProperties": False}, {"type": "object", "properties": {"result": {"type": "number"}}, "required": ["result"], "additionalProperties": False}]}),
    ("Describe two people in JSON.", {"type": "object", "properties": {"people": {"type": "array", "items": PERSON, "minItems": 2, "maxItems": 2}}, "required": ["people"], "additionalProperties": False}),
    ("A shopping list in JSON.", {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "object", "properties": {"item": {"type": "string", "maxLength": 20}, "quantity": {"type": "integer", "minimum": 1, "maximum": 12}, "unit": {"enum": ["kg", "pieces", "liters"]}}, "required": ["item", "quantity"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False}),
    ("An event with optional fields, in JSON.", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}, "online": {"type": "boolean"}, "attendees": {"type": ["integer", "null"], "minimum": 0, "maximum": 1000}}, "required": ["name", "time"], "additionalProperties": False}),
    # $ref into $defs, two levels (a recursive node lets a 135M model nest forever: it did).
    ("A category with two subcategories in JSON.", {"$defs": {"leaf": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 20}}, "required": ["label"], "additionalProperties": False}, "node": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 20}, "children": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"$ref": "#/$defs/leaf"}}}, "required": ["label", "children"], "additionalProperties": False}}, "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"], "additionalProperties": False}),
    ("An API response in JSON.", {"type": "object", "properties": {"status": {"enum": ["ok", "error"]}, "code": {"type": "integer", "minimum": 100, "maximum": 599}, "data": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{8}$"}, "score": {"type": "number", "minimum": 0, "maximum": 1}, "labels": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}, "required": ["id", "score"], "additionalProperties": False}]}}, "required": ["status", "code", "data"], "additionalProperties": False}),
]

MAX_TOKENS = 400
MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_there_are_twenty_schemas_and_each_is_valid_json_schema():
    assert len(CASES) == 20
    for _, schema in CASES:
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_server_output_validates(server, client, case):
    prompt, schema = CASES[case]
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        response_format={"type": "json_schema", "json_schema": {"name": f"case{case}", "schema": schema, "strict": True}},
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", f"case {case}: ran out of tokens: {choice.message.content!r}"
    jsonschema.validate(json.loads(choice.message.content), schema)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_cli_output_validates(tmp_path, case):
    prompt, schema = CASES[case]
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(schema))
    out = subprocess.run(
        [str(loupe_bin()), "generate", "--model", str(model_path()), "--chat", prompt, "--json-schema", str(schema_file), "-n", str(MAX_TOKENS), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "finish: length" not in out.stderr, out.stderr
    text = json.loads(out.stdout)["text"]
    jsonschema.validate(json.loads(text), schema)


def test_streamed_json_object_parses(server, client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France? Answer as JSON."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=MAX_TOKENS, stream=True,
    )
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop", text
    assert isinstance(json.loads(text), dict)


def test_schema_root_must_admit_an_object(server, client):
    ok = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "JSON please."}], temperature=0, max_tokens=MAX_TOKENS,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": ["object", "null"], "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}}},
    )
    assert isinstance(json.loads(ok.choices[0].message.content)["x"], int)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "string"}}},
        )
    assert e.value.body["param"] == "response_format" and "keyword 'type'" in e.value.body["message"]


@pytest.mark.parametrize(
    "schema, keyword, path",
    [
        ({"type": "object", "properties": {"xs": {"type": "array", "contains": {"type": "integer"}}}}, "contains", "/properties/xs"),
        ({"type": "object", "properties": {"when": {"type": "string", "format": "no-such-format"}}}, "format", "/properties/when"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref", "/properties/a"),
        ({"type": "object", "properties": {"b": {"anyOf": [{"type": "string"}, {"type": "string", "pattern": "(?<=x)y"}]}}}, "pattern", "/properties/b/anyOf/1"),
    ],
)
def test_unsupported_schemas_fail_closed_with_keyword_and_path(server, client, schema, keyword, path):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        )
    body = e.value.body
    assert (body["param"], body["keyword"], body["path"]) == ("response_format", keyword, path), body
    assert f"keyword '{keyword}' at '{path}'" in body["message"], body
