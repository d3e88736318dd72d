"""The clients of the server load test (test_load.py): streaming chat requests, closed
early or not, malformed ones, /health polls from a thread of their own, and /metrics reads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import http_get

MODEL = "smollm2-135m-instruct"
MAX_MODEL_LEN = 8192  # the target's own limit: room for the long streams of the test
CANCEL_AFTER_CHUNKS = 3
IDLE_TIMEOUT_S = 30
HEALTH_TIMEOUT_S = 30
REQUEST_TIMEOUT_S = 300
# kind -> (body, expected "param" of vLLM's error body); body is bytes (sent as is) or a dict.
MALFORMED = {
    "bad_json": (b'{"model": "smollm2-135m-instruct", "messages": [', None),
    "wrong_type": ({"temperature": "hot"}, "body.temperature"),
    "prompt_too_long": (
        {"messages": [{"role": "user", "content": "hello " * (MAX_MODEL_LEN + 50)}]},
        "input_tokens",
    ),
    "negative_max_tokens": ({"max_tokens": -5}, "max_tokens"),
}


def chat_body(question: str, max_tokens: int, **extra) -> dict:
    """A greedy streaming chat request that also returns the generated token ids."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "return_token_ids": True,
        **extra,
    }


def malformed_body(kind: str) -> bytes:
    body, _ = MALFORMED[kind]
    if isinstance(body, bytes):
        return body
    return json.dumps({**chat_body("Hi", 8), **body}).encode()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the /metrics samples called `name` whose labels include `labels`."""
    values = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
    assert values, f"{name} {labels} not in /metrics"
    return sum(values)


async def stream(
    client: httpx.AsyncClient,
    base: str,
    body: dict | bytes,
    cancel_after: int | None = None,
    started: asyncio.Event | None = None,
) -> dict:
    """POST one chat request; collect the streamed token ids and the finish reason.

    With `cancel_after`, close the stream after that many chunks (the client goes away).
    `started`, if given, is set at the first chunk (the request is running on the server).
    A non-200 answer is returned as {"status", "body"} (the parsed error body).
    """
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    tokens, finish, chunks = [], None, 0
    async with client.stream(
        "POST",
        base + "/v1/chat/completions",
        content=content,
        headers={"Content-Type": "application/json"},
    ) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "body": json.loads(await response.aread())}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                tokens += choice.get("token_ids") or []
                finish = choice.get("finish_reason") or finish
            chunks += 1
            if started is not None:
                started.set()
            if cancel_after is not None and chunks >= cancel_after:
                break
    return {"status": 200, "tokens": tokens, "finish": finish, "chunks": chunks}


async def stream_all(base: str, bodies: list[dict]) -> list[dict]:
    """All `bodies` as concurrent streams; their results in order."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        return await asyncio.gather(*(stream(client, base, body) for body in bodies))


class HealthWatch(threading.Thread):
    """GET /health every half second from a thread of its own until `done` is set.

    `polls`: (status code, or the error, and seconds the answer took) per GET. Blocking
    sockets in a separate thread, not a task on the load's event loop: a timeout measured
    on that loop would also count the time the loop spent on the 64 streams it serves,
    and this measures only the server.
    """

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.url, self.done, self.polls = base + "/health", threading.Event(), []

    def run(self) -> None:
        while not self.done.wait(0.5):
            start = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=HEALTH_TIMEOUT_S) as response:
                    outcome = response.status
            except urllib.error.HTTPError as err:
                outcome = err.code
            except OSError as err:
                outcome = repr(err)
            self.polls.append((outcome, round(time.monotonic() - start, 3)))


class CancelledStreams(threading.Thread):
    """The streams the client closes after CANCEL_AFTER_CHUNKS chunks, on a loop of their own.

    A client of their own, so that closing them never waits behind the main loop's 64
    other streams: a close that came late (the requests already decoded to their end) would
    not test aborts. `results` holds stream's dicts plus "closed_s", the seconds from
    `start` until the client closed the stream.
    """

    def __init__(self, base: str, bodies: list[dict]) -> None:
        super().__init__(daemon=True)
        self.base, self.bodies, self.results = base, bodies, []
        self.start_s = time.monotonic()

    async def _one(self, client: httpx.AsyncClient, body: dict) -> dict:
        result = await stream(client, self.base, body, CANCEL_AFTER_CHUNKS)
        return {**result, "closed_s": round(time.monotonic() - self.start_s, 2)}

    async def _all(self) -> list[dict]:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
            return await asyncio.gather(*(self._one(client, body) for body in self.bodies))

    def run(self) -> None:
        self.results = asyncio.run(self._all())


async def run_load(base: str, valid: list[dict], cancelled: list[dict]) -> dict:
    """Everything at once: valid, cancelled and malformed requests, plus /health polls."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    health, cancelling = HealthWatch(base), CancelledStreams(base, cancelled)
    health.start()
    cancelling.start()
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        kinds = [kind for kind in MALFORMED for _ in range(2)]
        results = await asyncio.gather(
            *(stream(client, base, body) for body in valid),
            *(stream(client, base, malformed_body(kind)) for kind in kinds),
        )
    cancelling.join()
    health.done.set()
    health.join()
    n = len(valid)
    return {
        "valid": results[:n],
        "cancelled": cancelling.results,
        "malformed": list(zip(kinds, results[n:], strict=True)),
        "health": health.polls,
    }


def wait_until_idle(base: str, idle_usage: float) -> tuple[str, float]:
    """Poll /metrics until no request runs or waits and the KV usage is back at idle.

    Returns (the last /metrics text, seconds waited); fails after IDLE_TIMEOUT_S.
    """
    start = time.monotonic()
    while True:
        text = http_get(base + "/metrics")
        busy = metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
        usage = metric(text, "vllm:kv_cache_usage_perc")
        if busy == 0 and usage == idle_usage:
            return text, time.monotonic() - start
        if time.monotonic() - start > IDLE_TIMEOUT_S:
            pytest.fail(
                f"not idle {IDLE_TIMEOUT_S} s after the load: {busy} requests, "
                f"KV usage {usage} (idle {idle_usage})"
            )
        time.sleep(0.5)
