"""transformers' flash-attention path for continuous batching, with the FlashAttention-2
kernels that PyTorch's CUDA builds ship (``aten::_flash_attention_forward``) standing in for the
``flash-attn`` package, which our GPU machines do not have.

Why: without a flash implementation, transformers' continuous batching runs ``paged|sdpa``,
which attends every query token of a step to the keys of EVERY request in the batch under a
[query tokens, all keys] mask (each request's cache gathered, its KV heads repeated, the
mask built on the host per request): at 128 requests of ~400 tokens each layer's attention is
a 128 x 51k problem and an 8B model's step takes ~100 ms on an H100 (bench_serving, 2026-11-28),
where its weights take ~5 ms to read. Its flash path (``flash_attention_2``) attends each
request to its own keys (variable-length), needs no mask and turns on transformers' CUDA
graphs and asynchronous batching by default. ``install()`` gives that path a varlen function
of torch's own kernels, under the implementation name ``NAME``: transformers' glue (its cache
update, its sequence lengths, its padding for CUDA graphs) is unchanged. Its decode fast path
(``flash_attn_with_kvcache`` on the block table) stays off: every step gathers the batch's
cached keys by index, as its varlen path does.

On the CPU the same op runs a per-request ``scaled_dot_product_attention`` loop (a dry run of
the wiring; host syncs there).
"""

from __future__ import annotations

import torch

NAME = "torch_flash"  # "flash" in it: transformers' flash rules; no 2 / 3: no decode fast path


@torch.library.custom_op("flashsampling_bench::flash_varlen", mutates_args=())
def flash_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """Attention of packed variable-length sequences: query [Tq, H, D], key and value [Tk,
    Hkv, D] (H a multiple of Hkv), sequence i the rows cu_seqlens[i]:cu_seqlens[i + 1];
    causal aligned to the bottom right (a request's new tokens after its cached ones).
    Rows past cu_seqlens_q[-1] (transformers' padding) are left unwritten."""
    if query.is_cuda:
        return torch.ops.aten._flash_attention_forward(
            query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            0.0, causal, False, scale=scale,
        )[0]  # fmt: skip
    out = torch.zeros_like(query)
    groups = query.shape[1] // key.shape[1]
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    spans_q = zip(bounds_q[:-1], bounds_q[1:], strict=True)
    spans_k = zip(bounds_k[:-1], bounds_k[1:], strict=True)
    for (q0, q1), (k0, k1) in zip(spans_q, spans_k, strict=True):
        if q1 == q0:
            continue
        q = query[q0:q1].transpose(0, 1)
        k = key[k0:k1].transpose(0, 1).repeat_interleave(groups, 0)
        v = value[k0:k1].transpose(0, 1).repeat_interleave(groups, 0)
        mask = None
        if causal:
            rows = torch.arange(q1 - q0).unsqueeze(1) + (k1 - k0) - (q1 - q0)
            mask = torch.arange(k1 - k0).unsqueeze(0) <= rows
        out[q0:q1] = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, scale=scale
        ).transpose(0, 1).to(out.dtype)  # fmt: skip
    return out


@flash_varlen.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal):
    return torch.empty_like(query)


@torch.library.custom_op(
    "flashsampling_bench::paged_flash_varlen", mutates_args=("key_cache", "value_cache")
)
def paged_flash_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    write_index: torch.Tensor,
    read_index: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
) -> torch.Tensor:
    """transformers 5.17's paged cache update (the step's new keys and values [Tn, Hkv, D]
    written at ``write_index`` of the layer's cache [pages, Hkv, D], the batch's keys read back
    at ``read_index``) and the causal varlen attention, in one op: opaque to Inductor, which
    otherwise compiles the read-back into a gather 3.5x slower than ATen's (H200, Llama-3.1-8B
    shape, B = 64: 111 against 31 us a call, twice a layer)."""
    key_cache.index_copy_(0, write_index, key)
    value_cache.index_copy_(0, write_index, value)
    if read_index.numel():  # else every request is a whole prefill: its keys are the new ones
        key = key_cache.index_select(0, read_index)
        value = value_cache.index_select(0, read_index)
    return flash_varlen(
        query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, True
    )


@paged_flash_varlen.register_fake
def _(query, key, value, key_cache, value_cache, write_index, read_index, *args):
    return torch.empty_like(query)


def paged_attention_forward(
    module, query, key, value, attention_mask, cache, cu_seq_lens_q, cu_seq_lens_k,
    max_seqlen_q, max_seqlen_k, block_table=None, **kwargs,
):  # fmt: skip
    """transformers 5.17's ``flash_paged.paged_attention_forward`` without a block table
    (query [1, H, Tq, D], key and value [1, Hkv, Tq, D]), its cache update and attention one
    op (``paged_flash_varlen``). -> ([Tq, H, D], None)."""
    if block_table is not None or getattr(module, "sliding_window", None):
        raise NotImplementedError("torch_flash: no block table, no sliding windows")
    if isinstance(cu_seq_lens_k, dict):
        cu_seq_lens_k, max_seqlen_k = (
            cu_seq_lens_k["full_attention"],
            max_seqlen_k["full_attention"],
        )
    group, index_in_group = cache.layer_index_to_group_indices[module.layer_idx]
    out = paged_flash_varlen(
        query.transpose(1, 2).squeeze(0).contiguous(),
        key.transpose(1, 2).squeeze(0).contiguous(),
        value.transpose(1, 2).squeeze(0).contiguous(),
        cache.key_cache[index_in_group],
        cache.value_cache[index_in_group],
        kwargs["write_index"][group],
        kwargs["read_index"][group],
        cu_seq_lens_q.to(torch.int32),
        cu_seq_lens_k.to(torch.int32),
        max_seqlen_q,
        max_seqlen_k,
        float(module.scaling),
    )
    return out, None


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
):  # fmt: skip
    """The ``flash_attn`` package's function of that name, as far as transformers calls it
    (its signature is what transformers reads to know which arguments to pass)."""
    if dropout_p:
        raise NotImplementedError("torch_flash: inference only (no dropout)")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError("torch_flash: no sliding windows")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return flash_varlen(
        q, k, v, cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32),
        max_seqlen_q, max_seqlen_k, scale, causal,
    )  # fmt: skip


def install() -> str:
    """Register ``NAME`` with transformers (its flash-attention code path, our varlen function);
    -> the name to pass to ``model.set_attn_implementation``. Idempotent."""
    from transformers import AttentionInterface
    from transformers import modeling_flash_attention_utils as flash_utils

    lazy_imports = flash_utils._lazy_imports
    if not getattr(lazy_imports, "_torch_flash", False):

        def imports_with_torch_flash(implementation, *args, **kwargs):
            if implementation is not None and implementation.endswith(NAME):
                from transformers.modeling_flash_attention_utils import _pad_input, _unpad_input

                return None, flash_attn_varlen_func, None, _pad_input, _unpad_input
            return lazy_imports(implementation, *args, **kwargs)

        imports_with_torch_flash._torch_flash = True
        flash_utils._lazy_imports = imports_with_torch_flash
    from transformers.integrations.flash_attention import flash_attention_forward

    AttentionInterface.register(NAME, flash_attention_forward)
    # transformers <= 5.22: continuous batching runs the "paged|" variant, which updates the
    # cache itself (5.24 updates it in the model, before the attention function).
    AttentionInterface.register(f"paged|{NAME}", paged_attention_forward)
    return NAME


def check(device: str = "cuda") -> float:
    """The op on ``device`` against its CPU loop (fp32) on packed bf16 requests of mixed
    lengths, grouped heads, causal: -> the largest absolute difference (printed)."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 32, 8, 128
    lengths_q = [1, 1, 7, 64, 1, 300]
    lengths_k = [1, 90, 7, 200, 513, 300]
    pad = 64 - sum(lengths_q) % 64  # transformers' padding under CUDA graphs: rows past the end
    cu_q = torch.tensor([0, *lengths_q]).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0, *lengths_k]).cumsum(0).to(torch.int32)
    query = torch.randn(sum(lengths_q) + pad, heads, dim, dtype=torch.bfloat16)
    key = torch.randn(sum(lengths_k), kv_heads, dim, dtype=torch.bfloat16)
    value = torch.randn(sum(lengths_k), kv_heads, dim, dtype=torch.bfloat16)
    args = (max(lengths_q), max(lengths_k), dim**-0.5, True)
    expected = flash_varlen(query, key, value, cu_q, cu_k, *args)[: cu_q[-1]].float()
    on = [x.to(device) for x in (query, key, value, cu_q, cu_k)]
    got = flash_varlen(*on, *args)[: cu_q[-1]].float().cpu()
    error = (got - expected).abs().max().item()
    print(f"torch_flash on {device}: max |op - CPU reference| = {error:.4f} (bf16 inputs)")
    return error


if __name__ == "__main__":
    if torch.cuda.is_available():
        print(torch.ops.aten._flash_attention_forward.default._schema)
        assert check() < 0.05
    else:
        print("torch_flash.py: no CUDA GPU, the CPU loop checked against itself only")
        check("cpu")
