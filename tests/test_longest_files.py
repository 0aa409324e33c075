"""The files `make test` starts first (tests/conftest.py LONGEST_FILES) are test files of this suite: a file
renamed or removed must leave the list, or the long file that replaced it would run last again."""

from __future__ import annotations

from tests.conftest import LONGEST_FILES, REPO


def test_every_file_started_first_is_a_test_file_here():
    missing = [path for path in LONGEST_FILES if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FILES names files that are not here: {missing}"
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
