"""SLIs as users feel them, through the public API under uvicorn on real sockets:
a scripted upstream, an ordinary FastAPI relay instrumented with ``instrument_app`` and
serving ``/metrics``, and a real httpx client that reads the stream, times it on its own
clock, and gives up the way clients do (a read timeout that closes the connection).

Every reading is taken from the gateway's scraped ``/metrics`` (the Prometheus text a
scraper reads) and checked against what the client saw: the gaps it measured, the events
it received, whether it got an answer at all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stagelens import instrument_app, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import relayed

pytestmark = pytest.mark.anyio

AV, TT, IT, GP = sc.SLI_AVAILABILITY, sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT
USAGE = {"prompt_tokens": 2000, "completion_tokens": 3}
"""2000 input tokens: the ``8192`` class by default (TTFT threshold 1 s)."""
SIZE = "8192"
ASK = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}]}
"""The request body; the upstream's ``x_*`` knobs are added to it."""


def _event(text: str) -> bytes:
    chunk = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()


def _scripted() -> Starlette:
    """Streams ``x_gaps`` (seconds to wait before each content event), then the usage
    event and ``[DONE]``; with ``x_die`` it drops the connection after the events instead.
    Not streamed: answers after ``x_wait`` seconds."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            await asyncio.sleep(float(body.get("x_wait", 0)))
            message = {"role": "assistant", "content": "hi"}
            return JSONResponse({"id": "c1", "choices": [{"message": message}], "usage": USAGE})

        async def events() -> AsyncIterator[bytes]:
            for i, wait in enumerate(body.get("x_gaps", [])):
                if wait:
                    await asyncio.sleep(wait)
                yield _event(f"t{i} ")
            if body.get("x_die"):
                raise RuntimeError("engine died")
            chunk = {"id": "c1", "choices": [], "usage": USAGE}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


class _Served:
    """An ASGI app served by uvicorn on a loopback port, in a thread."""

    def __init__(self, app: Any, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> _Served:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def upstream_url(port_factory: Any) -> Iterator[str]:
    with _Served(_scripted(), port_factory()) as served:
        yield served.url


def _relay(cap: TelemetryCapture, upstream: str) -> FastAPI:
    """An ordinary relay: streamed answers passed on as they come, others whole."""
    client = httpx.AsyncClient(base_url=upstream, timeout=30)
    instrument_httpx_client(client, telemetry=cap.telemetry)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream"):
            answer = await client.post("/v1/chat/completions", json=body)
            return JSONResponse(answer.json(), status_code=answer.status_code)
        answer = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )

        return relayed(answer)

    instrument_app(app, telemetry=cap.telemetry, metrics_path="/metrics")
    return app


class _Gateway:
    """The relay served by uvicorn, its settings given, scraped over HTTP."""

    def __init__(self, upstream: str, port: int, **settings: Any) -> None:
        self._capture = capture_telemetry(models=("tiny",), **settings)
        self.cap = self._capture.__enter__()
        self._served = _Served(_relay(self.cap, upstream), port).__enter__()
        self.url = self._served.url

    def close(self) -> None:
        self._served.__exit__()
        self._capture.__exit__(None, None, None)

    async def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of ``/metrics``, as (name, sorted labels) -> value."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            text = (await client.get("/metrics")).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    async def settled(self, requests: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The scrape once ``requests`` requests have ended at the gateway (a client that
        gave up does not wait for the gateway to finish)."""
        deadline = time.monotonic() + 10
        while True:
            samples = await self.scrape()
            done = sum(v for (name, _), v in samples.items() if name == sc.REQUESTS)
            if done >= requests or time.monotonic() > deadline:
                return samples
            await asyncio.sleep(0.05)


@pytest.fixture
def gateway(upstream_url: str, port_factory: Any) -> Iterator[Any]:
    """``gateway(**settings)``: a served, instrumented relay (closed after the test)."""
    made: list[_Gateway] = []

    def make(**settings: Any) -> _Gateway:
        gw = _Gateway(upstream_url, port_factory(), **settings)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.close()


def _get(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _sli(samples: dict[Any, float], size: str = SIZE) -> dict[str, tuple[float, float]]:
    """sli -> (requests counted, bad) of model ``tiny`` and prompt-size class ``size``."""
    found: dict[str, tuple[float, float]] = {}
    for sli in (AV, TT, IT, GP):
        counted = _get(samples, sc.SLI_REQUESTS, model="tiny", sli=sli, prompt_size=size)
        bad = _get(samples, sc.SLI_ERRORS, model="tiny", sli=sli, prompt_size=size)
        if counted is not None:
            found[sli] = (counted, bad or 0.0)
    return found


async def _stream(url: str, body: dict[str, Any]) -> tuple[int, list[float]]:
    """POST a streamed completion; the status and the client's own arrival time of each
    content event (``perf_counter``, when its line was read)."""
    seen: list[float] = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json={**ASK, "stream": True, **body}) as r,
    ):
        try:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    seen.append(time.perf_counter())
        except httpx.RemoteProtocolError:
            pass  # the gateway closed the connection: the stream was cut
        return r.status_code, seen


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


class TestStalls:
    """ITL is judged per request by its worst gap."""

    async def test_a_smooth_stream_is_good_for_every_sli(self, gateway) -> None:
        """Twelve events 20 ms apart: counted once by each SLI, bad for none; the client's
        own worst gap is far under the stall threshold."""
        gw = gateway()
        status, seen = await _stream(gw.url, {"x_gaps": [0] + [0.02] * 11})
        assert status == 200
        assert len(seen) == 12
        assert max(_gaps(seen)) < 0.5
        samples = await gw.settled(1)
        assert _sli(samples) == {AV: (1, 0), TT: (1, 0), IT: (1, 0), GP: (1, 0)}
        assert _get(samples, sc.REQUESTS, model="tiny", code="200") == 1
        count = _get(samples, f"{sc.INTER_TOKEN_LATENCY}_count", model="tiny")
        assert count == 11

    async def test_one_freeze_among_quick_tokens_is_a_stall(self, gateway) -> None:
        """Twenty events 10 ms apart and one 0.6 s freeze (stall threshold 0.3 s): the mean
        gap the client saw is under the 100 ms ITL threshold (which judged it good), its
        worst gap is a stall: bad for ITL and goodput, good for TTFT and availability."""
        gw = gateway(itl_stall_threshold_seconds=0.3)
        gaps = [0] + [0.01] * 10 + [0.6] + [0.01] * 9
        status, seen = await _stream(gw.url, {"x_gaps": gaps})
        assert status == 200
        client_gaps = _gaps(seen)
        assert len(seen) == 21
        assert sum(client_gaps) / len(client_gaps) < 0.1
        assert max(client_gaps) > 0.3
        samples = await gw.settled(1)
        assert _sli(samples) == {AV: (1, 0), TT: (1, 0), IT: (1, 1), GP: (1, 1)}
        # The histogram holds the stall the client saw: one gap above 0.5 s.
        above = _get(samples, f"{sc.INTER_TOKEN_LATENCY}_count", model="tiny")
        under = _get(samples, f"{sc.INTER_TOKEN_LATENCY}_bucket", model="tiny", le="0.5")
        assert (above, under) == (20, 19)


class TestOneTokenCut:
    """A stream cut after exactly one output event is bad for goodput."""

    async def test_the_engine_dying_after_one_token(self, gateway) -> None:
        """The upstream sends one event and dies: the client received one token and a
        200; bad for availability and goodput, good for TTFT (the token came fast); ITL has
        no gap to judge and does not count it."""
        gw = gateway()
        status, seen = await _stream(gw.url, {"x_gaps": [0], "x_die": True})
        assert (status, len(seen)) == (200, 1)
        samples = await gw.settled(1)
        # The estimate from the prompt (no usage event came): a small prompt.
        assert _sli(samples, "1024") == {AV: (1, 1), TT: (1, 0), GP: (1, 1)}
        assert _get(samples, sc.REQUESTS, model="tiny", code="200") == 1

    async def test_the_client_leaving_after_one_token(self, gateway) -> None:
        """The client reads one token and closes the connection while the next is 1 s
        away: recorded 499; bad for goodput; out of availability (it left early)."""
        gw = gateway()
        got: list[str] = []
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=30) as client,
            client.stream(
                "POST",
                "/v1/chat/completions",
                json={**ASK, "stream": True, "x_gaps": [0, 1.0, 0]},
            ) as r,
        ):
            async for line in r.aiter_lines():
                if '"content"' in line:
                    got.append(line)
                    break  # leaving: the stream is closed with the client
        assert (r.status_code, len(got)) == (200, 1)
        samples = await gw.settled(1)
        assert _get(samples, sc.REQUESTS, model="tiny", code="499") == 1
        assert _get(samples, sc.REQUESTS, model="tiny", code="200") is None
        assert _sli(samples, "1024") == {TT: (1, 0), GP: (1, 1)}


class TestClientGaveUp:
    """A client that times out and closes: 499, never the 200 nobody received."""

    async def test_not_streamed_three_clients_time_out_on_a_slow_answer(self, gateway) -> None:
        """The issue's case: three clients time out at 0.4 s on answers that take 2 s
        (uvicorn drops an answer sent after the client left). Each is recorded 499, none
        200; with the timeout at 0.6 s, each is bad for availability."""
        gw = gateway(client_left_bad_after_seconds=0.6)

        async def one() -> float:
            started = time.perf_counter()
            async with httpx.AsyncClient(base_url=gw.url, timeout=0.4) as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.post("/v1/chat/completions", json={**ASK, "x_wait": 2.0})
            return time.perf_counter() - started

        waited = await asyncio.gather(one(), one(), one())
        assert all(0.35 < w < 2.0 for w in waited), waited  # gone before the answer
        samples = await gw.settled(3)
        assert _get(samples, sc.REQUESTS, model="tiny", code="499") == 3
        assert _get(samples, sc.REQUESTS, model="tiny", code="200") is None
        assert _sli(samples) == {AV: (3, 3)}
        # The gateway kept working after each client left: its durations are longer.
        total = _get(samples, f"{sc.REQUEST_DURATION}_sum", model="tiny", code="499")
        assert total is not None
        assert total > sum(waited)
        root = [s for s in gw.cap.spans() if s.name == "POST /v1/chat/completions"]
        assert len(root) == 3
        for span in root:
            assert span.attributes[sc.ATTR_CLIENT_DISCONNECTED] is True
            assert span.attributes["http.response.status_code"] == 200  # what the app sent

    async def test_not_streamed_a_client_leaving_early_is_out_of_availability(
        self, gateway
    ) -> None:
        """Under the default 10 s, a client gone after 0.4 s is recorded 499 and left out
        of availability; an answered request next to it is a good 200."""
        gw = gateway()
        async with httpx.AsyncClient(base_url=gw.url, timeout=0.4) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/chat/completions", json={**ASK, "x_wait": 0.8})
        async with httpx.AsyncClient(base_url=gw.url, timeout=5) as client:
            r = await client.post("/v1/chat/completions", json={**ASK, "x_wait": 0})
        assert r.status_code == 200
        samples = await gw.settled(2)
        assert _get(samples, sc.REQUESTS, model="tiny", code="499") == 1
        assert _get(samples, sc.REQUESTS, model="tiny", code="200") == 1
        assert _sli(samples) == {AV: (1, 0)}

    async def test_streamed_a_client_timing_out_before_the_first_token(self, gateway) -> None:
        """Streamed: the first token is 1.5 s away, the client times out at 0.7 s after
        the 200 headers. Recorded 499; bad for TTFT and goodput (it waited past the
        threshold), and for availability with the timeout at 0.5 s. Nothing was received
        to bill or estimate from: its prompt size is ``unknown``."""
        gw = gateway(client_left_bad_after_seconds=0.5, ttft_slo_thresholds_seconds={})
        started = time.perf_counter()
        status = None
        async with httpx.AsyncClient(base_url=gw.url, timeout=0.7) as client:
            try:
                async with client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={**ASK, "stream": True, "x_gaps": [1.5, 0]},
                ) as r:
                    status = r.status_code
                    async for _ in r.aiter_lines():
                        pass
            except httpx.ReadTimeout:
                status = status or -1
        waited = time.perf_counter() - started
        assert status == 200  # the headers came, then the client timed out
        samples = await gw.settled(1)
        assert _get(samples, sc.REQUESTS, model="tiny", code="499") == 1
        assert _get(samples, sc.REQUESTS, model="tiny", code="200") is None
        unknown = sc.PROMPT_SIZE_UNKNOWN
        assert _sli(samples, unknown) == {AV: (1, 1), TT: (1, 1), GP: (1, 1)}
        duration = _get(samples, f"{sc.REQUEST_DURATION}_sum", model="tiny", code="499")
        assert duration is not None
        # Noticed as it left (after its 0.7 s read timeout, by the client's clock no later
        # than ``waited``), not when the first token would have come (1.5 s).
        assert 0.6 < duration < min(waited + 0.1, 1.5)


class TestLookingForTheDeparture:
    """The look at ``receive`` before an answer is sent, with servers' own receives: it
    finds a departed client, loses no message and never waits."""

    @staticmethod
    def _app(received: list[dict[str, Any]], *, wait: float, read_body: bool = True) -> Any:
        """Reads its body (or not), works ``wait`` s, answers 200, then receives once more
        (what it gets is kept in ``received``)."""

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if read_body:
                received.append(await receive())
            await asyncio.sleep(wait)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            received.append(await asyncio.wait_for(receive(), timeout=1))

        return app

    @staticmethod
    def _scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "headers": list(headers),
            "scheme": "http",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000),
        }

    async def test_a_queued_departure_is_found_and_still_given_to_the_app(self) -> None:
        """A server whose receive is a queue (as hypercorn's): the client leaves while the
        app works; the look takes ``http.disconnect`` from the queue, the request is 499,
        and the app's own next receive still gets that message."""
        from stagelens.instrumentation.asgi import StageLensMiddleware

        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b"{}", "more_body": False})
        received: list[dict[str, Any]] = []
        with capture_telemetry(models=("unknown",)) as cap:
            app = StageLensMiddleware(self._app(received, wait=0.1), telemetry=cap.telemetry)
            asyncio.get_running_loop().call_later(
                0.05, queue.put_nowait, {"type": "http.disconnect"}
            )
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            await app(self._scope(), queue.get, send)
            assert [m["type"] for m in received] == ["http.request", "http.disconnect"]
            assert cap.value(sc.REQUESTS, model="unknown", code="499") == 1
            assert cap.value(sc.REQUESTS, model="unknown", code="200") is None
        assert len(sent) == 2  # the answer was still passed on: the server decides

    async def test_a_client_still_there_is_not_waited_for(self) -> None:
        """The client stays: the look does not wait (the answer goes out at once), the
        request is a 200, and a message arriving later reaches the app's own receive."""
        from stagelens.instrumentation.asgi import StageLensMiddleware

        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b"{}", "more_body": False})
        received: list[dict[str, Any]] = []
        with capture_telemetry(models=("unknown",)) as cap:
            app = StageLensMiddleware(self._app(received, wait=0), telemetry=cap.telemetry)
            asyncio.get_running_loop().call_later(
                0.2, queue.put_nowait, {"type": "http.disconnect"}
            )
            started = time.perf_counter()
            answered: list[float] = []

            async def send(message: dict[str, Any]) -> None:
                answered.append(time.perf_counter() - started)

            await app(self._scope(), queue.get, send)
            assert answered[-1] < 0.15  # sent before the later message arrived
            assert [m["type"] for m in received] == ["http.request", "http.disconnect"]
            assert cap.value(sc.REQUESTS, model="unknown", code="200") == 1

    async def test_a_client_waiting_to_send_its_body_is_not_asked_for_it(self) -> None:
        """``Expect: 100-continue`` and an app that answers without reading the body: the
        look does not call receive (a server would answer "100 Continue" to it)."""
        from stagelens.instrumentation.asgi import StageLensMiddleware

        calls: list[str] = []

        async def receive() -> dict[str, Any]:
            calls.append("receive")
            return {"type": "http.disconnect"}

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        async def send(message: dict[str, Any]) -> None:
            pass

        with capture_telemetry() as cap:
            wrapped = StageLensMiddleware(app, telemetry=cap.telemetry)
            await wrapped(self._scope((b"expect", b"100-continue")), receive, send)
            assert calls == []
            assert cap.value(sc.REQUESTS, model="unknown", code="401") == 1
            await wrapped(self._scope(), receive, send)  # without it, the look is made
            assert calls == ["receive"]
