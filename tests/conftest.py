"""Fixtures shared by the test modules that run the command line."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory) -> dict:
    """Environment for command-line runs: one private cache for the whole session (the built-in corpus is prepared
    once, never in the user's ~/.cache), unbuffered output."""
    return dict(os.environ, TINYELECTRA_CACHE=str(tmp_path_factory.mktemp("cache")), PYTHONUNBUFFERED="1")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test, restored after: tiny models gain nothing from threads, and on a machine
    shared with other jobs two threads can run 10x slower than one (OpenMP spin-waiting). Modules that want it
    say `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
