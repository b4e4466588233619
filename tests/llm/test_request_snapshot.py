"""A call reads its messages and params once (`trm_llm.request_snapshot`): what another task
changes in them while the call waits is neither sent nor cached under the key of the request
the call was made with (a poisoned cache answers everyone who asks that request)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from trm_llm.errors import LLMConfigError
from trm_llm.simulated_server import SimulatedServer
from trm_llm.sqlite_cache import SqliteResponseCache

from .conftest import ClientFactory


@pytest.fixture
def cache(tmp_path: Path) -> SqliteResponseCache:
    return SqliteResponseCache(tmp_path / "cache.db", ttl_s=600)


async def edited_meanwhile(edit: Any) -> asyncio.Task[None]:
    """A task that runs `edit` as soon as the call that follows first waits."""

    async def run() -> None:
        await asyncio.sleep(0)
        edit()

    return asyncio.create_task(run())


@pytest.mark.parametrize("what", ["message", "param"])
async def test_an_edit_while_the_call_waits_is_neither_sent_nor_cached_under_the_old_key(
    server: SimulatedServer, make_client: ClientFactory, cache: SqliteResponseCache, what: str
) -> None:
    client = make_client(cache=cache)
    messages = [{"role": "user", "content": "2+2?"}]
    stop = ["\n"]
    if what == "message":
        task = await edited_meanwhile(lambda: messages[0].update(content="capital of France?"))
    else:
        task = await edited_meanwhile(lambda: stop.append("Paris"))
    await client.chat(messages, stop=stop)
    await task
    (sent,) = server.requests
    assert sent.body["messages"] == [{"role": "user", "content": "2+2?"}]
    assert sent.body["stop"] == ["\n"]
    asked = cache.build_key(
        "sim",
        [{"role": "user", "content": "2+2?"}],
        None,
        {"stop": ["\n"]},
        endpoint=server.base_url,
    )
    edited = cache.build_key("sim", messages, None, {"stop": stop}, endpoint=server.base_url)
    assert await cache.get(asked) is not None
    assert await cache.get(edited) is None


async def test_a_request_that_contains_itself_is_refused_with_a_typed_error(
    server: SimulatedServer, make_client: ClientFactory
) -> None:
    looped: dict[str, Any] = {"role": "user", "content": "hi"}
    looped["self"] = looped
    with pytest.raises(LLMConfigError, match="cycle"):
        await make_client().chat([looped])
    assert server.request_count == 0
