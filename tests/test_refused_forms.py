"""Sampling forms the pass knows and leaves to stock Inductor (``patterns.REFUSED``): each is
a site with its reason, warned about like any unfused sampling op after an LM head, never a
silent miss; the same op that draws nothing is no site."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashsampling_inductor import explain, patterns

from .catalog_checks import assert_left_alone

D, V = 24, 1000
torch.manual_seed(0)
WEIGHT = torch.randn(V, D)
h = torch.randn(3, D)


def inverse_cdf(h):
    probs = torch.softmax(F.linear(h, WEIGHT) / 0.7, dim=-1)
    return torch.searchsorted(probs.cumsum(-1), torch.rand(h.shape[0], 1))


def bucketed_logits(h):  # searchsorted of no random numbers: no draw
    edges = torch.linspace(-3, 3, 7).expand(h.shape[0], 7).contiguous()
    return torch.searchsorted(edges, F.linear(h, WEIGHT))


def test_inverse_cdf_is_left_alone_with_its_reason():
    assert_left_alone(inverse_cdf, h, reason="inverse-CDF sampling")


def test_inverse_cdf_is_reported_unfused():
    report = str(explain(inverse_cdf, h))
    assert report.startswith("flashsampling: 0 of 1 sampling op(s) fused"), report
    assert "inverse_cdf" in report


def test_a_searchsorted_that_draws_nothing_is_no_site():
    assert str(explain(bucketed_logits, h)).startswith("flashsampling: no sampling op"), str(
        explain(bucketed_logits, h)
    )


def test_refused_modules_live_in_the_catalog_folder():
    """The pass's uuid hashes the catalog folder: a refusal added there invalidates cached
    graphs as an idiom does."""
    folder = patterns.__file__.rsplit("/", 1)[0]
    assert all(module.__file__.rsplit("/", 1)[0] == folder for module in patterns.REFUSED)
