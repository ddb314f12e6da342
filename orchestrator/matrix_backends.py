"""The backend stage of loading a matrix: resolve each backend name of the file (or --backend) to
its declared Capabilities, refuse a family no backend implements or a feature a shape needs that
its backend lacks, and give a case's backend skip reasons.

Split out of orchestrator/matrix.py, whose _Loader inherits BackendChecks; it is the one stage that
may import backend classes (and torch with them), so load_matrix(backend_checks=False) never calls it.
"""

from __future__ import annotations

from typing import Any

from backend.attention.support import unavailable
from backend.case import Case, ModelShape
from backend.families.contract import spec as family_spec
from orchestrator import matrix_schema as S
from orchestrator.errors import InputError


class BackendChecks:
    """The backend checks of orchestrator/matrix.py's _Loader (which provides what is declared here)."""

    doc: S.MatrixDoc
    device_class: str
    _backends: dict[tuple[str, str], Any]
    _unavailable: dict[tuple[str, str], str | None]

    @property
    def families(self) -> list[str]:
        raise NotImplementedError

    def model_of(self, family: str) -> ModelShape:
        raise NotImplementedError

    def family_axes(self, family: str) -> dict[str, list]:
        raise NotImplementedError

    def err(self, loc: tuple, message: str) -> InputError:
        raise NotImplementedError

    def backend_class(self, name: str, family: str, loc: tuple | None) -> Any:
        """The backend's Capabilities for one family (declared for builtins: no torch import; a
        plugin's class is imported and read), or None when the provider does not implement the
        family (its cases are skipped with family_reason's words)."""
        key = (name, family)
        if key not in self._backends:
            from backend.attention.registry import (
                BackendLoadError,
                check_explicit,
                check_name,
                family_reason,
                get_capabilities,
            )

            if family_reason(name, family):
                self._backends[key] = None
                return None
            try:
                if loc is None:  # --backend: what is a skip in a matrix may be bad input here
                    check_explicit(name)
                else:
                    check_name(name)
                self._backends[key] = get_capabilities(name, family)
            except BackendLoadError as e:
                if loc is None:
                    raise InputError(f"{e}", source="--backend") from None
                raise self.err(loc, f"{e}") from None
        return self._backends[key]

    def check_families_have_backends(self, override: str | None) -> None:
        """Each family of the matrix needs a backend that implements it (a whole family skipped for
        want of one is a mistake in the file). `--backend` instead only has to load: a family it
        does not implement is its cases' skip reason (backend_reasons), as a plugin's always was,
        so `--filter` decides which families are in question."""
        from backend.attention.registry import family_reason

        if override is not None:
            for family in self.families:
                if not family_reason(override, family):
                    self.backend_class(override, family, None)  # a name that does not load: exit 2
            return
        for i, family in enumerate(self.families):
            names = self.family_axes(family)["backend"]
            ok = [
                n
                for n in names
                if not family_reason(n, family) and self._implements(n, family, self._backend_loc(n, family))
            ]
            if not ok:
                where = (
                    ("families", family, "axes", "backend")
                    if family in self.doc.families and self.doc.families[family].axes.backend
                    else ("axes", "backend")
                )
                raise self.err(
                    where,
                    f"no backend here implements the {family} attention family "
                    f"({', '.join(names)}); axes.attention[{i}] names it",
                )

    def feature_reason(self, name: str, family: str, caps: Any) -> str | None:
        """Why backend `name` (which implements `family`) cannot run this matrix's shape of it: a
        feature the shape needs that the backend lacks (swa_sinks with sinks: 1), or None."""
        needs = set(family_spec(family).requires(self.model_of(family)))
        missing = sorted(needs - set(getattr(caps, "features", ()) or ()))
        if not missing:
            return None
        return f"{name} has no {', '.join(missing)}, which the {family} model asks for (its {'/'.join(missing)}: 1)"

    def check_features(self) -> None:
        """A backend of the file without a feature its family's shape needs is a mistake in the
        file: one line at its entry. (A `--backend` without it skips those cases instead.)"""
        for family in self.families:
            for name in self.family_axes(family)["backend"]:
                caps = self.backend_class(name, family, self._backend_loc(name, family))
                if caps is None or getattr(caps, "family", "gqa") != family:
                    continue  # does not implement the family: its cases are skips, with that reason
                why = self.feature_reason(name, family, caps)
                if why:
                    raise self.err(self._backend_loc(name, family), why)

    def _implements(self, name: str, family: str, loc: tuple | None) -> bool:
        """Whether `name` implements `family` (loc None: named by --backend, checked as bad input)."""
        caps = self.backend_class(name, family, loc)
        return caps is not None and getattr(caps, "family", "gqa") == family

    def _backend_loc(self, name: str, family: str) -> tuple:
        block = self.doc.families.get(family)
        if block is not None and block.axes.backend and name in block.axes.backend:
            return ("families", family, "axes", "backend", block.axes.backend.index(name))
        return (
            ("axes", "backend", self.doc.axes.backend.index(name))
            if name in self.doc.axes.backend
            else ("axes", "backend")
        )

    def backend_reasons(self, case: Case) -> list[str]:
        from backend.attention.registry import family_reason

        why = family_reason(case.backend, case.attention)
        if why:
            return [f"unsupported: {why}"]
        caps = self.backend_class(case.backend, case.attention, self._backend_loc(case.backend, case.attention))
        label = case.backend_label
        if getattr(caps, "family", "gqa") != case.attention:
            return [f"unsupported: {label} implements the {caps.family} attention family, not {case.attention}"]
        feature = self.feature_reason(case.backend, case.attention, caps)  # only a --backend gets here
        reasons = [f"unsupported: {feature}"] if feature else []
        if case.kv_cache_dtype not in caps.kv_cache_dtypes:
            reasons.append(f"{label} does not support kv_cache_dtype {case.kv_cache_dtype}")
        if case.model.dtype not in caps.dtypes:
            reasons.append(f"{label} does not support dtype {case.model.dtype}")
        key = (case.backend, case.attention)
        if key not in self._unavailable:
            self._unavailable[key] = unavailable_reason(case.backend, caps, self.device_class, case.attention)
        why = self._unavailable[key]
        if why:
            reasons.append(unavailable(why))
        return reasons


def unavailable_reason(name: str, caps: Any, device_class: str, family: str = "gqa") -> str | None:
    """Why backend `name` cannot run on this device class, or None; where the declaration cannot
    tell without the class (ASK_CLASS), the class is imported and asked."""
    from backend.attention.capabilities import ASK_CLASS, of_class

    why = caps.unavailable_reason(device_class)
    if why == ASK_CLASS:
        from backend.attention.registry import get_backend

        why = of_class(get_backend(name, family), name).unavailable_reason(device_class)
    return why
