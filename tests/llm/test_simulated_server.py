"""The loopback server itself: thread mode, markers, keep-alive reuse, unknown paths."""

from __future__ import annotations

import httpx

from trm_llm.simulated_server import SimulatedServer, status


def test_thread_mode_markers_and_request_count() -> None:
    server = SimulatedServer()
    stop = server.run_in_thread()
    try:
        with httpx.Client() as http:
            url = f"{server.base_url}/chat/completions"
            marked = {
                "model": "m",
                "messages": [{"role": "user", "content": "x [[sim:unauthorized]]"}],
            }
            assert http.post(url, json=marked).status_code == 401
            body = http.post(url, json={"model": "m", "messages": []}).text
            assert body.endswith("data: [DONE]\n\n") and '"content": "Hello"' in body
            assert http.post(f"{server.base_url}/models", json={}).status_code == 404
            server.script(status(503))
            assert http.post(url, json={"model": "m", "messages": []}).status_code == 503
    finally:
        stop()
    assert server.request_count == 3  # chat requests only
    assert server.requests[0].body["messages"][0]["content"].endswith("[[sim:unauthorized]]")
