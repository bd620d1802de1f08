"""Run a function on every rank of a fresh process group: spawned CPU processes with gloo
(or NCCL on GPUs), as the tensor-parallel tests need. Each rank's return value (or its
exception, re-raised here with the rank named) comes back to the test."""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import sys
import tempfile
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

# The environment every multi-GPU run takes (../shared/gpu/README.md): no NVLink multicast.
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# Seconds a rank may take to exit after its result (destroy_process_group and interpreter
# exit): NCCL's teardown takes a second or two; one that hangs (a CUDA graph holding captured
# collectives, docs/tp.md) dumps its threads' stacks and fails the test.
EXIT_S = float(os.environ.get("FLASHSAMPLING_TP_EXIT_S", "30"))
# How long the last run_ranks call's ranks took to exit, slowest first (the GPU job logs it).
last_exit_s: list[float] = []


def run_ranks(
    world_size: int,
    worker,
    *args,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    exit_s: float = EXIT_S,
    clean_exit: bool = True,
):
    """``worker(rank, world_size, *args)`` on each rank -> the list of their return values.

    ``timeout_s`` bounds each collective's wait and (plus a minute) each rank's whole run: a
    loaded CI machine (2 cores, test workers beside the ranks) can keep one rank compiling
    for minutes while the other waits. A rank that does not exit cleanly (exit code 0)
    within ``exit_s`` seconds of the last result fails the call, its stacks in its stderr
    (``clean_exit=False``: it is only killed, for a test whose rank loses its CUDA context)."""
    os.environ.update(NO_MULTICAST)
    context = _context(backend, worker)
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init = f"file://{os.path.join(folder, 'rendezvous')}"
        processes = [
            context.Process(
                target=_main,
                args=(rank, world_size, backend, init, timeout_s, exit_s, results, worker, args),
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        outcomes, exits = {}, {}
        try:
            for _ in processes:
                rank, ok, value = results.get(timeout=timeout_s + 60)
                outcomes[rank] = (ok, value)
        finally:
            exits = _join(processes, exit_s + 10)
    for rank in range(world_size):
        ok, value = outcomes[rank]
        if not ok:
            raise AssertionError(f"rank {rank} of {world_size} failed:\n{value}")
    last_exit_s[:] = sorted((seconds for _, seconds in exits.values()), reverse=True)
    print(
        f"tp_ranks: the {world_size} ranks of {worker.__name__} exited {last_exit_s[0]:.1f} s "
        f"after their results (exit codes {[code for code, _ in exits.values()]})",
        file=sys.stderr,
        flush=True,
    )
    unclean = {rank: code for rank, (code, _) in exits.items() if code != 0}
    if unclean and clean_exit:
        raise AssertionError(
            f"rank(s) {sorted(unclean)} of {world_size} did not exit cleanly within {exit_s:.0f}"
            f" s of their result (exit codes {unclean}; None: killed, 1: the teardown hung and"
            " dumped its stacks to stderr)"
        )
    return [pickle.loads(outcomes[rank][1]) for rank in range(world_size)]


def _join(processes, bound_s: float) -> dict[int, tuple[int | None, float]]:
    """Rank -> (exit code, None where it had to be killed; seconds it took to exit)."""
    started, exits = time.monotonic(), {}
    for rank, process in enumerate(processes):
        process.join(timeout=max(0.0, bound_s - (time.monotonic() - started)))
        code = process.exitcode
        if process.is_alive():
            process.kill()
            process.join()
            code = None
        exits[rank] = (code, time.monotonic() - started)
    return exits


def _context(backend: str, worker):
    """CUDA ranks are spawned. CPU ranks fork from a forkserver that imported torch and the
    test module once (seconds saved per rank on a busy machine); forking the test process
    itself could deadlock in an OpenMP pool it has used."""
    if backend == "nccl":
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "flashsampling_inductor", worker.__module__])
    return context


def _main(rank, world_size, backend, init, timeout_s, exit_s, results, worker, args):
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
        # A teardown that hangs names where (every thread's stack) and exits with code 1.
        faulthandler.dump_traceback_later(exit_s, exit=True)
        if dist.is_initialized():
            started = time.monotonic()
            dist.destroy_process_group()
            print(f"tp_ranks: rank {rank} destroyed its process group in "
                  f"{time.monotonic() - started:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
