"""YAML a user wrote (sweep specs): plain data only, each problem one line naming the file's line.

`yaml.safe_load` already refuses `!!python` tags, but it keeps the last of two equal keys, builds
whatever anchors and aliases ask for (a few hundred bytes of aliases can stand for billions of
values) and composes nested collections recursively (a list nested thousands deep is a
RecursionError). Here a document is checked as a node graph before any value is built: its depth and
its size with every alias expanded are bounded, and a mapping that gives a key twice is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import shown
from workbench.paths import open_regular

MAX_FILE_BYTES = 1 << 20  # a sweep spec is a few hundred bytes; a megabyte is not a spec
MAX_DEPTH = 32  # spec values nest three levels (zip: [ {key: [values]} ]); lists of lists a few more
MAX_NODES = 100_000  # values after alias expansion: 10,000 points of a few keys each, with room to spare
MERGE_TAG = "tag:yaml.org,2002:merge"


class UserYamlError(ValueError):
    """A document that is not plain, bounded YAML; the message is one line: `file: line L, column C: ...`."""


def load_file(path: Path) -> Any:
    """The document in `path` as plain data; raises UserYamlError (one line) for anything else: a path
    that is no regular file, a file over MAX_FILE_BYTES, invalid YAML, a duplicate key, or a document
    deeper than MAX_DEPTH or larger than MAX_NODES values once its aliases are expanded."""
    try:
        with open_regular(path) as f:  # a FIFO or a device would block or never end: refused by its kind
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise UserYamlError(f"{path}: {size:,} bytes, more than {MAX_FILE_BYTES:,}; not a sweep spec")
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserYamlError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UserYamlError(f"{path}: cannot read: {exc.strerror}") from None
    return load_text(text, str(path))


def load_text(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        _check_nesting(text, source)  # before composing: the composer recurses once per level
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded(node, source)
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # a scalar Python cannot hold: an integer of 5,000 digits, a 13th month
            raise UserYamlError(f"{source}: not valid YAML: a value that cannot be read ({exc})") from None
    except yaml.MarkedYAMLError as exc:
        raise UserYamlError(_one_line(exc, source)) from None
    except yaml.YAMLError as exc:
        raise UserYamlError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def _one_line(exc: yaml.MarkedYAMLError, source: str) -> str:
    """`file: line L, column C: not valid YAML: problem (context)`, at the problem's own mark (inside a
    quoted scalar spanning lines, not where the scalar began): PyYAML's own text spans several lines
    with a caret diagram of the offending line."""
    mark = exc.problem_mark or exc.context_mark
    where = _at(source, mark) if mark is not None else source
    problem = exc.problem or "invalid"
    context = f" ({exc.context})" if exc.context and exc.context_mark is not None else ""
    return f"{where}: not valid YAML: {problem}{context}"


def _at(source: str, mark: yaml.Mark) -> str:
    return f"{source}: line {mark.line + 1}, column {mark.column + 1}"


def _check_nesting(text: str, source: str) -> None:
    """The collections as written nest at most MAX_DEPTH deep (the parser is iterative, so this is safe)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise UserYamlError(f"{_at(source, mark)}: nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_expanded(root: yaml.Node, source: str) -> None:
    """Depth and value count of the document with every alias expanded, without expanding it: each node
    is walked once and its expanded size and height (collection levels from it down) remembered, so a
    chain of aliases that doubles at each step costs one visit per node. An alias that contains itself
    is walked until it is too deep."""
    known: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height)

    def too_deep(node: yaml.Node) -> UserYamlError:
        return UserYamlError(f"{_at(source, node.start_mark)}: nested more than {MAX_DEPTH} levels deep once its "
                             f"aliases are expanded")

    def walk(node: yaml.Node, above: int) -> tuple[int, int]:
        """(values, height) of `node`, which `above` collections enclose."""
        if above > MAX_DEPTH:
            raise too_deep(node)
        if id(node) not in known:
            if isinstance(node, yaml.ScalarNode):
                children: list[yaml.Node] = []
            elif isinstance(node, yaml.SequenceNode):
                children = node.value
            else:
                children = [part for pair in node.value for part in pair]
            values, height = 1, 0 if isinstance(node, yaml.ScalarNode) else 1
            for child in children:
                child_values, child_height = walk(child, above + 1)
                values += child_values
                height = max(height, child_height + 1)
            if values > MAX_NODES:
                raise UserYamlError(f"{_at(source, node.start_mark)}: more than {MAX_NODES:,} values once its "
                                    f"anchors and aliases are expanded; not a sweep spec")
            known[id(node)] = (values, height)
        if above + known[id(node)][1] > MAX_DEPTH:  # reached again, deeper than when first walked
            raise too_deep(node)
        return known[id(node)]

    walk(root, 0)


class _Constructor(yaml.constructor.SafeConstructor):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *base` merges; its keys may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeConstructor reports it below
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)} (first given on line {first.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


class _Loader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer, _Constructor,
              yaml.resolver.Resolver):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Constructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
