"""plugin_v1.MyBackend after the PR #22721 change, as it really was (DESIGN.md §4a): it declares
ALWAYS and its prefill branch builds metadata per step, so every FULL graph (captured with host
max_query_len = N, i.e. on the prefill branch) replays stale metadata for its prefill rows."""

from tests.mutants.seed_aiter_fa import Backend as _Seed


class MyBackend(_Seed):
    name = "my-backend"
