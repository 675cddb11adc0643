"""Safe YAML loading for campaign files: data plus the line of every value.

`load(path)` returns `(data, lines)`, where `lines` maps a path of keys and indices
(`("stages", 2, "nodes")`) to its 1-based line, so validation errors can name the line.
Refused, each with a message naming the field, file and line: tags other than YAML's
plain ones (no `!!python/...`, no custom `!Tag`), duplicate keys, keys that are not text,
merge keys, alias expansion past a node budget ("billion laughs") or nesting past a depth
limit (recursive aliases), files over `MAX_BYTES` or not UTF-8, and documents that are
empty or not a mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import yaml

from campaign.errors import SpecError

MAX_BYTES = 1 << 20
"""A campaign file is a page of text; a megabyte is already absurd."""
MAX_NODES = 100_000
"""Budget of YAML nodes after alias expansion; an alias bomb blows through it."""
MAX_DEPTH = 64
"""Nesting limit; a recursive alias (`a: &a [*a]`) reaches it at once."""

Lines = dict[tuple[Any, ...], int]

_YAML = "tag:yaml.org,2002:"
_PLAIN_TAGS = frozenset(_YAML + t for t in ("null", "bool", "int", "float", "str", "timestamp", "seq", "map"))


def load(path: str | Path) -> tuple[Any, Lines]:
    """Read and parse one campaign file; raise SpecError on anything unsafe or broken."""
    name = str(path)
    return loads(_read(Path(path), name), name)


def loads(text: str, name: str) -> tuple[Any, Lines]:
    """Parse campaign text (e.g. the copy kept in the ledger); `name` labels errors."""
    if len(text.encode()) > MAX_BYTES:
        _fail(name, None, f"text is over {MAX_BYTES:,} bytes; campaign files are limited to {MAX_BYTES:,}")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise SpecError(name, [_yaml_message(e, name)]) from None
    if node is None:
        _fail(name, None, "file is empty: expected a mapping with name, site and stages")
    if not isinstance(node, yaml.MappingNode):
        _fail(name, (), f"expected a mapping (name: ..., stages: ...), got a {_kind(node)}", node.start_mark.line + 1)
    lines: Lines = {}
    data = _build(node, (), lines, [MAX_NODES], name)
    return data, lines


def _read(p: Path, name: str) -> str:
    try:
        raw = p.read_bytes()
    except OSError as e:
        _fail(name, None, f"cannot read the file: {e.strerror or e}")
    if len(raw) > MAX_BYTES:
        _fail(name, None, f"file is {len(raw):,} bytes; campaign files are limited to {MAX_BYTES:,}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        _fail(name, None, f"not UTF-8 text: byte 0x{raw[e.start]:02x} cannot be decoded (save the file as UTF-8)",
              line, column)


def _build(node: yaml.Node, at: tuple[Any, ...], lines: Lines, budget: list[int], name: str) -> Any:
    line = node.start_mark.line + 1
    budget[0] -= 1
    if budget[0] < 0:
        _fail(name, at[:1], f"too many values after alias expansion (limit {MAX_NODES:,}); is this an alias bomb?",
              lines.get(at[:1], line))
    if len(at) > MAX_DEPTH:
        _fail(name, at[:1], f"nested more than {MAX_DEPTH} levels deep; is an alias recursive?", lines.get(at[:1], line))
    lines.setdefault(at, line)
    if node.tag not in _PLAIN_TAGS:
        _fail(name, at, f"tag {_tag(node.tag)} is not allowed; campaign files are plain YAML (no tags)", line)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == _YAML + "merge":
                _fail(name, at, "merge keys (<<) are not supported; write the values out", key_line)
            key = _scalar(key_node, at, name)
            if not isinstance(key, str):
                _fail(name, at, f"key {key_node.value!r} is read as {type(key).__name__}, not text; "
                      f"put it in quotes if you mean it", key_line)
            if key in out:
                first = lines.get(at + (key,), "?")
                _fail(name, at + (key,), "duplicate key; keep one of them", f"{first} and {key_line}")
            lines[at + (key,)] = key_line
            out[key] = _build(value_node, at + (key,), lines, budget, name)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, at + (i,), lines, budget, name) for i, item in enumerate(node.value)]
    return _scalar(node, at, name)


def _scalar(node: yaml.Node, at: tuple[Any, ...], name: str) -> Any:
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.ScalarNode):
        _fail(name, at, "a mapping key must be a plain value, not a list or mapping", line)
    if node.tag not in _PLAIN_TAGS:
        _fail(name, at, f"tag {_tag(node.tag)} is not allowed; campaign files are plain YAML (no tags)", line)
    try:
        return _construct(node)
    except yaml.YAMLError as e:
        raise SpecError(name, [_yaml_message(e, name)]) from None


def _construct(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _fail(name: str, at: tuple[Any, ...] | None, message: str, line: int | str | None = None,
          column: int | None = None) -> NoReturn:
    """Raise the one problem as `field: message (file, line N)`; `at=None` for the whole file."""
    raise SpecError(name, [problem(name, at, message, line, column)])


def problem(name: str, at: tuple[Any, ...] | None, message: str, line: int | str | None = None,
            column: int | None = None) -> str:
    """One problem line in the form every campaign-file error uses."""
    where = Path(name).name
    if line is not None:
        where += f", line{'s' if isinstance(line, str) else ''} {line}"
    if column is not None:
        where += f", column {column}"
    field = "" if at is None else f"{_dotted(at) or '(top level)'}: "
    return f"{field}{message} ({where})"


def _tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_YAML) if tag.startswith(_YAML) else tag


def _kind(node: yaml.Node) -> str:
    return {yaml.SequenceNode: "list", yaml.ScalarNode: "single value"}.get(type(node), "value")


def _yaml_message(e: yaml.YAMLError, name: str) -> str:
    mark = getattr(e, "problem_mark", None)
    problem_text = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    if context:
        problem_text = f"{problem_text} ({context})"
    if "<block" in problem_text:
        problem_text += "; check the indentation"
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    return problem(name, None, f"invalid YAML: {problem_text}", line, column)


def _dotted(at: tuple[Any, ...]) -> str:
    out = ""
    for part in at:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


dotted = _dotted


def parse_dotted(text: str) -> tuple[Any, ...]:
    """`dotted`'s inverse: "stages[2].nodes" -> ("stages", 2, "nodes")."""
    return tuple(int(c) if c.isdigit() else c for c in text.replace("]", "").replace("[", ".").split(".") if c)
