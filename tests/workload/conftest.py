from __future__ import annotations

import pytest

from workbench.paths import shared_traces_dir


@pytest.fixture
def shared_traces():
    folder = shared_traces_dir()
    if folder is None:
        pytest.skip("../shared/traces is not present")
    return folder
