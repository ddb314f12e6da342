"""The MLA mutation suite: one deliberately broken MLA backend per public precedent (DESIGN.md
§9a), each red with its check exactly where the bug is reachable and green everywhere else; the
correct providers green over seeds 0, 1, 2. Reachability, for a UNIFORM_BATCH backend: FULL
resolves to FULL_AND_PIECEWISE, so decode batches replay a FULL decode graph in FULL,
FULL_DECODE_ONLY and FULL_AND_PIECEWISE, and mixed batches never replay a FULL graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from backend.harness.checker import run_case, run_case_local
from backend.result import Status
from tests.families.conftest import DECODE, MIXED, TINY_MLA, make_case

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DECODE_GRAPH = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
UNIFORM = {"FULL": "FULL_AND_PIECEWISE"}  # UNIFORM_BATCH's resolution


@dataclass(frozen=True)
class Expect:
    backend: str
    flagged: Callable[[str, str, str, int], bool]  # (mode, kv, batch kind, k) -> reachable here
    status: Status
    check: str
    first_any: tuple[str, ...] = ()


def decode_graph(mode, kv, kind, k):
    return mode in DECODE_GRAPH and kind == "decode"


def padded_decode_graph(mode, kv, kind, k):
    """A decode graph replayed with padded rows: at k = 0 every step (3 rows in a graph of 4); at
    k = 2 step 2, one request in the graph of 2 after steps of 3 (the verify step plan prefers a
    count that pads a decode graph: backend/harness/steps.py count_ranks; steps 0 and 1 fill the
    graph of 3 exactly)."""
    return decode_graph(mode, kv, kind, k)


MUTANTS = {
    "#57017 pad rows 0/0 NaN spread by a per-tensor quantiser": Expect(
        "tests.mutants.mla_pad_nan_quant:Backend", padded_decode_graph, Status.FAIL, "finite", first_any=("replay",)
    ),
    "#37682 padded output rows never written": Expect(
        "tests.mutants.mla_pad_rows_unwritten:Backend", padded_decode_graph, Status.FAIL, "padded_finite"
    ),
    "#35175 fresh fp8 metadata tensor per build": Expect(
        "tests.mutants.mla_fresh_fp8_metadata:Backend",
        lambda mode, kv, kind, k: kv == "fp8" and decode_graph(mode, kv, kind, k),
        Status.FAIL,
        "replay",
    ),
    "#51119 host split choice frozen at capture": Expect(
        "tests.mutants.mla_split_frozen:Backend", decode_graph, Status.FAIL, "replay"
    ),
    "#39444 warm-up write to slot 0": Expect(
        "tests.mutants.mla_warmup_slot0:Backend", decode_graph, Status.FAIL, "kv_integrity"
    ),
    "#21505 q = 1 capture replayed at q = 1 + k": Expect(
        "tests.mutants.mla_q1_capture:Backend",
        lambda mode, kv, kind, k: k > 0 and decode_graph(mode, kv, kind, k),
        Status.FAIL,
        "replay",
    ),
    "softmax scale over the latent's 576 dims": Expect(
        "tests.mutants.mla_latent_scale:Backend",
        lambda mode, kv, kind, k: True,
        Status.FAIL,
        "reference",
        first_any=("attn_reference",),
    ),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_mla_mutant_flagged_exactly_where_reachable(name, mla_sessions):
    exp = MUTANTS[name]
    seen = []
    for kv, k in (("auto", 0), ("fp8", 0), ("auto", 2)):
        for batch in (DECODE, MIXED):
            for mode in MODES:
                r = run_case(make_case(exp.backend, mode, kv, batch, spec_tokens=k), sessions=mla_sessions)
                flagged = exp.flagged(mode, kv, batch.kind, k)
                want = exp.status if flagged else Status.PASS
                where = f"{name}: {mode}/{kv}/k{k}/{batch.kind}"
                assert r.status == want, f"{where}: {r.status.value} {r.reason}"
                if want == Status.FAIL:
                    assert any(r.reason.startswith(f"{c} check failed") for c in (exp.check, *exp.first_any)), (
                        f"{where}: {r.reason}"
                    )
                    assert not next(c for c in r.checks if c.name == exp.check).passed, f"{where}: {r.reason}"
                resolved = UNIFORM.get(mode, mode)
                assert r.resolved_mode == resolved and r.downgraded == (resolved != mode), where
                seen.append(flagged)
    assert any(seen)


@pytest.mark.parametrize("backend", ["torch", "aiter-emulated"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_mla_providers_pass_every_mode_over_three_seeds(backend, seed, mla_sessions):
    for kv, k in (("auto", 0), ("fp8", 0), ("auto", 2)):
        for batch in (DECODE, MIXED):
            for mode in MODES:
                r = run_case(make_case(backend, mode, kv, batch, seed=seed, spec_tokens=k), sessions=mla_sessions)
                assert r.status == Status.PASS, f"{backend} {mode}/{kv}/k{k}/{batch.kind}/s{seed}: {r.reason}"


def test_split_frozen_is_a_v2_capture_hazard(mla_sessions):
    """V1 captures with seq_lens = max_model_len: the frozen split count covers every replay."""
    import dataclasses

    for style, want in (("v1", Status.PASS), ("v2", Status.FAIL)):
        model = dataclasses.replace(TINY_MLA, capture_style=style)
        r = run_case(
            make_case("tests.mutants.mla_split_frozen:Backend", "FULL_DECODE_ONLY", "auto", DECODE, model=model),
            sessions=mla_sessions,
        )
        assert r.status == want, f"{style}: {r.reason}"


@pytest.mark.slow
@pytest.mark.parametrize("tp, mode", [(2, "FULL_DECODE_ONLY"), (2, "PIECEWISE"), (4, "FULL_AND_PIECEWISE")])
def test_mla_tp_gang_replicates_the_latent_cache(tp, mode):
    """Heads split over the gang, every rank writes and reads the whole latent cache: a correct
    provider passes on a gloo gang; the pad-NaN mutant fails there too (on every rank)."""
    r = run_case_local(make_case("torch", mode, "auto", DECODE, tp=tp))
    assert r.status == Status.PASS, r.reason + r.log_tail[-1500:]
    bad = run_case_local(
        make_case("tests.mutants.mla_pad_nan_quant:Backend", "FULL_DECODE_ONLY", "auto", DECODE, tp=tp)
    )
    assert bad.status == Status.FAIL and "[all ranks fail]" in bad.reason, bad.reason
    assert not next(c for c in bad.checks if c.name == "finite").passed, bad.reason
