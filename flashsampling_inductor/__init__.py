"""flashsampling_inductor: exact LLM token sampling fused into the LM-head matmul.

``fused_sample`` is the operator; ``flashsampling_backend`` (also ``backend="flashsampling"``)
is stock Inductor plus one graph pass that rewrites sampling idioms into calls of it.
"""

from .backend import flashsampling_backend
from .op import fused_sample
from .tp import tp_fused_sample

__all__ = ["flashsampling_backend", "fused_sample", "tp_fused_sample"]
