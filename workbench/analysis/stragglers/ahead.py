"""Work built one item ahead in a thread: while the caller works on one item, the next is
built. The engine and NumPy's sorts and scatters release the GIL, so on two cores a pass that
alternates reading rows (the engine, partly one core) and ranking them (NumPy, one core) keeps
both busy. No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_END = object()


def built_ahead(
    items: Iterable[T], build: Callable[[T], R], hold: Callable[[R], bool] | None = None
) -> Iterator[R]:
    """``build(item)`` of each item of ``items``, in order, the next one built (and ``items``
    advanced) in a thread while the caller works on the one handed out. ``hold(result)``:
    whether the next may be built only once the caller is done with this one (it still reads
    through something that advancing ``items`` closes, or holds memory that two would exceed).
    An exception in a build is raised here, at that item; stopping early waits for the build
    under way and closes ``items``."""
    source = iter(items)

    def make() -> object:
        for item in source:
            return build(item)
        return _END

    pool = ThreadPoolExecutor(1, thread_name_prefix="workbench-ahead")
    pending: Future[object] | None = pool.submit(make)
    try:
        while pending is not None:
            got = pending.result()
            if got is _END:
                return
            result: R = got  # type: ignore[assignment]
            waits = hold is not None and hold(result)
            pending = None if waits else pool.submit(make)
            yield result
            if waits:
                pending = pool.submit(make)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(source, "close", None)
        if close is not None:  # a generator's own clean-up (an engine connection), here
            close()
