"""A user's attention backend, "before the change": the correct torch provider under its own name.
plugin_v2.py is the same class name "after the change" (the PR #22721 bug as it was), so both produce the
same case ids and a baseline comparison can tell what the change broke."""

from backend.providers.torch_backend import TorchBackend


class MyBackend(TorchBackend):
    name = "my-backend"
