"""A plug-in dataset whose items are narrower than the model's input: the failure names both."""

from __future__ import annotations

import pytest

from workbench.errors import RunFailedError
from workbench.run.launch import launch

from .conftest import base_config
from .helpers import WARM

pytestmark = pytest.mark.slow


def test_a_dataset_that_does_not_fit_the_model_is_named(store) -> None:
    # two_features gives 6 features per item; the built-in mlp takes 32.
    handle = launch(
        base_config(store, run_name="width-mismatch", dataset="tests.plugins:two_features"),
        WARM,
    )
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=120)
    failure = err.value
    assert failure.rank == 0
    message = failure.exception or ""
    assert "'mlp' does not take the inputs of the dataset 'tests.plugins:two_features'" in message
    assert "must equal the width of the dataset's items" in message
    assert "(64x6 and 32x" in message, "torch's own shapes stay, so the widths can be read off"
