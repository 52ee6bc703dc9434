"""Fixtures shared by the test modules that run the command line."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory) -> dict:
    """Environment for command-line runs: one private cache for the whole session (the built-in corpus is prepared
    once, never in the user's ~/.cache), unbuffered output."""
    return dict(os.environ, TINYELECTRA_CACHE=str(tmp_path_factory.mktemp("cache")), PYTHONUNBUFFERED="1")
