"""flashsampling_inductor: exact LLM token sampling fused into the LM-head matmul.

``fused_sample`` is the operator; ``flashsampling_backend`` (also ``backend="flashsampling"``)
is stock Inductor plus one graph pass that rewrites sampling idioms into calls of it;
``explain`` says which sampling ops of a function it rewrote, and why not.
"""

from .backend import flashsampling_backend
from .explain import explain
from .op import fused_sample, sample_logits
from .tp import tp_fused_sample

__all__ = ["explain", "flashsampling_backend", "fused_sample", "sample_logits", "tp_fused_sample"]
