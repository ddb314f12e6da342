"""A stale per-request tail under spec decode (DESIGN.md §11): the GDN builder writes the spec state
indices of the real rows, `[:n]`, and leaves the rest of its persistent buffer as the last build
left it, where vLLM's builder fills it with the padding. A FULL decode graph (keyed by request
count) then hands its padded rows the slots of requests a larger step had in those rows: the graph
updates a state that is nobody's now (a finished request's), or a live request's.

Reachable only where a verify step replays a padded decode graph after a step with more requests
(the step plan's count_ranks, backend/harness/steps.py); the capture's own rows are padding, so a
first padded replay reads padding. Not at k = 0 (the non-spec indices keep their padding), not in
PIECEWISE / NONE (no padded request rows), not for a mixed batch (never in a FULL graph).
tests/families/test_gdn_mutants.py pins where it is red.
"""

from __future__ import annotations

from backend.attention.gdn import GDNMetadataBuilder
from backend.providers.torch_gdn import TorchHybridGDNBackend


class _StaleSpecTailBuilder(GDNMetadataBuilder):
    def pad_indices(self, buf):
        if buf.dim() == 1:  # the non-spec indices [rows]: padded as they should be
            super().pad_indices(buf)
        # the spec indices [rows, 1 + k]: the tail keeps what a larger step wrote there


class StaleSpecTail(TorchHybridGDNBackend):
    name = "mutant-gdn-stale-spec-tail"
    gdn_builder_cls = _StaleSpecTailBuilder
