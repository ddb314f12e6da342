"""vllm:GDN_ATTN broken on purpose (backend/adapters/vllm/gdn.py): vLLM's GDN builder run as in an
engine without full graphs (use_full_cuda_graph False), which stages nothing in its persistent
buffers. The "metadata not in persistent buffers" class of DESIGN.md §6, on vLLM's own builder.
Where it bites (found by running it): k > 0 FULL decode graphs, whose capture build derives the
accepted counts from the capture batch's query_start_loc into a fresh tensor the graph then
keeps (every verify row reads column 1 + k - 1 at replay). At k = 0 the unstaged metadata are
views of the runner's persistent block table and query_start_loc: still right at replay."""

from __future__ import annotations

from backend.adapters.vllm.gdn import VllmGDNBuilder, make_gdn_backend


class _UnstagedBuilder(VllmGDNBuilder):
    def __init__(self, config):
        super().__init__(config)
        self.vllm_builder.use_full_cuda_graph = False


class Unstaged(make_gdn_backend()):
    name = "mutant-vllm-gdn-unstaged"
    gdn_builder_cls = _UnstagedBuilder
