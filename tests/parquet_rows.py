"""The rows the Parquet dataset maker promises, computed here from its stated construction
(standard-normal inputs from the seed, labels from a fixed random teacher), so that a file can be
checked against something it was not read from."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def expected_rows(samples: int, features: int = 32, classes: int = 4, seed: int = 0) -> pa.Table:
    """Columns ``x0`` .. ``x{features-1}`` (float32) and ``label`` (int64), in row order."""
    x = np.random.default_rng(seed).standard_normal((samples, features), dtype=np.float32)
    teacher = np.random.default_rng(12345).standard_normal((features, classes)).astype(np.float32)
    label = np.argmax(np.tanh(x) @ teacher, axis=1).astype(np.int64)
    return pa.table({**{f"x{i}": x[:, i] for i in range(features)}, "label": label})
