"""Tensor-parallel sampling through the compiler, on the CPU (gloo) or on GPUs (NCCL):

    torchrun --nproc_per_node=2 tp_demo.py

Each rank holds a vocabulary shard of a random LM head; the decode step gathers the sharded
logits and samples, as vLLM- or torchtitan-style code does. Compiled with
``backend="flashsampling"``, the gather and the sampling become one ``tp_fused_sample`` call:
the ranks exchange a few candidates per row instead of the [B, V] logits, and draw the same
tokens. The script prints the rewrite and every rank's tokens, for temperature sampling and
for gpt-fast's top-k (each rank then also sends its shard's k largest scores).
"""

from __future__ import annotations

import os

for _name, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ[_name] = _value  # never NVLink multicast
# On a CPU-only machine the pass leaves sampling stock by default (the fused op's CPU path is
# slower than stock Inductor's code); this demo asks for the rewrite there, to show it.
os.environ.setdefault("FLASHSAMPLING_CPU", "1")
os.environ.setdefault("FLASHSAMPLING_FP32", "1")  # (its fp32 head on GPUs too: op.FP32_SWITCH)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import flashsampling_inductor  # noqa: E402, F401  (registers backend="flashsampling")

BATCH, HIDDEN, VOCAB = 4, 64, 1000


def decode_step(hidden: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """The sharded LM head, the gather of its logits, temperature sampling."""
    logits = funcol.all_gather_tensor(
        hidden @ weight_shard.T, gather_dim=-1, group=dist.group.WORLD
    )
    probs = torch.softmax(logits[:, :VOCAB] / 0.8, dim=-1)
    return torch.multinomial(probs, num_samples=1)


def decode_step_top_k(hidden: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """The same gather, then gpt-fast's logits_to_probs with top_k = 50."""
    logits = funcol.all_gather_tensor(
        hidden @ weight_shard.T, gather_dim=-1, group=dist.group.WORLD
    )
    logits = logits[:, :VOCAB] / 0.8
    pivot = torch.topk(logits, 50)[0].select(-1, -1).unsqueeze(-1)
    logits = torch.where(logits < pivot, -float("Inf"), logits)
    return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)


def main() -> None:
    cuda = torch.cuda.is_available()
    rank = int(os.environ.get("RANK", 0))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()
    device = device or torch.device("cpu")
    generator = torch.Generator().manual_seed(0)  # the same problem on every rank
    hidden = torch.randn(BATCH, HIDDEN, generator=generator).to(device)
    shard = -(-VOCAB // world)  # padded to equal shards, as all_gather_into_tensor needs
    weight = torch.randn(world * shard, HIDDEN, generator=generator) * HIDDEN**-0.5
    weight_shard = weight[rank * shard : (rank + 1) * shard].to(device)

    for name, fn in (("temperature 0.8", decode_step), ("top-k 50", decode_step_top_k)):
        counters.clear()
        step = torch.compile(fn, backend="flashsampling")
        for call in range(3):
            tokens = step(hidden, weight_shard)
            gathered = [torch.empty_like(tokens) for _ in range(world)]
            dist.all_gather(gathered, tokens)
            if rank == 0:
                same = all(torch.equal(t, tokens) for t in gathered)
                print(
                    f"{name}, step {call}: tokens {tokens.flatten().tolist()}, the same on all"
                    f" {world} ranks: {same}"
                )
        if rank == 0:
            print(f"{name}: rewrites {dict(counters['flashsampling'])}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
