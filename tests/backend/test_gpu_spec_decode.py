"""benchmarks/gpu_spec_decode.py runs on CPU (emulated graphs): the cases and their capture sizes
come from the matrix loader for each k, the markdown grid has a verdict per (provider, k, mode, kv,
batch), --compare reports differing verdicts, and bad input is one line + exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from backend.harness.modes import vllm_capture_sizes

_ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = _ROOT / "benchmarks" / "gpu_spec_decode.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_spec_decode", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_sizes_per_k_grid_and_compare(tmp_path, monkeypatch, capsys):
    # full.yaml with `default` sizes and a small max_num_seqs, so the default grid depends on k
    # (min(2 * 8 * (1 + k), 512)): the benchmark must give each k the sizes the matrix gives it.
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        f"extends: {json.dumps(str(_ROOT / 'matrices' / 'full.yaml'))}\nname: t\n"
        "model: {cpu: {max_num_seqs: 8}}\ncapture_sizes: default\n"
    )
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    module = _load()
    assert module.main(["--matrix", str(matrix), "--quick", "--no-mutants"]) == 0
    rows = json.loads((tmp_path / "out" / "spec_decode.json").read_text())
    torch_rows = [r for r in rows if r["backend"] == "torch"]
    assert {(r["k"], r["mode"]) for r in torch_rows} == {(k, m) for k in module.KS for m in module.MODES}
    assert all(r["status"] == "pass" for r in torch_rows), [r["reason"] for r in torch_rows if r["status"] != "pass"]
    for r in torch_rows:
        assert r["configured_sizes"] == list(vllm_capture_sizes(8, 8192, r["k"], limit=512)), r
    assert {max(r["configured_sizes"]) for r in torch_rows} == {32, 64}  # k = 1, 3
    md = (tmp_path / "out" / "spec_decode.md").read_text()
    assert "**torch**" in md and "| k | mode | auto decode_7 |" in md and "| 3 | FULL_DECODE_ONLY | pass" in md
    assert md.count("\n| 1 | ") == md.count("\n| 3 | ") == 2 * len(module.MODES)  # torch + aiter-triton

    # --compare: one flipped verdict in the other run is reported, by backend and case id
    other = [dict(r) for r in rows]
    other[0]["status"] = "fail"
    for r in other[1:]:
        r["status"] = "skip"  # a cell skipped there (e.g. the GPU-only provider on CPU) is no difference
    (tmp_path / "other.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert (
        module.main(["--matrix", str(matrix), "--quick", "--no-mutants", "--compare", str(tmp_path / "other.json")])
        == 0
    )
    out = capsys.readouterr().out
    assert "1 verdicts differ" in out and f"{rows[0]['case']}: fail there, {rows[0]['status']} here" in out


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    module = _load()
    assert module.main(["--matrix", str(tmp_path / "missing.yaml")]) == 2
    assert module.main(["--compare", str(tmp_path / "missing.json")]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert module.main(["--matrix", str(bad), "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("gpu_spec_decode: ") for line in err), err
