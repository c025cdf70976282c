"""The names torch.distributed imports from the torchcomms package, so that a test can run torch's TorchComms mode
where the package cannot be installed (its PyPI name holds a placeholder that refuses to import). With this on
PYTHONPATH and TORCH_DISTRIBUTED_USE_TORCHCOMMS=1, torch's own code decides, per backend name, what TorchComms
handles: the names it reports as built go to new_comm, which fails here, so a test that passes shows that no group
of the test was routed through TorchComms."""

_BUILT = frozenset({"nccl", "ncclx", "rccl", "gloo", "xccl"})


def is_backend_built(name: str) -> bool:
    """Which backends the real package builds in (the ones torch then routes through TorchComms)."""
    return name in _BUILT


def new_comm(*args, **kwargs):
    raise RuntimeError(f"torchcomms stand-in: torch asked TorchComms for a communicator ({args!r}); a `tuned` group "
                       "must never be routed here")
