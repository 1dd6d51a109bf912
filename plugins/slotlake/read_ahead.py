"""An iterator read by a thread of its own, a few items ahead of its consumer: for readers that release the GIL
while they read (ADBC's COPY stream in the extract, pyarrow's Parquet reader in the decode), so reading overlaps
what the consumer does with the previous item."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_DONE = object()


class ReadAhead(Generic[T]):
    """The items of `source`, read by a thread of its own while the caller works on the previous one; at most `depth`
    wait in between. `close()` stops the thread (after the item it is reading, if any), before the caller closes
    what `source` reads; the reader's error is raised by the iteration, as reading `source` directly would. Also a
    context manager (`close()` at its end)."""

    def __init__(self, source: Iterable[T], depth: int = 1, *, name: str = "slotlake-read-ahead") -> None:
        self._source = source
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _pump(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the iterating thread, which raises it
            self._put(e)

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
