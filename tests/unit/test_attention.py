from __future__ import annotations

import pytest

from factory.generate.attention import Capabilities, choose

H200 = Capabilities(cuda=True, compute_capability=(9, 0), flash_attn_2=True, flash_attn_3=True)
A100 = Capabilities(cuda=True, compute_capability=(8, 0), flash_attn_2=True, flash_attn_3=True)
BARE_GPU = Capabilities(
    cuda=True, compute_capability=(9, 0), flash_attn_2=False, flash_attn_3=False
)
CPU = Capabilities(cuda=False, compute_capability=None, flash_attn_2=False, flash_attn_3=False)


@pytest.mark.parametrize(
    ("caps", "dense", "expected", "why"),
    [
        (H200, False, "_flash_3", "Hopper"),
        (A100, False, "flash", "flash-attn 2"),
        (BARE_GPU, False, "native", "not installed"),
        (H200, True, "native", "dense attention mask"),
        (CPU, False, "native", "no CUDA"),
    ],
)
def test_the_fastest_backend_that_fits(caps, dense, expected, why):
    backend, reason = choose(caps, dense_mask=dense)
    assert backend == expected and why in reason


def test_override_and_bad_override():
    assert choose(CPU, override="flash") == ("flash", "chosen by FACTORY_ATTENTION_BACKEND")
    with pytest.raises(ValueError, match="not one of"):
        choose(CPU, override="sparse")


def test_probe_on_this_machine():
    caps = Capabilities.probe("cpu")
    assert caps.cuda is False and choose(caps)[0] == "native"
