"""Grammar cases shared by bench/compare_grammar_libs.py and bench/bench_constraints.py.

COVERAGE: (feature, schema or (kind, text), valid examples, invalid examples); a library
"enforces" a feature when every valid example passes token by token and no invalid one does.
GENERATIONS: (name, kind, text, prompt) for the per-token cost on real generations."""

from __future__ import annotations

import json

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}

TOOL_CALL_SCHEMA = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER_TOOL["function"]["parameters"]},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TOOL_CALL = json.dumps({"begin": "<tool_call>\n", "schema": TOOL_CALL_SCHEMA, "end": "\n</tool_call>"})

# llama.cpp grammars/arithmetic.gbnf
ARITHMETIC_GBNF = r"""root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""
YES_NO_GBNF = 'root ::= ("yes" | "no") " because " [a-z ]{1,40} "."\n'

COVERAGE = [
    ("nested objects", {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "string"}}, "required": ["b"]}}, "required": ["a"]},
     ['{"a": {"b": "x"}}'], ['{"a": {}}', '{"a": 1}']),
    ("enum", {"enum": ["red", "green", 3]}, ['"red"', "3"], ['"blue"', "4"]),
    ("array minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
     ["[1, 2]", "[1,2,3]"], ["[1]", "[1, 2, 3, 4]"]),
    ("integer minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 12},
     ["7", "12"], ["0", "13", "-5", "100"]),
    ("string minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 4},
     ['"ab"', '"abcd"'], ['"a"', '"abcde"']),
    ("string pattern", {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"}, ['"abc-12"'], ['"ab-12"', '"abc-1"']),
    ("string format date", {"type": "string", "format": "date"}, ['"2024-01-31"'], ['"yesterday"']),
    ("string format email", {"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"not an email"']),
    ("$ref/$defs", {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
                    "type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}}, "required": ["p"]},
     ['{"p": {"x": 1}}'], ['{"p": {"x": "1"}}']),
    ("recursive $ref", {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"},
     ['{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}'], ['{"kids": []}']),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "enum": ["none"]}]}, ["5", '"none"'], ['"x"']),
    ("additionalProperties false", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                    "additionalProperties": False}, ['{"a": 1}'], ['{"a": 1, "b": 2}', "{}"]),
    ("number exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, ["0.5", "3"], ["0", "-1"]),
    ("integer range 10..999", {"type": "integer", "minimum": 10, "maximum": 999}, ["10", "999", "57"],
     ["9", "1000", "-10"]),
    ("number minimum/maximum", {"type": "number", "minimum": -1.5, "maximum": 2.5}, ["-1.5", "0.25", "2"],
     ["-2", "2.6", "30"]),
    ("const", {"const": "fixed"}, ['"fixed"'], ['"other"']),
    ("oneOf", {"oneOf": [{"type": "boolean"}, {"type": "null"}]}, ["true", "null"], ["1"]),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     ['{"a": 1, "b": "x"}'], ['{"a": 1}']),
    ("prefixItems (tuple)", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                             "items": False}, ['[1, "a"]'], ['["a", 1]', '[1, "a", 2]']),
    ("deep recursion (depth 6)", {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}},
                                  "$ref": "#/$defs/n"},
     ['{"c": {"c": {"c": {"c": {"c": {"c": {}}}}}}}'], ['{"c": 1}']),
    ("json_object (any object)", ("json_object", ""), ['{"x": [1, {"y": null}]}', "{}"], ["[1]", '"s"']),
    ("gbnf", ("gbnf", YES_NO_GBNF), ["yes because it is."], ["maybe because x."]),
    ("regex", ("regex", r"\d{4}-\d{2}-\d{2}"), ["2024-01-31"], ["2024-1-31"]),
]

GENERATIONS = [
    ("json_object", "json_object", "", "Describe a cat as a JSON object."),
    ("nested", "json_schema", json.dumps(PERSON), "Give me a JSON record for a user named Ann who lives in Paris."),
    ("tool_call", "tool_call", TOOL_CALL, "What is the weather in Paris?"),
    ("gbnf", "gbnf", ARITHMETIC_GBNF, "Write two arithmetic equations."),
    ("regex", "regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "What is today's date?"),
]
