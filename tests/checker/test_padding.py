"""The values padded requests get are a backend capability (vLLM's cg_pad_seq_lens /
cg_pad_block_table, tests/v1/attention/test_cg_padding.py): declared by builders, the maximum of
each taken over a session's builders, padded with by the runner roles, crossed by the matrix; the
checks hold for any pair a correct backend is given; a builder that declares a pair and pads with
another is red where a FULL graph pads."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

from backend.attention import padding
from backend.attention.registry import get_backend
from backend.harness.checker import _session_plan, run_case
from backend.result import Status
from orchestrator.errors import InputError
from orchestrator.matrix import load_matrix
from tests.checker.conftest import CPU, DECODE, DEVICES, MIXED, make_case
from tests.families import conftest as fam


def _builder(seq=None, block=None):
    b = SimpleNamespace()
    if seq is not None:
        b.cg_pad_seq_lens = seq
    if block is not None:
        b.cg_pad_block_table = block
    return b


# name: (the session's builder, the pair its runner pads with) — vLLM's max-over-builders rule
CONSOLIDATED = {
    "declares nothing: vLLM's defaults": (_builder(), (0, -1)),
    "one group builder fp8 FlashMLA among defaults": (
        SimpleNamespace(builders=[_builder(), _builder(1, 0), _builder()]),
        (1, 0),
    ),
    "the max of each": (SimpleNamespace(builders=[_builder(1, 0), _builder(2, 1)]), (2, 1)),
    "a runner's own declaration counts": (
        SimpleNamespace(cg_pad_seq_lens=0, cg_pad_block_table=0, vllm_builder=_builder()),
        (0, 0),
    ),
    "behind a one-group wrapper": (SimpleNamespace(builder=_builder(1, 0)), (1, 0)),
}


@pytest.mark.parametrize("name", CONSOLIDATED)
def test_the_runner_pads_with_the_max_over_its_builders(name):
    builder, pair = CONSOLIDATED[name]
    assert padding.consolidated(builder) == pair


# A session's padded requests hold the pair, in every family's runner role (one group, MLA, the
# swa_sinks groups), declared or crossed.
SHAPES = {
    "gqa": (make_case, DECODE),
    "mla": (fam.make_case, fam.DECODE),
    "swa_sinks": (fam.make_swa_case, fam.SWA_DECODE),
}


@pytest.mark.parametrize("family", SHAPES)
@pytest.mark.parametrize("pair", [None, (1, 0), (0, -1)], ids=["declared", "1/0", "0/-1"])
def test_the_builder_pads_with_the_pair(family, pair):
    make, batch = SHAPES[family]
    case = dataclasses.replace(make("torch", "FULL", "auto", batch), cg_padding=pair)
    session = _session_plan(case, get_backend("torch", case.attention), 0, CPU).factory()
    want = pair or (0, 0)  # orch's builders declare seq_len 0 and the null block
    assert session.cg_padding == want
    from backend.harness.steps import make_step_inputs, plan_steps

    step = plan_steps(case.batch, case.model, case.capture_sizes, 1, 0)[0]
    inputs = make_step_inputs(step, case.model, 0, CPU, context=False)
    md = session.builder.build(inputs.batches, num_padded_tokens=4, num_padded_reqs=4)
    md = md[0] if isinstance(md, tuple) else md
    n = len(batch.query_lens)
    assert md.seq_lens[n:4].tolist() == [want[0]] * (4 - n)
    assert md.block_table[n:4].unique().tolist() == [want[1]]


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("pair", [(1, 0), (0, -1)], ids=["1/0", "0/-1"])
@pytest.mark.parametrize("batch", [DECODE, MIXED], ids=["decode", "mixed"])
def test_the_checks_hold_for_any_pair_a_correct_backend_is_given(pair, batch, device, sessions):
    for backend in ("torch", "aiter-emulated"):
        for mode in ("FULL", "FULL_AND_PIECEWISE"):
            r = run_case(make_case(backend, mode, "auto", batch, cg_padding=pair), device=device, sessions=sessions)
            assert r.status == Status.PASS, (backend, mode, r.reason)
            assert f"-auto-pad{pair[0]}_{pair[1]}-{batch.name}-" in r.case_id


@pytest.mark.parametrize("device", DEVICES, ids=str)
@pytest.mark.parametrize("batch", [DECODE, MIXED], ids=["decode", "mixed"])
def test_a_builder_that_declares_one_pair_and_pads_another_is_red_where_a_full_graph_pads(batch, device, sessions):
    padded_graph = {"decode": ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"), "mixed": ("FULL",)}[batch.kind]
    for mode in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        bad = run_case(
            make_case("tests.mutants.pad_declared:Backend", mode, "auto", batch), device=device, sessions=sessions
        )
        honest = run_case(
            make_case("tests.mutants.pad_declared:Honest", mode, "auto", batch), device=device, sessions=sessions
        )
        assert honest.status == Status.PASS, (mode, honest.reason)
        if mode in padded_graph:
            assert bad.status == Status.FAIL and bad.reason.startswith("padded_finite check failed"), (mode, bad.reason)
        else:
            assert bad.status == Status.PASS, (mode, bad.reason)


def test_a_matrix_crosses_the_declared_values(tmp_path):
    smoke = os.path.abspath("matrices/smoke.yaml")
    path = tmp_path / "m.yaml"
    path.write_text(f"extends: {smoke}\nname: pad\naxes: {{cg_padding: [declared, 1/0, 0/-1]}}\n")
    m = load_matrix(str(path), devices="cpu")
    ids = {
        c.case_id
        for c in m.cases
        if c.axes["batch"] == "decode_7"
        and c.attention == "gqa"
        and c.mode == "FULL"
        and c.tp == 1
        and c.kv_cache_dtype == "auto"
        and c.backend == "torch"
    }
    assert ids == {
        "tp1-FULL-auto-decode_7-torch-s0",
        "tp1-FULL-auto-pad1_0-decode_7-torch-s0",
        "tp1-FULL-auto-pad0_-1-decode_7-torch-s0",
    }
    crossed = next(c for c in m.cases if c.case_id == "tp1-FULL-auto-pad1_0-decode_7-torch-s0")
    assert crossed.cg_padding == (1, 0) and crossed.axes["cg_padding"] == "1/0"
    path.write_text(f"extends: {smoke}\nname: pad\naxes: {{cg_padding: [1-0]}}\n")
    with pytest.raises(InputError, match="cg_padding"):
        load_matrix(str(path), devices="cpu")
