"""Running one of farm's modules in a fresh Python process.

Fresh processes, not multiprocessing: spawn re-imports the caller's `__main__` (a user's unguarded script would
run again) and fork copies a driver's state without its threads. The child imports this same farm package, first
on its path, even when the parent found it through a path the child wouldn't search or the child's working
directory holds another `farm`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import farm


def module_command(module: str) -> list[str]:
    """argv that runs `module` as __main__ in a fresh interpreter, with this farm package first on sys.path."""
    root = str(Path(farm.__file__).resolve().parent.parent)
    code = f"import runpy, sys; sys.path.insert(0, {root!r}); runpy.run_module({module!r}, run_name='__main__')"
    return [sys.executable, "-c", code]
