from __future__ import annotations

import pytest
import torch


@pytest.fixture
def seed_store(tmp_path) -> str:
    """A store written by the project's writer, holding the seed post's measurements."""
    from results.store import Store
    from tests.seed_rows import seed_rows

    store = Store.open(str(tmp_path))
    for r in seed_rows():
        store.write_row(r)
    return str(tmp_path)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
