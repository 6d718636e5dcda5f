"""Generated artefacts (models, drafters) shared by concurrent processes.

The test suite runs on several workers at once (pytest-xdist) and each may need
the same generated checkpoint under `.cache/`: the generators write atomically
and skip work a `.complete` marker says is done, but two of them starting
together would both build, and one would replace the directory under the other's
reader. `exclusive(out_dir)` serialises them: the first builds, the rest wait
and then find the marker.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock (flock) on a file beside out_dir for the block."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
