"""bench.peer reads issue 47's done-when from the ``--activation-budget`` rows at PyTorch's bytes."""

from __future__ import annotations

from bench import peer


def _cli(kept: int, matmul: int, checked: bool) -> dict:
    row = {"share": 0.4, "kept_bytes": kept, "kept_share": 0.4, "recompute_matmul_flops": matmul}
    return row | ({"passed": True, "outputs_equal": True, "measured_in_use": 10, "original_in_use": 20}
                  if checked else {})


def _model(at_torch: dict[float, tuple[int, int]], checked: bool = False) -> dict:
    """One model whose CLI row at PyTorch's bytes keeps/recomputes ``at_torch[budget]``;
    PyTorch keeps 1000 bytes and recomputes 500 matmul FLOPs at every budget."""
    rows = [{"budget": b, "torch": {"activation_bytes": 1000, "recompute_matmul_flops": 500},
             "same_share": _cli(1200, 100, checked), "torch_bytes": _cli(kept, matmul, checked)}
            for b, (kept, matmul) in at_torch.items()]
    return {"model": "m", "ckpt_forward_matmul_flops": 1000, "torch_forward_matmul_flops": 1000,
            "activation_budget": rows}


def test_the_verdict_needs_no_more_bytes_and_no_more_matmul_flops_than_pytorch() -> None:
    assert peer.cli_verdict(_model({0.5: (1000, 500), 0.2: (999, 400)})) == {0.5: True, 0.2: True}
    assert peer.cli_verdict(_model({0.5: (1000, 501), 0.2: (999, 400)})) == {0.5: False, 0.2: True}
    assert peer.cli_verdict(_model({0.5: (1001, 400), 0.2: (999, 400)})) == {0.5: False, 0.2: True}


def test_a_missing_or_failed_row_has_no_verdict() -> None:
    m = _model({0.5: (1000, 500)})
    assert peer.cli_verdict(m) == {0.5: True, 0.2: None}
    m["activation_budget"][0]["torch_bytes"] = {"share": 0.4, "error": "boom"}
    assert peer.cli_verdict(m) == {0.5: None, 0.2: None}
    assert peer.cli_verdict({"model": "m"}) == {0.5: None, 0.2: None}


def _lines(m: dict) -> list[str]:
    lines: list[str] = []
    peer._render_cli_summary({"models": [m]}, lines.append)
    peer._render_cli_verdict(m, lines.append)
    peer._render_activation_budget(m, lines.append)
    return lines


def test_the_summary_names_a_model_that_recomputes_more_than_pytorch() -> None:
    text = "\n".join(_lines(_model({0.5: (1000, 500), 0.2: (1000, 600)})))
    assert "met on none; not met on m." in text
    assert "0.2: NO (activations 1.000, matmul recompute 1.200)" in text
    assert "0.5: yes (activations 1.000, matmul recompute 1.000)" in text


def test_unchecked_rows_are_said_to_be_predicted() -> None:
    predicted = "\n".join(_lines(_model({0.5: (1000, 500), 0.2: (900, 400)})))
    assert "met on m; not met on none." in predicted
    assert "predicted: the plan's own figures, no `--check` run" in predicted
    assert "| n/a | n/a | n/a |" in predicted and "| True | PASS |" not in predicted
    checked = "\n".join(_lines(_model({0.5: (1000, 500), 0.2: (900, 400)}, checked=True)))
    assert "(`ckpt rewrite --activation-budget F --check`)" in checked and "predicted" not in checked
    assert "| True | PASS | 0.000 MiB of 0.000 MiB |" in checked
