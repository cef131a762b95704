"""Model-controlled names reach the terminal escaped (issue 11, item 9): Rich markup in a
node or tensor name neither crashes nor styles the output, and terminal escape sequences
are shown as text, never sent to the terminal."""

import onnx
import pytest
from click.testing import CliRunner

from chain import chain_model
from ckpt_cli.cli import main
from ckpt_cli.report.text import plain, safe

HOSTILE = ["[/]", "[link=http://x]a[/link]", "\x1b]8;;x\x07", "[bold red]spoof[/bold red]\x9b2J"]


def hostile_chain(name: str) -> onnx.ModelProto:
    """The chain graph with its first activation, its producer and a scope named ``name``."""
    m = chain_model(layers=2, batch=8, width=16)
    for n in m.graph.node:
        n.input[:] = [name if t == "a0" else t for t in n.input]
        n.output[:] = [name if t == "a0" else t for t in n.output]
        if n.name == "/layers.0/Relu":
            n.name = f"/layers.0/{name}"
    return m


def test_text_helpers():
    assert plain("a\x1b]8;;x\x07b") == "a\\x1b]8;;x\\x07b"
    assert plain("\u202eevil") == "\\u202eevil"
    assert safe("[link=http://x]a[/link]") == "\\[link=http://x]a\\[/link]"


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("command", ["inspect", "rewrite", "plan"])
def test_hostile_names_render_escaped(tmp_path, name, command):
    path = tmp_path / "hostile.onnx"
    onnx.save(hostile_chain(name), path)
    args = [command, str(path)]
    if command == "rewrite":
        args += ["-o", str(tmp_path / "out.onnx"), "--region", "/layers.0/*"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "\x9b" not in r.output
    visible = plain(name)
    if command == "inspect":  # the activation is the largest stashed one: it is listed
        assert visible in r.output, r.output


def test_unknown_sizes_are_announced_not_silent():
    import io

    from ckpt_cli.report.render import make_console, render_unsized

    out = io.StringIO()
    render_unsized({"unsized": [{"tensor": "nz[/]", "missing_dims": ["?"]}]}, make_console(file=out))
    text = out.getvalue()
    assert "1 tensors have unknown size" in text and "lower bounds" in text and "nz\\[/]" not in text
    assert "nz[/]" in text


def test_piped_text_keeps_each_sentence_on_one_line_without_padding(tmp_path):
    """Piped output (a CI log): no sentence wrapped mid-phrase, no line padded with spaces."""
    from conftest import SAMPLES

    r = CliRunner().invoke(main, ["rewrite", str(SAMPLES / "gpt.onnx"), "-o", str(tmp_path / "g.onnx")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert not [line for line in lines if line != line.rstrip()]
    knee = [line for line in lines if "the lowest predicted peak of" in line]
    assert len(knee) == 1 and knee[0].endswith("with the fewest recompute FLOPs"), knee
    pinned = next(line for line in lines if line.startswith("Order pinned:"))
    assert pinned.endswith("under any execution order and optimization level."), pinned


def test_a_plan_of_many_regions_lists_twenty_and_sums_the_rest(tmp_path):
    """A region a layer of a 25-layer transformer: the terminal lists the first 20 in graph
    order and one row summing the others; the JSON report keeps every region."""
    from synthetic import save_transformer

    src = save_transformer(str(tmp_path / "t.onnx"), layers=25)["path"]
    report = tmp_path / "report.json"
    shown = CliRunner().invoke(main, ["rewrite", src, "-o", str(tmp_path / "a.onnx"), "--report", str(report),
                                        "--regions-by-scope", r"blocks\.(\d+)"])
    assert shown.exit_code == 0, shown.output
    import json

    regions = json.loads(report.read_text())["regions"]
    rest = regions[20:]
    assert len(rest) >= 5
    assert f"Regions ({len(regions)}; the first 20 shown, all in --json)" in shown.output
    listed = [r["name"] for r in regions if f"\n{r['name']} " in shown.output]
    assert listed == [r["name"] for r in regions[:20]]
    summed = next(line for line in shown.output.splitlines() if line.startswith(f"... {len(rest)} more"))
    cells = [c.strip() for c in summed.split("|")]
    assert cells[1:3] == [str(sum(r["nodes"] for r in rest)), str(sum(r["recompute_nodes"] for r in rest))]
