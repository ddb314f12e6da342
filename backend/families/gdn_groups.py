"""hybrid_gdn's KV-cache groups over one shared common metadata (backend/attention/groups.py), with
the two things its state check needs to turn a broken builder into a verdict rather than an error.

- A capture build that writes the shared metadata. The groups' builders all read one
  query_start_loc (device and host), one seq_lens, one query_lens; a builder that mutates them in
  place during its capture build (a ROCm GDN builder zeroing query_start_loc) hands every later
  group's builder wrong counts, which that builder's graph freezes. The mutation is left to take
  its effect, as in vLLM; each capture build compares the shared tensors before and after every
  group's build and keeps what changed, by the capture's token count, and a step's build for a
  FULL graph of that size carries it (`capture_problems`): gdn_state's graph check names it.
- Metadata whose rows cannot hold the step's tokens (`uncovered`): a later group given zeroed
  offsets under spec decode classes its 1 + k token rows as one-token decodes, so its decode rows
  cover a third of the tokens; a GDN kernel handed that fails on shapes (a harness ERROR) or
  reads past its rows. The family skips the core for such a layer (its output zeros: what the
  graph then replays) and the checks report what followed.
"""

from __future__ import annotations

import dataclasses

import torch

from backend.attention.groups import GroupedMetadataBuilder, LayerMetadata

# The common metadata's tensors every group's builder reads (the runner's, one set for the model).
SHARED = ("query_start_loc", "query_start_loc_cpu", "seq_lens", "seq_lens_cpu", "query_lens")


def uncovered(md, tokens: int) -> str | None:
    """Why a decode-only GDN metadata's state rows cannot hold `tokens` (a non-spec decode row holds
    one token, a spec row 1 + k); None when they can, or when it has prefill rows (no FULL graph)."""
    if getattr(md, "num_prefills", 1) != 0:
        return None
    if getattr(md, "num_spec_decodes", 0):
        name = "spec_state_indices_tensor"
    elif getattr(md, "num_decodes", 0):
        name = "non_spec_state_indices_tensor"
    else:
        return None
    idx = getattr(md, name, None)
    if idx is None:
        return None
    per = idx.shape[1] if idx.dim() == 2 else 1
    if idx.shape[0] * per >= tokens:
        return None
    return (
        f"{name} has {idx.shape[0]} rows of {per} token{'s' if per != 1 else ''} for the step's {tokens} tokens "
        f"({md.num_spec_decodes} spec decodes, {md.num_decodes} decodes)"
    )


class StateGroupsBuilder(GroupedMetadataBuilder):
    """GroupedMetadataBuilder that notes a group's capture build writing the shared metadata."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.capture_problems: dict[int, tuple[str, ...]] = {}  # capture token count -> what its build wrote

    def _per_group(self, common, capture: bool) -> LayerMetadata:
        if not capture:
            return super()._per_group(common, capture)
        built, problems = [], []
        for g, builder in enumerate(self.builders):
            before = {name: getattr(common, name).clone() for name in SHARED}
            cm = dataclasses.replace(
                common,
                block_table_tensor=self.block_tables[g][: common.num_padded_reqs],
                slot_mapping=self.slot_mappings[g][: common.num_padded_tokens],
            )
            built.append(builder.build_for_capture(cm))
            changed = [name for name in SHARED if not torch.equal(before[name], getattr(common, name))]
            later = [grp.name for grp in self.groups[g + 1 :]]
            if changed and later:
                problems.append(
                    f"group {self.groups[g].name}'s capture build wrote the shared {', '.join(changed)}, "
                    f"which {', '.join(later)} then built from"
                )
        self.capture_problems[common.num_padded_tokens] = tuple(problems)
        return LayerMetadata(built[g] for g in self.layer_group)

    def build(self, batches, num_padded_tokens=None, num_padded_reqs=None) -> LayerMetadata:
        md = super().build(batches, num_padded_tokens, num_padded_reqs)
        # A FULL graph's replay (the padded sizes given): what its capture build wrote.
        md.capture_problems = self.capture_problems.get(num_padded_tokens, ()) if num_padded_tokens else ()
        return md
