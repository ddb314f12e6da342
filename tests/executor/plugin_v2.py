"""plugin_v1.MyBackend after a change that branches in Python on max_query_len (frozen at capture)."""

from tests.mutants.frozen_branch import Backend as _FrozenBranch


class MyBackend(_FrozenBranch):
    name = "my-backend"
