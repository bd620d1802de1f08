"""Run a function on every rank of a fresh process group: spawned CPU processes with gloo
(or NCCL on GPUs), as the tensor-parallel tests need. Each rank's return value (or its
exception, re-raised here with the rank named) comes back to the test."""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

# The environment every multi-GPU run takes (../shared/gpu/README.md): no NVLink multicast.
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def run_ranks(world_size: int, worker, *args, backend: str = "gloo", timeout_s: float = 300.0):
    """``worker(rank, world_size, *args)`` on each rank -> the list of their return values.

    ``timeout_s`` bounds each collective's wait and (plus a minute) each rank's whole run: a
    loaded CI machine (2 cores, test workers beside the ranks) can keep one rank compiling
    for minutes while the other waits."""
    os.environ.update(NO_MULTICAST)
    context = _context(backend, worker)
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init = f"file://{os.path.join(folder, 'rendezvous')}"
        processes = [
            context.Process(
                target=_main,
                args=(rank, world_size, backend, init, timeout_s, results, worker, args),
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        outcomes = {}
        try:
            for _ in processes:
                rank, ok, value = results.get(timeout=timeout_s + 60)
                outcomes[rank] = (ok, value)
        finally:
            for process in processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
    for rank in range(world_size):
        ok, value = outcomes[rank]
        if not ok:
            raise AssertionError(f"rank {rank} of {world_size} failed:\n{value}")
    return [pickle.loads(outcomes[rank][1]) for rank in range(world_size)]


def _context(backend: str, worker):
    """CUDA ranks are spawned. CPU ranks fork from a forkserver that imported torch and the
    test module once (seconds saved per rank on a busy machine); forking the test process
    itself could deadlock in an OpenMP pool it has used."""
    if backend == "nccl":
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "flashsampling_inductor", worker.__module__])
    return context


def _main(rank, world_size, backend, init, timeout_s, results, worker, args):
    try:
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=init,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        # Pickled here, by value: a tensor put on the queue as is would be shared through a
        # file descriptor that dies with this process.
        results.put((rank, True, pickle.dumps(worker(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
