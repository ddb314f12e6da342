"""Load a matrix file into cases: validate, expand (product, exclude, include), apply constraints.

    load_matrix("matrices/full.yaml", devices="cpu") -> Matrix(cases=runnable, skipped=with reasons)

Validation happens once, here; anything wrong in the file is an InputError naming file and line
(orchestrator/matrix_tree.py keeps every value's origin). A combination that is well-formed but
cannot run (heads not divisible by tp, backend unavailable on this device class, kv dtype not
supported, a user constraint) is not an error: it becomes a SkippedCase with the reason, so the
plan and the dashboard show it. Language reference: docs/MATRIX.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from backend.attention import padding
from backend.case import BatchSpec, Case, ModelShape, Tolerance
from backend.families.contract import spec as family_spec
from orchestrator import matrix_schema as S
from orchestrator import matrix_tree as T
from orchestrator.errors import InputError
from orchestrator.matrix_backends import BackendChecks
from orchestrator.matrix_backends import unavailable_reason as unavailable_reason  # re-exported
from orchestrator.matrix_expand import IncompleteInclude, axis_values, expand, fits, matches  # also re-exported
from orchestrator.matrix_models import family_shape

# Used when a matrix gives no `tolerances:` entry for the case's dtype key. bf16/fp16 follow
# AITER's own attention tests (~1e-2); fp8 KV is much coarser (~0.1-0.15).
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(1e-2, 1e-2),
    "float32": Tolerance(1e-4, 1e-4),
    "fp8": Tolerance(0.15, 0.15),
}
# vLLM's default largest capture size: min(2 * max_num_seqs * (1 + k), 512).
MAX_DEFAULT_CAPTURE = 512
# A product beyond this is a typo (a seed range pasted in), not a test plan; refuse it before
# materialising it.
MAX_COMBINATIONS = 200_000


@dataclass(frozen=True)
class SkippedCase:
    case: Case
    reason: str


@dataclass(frozen=True)
class Matrix:
    path: str
    name: str
    device_class: str
    cases: tuple[Case, ...]  # runnable
    skipped: tuple[SkippedCase, ...]
    known_failures: str | None = None  # the known-failures file it names (its `known_failures:` key)

    def find(self, case_id: str) -> Case | SkippedCase | None:
        for case in self.cases:
            if case.case_id == case_id:
                return case
        for skipped in self.skipped:
            if skipped.case.case_id == case_id:
                return skipped
        return None


def resolve_device_class(devices: str) -> str:
    if devices in T.DEVICE_CLASSES:
        return devices
    if devices == "auto":
        from backend.attention.capabilities import gpu_visible

        return "gpu" if gpu_visible() else "cpu"
    raise InputError(f"--devices: expected cpu, gpu or auto, got {devices!r}")


def load_matrix(
    path: str, *, devices: str = "auto", backend_override: str | None = None, backend_checks: bool = True
) -> Matrix:
    """The matrix as runnable cases and skips. backend_checks=False stops before the backend
    classes are imported (and torch with them): backend names are not resolved and skips say
    only what the file and the model shape decide (heads vs tp, constraints). `devices` must then
    be cpu or gpu (auto asks torch)."""
    device_class = resolve_device_class(devices)
    tree = T.read_tree(path)
    # The other device class's variants are validated too (a broken gpu block must not wait for
    # the first GPU run to be noticed), unless the file simply has no variant for it.
    other = "gpu" if device_class == "cpu" else "cpu"
    try:
        other_tree = T.select_device(tree, other)
        # Expanded too (torch-free): a k that does not fit the other class's batches, or a
        # duplicate id there, is found on either machine.
        _Loader(path, other_tree, S.validate_doc(other_tree), other).build(backend_override, backend_checks=False)
    except T.MissingVariant:
        pass
    selected = T.select_device(tree, device_class)
    loader = _Loader(path, selected, S.validate_doc(selected), device_class)
    return loader.build(backend_override, backend_checks=backend_checks)


class _Loader(BackendChecks):
    def __init__(self, path: str, tree: T.Node, doc: S.MatrixDoc, device_class: str):
        self.path, self.tree, self.doc, self.device_class = path, tree, doc, device_class
        self._models: dict[str, ModelShape] = {}
        self._backends: dict[tuple[str, str], Any] = {}
        self._unavailable: dict[tuple[str, str], str | None] = {}

    @property
    def families(self) -> list[str]:
        """The attention families the matrix runs (the axis, and any an include entry names)."""
        extra = [a for e in self.doc.include for a in e.values("attention")]
        return list(dict.fromkeys([*self.doc.axes.attention, *extra]))

    def model_of(self, family: str) -> ModelShape:
        """The family's model shape (orchestrator/matrix_models.py), built once."""
        if family not in self._models:
            self._models[family] = family_shape(self.tree, self.doc, family, self.device_class)
        return self._models[family]

    @property
    def model(self) -> ModelShape:
        return self.model_of(self.families[0])

    def family_axes(self, family: str) -> dict[str, list]:
        """The axis values of one family's combinations: the matrix's, with families.<f>.axes over them."""
        block = self.doc.families.get(family)
        axes = {k: list(getattr(self.doc.axes, k)) for k in S.AXES}
        axes.update(block.axes.given() if block is not None else {})
        axes["attention"] = [family]
        return axes

    def err(self, loc: tuple, message: str) -> InputError:
        field = T.field_path(self.tree, loc)
        return T.error_at(self.tree, loc, f"{field}: {message}" if field else message)

    # --- checks that need more than one field --------------------------------------------

    def check(self) -> None:
        # A families block for a family the axis does not name is unused (a matrix that extends
        # another may narrow the axis); its name was checked by the schema.
        for family in self.families:
            self.capture_sizes(self.model_of(family))
        names = self.doc.batches
        used = [b for e in self.doc.include for b in e.values("batch")]
        for i, name in enumerate(self.doc.axes.batch):
            if name not in names:
                raise self.err(
                    ("axes", "batch", i), f"no batch spec named {name!r} under batches: (have {', '.join(names)})"
                )
        for family, block in self.doc.families.items():
            for i, name in enumerate(block.axes.batch or ()):
                if name not in names:
                    raise self.err(
                        ("families", family, "axes", "batch", i), f"no batch spec named {name!r} under batches:"
                    )
        for family in self.families:
            used += [(name, family) for name in self.family_axes(family)["batch"]]
        entries: list[tuple[tuple[str | int, ...], Any]] = [
            ((key, i), e.when if key == "constraints" else e)
            for key in ("exclude", "include", "constraints")
            for i, e in enumerate(getattr(self.doc, key))
        ]
        entries += [
            (("families", f, "exclude", i), e) for f, b in self.doc.families.items() for i, e in enumerate(b.exclude)
        ]
        for where, match in entries:
            for j, name in enumerate(match.values("batch")):
                if name not in names:
                    loc = (*where, "when", "batch", j) if where[0] == "constraints" else (*where, "batch", j)
                    raise self.err(loc, f"no batch spec named {name!r} under batches:")
        for item in dict.fromkeys(used):
            name, family = item if isinstance(item, tuple) else (item, self.families[0])
            self.batch(name, self.model_of(family))

    def batch(self, name: str, m: ModelShape) -> BatchSpec:
        block = self.doc.batches[name]
        q, s = block.rows()
        loc = ("batches", name)
        if len(q) > m.max_num_seqs:
            raise self.err(loc, f"{len(q)} requests exceed model max_num_seqs {m.max_num_seqs}")
        for i, (ql, sl) in enumerate(zip(q, s)):
            if ql < 1:
                raise self.err(loc, f"request {i}: query_len {ql} must be >= 1")
            if sl < ql:
                raise self.err(loc, f"request {i}: seq_len {sl} < query_len {ql} (seq_len counts context + new tokens)")
            if sl > m.max_model_len:
                raise self.err(loc, f"request {i}: seq_len {sl} exceeds model max_model_len {m.max_model_len}")
        if m.num_blocks:
            need = m.blocks_for(s)
            if need > m.num_blocks - 1:
                raise self.err(
                    loc,
                    f"needs {need} KV-cache blocks of {m.block_size} tokens; model num_blocks "
                    f"{m.num_blocks} leaves {m.num_blocks - 1} (block 0 is the null block)",
                )
        return BatchSpec(name, q, s, block.description)

    def capture_sizes(self, m: ModelShape, spec_tokens: int = 0) -> tuple[int, ...]:
        """The configured sizes for a case with k = spec_tokens: `default` is vLLM's grid for that k
        (backend/modes.vllm_capture_sizes: up to min(2 * max_num_seqs * (1 + k), 512)); a list is
        taken as written. Either is rounded to multiples of 1 + k later, at mode resolution, where
        vLLM does it (modes.resolve_capture_sizes): that needs the backend's support level."""
        if self.doc.capture_sizes == "default":
            from backend.harness.modes import vllm_capture_sizes  # torch-free

            return vllm_capture_sizes(m.max_num_seqs, m.batched_tokens_limit, spec_tokens, limit=MAX_DEFAULT_CAPTURE)
        sizes = list(self.doc.capture_sizes)
        if not sizes:
            raise self.err(("capture_sizes",), "empty list (omit the key for vLLM's default sizes)")
        if len(set(sizes)) != len(sizes):
            raise self.err(("capture_sizes",), "duplicate capture sizes")
        # The capture dummy batch spreads N tokens over min(N, max_num_seqs) requests.
        limit = m.max_num_seqs * m.max_model_len
        if max(sizes) > limit:
            raise self.err(("capture_sizes",), f"size {max(sizes)} exceeds max_num_seqs * max_model_len = {limit}")
        return tuple(sorted(sizes))

    def build(self, backend_override: str | None, *, backend_checks: bool = True) -> Matrix:
        """Expand, then (backend_checks) the one stage that needs the backend classes: their
        names are resolved (torch loads here, through backend/attention/interface.py) and a
        combination they cannot run becomes a skip. Without it nothing imports torch."""
        self.check()
        doc = self.doc
        per_family = [self.family_axes(f) for f in doc.axes.attention]
        includes = self.includes(per_family)
        if backend_override is not None:
            if backend_checks:
                self.check_families_have_backends(backend_override)
            for axes in per_family:
                axes["backend"] = [backend_override]
            # A backend-specific include is kept, re-targeted at the override.
            includes = [{**inc, "backend": backend_override} if "backend" in inc else inc for inc in includes]
        elif backend_checks:
            for axes in per_family:
                for name in axes["backend"]:
                    self.backend_class(name, axes["attention"][0], self._backend_loc(name, axes["attention"][0]))
            for i, e in enumerate(doc.include):
                for j, name in enumerate(e.values("backend")):
                    for family in e.values("attention") or doc.axes.attention[:1]:
                        self.backend_class(name, family, ("include", i, "backend", j))
            self.check_families_have_backends(None)
            self.check_features()
        cases = self.expand_cases(per_family, includes)
        runnable: list[Case] = []
        skipped: list[SkippedCase] = []
        head_only: dict[str, bool] = {}  # per family: every skip is about heads vs tp
        for combo, case in cases:
            heads = family_spec(case.attention).layout_reasons(case.model, case.tp)
            reasons = heads + (self.backend_reasons(case) if backend_checks else []) + self.user_reasons(combo)
            if reasons:
                head_only[case.attention] = head_only.get(case.attention, True) and bool(heads)
                skipped.append(SkippedCase(case, "; ".join(reasons)))
            else:
                head_only[case.attention] = False
                runnable.append(case)
        for family, only in head_only.items():
            if only:
                m = self.model_of(family)
                first = next(s.reason for s in skipped if s.case.attention == family)
                where = (
                    ("families", family, "axes", "tp")
                    if family in doc.families and doc.families[family].axes.tp
                    else ("axes", "tp")
                )
                raise self.err(
                    where,
                    f"nothing runnable for {family}: {first} (model num_heads {m.num_heads}, "
                    f"num_kv_heads {m.num_kv_heads})",
                )
        name = doc.name or os.path.splitext(os.path.basename(self.path))[0]
        return Matrix(
            self.path, name, self.device_class, tuple(runnable), tuple(skipped), S.known_failures_file(self.tree)
        )

    def inherited_include(self) -> T.Node | None:
        """The include list's node when this file did not write it (an `extends:` parent did)."""
        node = self.tree.value.get("include")
        return node if node is not None and os.path.realpath(node.src) != os.path.realpath(self.path) else None

    def includes(self, per_family: list[dict[str, list]]) -> list[dict]:
        """The include entries for expand(): one per combination of an entry's lists, each with its
        index. A parent's rows that name an axis value this file's axes no longer have (it narrowed
        them) are dropped: they were written for the parent's axes (narrowing `batch:` under
        full.yaml would otherwise fail inside full.yaml)."""
        values = axis_values(per_family)
        inherited = self.inherited_include() is not None
        out = []
        for i, e in enumerate(self.doc.include):
            rows = [{**row, **e.extras(), "_include": i} for row in e.combinations()]
            out += [row for row in rows if not inherited or fits(row, values)]
        return out

    def include_error(self, e: IncompleteInclude) -> InputError:
        """An include row that cannot become a case: at its line, or, when a parent wrote it, at
        this file's `extends:` (the user's file), saying how to drop the parent's rows."""
        node = self.inherited_include()
        if node is None:
            return self.err(("include", e.index), str(e))
        ext = self.tree.value.get("extends")
        row = node.value[e.index] if isinstance(node.value, list) and e.index < len(node.value) else node
        return InputError(
            f"include[{e.index}] (inherited from {row.src}:{row.line}) {e}; this file narrows the axes "
            f"it extends: `include: []` here drops the inherited include rows",
            source=self.path,
            line=ext.line if ext is not None else None,
        )

    def expand_cases(self, per_family: list[dict[str, list]], includes: list[dict]) -> list[tuple[dict, Case]]:
        """Product (family by family), exclude, include -> (combination, Case), ids unique, k fitted
        to each batch."""
        doc = self.doc
        size = 0
        for axes in per_family:
            n = 1
            for values in axes.values():
                n *= len(values)
            size += n
        if size > MAX_COMBINATIONS:
            raise self.err(("axes",), f"the product has {size} combinations (limit {MAX_COMBINATIONS})")
        exclude = [e.axes() for e in doc.exclude]
        exclude += [
            {**e.axes(), "attention": [family]} for family, block in doc.families.items() for e in block.exclude
        ]
        try:
            combos = expand(per_family, exclude, includes)
        except IncompleteInclude as e:
            raise self.include_error(e) from None
        if not combos:
            raise self.err(
                ("exclude",) if doc.exclude else ("axes",), "the product is empty: exclude removes every combination"
            )

        batches: dict[tuple[str, str], BatchSpec] = {}
        capture: dict[tuple[str, int], tuple[int, ...]] = {}
        out: list[tuple[dict, Case]] = []
        seen: dict[str, int] = {}
        for n, combo in enumerate(combos):
            family, k = combo["attention"], combo["spec_tokens"]
            model = self.model_of(family)
            if (combo["batch"], family) not in batches:
                batches[(combo["batch"], family)] = self.batch(combo["batch"], model)
            if (family, k) not in capture:
                capture[(family, k)] = self.capture_sizes(model, k)
            case = Case(
                backend=combo["backend"],
                tp=combo["tp"],
                mode=combo["cudagraph_mode"],
                kv_cache_dtype=combo["kv_cache_dtype"],
                batch=batches[(combo["batch"], family)],
                seed=combo["seed"],
                model=model,
                capture_sizes=capture[(family, k)],
                steps=combo.get("steps", doc.steps),
                tolerance=self.tolerance(combo["kv_cache_dtype"], family),
                timeout_s=float(combo.get("timeout_s", doc.timeout_s)),
                matrix=self.path,
                tier=doc.tier,
                spec_tokens=k,
                cg_padding=padding.parse(combo["cg_padding"]),
            )
            self.check_spec(combo, case)
            cid = case.case_id
            if cid in seen:
                where = ("include", combo["_include"]) if "_include" in combo else ("axes", "backend")
                raise self.err(
                    where, f"duplicate case id {cid} (two combinations, or two backends with one class name)"
                )
            seen[cid] = n
            out.append((combo, case))
        return out

    def check_spec(self, combo: Mapping[str, Any], case: Case) -> None:
        """A k that cannot run a combination's batch is a mistake in the file (exclude the pair
        if it is deliberate): one error at the include entry or the spec_tokens axis value."""
        k = case.spec_tokens
        if not k:
            return
        why = spec_reason(case.batch, k, case.model)
        if why is None:
            return
        if "_include" in combo:
            i = combo["_include"]
            loc: tuple[str | int, ...] = (
                ("include", i, "spec_tokens") if self.doc.include[i].spec_tokens is not None else ("include", i)
            )
        else:
            block = self.doc.families.get(case.attention)
            if block is not None and block.axes.spec_tokens and k in block.axes.spec_tokens:
                loc = ("families", case.attention, "axes", "spec_tokens", block.axes.spec_tokens.index(k))
            else:
                loc = ("axes", "spec_tokens", self.doc.axes.spec_tokens.index(k))
        raise self.err(loc, f"spec_tokens {k} with batch {case.batch.name!r}: {why} (exclude the pair if intended)")

    def tolerance(self, kv_cache_dtype: str, family: str) -> Tolerance:
        # fp8_ds_mla takes the model dtype's: the reference rounds its rows exactly (docs/FAMILIES.md).
        key = cast(S.ToleranceKey, "fp8" if kv_cache_dtype == "fp8" else self.model_of(family).dtype)
        block = self.doc.families.get(family)
        tol = (block.tolerances.get(key) if block is not None else None) or self.doc.tolerances.get(key)
        return Tolerance(tol.atol, tol.rtol) if tol else DEFAULT_TOLERANCES[key]

    def user_reasons(self, combo: Mapping[str, Any]) -> list[str]:
        return [c.reason for c in self.doc.constraints if matches(combo, c.when.axes())]


def spec_reason(batch: BatchSpec, k: int, model: ModelShape) -> str | None:
    """Why `batch` cannot run with k speculative tokens on `model` (decode rows become verify rows
    of 1 + k tokens over the same seq_lens, BatchSpec.verify), or None."""
    q = 1 + k
    if q > model.max_model_len:
        return f"verify rows of 1 + k = {q} tokens exceed model max_model_len {model.max_model_len}"
    prompts = family_spec(model.attention).fresh_prompts_are_prefills  # a one-token prompt stays one
    for i, (ql, sl) in enumerate(zip(batch.query_lens, batch.seq_lens)):
        if ql == 1 and sl < q and not (prompts and sl == ql):
            return f"decode row {i} has seq_len {sl} < 1 + k = {q} (seq_len counts context + the verify tokens)"
    # The capture helper adds the token budget to ModelShape; 0 / absent = unlimited.
    budget = getattr(model, "max_num_batched_tokens", 0) or 0
    tokens = batch.verify(k).num_tokens
    if budget and tokens > budget:
        return f"{tokens} tokens with verify rows exceed model max_num_batched_tokens {budget}"
    return None


def head_reasons(model: ModelShape, tp: int) -> list[str]:
    """Why `tp` cannot shard this model's heads (its family's rules, vLLM's), or []."""
    return family_spec(model.attention).layout_reasons(model, tp)
