"""Token streaming from live workers: the answering step's text reaches the client as it is made.

The workers are :class:`~rl_conductor.workers.live.testing.ScriptedServer` instances speaking the
vendors' streaming wire formats (OpenAI ``chat.completion.chunk`` events with the ``usage`` chunk
and ``[DONE]``; Anthropic's ``message_start`` ... ``message_stop`` events; Gemini's
``streamGenerateContent`` chunks), including a mid-stream error event. The end-to-end tests run
the real predictor process and read it with the official ``openai`` SDK. That the first token
arrives before the worker's last one is shown with a handshake, not a clock: the worker stops
after its first piece until the test, holding that piece, releases it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import yaml

from _lazy import lazy
from predictor import Predictor, predictor
from rl_conductor.workers.base import STREAM_SINK, TokenSink, WorkerInfo
from rl_conductor.workers.live.base import LiveWorker, StreamInterruptedError
from rl_conductor.workers.live.resilience import RetryPolicy
from rl_conductor.workers.live.spend import SpendGuard, worst_case_cost
from rl_conductor.workers.live.testing import (
    Reply,
    ScriptedServer,
    error,
    scripted_server,
    streamed,
    success_body,
)

PIECES = ["The", " answer", " is", " 42."]
MESSAGES = [{"role": "user", "content": "What is 6*7?"}]
INFO = WorkerInfo(name="w", price_in=1.0, price_out=2.0, hosting="external")
# vendor SDKs are imported by the first test that uses them (tests/_lazy.py): seconds of CPU each
openai = lazy("openai")
CLASSES = {  # vendor -> (module, class)
    "openai": ("rl_conductor.workers.live.openai_chat", "OpenAIChatWorker"),
    "anthropic": ("rl_conductor.workers.live.anthropic_messages", "AnthropicWorker"),
    "gemini": ("rl_conductor.workers.live.gemini", "GeminiWorker"),
}
VENDORS = list(CLASSES)


async def _no_wait(_: float) -> None:
    return None


def _worker(vendor: str, srv: ScriptedServer, spend: SpendGuard | None = None) -> LiveWorker:
    module, name = CLASSES[vendor]
    cls: type[LiveWorker] = getattr(lazy(module), name)
    return cls(
        info=INFO,
        model="m",
        base_url=srv.base_url,
        api_key="k",
        retry=RetryPolicy(attempts=3, initial_s=0.0, jitter_s=0.0),
        sleep=_no_wait,
        spend=spend,
    )


def _streaming_call(worker: LiveWorker) -> tuple[Any, list[str], list[str]]:
    """Call ``worker`` with a sink set, as the serving layer does for a request's answering step."""
    deltas: list[str] = []
    broken: list[str] = []

    async def go() -> Any:
        STREAM_SINK.set(TokenSink(deltas.append, broken.append))
        try:
            return await worker.complete(MESSAGES, max_tokens=50, temperature=0.0)
        except StreamInterruptedError as exc:
            return exc

    return asyncio.run(go()), deltas, broken


# -- the live clients -------------------------------------------------------------------------


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_live_worker_streams_its_text_and_bills_the_streamed_usage(vendor: str) -> None:
    with scripted_server(vendor, [streamed(vendor, PIECES, input_tokens=11, output_tokens=7)]) as srv:
        comp, deltas, broken = _streaming_call(_worker(vendor, srv))
        body, path = srv.requests[0].body, srv.requests[0].path
    assert deltas == PIECES and broken == []
    assert comp.text == "".join(PIECES) and comp.finish_reason == "stop"
    assert (comp.input_tokens, comp.output_tokens, comp.tokens_estimated) == (11, 7, False)
    assert comp.cost_usd == pytest.approx(INFO.cost(11, 7))
    if vendor == "gemini":
        assert ":streamGenerateContent" in path and "alt=sse" in path
    else:
        assert body["stream"] is True
    if vendor == "openai":
        assert body["stream_options"] == {"include_usage": True}


def test_a_stream_without_usage_is_charged_its_worst_case_marked_estimated() -> None:
    with scripted_server(
        "openai", [streamed("openai", PIECES, input_tokens=None, output_tokens=None)]
    ) as srv:
        comp, deltas, _ = _streaming_call(_worker("openai", srv))
    assert deltas == PIECES
    assert comp.tokens_estimated is True and comp.output_tokens == 50


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_failing_before_its_first_token_is_retried(vendor: str) -> None:
    script = [error(vendor, 503), streamed(vendor, ["x", " y"], error_after=0), streamed(vendor, PIECES)]
    with scripted_server(vendor, script) as srv:
        comp, deltas, broken = _streaming_call(_worker(vendor, srv))
        sent = len(srv.requests)
    assert sent == 3  # a 503, then an error event before any text: both retried
    assert deltas == PIECES and broken == [] and comp.text == "".join(PIECES)


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_breaking_after_its_first_token_is_reported_and_charged_not_retried(vendor: str) -> None:
    guard = SpendGuard(1.0)
    script = [streamed(vendor, PIECES, error_after=2), streamed(vendor, PIECES)]
    with scripted_server(vendor, script) as srv:
        worker = _worker(vendor, srv, guard)
        exc, deltas, broken = _streaming_call(worker)
        sent = len(srv.requests)
    assert isinstance(exc, StreamInterruptedError)
    assert sent == 1, "text was already passed on: a retry would repeat it"
    assert deltas == PIECES[:2]
    assert len(broken) == 1 and "broke after 2 chunks" in broken[0]
    # the vendor bills what it generated, which may be more than reached us: the worst case
    assert guard.spent_usd == pytest.approx(worst_case_cost(INFO, MESSAGES, 50))
    assert worker.breaker.state != "open" and worker.stats().failures == 1


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_ending_without_its_end_marker_after_text_is_broken_and_charged_its_worst_case(
    vendor: str,
) -> None:
    # the body just ends after two pieces: no finish_reason / [DONE], no message_delta /
    # message_stop, no finishReason; Anthropic's message_start holds a placeholder output count
    guard = SpendGuard(1.0)
    script = [
        streamed(vendor, PIECES, truncate_after=2, input_tokens=11, output_tokens=7),
        streamed(vendor, PIECES),
    ]
    with scripted_server(vendor, script) as srv:
        worker = _worker(vendor, srv, guard)
        exc, deltas, broken = _streaming_call(worker)
        sent = len(srv.requests)
    assert isinstance(exc, StreamInterruptedError), f"a cut stream came back as an answer: {exc!r}"
    assert sent == 1 and deltas == PIECES[:2]
    assert len(broken) == 1 and "end marker" in broken[0]
    assert guard.spent_usd == pytest.approx(worst_case_cost(INFO, MESSAGES, 50))


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_ending_without_its_end_marker_before_text_is_retried_and_charged(vendor: str) -> None:
    guard = SpendGuard(1.0)
    script = [
        streamed(vendor, PIECES, truncate_after=0),
        streamed(vendor, PIECES, input_tokens=11, output_tokens=7),
    ]
    with scripted_server(vendor, script) as srv:
        comp, deltas, broken = _streaming_call(_worker(vendor, srv, guard))
        sent = len(srv.requests)
    assert sent == 2 and deltas == PIECES and broken == []
    assert comp.text == "".join(PIECES) and comp.finish_reason == "stop"
    # the cut attempt was sent and may be billed: its worst case, on top of the answer's cost
    assert guard.spent_usd == pytest.approx(worst_case_cost(INFO, MESSAGES, 50) + INFO.cost(11, 7))


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_usage_without_candidates_token_count_is_charged_the_worst_case(stream: bool) -> None:
    body = success_body("gemini", "The answer is 42.", input_tokens=11, output_tokens=7)
    del body["usageMetadata"]["candidatesTokenCount"]
    with scripted_server("gemini", [Reply(body=body)]) as srv:
        worker = _worker("gemini", srv)
        if stream:
            comp, _, _ = _streaming_call(worker)
        else:
            comp = asyncio.run(worker.complete(MESSAGES, max_tokens=50, temperature=0.0))
    assert comp.text == "The answer is 42."
    assert (comp.input_tokens, comp.output_tokens, comp.tokens_estimated) == (11, 50, True)


def test_without_a_sink_a_live_worker_asks_for_no_stream() -> None:
    with scripted_server("openai") as srv:
        asyncio.run(_worker("openai", srv).complete(MESSAGES, max_tokens=20, temperature=0.0))
        assert "stream" not in srv.requests[0].body


# -- through the predictor ----------------------------------------------------------------------


def _live(name: str, vendor: str, srv: ScriptedServer, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": vendor,
        "model": "m",
        "base_url": srv.base_url,
        "hosting": "self",
        "price_in": 1.0,
        "price_out": 2.0,
        "retries": {"attempts": 1},
        **extra,
    }


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[ScriptedServer, ScriptedServer, ScriptedServer]]:
    with (
        scripted_server("openai") as a,
        scripted_server("openai") as b,
        scripted_server("anthropic") as c,
    ):
        yield a, b, c


@pytest.fixture(scope="module")
def served(
    workers: tuple[ScriptedServer, ScriptedServer, ScriptedServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Predictor]:
    a, b, c = workers
    root = tmp_path_factory.mktemp("streaming")
    pool = {
        "name": "streaming",
        "workers": [
            _live("live-a", "openai", a),
            _live("live-b", "openai", b),
            _live("claude", "anthropic", c, api_key_env="TEST_ANTHROPIC_KEY", hosting="external"),
        ],
    }
    (root / "pool.yaml").write_text(yaml.safe_dump(pool))
    # the first worker of the view: live-a, or claude for a request that allows only claude
    args = ["--policy", "fixed:0", "--pool", str(root / "pool.yaml")]
    with predictor(args, root, env={"TEST_ANTHROPIC_KEY": "k"}) as srv:
        yield srv


def _client(served: Predictor) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/openai/v1", api_key="not-needed", max_retries=0)


def _stream(served: Predictor, **extra: Any) -> Any:
    return _client(served).chat.completions.create(
        model="conductor", messages=MESSAGES, stream=True, extra_body=extra or None
    )


def test_the_first_token_reaches_the_client_before_the_worker_makes_its_last(
    workers: tuple[ScriptedServer, ...], served: Predictor
) -> None:
    hold = threading.Event()
    workers[0].script[:] = [streamed("openai", PIECES, hold=hold, input_tokens=11, output_tokens=7)]
    texts: list[str] = []
    released_before_first = None
    chunks = []
    for chunk in _stream(served):
        chunks.append(chunk)
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            if not texts:
                released_before_first = hold.is_set()
                hold.set()  # only now may the worker produce the rest of its answer
            texts.append(text)
    assert released_before_first is False
    assert texts == PIECES, "each piece is passed on as it arrives, not the answer whole"
    final = chunks[-1]
    doc = final.model_extra["conductor"]
    assert final.choices[0].finish_reason == "stop" and doc["answer"] == "".join(PIECES)
    assert final.usage.prompt_tokens == 11 and final.usage.completion_tokens == 7
    assert doc["cost_usd"] == pytest.approx((11 * 1.0 + 7 * 2.0) / 1e6)


def test_a_stream_failing_before_its_first_token_falls_back(
    workers: tuple[ScriptedServer, ...], served: Predictor
) -> None:
    a, b, _ = workers
    a.script[:] = [streamed("openai", PIECES, error_after=0)]
    b.script[:] = [streamed("openai", ["B", " says", " 42."])]
    chunks = list(_stream(served))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    doc = chunks[-1].model_extra["conductor"]
    assert text == "B says 42." == doc["answer"]
    assert doc["worker_fallback"] is True and [a["worker"] for a in doc["steps"][0]["attempts"]] == [
        "live-a",
        "live-b",
    ]


@pytest.mark.parametrize(
    "cut",
    [{"error_after": 2}, {"truncate_after": 2}],
    ids=["breaking-mid-answer", "cut-without-its-end-marker"],
)
def test_a_stream_broken_or_cut_ends_with_an_error_event_not_a_stop(
    workers: tuple[ScriptedServer, ...], served: Predictor, cut: dict[str, int]
) -> None:
    """A stream that breaks mid-answer, or ends without its end marker, is never a whole answer:
    an error event, no finish reason, and no fallback continues it."""
    a, b, _ = workers
    a.script[:] = [streamed("openai", PIECES, **cut)]
    b_before = len(b.requests)
    texts: list[str] = []
    finishes: list[str] = []
    with pytest.raises(openai.APIError, match="broke off mid-stream") as info:
        for chunk in _stream(served):
            for choice in chunk.choices:
                if choice.delta.content:
                    texts.append(choice.delta.content)
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
    assert texts == PIECES[:2] and finishes == []
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "stream_interrupted"
    assert len(b.requests) == b_before, "the broken answer is not continued by a fallback"


def test_an_anthropic_worker_streams_through_the_predictor(
    workers: tuple[ScriptedServer, ...], served: Predictor
) -> None:
    hold = threading.Event()
    workers[2].script[:] = [streamed("anthropic", PIECES, hold=hold)]
    texts: list[str] = []
    released_before_first = None
    for chunk in _stream(served, allowed_workers=["claude"]):
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            if not texts:
                released_before_first = hold.is_set()
                hold.set()
            texts.append(text)
    assert released_before_first is False and texts == PIECES


def test_a_request_without_stream_gets_the_whole_answer(
    workers: tuple[ScriptedServer, ...], served: Predictor
) -> None:
    workers[0].script[:] = [streamed("openai", PIECES)]
    resp = _client(served).chat.completions.create(model="conductor", messages=MESSAGES)
    assert resp.choices[0].message.content == "".join(PIECES)
    assert "stream" not in workers[0].requests[-1].body


# -- policies whose answer is not the planned last step's text -----------------------------------


@pytest.mark.parametrize(
    ("spec", "scripts", "want"),
    [
        # the cascade's first pair disagrees (41 / 40), so it escalates to c: c's 42 is the answer
        (
            "cascade:a,b>c",
            {"a": ["The answer is 41."], "b": ["The answer is 40."], "c": ["It is 42."]},
            "It is 42.",
        ),
        # self-consistency: five samples of a, the majority (42) wins. The samples are concurrent
        # calls, so which sample gets which scripted reply is the order they reach the server (it
        # flaked about 1 run in 100 with four different 42 texts: the vote picks the first sample
        # in step order with the winning answer); the majority's replies are one text, the two
        # others a minority answer that a stream of the last planned step would show
        (
            "self-consistency:a",
            {"a": ["The answer is 42."] * 3 + ["Surely 41 then."] * 2},
            "The answer is 42.",
        ),
    ],
)
async def test_a_policy_whose_answer_is_not_its_last_planned_step_streams_the_answer_whole(
    spec: str, scripts: dict[str, list[str]], want: str
) -> None:
    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService, load_policy
    from rl_conductor.workers.pool import build_pool

    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                scripted_server("openai", [streamed("openai", [text]) for text in texts])
            )
            for name, texts in scripts.items()
        }
        for name in ("a", "b", "c"):
            servers.setdefault(name, stack.enter_context(scripted_server("openai")))
        pool = build_pool(
            {
                "name": "p",
                "default_dataset": "gsm8k",
                "workers": [_live(n, "openai", s) for n, s in servers.items()],
            }
        )
        deltas: list[str] = []
        broken: list[str] = []
        service = ConductorService(load_policy(None, spec, pool), pool)
        doc = await service.answer(
            ConductorRequest(question="What is 6*7?", max_cost_usd=0.5),
            stream=TokenSink(deltas.append, broken.append),
        )
    assert broken == [], "the request was answered: nothing may break the stream"
    assert doc["answer"] == want
    assert deltas == [], f"a non-answer was streamed: {''.join(deltas)!r}"


async def test_a_stream_cut_by_the_step_timeout_is_logged_as_no_answer_not_as_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker stalls after its first piece past the step timeout: the stream breaks and the
    server stops the request, as it does when its streamed answer broke. The log line says the
    request got no answer, not that its client left (before: ``cancelled: true``)."""
    import json
    import logging

    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService, ServiceConfig, load_policy
    from rl_conductor.workers.pool import build_pool

    caplog.set_level(logging.INFO, "rl_conductor.serving")
    hold = threading.Event()
    try:
        with scripted_server("openai", [streamed("openai", PIECES, hold=hold)]) as srv:
            pool = build_pool({"name": "p", "workers": [_live("a", "openai", srv)]})
            service = ConductorService(
                load_policy(None, "fixed:0", pool), pool, ServiceConfig(step_timeout_s=5.0)
            )
            deltas: list[str] = []
            tasks: list[asyncio.Future[Any]] = []
            # the server's answer to a broken stream: nothing more can reach the client, stop it
            sink = TokenSink(deltas.append, lambda why: tasks[0].cancel())
            tasks.append(
                asyncio.ensure_future(service.answer(ConductorRequest(question="What is 6*7?"), stream=sink))
            )
            with pytest.raises(asyncio.CancelledError):
                await tasks[0]
    finally:
        hold.set()
    (record,) = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith('{"event"')]
    assert deltas == PIECES[:1]
    assert record["cancelled"] is False, "the client did not leave: the stream broke"
    assert "broke off" in record["error"] and "cut off" in record["error"]


def test_a_cut_stream_is_never_stored_in_the_response_cache(tmp_path: Any) -> None:
    from rl_conductor.workers.pool import build_pool

    with scripted_server(
        "openai", [streamed("openai", PIECES, truncate_after=2), streamed("openai", PIECES)]
    ) as srv:
        pool = build_pool({"cache": str(tmp_path / "c.sqlite"), "workers": [_live("a", "openai", srv)]})
        first, deltas, broken = _streaming_call(pool.workers[0])
        second, _, _ = _streaming_call(pool.workers[0])
        sent = len(srv.requests)
    assert isinstance(first, StreamInterruptedError) and deltas == PIECES[:2] and broken
    assert sent == 2, "the cut answer was replayed from the cache"
    assert second.text == "".join(PIECES) and not second.cached


async def test_a_client_leaving_mid_stream_is_still_logged_as_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import json
    import logging

    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService, load_policy
    from rl_conductor.workers.pool import build_pool

    caplog.set_level(logging.INFO, "rl_conductor.serving")
    hold = threading.Event()
    try:
        with scripted_server("openai", [streamed("openai", PIECES, hold=hold)]) as srv:
            pool = build_pool({"name": "p", "workers": [_live("a", "openai", srv)]})
            service = ConductorService(load_policy(None, "fixed:0", pool), pool)
            first = asyncio.Event()
            sink = TokenSink(lambda text: first.set(), lambda why: None)
            task = asyncio.ensure_future(
                service.answer(ConductorRequest(question="What is 6*7?"), stream=sink)
            )
            await first.wait()
            sink.abandon()  # what the server does when its client went away
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        hold.set()
    (record,) = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith('{"event"')]
    assert record["cancelled"] is True and record["error"] == ""
