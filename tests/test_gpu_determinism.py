"""Same seed, same tokens, in every process, with the backend's deterministic mode
(``FLASHSAMPLING_DETERMINISTIC=1``): ``generate`` after ``hf.enable`` in fresh processes (fresh
Inductor and Triton caches) whose Inductor would pick other kernel configurations (its
benchmark timings inverted) draws the same tokens. GPU only (``pytest -m gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# A Qwen3-1.7B-shaped model cut to two layers (random bf16 weights), B = 8, generate's
# top-k 50: where runs once drew different tokens in rows 1-7 (benchmarks/probes/token_repro.py).
_CHILD = r"""
import torch, transformers
from flashsampling_inductor import hf

config = transformers.Qwen3Config(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=2,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = transformers.Qwen3ForCausalLM(config).eval()
torch.set_default_dtype(torch.float32)
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
prompt = torch.randint(1, 1000, (8, 16), device="cuda")
hf.enable(model)
torch.manual_seed(1)
out = model.generate(prompt, do_sample=True, temperature=0.7, top_k=50, max_new_tokens=32)
print("TOKENS", out[:, 16:].tolist())
"""


def _start(tmp_path, name: str, **env):
    caches = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / name / "triton"),
        "FLASHSAMPLING_DETERMINISTIC": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        env={**os.environ, **caches, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _tokens(process) -> str:
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-4000:]
    return next(line for line in stdout.splitlines() if line.startswith("TOKENS"))


def test_gpu_tokens_do_not_follow_inductors_timings(tmp_path):
    timed = _start(tmp_path, "timed")
    inverted = _start(tmp_path, "inverted", TORCHINDUCTOR_DISTORT_BENCHMARKING_RESULT="inverse")
    assert _tokens(timed) == _tokens(inverted)
