"""What the library keeps per process group, released before the group is destroyed.

``dist.destroy_process_group()`` hung after a fused TP ``generate`` (two H200s, torch 2.11,
2026-11-27 21:01 UTC: both ranks inside it for minutes). NCCL's communicator teardown waits
until every CUDA graph that captured one of its collectives is destroyed
(``commDestroySync`` spins while ``localPersistentRefs != 0``; pytorch issue 115388), and
the decode step compiled with ``mode="reduce-overhead"`` (hf.enable's, as transformers'
own) keeps its CUDA graphs, with the model's all-reduces in them, in torch.compile's
cudagraph trees for the life of the process, which ends only after the group's teardown.

``release()`` frees those graphs and what the TP op keeps per group (the symmetric-memory
exchange, the agreed generators, the cached group lookups). The first TP call on CUDA and
hf.enable's compiled step call ``release_before_destroy()``, which makes
``torch.distributed.destroy_process_group`` run ``release()`` first, so a fused program
exits as it would without the fusion, with nothing for the user to do.

Modules register what they keep with ``on_release``; this module imports none of them.
"""

from __future__ import annotations

import functools
import gc
import threading
import warnings
from collections.abc import Callable

import torch

__all__ = ["on_release", "release", "release_before_destroy"]

_RELEASES: list[Callable[[], None]] = []
_INSTALLED = threading.Lock()
_installed = False


def on_release(release_kept: Callable[[], None]) -> Callable[[], None]:
    """Register ``release_kept()``: drops what its module keeps per process group, which the
    module makes again (collectively, at a TP call every rank makes) when next needed."""
    _RELEASES.append(release_kept)
    return release_kept


def release() -> None:
    """Free what fused TP calls keep across calls: the CUDA graphs of this thread's cudagraph
    trees (``torch.compile(mode="reduce-overhead")``, which hold captured NCCL collectives
    and block the communicator's destruction), the symmetric-memory exchange and the
    per-group agreements. Runs by itself before ``dist.destroy_process_group``; call it
    yourself only to free them earlier. Call it on every rank alike: the next TP call makes
    the exchange again (a rendezvous of the group), and a compiled step records its CUDA
    graphs again. Nothing it frees may be in use: no graph that ran a TP call is replayed
    after it."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()  # no kernel of ours in flight while its state goes
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()
    for release_kept in _RELEASES:
        release_kept()
    gc.collect()  # (graph nodes and tensors in reference cycles go now, not at exit)
    if cuda:
        torch.cuda.synchronize()


def release_before_destroy() -> None:
    """Make ``torch.distributed.destroy_process_group`` call ``release()`` before it destroys
    any group (once per process; cheap to call again). Both names of the function are
    replaced: ``torch.distributed``'s and ``distributed_c10d``'s; a program that bound the
    function to a name of its own before this ran calls ``release()`` itself."""
    global _installed
    if _installed:
        return
    with _INSTALLED:
        if _installed:
            return
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        destroy = c10d.destroy_process_group

        @functools.wraps(destroy)
        def destroy_process_group(*args, **kwargs):
            try:
                release()
            except Exception as error:  # noqa: BLE001 - the group is destroyed all the same
                # (a CUDA context lost to a device assert fails every CUDA call here)
                warnings.warn(
                    f"flashsampling: releasing the TP state before destroy_process_group "
                    f"failed ({type(error).__name__}: {error}); destroying it anyway",
                    stacklevel=2,
                )
            return destroy(*args, **kwargs)

        destroy_process_group.__flashsampling_releases__ = True
        c10d.destroy_process_group = destroy_process_group
        dist.destroy_process_group = destroy_process_group
        _installed = True
