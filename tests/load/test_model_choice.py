"""Which model `vstack bench load` sends to when none is named (issue 50, item 2): one that serves the
scenario's chat route, locally; never an embedding model; a clear refusal when none fits. Pure: the JSON of
/admin/models as a gateway answers it, no gateway or engine."""

from __future__ import annotations

from stack.load.model_choice import model_facts, pick, refusal_hint, why_not


def group(name: str, task: str | None = "generate", kind: str = "local", fallbacks: tuple[str, ...] = (),
          provider: str | None = None) -> dict:  # fmt: skip
    labels = {"task": task} if task else {}
    dep = {"id": f"engine-{name}", "kind": kind, "labels": labels, "provider_model": provider}
    return {"model": name, "aliases": [], "fallbacks": list(fallbacks), "context_window_fallbacks": [],
            "deployments": [dep]}  # fmt: skip


# As the newcomer's gateway listed them: the embedding model first, SmolLM2 with a cloud fallback.
GROUPS = [group("all-minilm-l6-v2", task="embed"), group("smollm2-135m-instruct", fallbacks=("gpt-4o-mini",)),
          group("gpt-4o-mini", task=None, kind="cloud", provider="openai/gpt-4o-mini"), group("tiny")]  # fmt: skip
LISTED = [g["model"] for g in GROUPS]


def test_no_model_named_picks_the_first_local_chat_model_and_says_which_and_why() -> None:
    chosen, why = pick(LISTED, model_facts(GROUPS), allow_cloud=False)
    assert chosen == "tiny"
    assert why.startswith("picked tiny: the first local chat model listed (")
    assert "all-minilm-l6-v2 is an embedding model (task: embed)" in why
    assert "smollm2-135m-instruct falls back to gpt-4o-mini (openai/gpt-4o-mini)" in why


def test_with_allow_cloud_a_local_model_still_comes_before_a_cloud_one() -> None:
    chosen, _ = pick(LISTED, model_facts(GROUPS), allow_cloud=True)
    assert chosen == "smollm2-135m-instruct"  # its fallback allowed; never the embedding model listed first


def test_no_model_fits_says_so_with_each_models_reason() -> None:
    only = GROUPS[:3]
    chosen, why = pick([g["model"] for g in only], model_facts(only), allow_cloud=False)
    assert chosen is None
    assert why.startswith("no model listed serves /v1/chat/completions locally (all-minilm-l6-v2 is an embedding")
    assert "gpt-4o-mini is served by openai/gpt-4o-mini" in why


def test_a_named_model_is_refused_for_its_real_reason_with_what_to_name_instead() -> None:
    facts = model_facts(GROUPS)
    embed = facts["all-minilm-l6-v2"]
    assert why_not(embed, allow_cloud=True) == (
        "all-minilm-l6-v2 is an embedding model (task: embed): it serves "
        "/v1/embeddings, and every scenario sends /v1/chat/completions"
    )
    assert refusal_hint("all-minilm-l6-v2", embed, LISTED, facts, False).startswith("name a chat model: --model tiny")
    smol = facts["smollm2-135m-instruct"]
    assert why_not(smol, allow_cloud=False) == (
        "smollm2-135m-instruct falls back to gpt-4o-mini (openai/gpt-4o-mini)"
        ": a cloud provider may answer (and bill) its requests"
    )
    hint = refusal_hint("smollm2-135m-instruct", smol, LISTED, facts, False)
    assert hint == (
        "pass --allow-cloud to send to it anyway (that spends money), or name a model without one: --model tiny"
    )
    assert why_not(smol, allow_cloud=True) is None and why_not(facts["tiny"], allow_cloud=False) is None
