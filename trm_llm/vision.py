"""`VisionLLMClient`: images in, OpenAI `image_url` content parts out, over any `LLMProvider`.

A wrapper must forward `cache_salt` (and `parent_call_id`): one that dropped it would key every
epoch's image question to the same cache entry and replay the first epoch's answer.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from trm_llm.client import ChatResult
from trm_llm.protocols import LLMProvider

__all__ = ["VisionLLMClient"]


class VisionLLMClient:
    """An `LLMProvider` that adds `ask(prompt, images)` to the provider it wraps."""

    def __init__(self, inner: LLMProvider, *, detail: str | None = None) -> None:
        self._inner = inner
        self._detail = detail

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        parent_call_id: str | None = None,
        cache_salt: str | None = None,
        **params: Any,
    ) -> ChatResult:
        """Forward unchanged, salt and parent included."""
        return await self._inner.chat(
            messages, parent_call_id=parent_call_id, cache_salt=cache_salt, **params
        )

    async def ask(
        self,
        prompt: str,
        images: Sequence[bytes | str],
        *,
        system: str | None = None,
        mime_type: str = "image/png",
        parent_call_id: str | None = None,
        cache_salt: str | None = None,
        **params: Any,
    ) -> ChatResult:
        """One user turn of text plus images (bytes become data URLs; str is a URL as given)."""
        parts: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
        for image in images:
            url = image if isinstance(image, str) else _data_url(image, mime_type)
            image_url: dict[str, str] = {"url": url}
            if self._detail is not None:
                image_url["detail"] = self._detail
            parts.append({"type": "image_url", "image_url": image_url})
        messages: list[dict[str, Any]] = [{"role": "user", "content": parts}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        return await self.chat(
            messages, parent_call_id=parent_call_id, cache_salt=cache_salt, **params
        )


def _data_url(data: bytes, mime_type: str) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(data).decode('ascii')}"
