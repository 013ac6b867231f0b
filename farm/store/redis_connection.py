"""How the Redis store (farm.store.redis_store) talks to its servers: the command packer that sends chunks
uncopied, the login a client adds to the blob Redis' URL the workers published (which carries none), redis-py's
errors as the store's, naming the server but never its password, and its replies typed as the bytes they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit, urlunsplit

from farm.errors import NotPermittedError, credentials_refused, redact_url, tls_refused, tls_verification_failure
from farm.store.base import StoreError, StoreUnreachableError

if TYPE_CHECKING:
    from redis import Redis


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Turn redis-py's errors into StoreErrors naming the store (never its password)."""
    import redis.exceptions

    try:
        yield
    except redis.exceptions.NoPermissionError as exc:
        raise NotPermittedError(url, str(exc)) from exc
    except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
        raise StoreUnreachableError(credentials_refused(url)) from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        failure = tls_verification_failure(exc)
        if failure:
            raise StoreUnreachableError(tls_refused(url, failure)) from exc
        raise StoreUnreachableError(f"can't reach the store at {redact_url(url)}: {exc}") from exc
    except redis.exceptions.InvalidResponse as exc:
        raise StoreUnreachableError(f"the store at {redact_url(url)} is not a Redis server? {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise StoreError(f"the store at {redact_url(url)} failed: {exc}") from exc


def without_login(url: str) -> str:
    """`url` without its user and password: what may be published to every client."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def with_login_of(url: str, login_from: str) -> str:
    """`url` with the user and password of `login_from` and, where `url` has none, its TLS parameters: a client
    logs in to the blob Redis the workers published as it logs in to the farm's."""
    parts, own = urlsplit(url), urlsplit(login_from)
    login = own.netloc.rpartition("@")[0]
    netloc = f"{login}@{parts.netloc.rpartition('@')[2]}" if login else parts.netloc.rpartition("@")[2]
    query = parts.query or (own.query if parts.scheme == own.scheme else "")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def zero_copy_packer() -> object:
    """redis-py's own command packer, which sends a big argument (a chunk) as the buffer it is, never copied. With
    hiredis installed redis-py packs with hiredis, which copies every argument twice (bytes() of a memoryview, then
    into the packed command): a submitter's 435 MB of weights took 1.36 s to SET in 8 MiB chunks that way, 0.45 s
    this way (2-core Zen 4, a Redis without persistence). Replies are still parsed by hiredis."""
    from redis.connection import Encoder, PythonRespSerializer

    return PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)


def get_bytes(client: Redis, name: str) -> bytes | None:
    """GET on one of the store's clients: the value, or None. Those clients leave redis-py's decode_responses off,
    so what they read is bytes; redis-py's types say `bytes | str` for every client (the job board's decodes)."""
    return cast("bytes | None", client.get(name))


def reply_bytes(reply: object) -> bytes:
    """One name in a list one of the store's clients read (SCAN, ZRANGEBYSCORE without scores): bytes, as for
    get_bytes, where redis-py's types allow str, or pairs with scores."""
    return cast(bytes, reply)
