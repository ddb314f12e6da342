"""A small valid matrix to mutate in scenario tables, and a writer for it."""

from __future__ import annotations

import textwrap
from pathlib import Path

BASE = """\
name: base
model: {num_heads: 8, num_kv_heads: 2, head_size: 16, block_size: 16, dtype: bfloat16,
        num_layers: 1, max_model_len: 256, max_num_seqs: 16}
capture_sizes: [1, 2, 4, 8, 16, 32]
batches:
  dec: {decode: 3, seq_len: 40}
  mix: {decode: 2, seq_len: 30, prefill: [[5, 20]]}
axes:
  tp: [1, 2]
  cudagraph_mode: [NONE, FULL]
  kv_cache_dtype: [auto, fp8]
  batch: [dec, mix]
  backend: [torch]
"""


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def marked_line(text: str) -> int:
    """1-based line of the line that carries the `#!` marker (where the error must point)."""
    for i, line in enumerate(textwrap.dedent(text).splitlines(), 1):
        if "#!" in line:
            return i
    raise AssertionError("no #! marker in scenario text")


def replace(old: str, new: str, base: str = BASE) -> str:
    """base with old -> new; a `#!` in new is moved to the end of its line in the result (a
    comment inside a flow mapping would break the YAML)."""
    assert old in base, old
    start = base.index(old)
    at = new.find("#!")
    if at >= 0:
        prefix = new[:at].rstrip(" ")
        new, at = prefix + new[at + 2 :], start + len(prefix)
    text = base[:start] + new + base[start + len(old) :]
    if at >= 0:
        eol = text.find("\n", at)
        eol = len(text) if eol < 0 else eol
        text = text[:eol] + "  #!" + text[eol:]
    return text


def assert_plan_names_the_marked_line(tmp_path: Path, capsys, doc: str, needle: str) -> None:
    """`orch plan` on `doc` exits 2 with one line on stderr, no traceback and nothing on stdout,
    naming the file and the `#!` line, and containing `needle`."""
    from orchestrator.cli import main

    path = write(tmp_path, doc)
    code = main(["plan", path, "--devices", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"orch: {path}:{marked_line(doc)}: "), lines[0]
    assert needle in lines[0], lines[0]
