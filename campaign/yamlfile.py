"""Safe YAML loading for campaign files: data plus the line of every value.

`load(path)` returns `(data, lines)`, where `lines` maps a path of keys and indices
(`("stages", 2, "nodes")`) to its 1-based line, so validation errors can name the line.
Refused, each with a message naming the file and line: arbitrary tags (safe loader only),
duplicate keys, alias expansion past a node budget ("billion laughs"), files over
`MAX_BYTES`, and documents that are empty or not a mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from campaign.errors import SpecError

MAX_BYTES = 1 << 20
"""A campaign file is a page of text; a megabyte is already absurd."""
MAX_NODES = 100_000
"""Budget of YAML nodes after alias expansion; an alias bomb blows through it."""

Lines = dict[tuple[Any, ...], int]


def load(path: str | Path) -> tuple[Any, Lines]:
    """Read and parse one campaign file; raise SpecError on anything unsafe or broken."""
    p = Path(path)
    name = str(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SpecError(name, [f"cannot read the file: {e.strerror or e}"]) from None
    if len(raw) > MAX_BYTES:
        raise SpecError(name, [f"file is {len(raw):,} bytes; campaign files are limited to {MAX_BYTES:,}"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(name, [f"not UTF-8 text (byte {e.start})"]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise SpecError(name, [_yaml_message(e)]) from None
    if node is None:
        raise SpecError(name, ["file is empty: expected a mapping with name, site and stages"])
    if not isinstance(node, yaml.MappingNode):
        raise SpecError(name, [f"line {node.start_mark.line + 1}: expected a mapping at the top level, got a {_kind(node)}"])
    lines: Lines = {}
    budget = [MAX_NODES]
    data = _build(node, (), lines, budget, name)
    return data, lines


def _build(node: yaml.Node, at: tuple[Any, ...], lines: Lines, budget: list[int], name: str) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise SpecError(name, [f"line {node.start_mark.line + 1}: too many nodes after alias expansion (limit {MAX_NODES:,}); is this an alias bomb?"])
    lines.setdefault(at, node.start_mark.line + 1)
    if not node.tag.startswith("tag:yaml.org,2002:"):
        raise SpecError(name, [f"line {node.start_mark.line + 1}: tag {node.tag} not allowed; campaign files use plain YAML only"])
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise SpecError(name, [f"line {key_node.start_mark.line + 1}: merge keys (<<) are not supported; write the values out"])
            key = _scalar(key_node, name)
            if key in out:
                first = lines.get(at + (key,), "?")
                raise SpecError(name, [f"line {key_node.start_mark.line + 1}: duplicate key {_dotted(at + (key,))!s} (first at line {first})"])
            lines[at + (key,)] = key_node.start_mark.line + 1
            out[key] = _build(value_node, at + (key,), lines, budget, name)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, at + (i,), lines, budget, name) for i, item in enumerate(node.value)]
    return _scalar(node, name)


def _scalar(node: yaml.Node, name: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise SpecError(name, [f"line {node.start_mark.line + 1}: a mapping key must be a plain value"])
    try:
        return _construct(node)
    except yaml.YAMLError as e:
        raise SpecError(name, [_yaml_message(e)]) from None


def _construct(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _kind(node: yaml.Node) -> str:
    return {yaml.SequenceNode: "list", yaml.ScalarNode: "single value"}.get(type(node), "value")


def _yaml_message(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(e, "problem", None) or str(e)
    if "could not determine a constructor" in str(e):
        problem = f"tag not allowed ({getattr(e, 'problem', '')}); campaign files use plain YAML only"
    return f"{where}{problem}"


def _dotted(at: tuple[Any, ...]) -> str:
    out = ""
    for part in at:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


dotted = _dotted
