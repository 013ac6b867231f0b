"""Lua scripts that survive a Redis restart at any moment.

The store (farm.store.redis_store) and the job board (farm.distributed.board) make their atomic steps Lua scripts
run by SHA1 (EVALSHA). A restarted Redis has an empty script cache, and redis-py's `Script` answers the first
NoScriptError with SCRIPT LOAD and one more EVALSHA; when the server restarts between those two calls (the
connection's retry reconnects to the fresh server inside the EVALSHA), the second EVALSHA fails too, and a worker's
step failed with `NoScriptError` while Redis was back and healthy. `LuaScript` falls back to EVAL instead: it
carries the script's body, so it cannot miss the cache, and it loads the script for the calls that follow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError


class LuaScript:
    """One Lua script bound to one Redis client; calling it runs the script atomically on that client's server."""

    def __init__(self, client: Any, source: str) -> None:
        self.client, self.source = client, source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        """The script's reply for KEYS = `keys`, ARGV = `args`."""
        try:
            return self.client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self.client.eval(self.source, len(keys), *keys, *args)
