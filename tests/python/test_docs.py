"""The examples of docs/python.md run, and do what they say (their asserts).
tests/python/package.sh also type-checks them with mypy."""

import gc
import re

import pytest

from conftest import np, torch
from docs_examples import examples

EXAMPLES = examples()


def test_there_are_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("line,code", EXAMPLES,
                         ids=[f"line{line}" for line, _ in EXAMPLES])
def test_example_runs(line, code, monkeypatch):
    if re.search(r"^import numpy|^from numpy", code, re.M) and np is None:
        pytest.skip("needs NumPy")
    if re.search(r"^import (pinpool\.)?torch|^from torch", code, re.M) \
            and torch is None:
        pytest.skip("needs torch")
    monkeypatch.delenv("PINPOOL_CONF", raising=False)
    exec(compile(code, f"docs/python.md:{line}", "exec"),  # noqa: S102
         {"__name__": "__main__"})
    gc.collect()
