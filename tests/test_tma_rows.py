"""The TMA row padding (sampling_device.rows_for_tma): zero rows up to the tile's multiple,
the input itself when none are needed. The kernels' tokens with it are checked on a GPU
(test_gpu_op.py, batches 100-200)."""

import torch

from flashsampling_inductor.sampling_device import rows_for_tma


def test_rows_padded_with_zeros_to_the_tile_multiple():
    hidden = torch.randn(144, 32, dtype=torch.bfloat16)
    padded = rows_for_tma(hidden, 64)
    assert padded.shape == (192, 32) and padded.is_contiguous()
    assert torch.equal(padded[:144], hidden)
    assert not padded[144:].any()


def test_a_multiple_of_the_tile_is_left_as_it_is():
    hidden = torch.randn(128, 32)
    assert rows_for_tma(hidden, 64) is hidden
