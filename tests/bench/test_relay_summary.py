"""The relay bench's figures (bench/gateway_relay.py): tokens/s over the counted windows, ratios to direct, the
gateway's CPU per 1,000 tokens, and a verdict that names the stand-ins and clients, not the gateway, when direct
itself stays under the target (issue 54: a one-process client would have measured itself)."""

from bench.harness.relay_clients import Share
from bench.harness.relay_summary import Tally, row, verdict


def _tally(name: str, workers: int | None, tokens_per_round: list[int], cpu: dict[str, float]) -> Tally:
    t = Tally(name, workers)
    for tokens in tokens_per_round:  # two client processes' shares, a 10 s window per round
        shares = [Share(window_tokens=tokens // 2, ttft=[0.010, 0.020], streams=4),
                  Share(window_tokens=tokens - tokens // 2, ttft=[0.030], streams=4)]  # fmt: skip
        t.add(shares, cpu, 10.0)
    return t


def test_rows_give_rates_ratios_and_the_gateways_cpu_per_1k_tokens() -> None:
    direct = _tally("direct", None, [700_000, 700_000], {"stand-ins": 30.0, "clients": 20.0, "machine": 60.0})
    gw = _tally("workers=4", 4, [693_000, 693_000], {"gateway": 20.79, "stand-ins": 30.0, "machine": 100.0})
    r = row(gw, direct)
    assert r["tokens_per_s"] == 69_300 and r["tokens_per_s_rounds"] == [69_300, 69_300]
    assert r["x_direct"] == 0.99
    assert r["ttft_p50_ms"] == 20.0 and r["ttft_p50_x_direct"] == 1.0
    assert r["gateway_cpu_ms_per_1k_tokens"] == 30.0  # 2 x 20.79 CPU-s over 2 x 693,000 tokens
    assert r["cores"] == {"gateway": 2.08, "machine": 10.0, "stand-ins": 3.0}
    assert row(direct, direct)["gateway_cpu_ms_per_1k_tokens"] is None
    lines = verdict([direct, gw], offered=102_400, target=60_000, cores=16)
    assert lines[-1] == "workers=4: 69,300 tok/s = 0.990x direct: the goal is met"


def test_direct_under_the_target_names_the_standins_and_clients_as_the_limit() -> None:
    direct = _tally("direct", None, [300_000], {"stand-ins": 10.0, "clients": 9.5, "machine": 19.9})
    gw = _tally("workers=2", 2, [297_000], {"gateway": 9.0, "machine": 19.8})
    lines = verdict([direct, gw], offered=102_400, target=60_000, cores=2)
    assert lines[1].startswith("DIRECT reached 30,000 tok/s, below the target 60,000: the stand-ins (1.0 cores) "
                               "and the client processes (0.9 cores) are the limit here, not the gateway")  # fmt: skip
    assert lines[2] == "direct: the machine's cores were busy (2.0 of 2)"
    assert lines[3] == ("workers=2: 29,700 tok/s = 0.990x direct (the machine's cores were busy, 2.0 of 2: it bounds "
                        "the ratio)")  # fmt: skip  # no "goal met" when direct did not reach the target
    low_offer = verdict([direct, gw], offered=6_400, target=60_000, cores=16)
    assert "the offer (6,400 tok/s) is below the target" in low_offer[1]
