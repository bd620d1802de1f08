"""benchmarks/bench_tp.py times every provider of a cell over rounds in rotated orders, the
same on every rank (a collective runs the same calls everywhere), so that drift between
runs falls on every provider alike."""

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_each_round_times_every_provider_once_and_no_provider_always_leads(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_tp

    names = ["shard_matmul", "fused_tp", "fused_tp_seed_scalar", "tp1_fused"]
    orders = bench_tp.round_orders(names, 5)
    assert len(orders) == 5
    assert all(sorted(order) == sorted(names) for order in orders)
    assert [order[0] for order in orders[:4]] == names  # each leads one round in four
    assert orders == bench_tp.round_orders(list(names), 5)  # the same on every rank
