"""The readings' meanings, each against an ordinary proxy instrumented with stagelens and a
scripted upstream on a real socket: TTFT at the first output-bearing event, ITL per SSE
event and per choice, a failure after the headers counted as one, billing gaps filled and
said, the model label kept from made-up names, and no TTFT for requests that are not
completions. Each failed on the code before these readings were fixed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.trace import StatusCode
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagelens import current_request, instrument_app, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import event, relayed

pytestmark = pytest.mark.anyio

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
UNKNOWN = sc.PROMPT_SIZE_UNKNOWN


def content(text: str, index: int = 0, **extra: Any) -> dict[str, Any]:
    return {"id": "c1", "choices": [{"index": index, "delta": {"content": text}, **extra}]}


def _proxy(cap: TelemetryCapture, url: str, *, calls: int = 1) -> FastAPI:
    """An ordinary relay (the app never looks at the events), ``calls`` upstream calls in
    a row per request, and a route that is no completion."""
    client = httpx.AsyncClient(base_url=url, timeout=10)
    instrument_httpx_client(client, telemetry=cap.telemetry)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        for _ in range(calls - 1):
            await client.post("/v1/chat/completions", json={**body, "stream": False})
        if not body.get("stream"):
            answer = await client.post("/v1/chat/completions", json=body)
            return JSONResponse(answer.json(), status_code=answer.status_code)
        upstream = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )

        return relayed(upstream)  # 200, whatever came

    @app.get("/v1/usage")
    async def usage() -> dict[str, int]:
        return {"requests": 1}

    instrument_app(app, telemetry=cap.telemetry)
    return app


async def _post(app: FastAPI, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.post("/v1/chat/completions", json={"model": "tiny", **body})


def _ttft(cap: TelemetryCapture) -> float:
    total = cap.value(sc.TIME_TO_FIRST_TOKEN + "_sum", model="tiny", prompt_size="1024")
    assert cap.value(sc.TIME_TO_FIRST_TOKEN + "_count", model="tiny", prompt_size="1024") == 1
    assert total is not None
    return total


def _itl(cap: TelemetryCapture) -> tuple[float, float]:
    count = cap.value(sc.INTER_TOKEN_LATENCY + "_count", model="tiny") or 0.0
    return count, cap.value(sc.INTER_TOKEN_LATENCY + "_sum", model="tiny") or 0.0


class TestFirstToken:
    """TTFT is taken at the first body carrying generated output."""

    async def test_role_chunk_comment_and_error_free_events_are_no_first_token(
        self, cap, scripted_url
    ) -> None:
        """A role-only chunk and a keep-alive come first; the first content 80 ms later is
        the first token, and the wait is no inter-token gap."""
        script = [[0, event(ROLE)], [0, ": keep-alive\n\n"], [0.08, event(content("a"))]]
        script += [[0.01, event(content("b"))], [0.01, event(content("c", finish_reason="length"))]]
        r = await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script})
        assert r.status_code == 200
        assert _ttft(cap) >= 0.08
        count, total = _itl(cap)
        assert count == 2  # three content events
        assert total < 0.08

    async def test_a_tool_call_delta_is_a_first_token(self, cap, scripted_url) -> None:
        """The first tool-call delta (``content: null``) is output, 50 ms after the role."""
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
        tool = {"choices": [{"index": 0, "delta": {"content": None, "tool_calls": [call]}}]}
        script = [[0, event(ROLE)], [0.05, event(tool)]]
        await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script})
        assert _ttft(cap) >= 0.05

    async def test_requests_that_are_no_completion_record_no_ttft(self, cap, scripted_url) -> None:
        """``GET /v1/usage`` answers 200 with a body, and records no TTFT sample."""
        transport = httpx.ASGITransport(app=_proxy(cap, scripted_url))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            assert (await client.get("/v1/usage")).status_code == 200
        samples = [
            s for m in cap.registry.collect() if m.name == sc.TIME_TO_FIRST_TOKEN for s in m.samples
        ]
        assert not [s for s in samples if s.name.endswith("_count") and s.value]


class TestInterTokenLatency:
    """ITL is per SSE event and per choice."""

    async def test_events_coalesced_in_one_read_are_each_a_token(self, cap, scripted_url) -> None:
        """Four events in one read and one more later: four gaps, three of them 0."""
        together = "".join(event(content(t)) for t in "abcd")
        script = [[0, together], [0.03, event(content("e", finish_reason="stop"))]]
        await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script})
        count, total = _itl(cap)
        assert count == 4
        # The 30 ms gap as the app sent it: the first read can reach the app a little later
        # than the second under load, so a few ms of it may be gone.
        assert 0.02 <= total < 0.1

    async def test_each_choice_has_its_own_gaps(self, cap, scripted_url) -> None:
        """n=2, events interleaved 20 ms apart: each choice's gaps are 40 ms, never the
        ~0 between one choice's event and the other's."""
        script = [[0, event(content("a", 0))], [0, event(content("b", 1))]]
        for _ in range(2):
            script += [[0.04, event(content("x", 0))], [0, event(content("y", 1))]]
        await _post(_proxy(cap, scripted_url), {"stream": True, "n": 2, "x_script": script})
        count, total = _itl(cap)
        assert count == 4  # 3 events per choice: 2 gaps each
        assert total / count >= 0.03  # per-read gaps would average ~0.02


class TestFailureAfterHeaders:
    """A stream that fails after its 200 is a failure wherever failures are counted."""

    @pytest.mark.parametrize("how", ["backend-dies", "error-event"])
    async def test_the_failure_is_counted_as_one(self, cap, scripted_url, how: str) -> None:
        """Root and inference spans in error with error.type, a rejection at inference
        under code 200, the availability SLI bad, tokens billed as estimated."""
        script = [[0, event(ROLE)], [0, event(content("a"))], [0, event(content("b"))]]
        knobs: dict[str, Any] = {"stream": True, "x_script": script}
        if how == "backend-dies":
            knobs["x_die"] = True
        else:
            script.append([0, event({"error": {"message": "engine gone", "type": "Internal"}})])
            knobs["x_no_usage"] = True
        r = await _post(_proxy(cap, scripted_url), knobs)
        assert r.status_code == 200
        root = cap.span("POST /v1/chat/completions")
        inference = cap.span("chat tiny")
        expected = (
            "RemoteProtocolError" if how == "backend-dies" else sc.ERROR_TYPE_UPSTREAM_ERROR_EVENT
        )
        for span in (root, inference):
            assert span.status.status_code is StatusCode.ERROR
            assert span.attributes[sc.ERROR_TYPE] == expected
        assert root.attributes[sc.ATTR_REJECTED_BY] == "inference"
        assert cap.value(sc.REQUESTS, model="tiny", code="200") == 1
        assert cap.value(sc.REJECTIONS, stage="inference", model="tiny", code="200") == 1
        assert (
            cap.value(sc.SLI_ERRORS, model="tiny", prompt_size="1024", sli=sc.SLI_AVAILABILITY) == 1
        )
        assert cap.value(sc.UNMETERED_REQUESTS, model="tiny", billing=sc.BILLING_ESTIMATED) == 1
        assert inference.attributes[sc.ATTR_USAGE_ESTIMATED] is True
        assert inference.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2

    async def test_a_fast_first_token_keeps_the_ttft_objective(self, cap, scripted_url) -> None:
        """Dying after two fast tokens: bad for availability and ITL (failed after its first
        token), good for TTFT, whose objective the first token met (documented)."""
        script = [[0, event(ROLE)], [0, event(content("a"))], [0, event(content("b"))]]
        await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script, "x_die": True})
        bad = {
            sli: cap.value(sc.SLI_ERRORS, model="tiny", prompt_size="1024", sli=sli)
            for sli in (sc.SLI_AVAILABILITY, sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT)
        }
        assert bad == {
            sc.SLI_AVAILABILITY: 1,
            sc.SLI_TTFT: 0,
            sc.SLI_ITL: 1,
            sc.SLI_GOODPUT: 1,
        }

    async def test_dying_before_the_first_token_is_bad_for_ttft(self, cap, scripted_url) -> None:
        """Dying after the role-only chunk: code 200 and no TTFT sample, but bad for
        availability and for TTFT (no first token because the request failed)."""
        script = [[0, event(ROLE)]]
        r = await _post(
            _proxy(cap, scripted_url), {"stream": True, "x_script": script, "x_die": True}
        )
        assert r.status_code == 200
        assert cap.value(sc.REQUESTS, model="tiny", code="200") == 1
        assert not cap.value(sc.TIME_TO_FIRST_TOKEN + "_count", model="tiny", prompt_size=UNKNOWN)
        for sli in (sc.SLI_AVAILABILITY, sc.SLI_TTFT, sc.SLI_GOODPUT):
            # No usage, no prompt text to estimate from: the class is not known.
            assert cap.value(sc.SLI_REQUESTS, model="tiny", prompt_size=UNKNOWN, sli=sli) == 1, sli
            assert cap.value(sc.SLI_ERRORS, model="tiny", prompt_size=UNKNOWN, sli=sli) == 1, sli


class TestStreamNamedByTheApp:
    """A stream the app refuses before any upstream call is in the TTFT SLI only when the
    app names it a stream (``current_request().set_streamed()``)."""

    @staticmethod
    def _refusing(cap: TelemetryCapture, *, name_it: bool) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await request.json()
            state = current_request()
            assert state is not None
            state.set_model(body["model"])
            if name_it and body.get("stream"):
                state.set_streamed()
            return JSONResponse({"error": {"message": "no capacity"}}, status_code=503)

        instrument_app(app, telemetry=cap.telemetry)
        return app

    @pytest.mark.parametrize("name_it", [True, False])
    async def test_a_refused_stream_counts_for_ttft_when_named(self, name_it) -> None:
        """503 before any call: bad for availability; bad for TTFT when named a stream,
        not counted by TTFT otherwise (nothing says it asked for one)."""
        with capture_telemetry(models=("tiny",)) as cap:
            r = await _post(self._refusing(cap, name_it=name_it), {"stream": True})
            self._check(cap, r, name_it)

    @staticmethod
    def _check(cap: TelemetryCapture, r: httpx.Response, name_it: bool) -> None:
        assert r.status_code == 503
        # Refused before any call: its input tokens are not known.
        assert (
            cap.value(sc.SLI_ERRORS, model="tiny", prompt_size=UNKNOWN, sli=sc.SLI_AVAILABILITY)
            == 1
        )
        counted = cap.value(sc.SLI_REQUESTS, model="tiny", prompt_size=UNKNOWN, sli=sc.SLI_TTFT)
        assert counted == (1 if name_it else None)
        if name_it:
            assert cap.value(sc.SLI_ERRORS, model="tiny", prompt_size=UNKNOWN, sli=sc.SLI_TTFT) == 1


class TestTokens:
    """Billing on the library path."""

    async def test_a_stream_without_usage_is_billed_from_the_usage_stagelens_asked(
        self, cap, scripted_url
    ) -> None:
        """The app asked for no usage: stagelens asks, bills it, and the app never sees it."""
        script = [[0, event(content("a", finish_reason="stop"))]]
        r = await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script})
        assert '"usage"' not in r.text
        assert cap.value(sc.TOKENS, model="tiny", tenant="other", type="input") == 7
        assert cap.value(sc.TOKENS, model="tiny", tenant="other", type="output") == 3
        assert cap.value(sc.UNMETERED_REQUESTS, model="tiny", billing=sc.BILLING_ESTIMATED) is None

    async def test_usage_of_several_upstream_calls_is_summed(self, cap, scripted_url) -> None:
        """Two calls in one request (a whole answer, then a stream): both are billed."""
        script = [[0, event(content("a", finish_reason="stop"))]]
        app = _proxy(cap, scripted_url, calls=2)
        await _post(app, {"stream": True, "x_script": script})
        assert cap.value(sc.TOKENS, model="tiny", tenant="other", type="input") == 14
        assert cap.value(sc.TOKENS, model="tiny", tenant="other", type="output") == 6


class TestModelLabel:
    """A model name becomes a label value only when its upstream call was answered."""

    async def test_an_app_answering_200_for_a_refused_model_does_not_make_it_served(
        self, cap, scripted_url
    ) -> None:
        """The relay answers 200 around the upstream's 404: the name stays ``other``,
        and the real model keeps its own value afterwards."""
        app = _proxy(cap, scripted_url)
        for i in range(3):
            r = await _post(app, {"model": f"made-up-{i}", "stream": True, "x_status": 404})
            assert r.status_code == 200
        await _post(app, {"stream": True, "x_script": [[0, event(content("a"))]]})
        models = {
            s.labels["model"]
            for m in cap.registry.collect()
            for s in m.samples
            if "model" in s.labels
        }
        assert not [m for m in models if m.startswith("made-up")]
        assert "tiny" in models


class TestServiceLevelIndicators:
    """The SLI counters and the upstream's share of TTFT, as the alert rules read them."""

    async def test_a_good_stream_counts_good_for_every_sli(self, cap, scripted_url) -> None:
        """A streamed answer well within the objectives: counted by all four SLIs, bad for
        none; the upstream's time to its first output event is recorded too."""
        script = [[0, event(ROLE)], [0.02, event(content("a"))], [0.01, event(content("b"))]]
        await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script})
        for sli in (sc.SLI_AVAILABILITY, sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT):
            assert cap.value(sc.SLI_REQUESTS, model="tiny", prompt_size="1024", sli=sli) == 1, sli
            assert cap.value(sc.SLI_ERRORS, model="tiny", prompt_size="1024", sli=sli) == 0, sli
        assert cap.value(sc.UPSTREAM_TTFT + "_count", model="tiny", prompt_size="1024") == 1
        upstream = cap.value(sc.UPSTREAM_TTFT + "_sum", model="tiny", prompt_size="1024")
        assert upstream is not None
        assert 0.02 <= upstream <= _ttft(cap)

    async def test_one_stall_among_quick_tokens_is_bad_for_itl_and_goodput(
        self, scripted_url
    ) -> None:
        """Ten tokens 5 ms apart, then one 250 ms freeze (stall threshold 200 ms): the mean
        gap (~27 ms) is well under the 100 ms symptom threshold, the worst gap is a stall:
        bad ITL and goodput, good TTFT."""
        script = [[0, event(content("a"))]]
        script += [[0.005, event(content("b"))] for _ in range(10)]
        script += [[0.25, event(content("c"))]]
        with capture_telemetry(models=("tiny",), itl_stall_threshold_seconds=0.2) as cap:
            await _post(_proxy(cap, scripted_url), {"stream": True, "x_script": script})
            gaps = cap.value(sc.INTER_TOKEN_LATENCY + "_sum", model="tiny")
            count = cap.value(sc.INTER_TOKEN_LATENCY + "_count", model="tiny")
            assert count == 11
            assert gaps is not None
            assert gaps / count < 0.1  # the mean, which judged it good before
            errors = {
                sli: cap.value(sc.SLI_ERRORS, model="tiny", prompt_size="1024", sli=sli)
                for sli in (sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT)
            }
        assert errors == {sc.SLI_TTFT: 0, sc.SLI_ITL: 1, sc.SLI_GOODPUT: 1}
