"""Hostile sweep YAML structure, fuzzed (hypothesis): alias chains that expand to billions of values, collections
nested thousands deep, keys given twice, huge values where a short one belongs, syntax errors inside quoted
scalars spanning lines. Each is refused with one line that names the file (and the line where one is at
fault), in bounded time and memory, before anything is expanded, run or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workbench.clean_exit import ERROR_CHARS
from workbench.sweep import SpecError, load_spec
from workbench.sweep.__main__ import run as sweep_main
from workbench.user_yaml import MAX_DEPTH, MAX_NODES

# per generator, in make test and (marked slow) make test-all; the huge-value one runs a third of that
# (PyYAML scans ~1 MB/s)
QUICK_EXAMPLES, YAML_EXAMPLES = 15, 60
MESSAGE_CHARS = 2000  # a refusal lists at most the valid keys; never the hostile value itself
TINY_BASE = "base: {kernel: none, num_requests: 4, workload: 'fixed:prompt=4,output=4'}\n"
KEYS = ("name", "description", "base", "axes")  # where a hostile value is planted
SETTINGS = settings(max_examples=YAML_EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def quick_and_full(check, share: float = 1.0, **strategies):
    """Two tests of `check` over the same `strategies`: a few draws for make test, many for make test-all."""
    quick = settings(SETTINGS, max_examples=max(1, int(QUICK_EXAMPLES * share)))(given(**strategies)(check))
    full = pytest.mark.slow(settings(SETTINGS, max_examples=int(YAML_EXAMPLES * share))(given(**strategies)(check)))
    return quick, full


def bomb(fanout: int, levels: int, where: str) -> tuple[str, int]:
    """Anchors that each repeat the previous one `fanout` times; the last is planted at `where`. Returns
    the text and the number of values the planted alias stands for."""
    chain = [f"&a0 [{', '.join(['x'] * fanout)}]"]
    chain += [f"&a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]" for i in range(1, levels)]
    planted = {"name": f"name: *a{levels - 1}", "description": f"description: *a{levels - 1}",
               "base": f"base: {{seed: *a{levels - 1}}}", "axes": f"axes: {{seed: *a{levels - 1}}}"}[where]
    values = sum(fanout**i for i in range(levels + 1))
    return f"zip: [{{seed: [{', '.join(chain)}]}}]\n{planted}\n", values


def nested(depth: int, where: str) -> str:
    inner = "[" * depth + "1" + "]" * depth
    return {"name": f"name: {inner}\n", "description": f"description: {inner}\n",
            "base": f"base: {{seed: {inner}}}\n", "axes": f"axes: {{seed: {inner}}}\n"}[where]


def sweep_cli(path: Path, out: Path, capsys) -> tuple[int, str]:
    try:
        status = sweep_main([str(path), "--out", str(out), "--no-progress"])
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def check_refused(path: Path, capsys, tmp: Path) -> str:
    """The spec is refused: SpecError naming the file, bounded; the CLI says it in one line, exit 2,
    and writes nothing."""
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and len(message) <= MESSAGE_CHARS, message[:300]
    before = sorted(p.name for p in tmp.iterdir())
    status, err = sweep_cli(path, tmp / "out", capsys)
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err[:300]
    assert len(err) <= len("error: \n") + ERROR_CHARS and "Traceback" not in err
    assert sorted(p.name for p in tmp.iterdir()) == before
    return message


def check_alias_chain(tmp_path_factory, capsys, fanout, levels, where):
    tmp = tmp_path_factory.mktemp("bomb")
    text, values = bomb(fanout, levels, where)
    path = tmp / "spec.yaml"
    path.write_text(text)
    message = check_refused(path, capsys, tmp)
    event("over the bound" if values > MAX_NODES else "within the bound")
    if values > MAX_NODES:
        assert f"more than {MAX_NODES:,} values once its anchors and aliases are expanded" in message
        line = int(message.split(": line ")[1].split(",")[0])  # the line of the collection that grew too big
        assert 1 <= line <= text.count("\n") + 1 and ", column " in message
    assert len(path.read_text()) < 4096  # a small file, whatever it stands for


test_alias_chains_are_refused_before_they_expand, test_more_alias_chains_are_refused_before_they_expand = \
    quick_and_full(check_alias_chain, fanout=st.integers(2, 12), levels=st.integers(1, 40), where=st.sampled_from(KEYS))


def check_deep_nesting(tmp_path_factory, capsys, depth, where):
    tmp = tmp_path_factory.mktemp("deep")
    path = tmp / "spec.yaml"
    path.write_text(nested(depth, where))
    message = check_refused(path, capsys, tmp)
    if depth + 1 > MAX_DEPTH:  # the mapping at the top is one level
        assert f"nested more than {MAX_DEPTH} levels deep" in message and ": line 1, column " in message


# depth from 2: `axes: {seed: [1]}` is a fine spec
test_deep_nesting_is_one_line_not_a_recursion_error, test_more_deep_nesting_is_one_line_not_a_recursion_error = \
    quick_and_full(check_deep_nesting, depth=st.integers(2, 5000), where=st.sampled_from(KEYS))


def test_an_alias_that_contains_itself_is_refused(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("base: &b {seed: *b}\n")
    assert "levels deep once its aliases are expanded" in check_refused(path, capsys, tmp_path)


VALID_LINES = ["name: dup", "description: a sweep", TINY_BASE.strip(), "axes: {seed: [0, 1]}"]
BASE_KEYS = ("seed", "rate", "kernel", "num_requests", "block_size")


def check_key_twice(tmp_path_factory, capsys, order, repeat, inside_base, key):
    tmp = tmp_path_factory.mktemp("dup")
    lines = [VALID_LINES[i] for i in order]
    if inside_base:
        lines = [line for line in lines if not line.startswith("base:")]
        lines += ["base:", f"  {key}: 1", "  n: 1", f"  {key}: 2"]
        second = len(lines)
        shown_key = key
    else:
        lines.append(lines[repeat])
        second = len(lines)
        shown_key = lines[repeat].split(":")[0]
    path = tmp / "spec.yaml"
    path.write_text("\n".join(lines) + "\n")
    message = check_refused(path, capsys, tmp)
    assert f"line {second}, column " in message and f"duplicate key '{shown_key}'" in message, message


test_a_key_given_twice_is_refused_at_its_second_line, test_more_keys_given_twice_are_refused_at_their_second_line = \
    quick_and_full(check_key_twice, order=st.permutations(range(len(VALID_LINES))),
                   repeat=st.integers(0, len(VALID_LINES) - 1), inside_base=st.booleans(),
                   key=st.sampled_from(BASE_KEYS))


def check_huge_value(tmp_path_factory, capsys, size, where):
    tmp = tmp_path_factory.mktemp("huge")
    huge = "x" * size
    text = {"name": f"name: {huge}\n", "description": f"description: [{huge}]\n", "axes": f"axes: {{seed: {huge}}}\n",
            "base": f"base: {{workload: {huge}}}\n", "key": f"base: {{{huge}: 1}}\n"}[where]
    path = tmp / "spec.yaml"
    path.write_text(text)
    message = check_refused(path, capsys, tmp)
    assert huge[:200] not in message


test_a_huge_value_is_shown_shortened, test_more_huge_values_are_shown_shortened = \
    quick_and_full(check_huge_value, share=1 / 3, size=st.integers(1_000, 100_000),
                   where=st.sampled_from(("name", "description", "axes", "base", "key")))


def check_bad_escape(tmp_path_factory, capsys, before, inside, escape):
    tmp = tmp_path_factory.mktemp("quoted")
    lines = [f"# comment {i}" for i in range(before)]
    lines.append('description: "first line')
    lines += [f"  more {i}" for i in range(inside)]
    lines.append(f'  bad {escape} here"')
    path = tmp / "spec.yaml"
    path.write_text("\n".join(lines) + "\n")
    message = check_refused(path, capsys, tmp)
    assert f": line {len(lines)}, column " in message and "not valid YAML" in message, message


test_a_bad_escape_in_a_quoted_scalar_spanning_lines_names_its_own_line, \
    test_more_bad_escapes_in_quoted_scalars_spanning_lines_name_their_own_line = \
    quick_and_full(check_bad_escape, before=st.integers(0, 6), inside=st.integers(0, 6),
                   escape=st.sampled_from(["\\q", "\\x4", "\\u12", "\\U1"]))
