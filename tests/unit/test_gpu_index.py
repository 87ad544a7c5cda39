"""`factory worker --gpu N`: N is the process's own view of the GPUs (generate/devices.py)."""

from __future__ import annotations

import re

import pytest

from factory.generate.devices import GpuNotUsable, choose_device, visible_list

ONE_CARD = (1, "nvidia-smi lists 1 GPU(s) here: 0")
NONE_HERE = (0, "nvidia-smi not found: no NVIDIA driver here")


def test_without_cuda_visible_devices_n_is_nvidia_smis_index_here() -> None:
    assert choose_device(1, None, 2, "two", allow_cpu=False).cuda_visible_devices == "1"
    assert choose_device(0, None, *ONE_CARD, allow_cpu=False).cuda_visible_devices == "0"


def test_a_container_with_one_card_has_only_gpu_0() -> None:
    """compose's device_ids: ["1"]: the container sees that card as GPU 0; --gpu 1 would have
    set CUDA_VISIBLE_DEVICES=1, a GPU the process cannot see (it ran on the CPU, silently)."""
    with pytest.raises(GpuNotUsable) as refused:
        choose_device(1, None, *ONE_CARD, allow_cpu=False)
    message = str(refused.value)
    assert "GPU 1 is not visible" in message and "lists 1 GPU(s) here: 0" in message
    assert "--gpu 0" in message


def test_an_inherited_cuda_visible_devices_is_indexed_not_replaced() -> None:
    for inherited, requested, expected in (("0", 0, "0"), ("2,3", 0, "2"), ("2,3", 1, "3"),
                                           ("GPU-8a1f,GPU-77c2", 1, "GPU-77c2"),
                                           (" 5 , 6", 1, "6")):  # fmt: skip
        chosen = choose_device(requested, inherited, 8, "eight", allow_cpu=False)
        assert chosen.cuda_visible_devices == expected, (inherited, requested)
        assert not chosen.on_cpu and chosen.note is None


def test_an_index_outside_the_inherited_list_is_refused_naming_it() -> None:
    with pytest.raises(GpuNotUsable) as refused:
        choose_device(1, "0", 8, "nvidia-smi lists 8", allow_cpu=False)
    message = str(refused.value)
    assert "GPU 1 is not visible" in message and "CUDA_VISIBLE_DEVICES='0'" in message
    assert "it sees 1 GPU(s), --gpu 0)" in message
    with pytest.raises(GpuNotUsable, match=re.escape("it sees 2 GPU(s), --gpu 0 to --gpu 1")):
        choose_device(2, "4,5", 8, "eight", allow_cpu=False)


@pytest.mark.parametrize("inherited", ["", "-1", "none", "NoDevFiles"])
def test_an_inherited_value_that_hides_every_gpu_means_no_gpu(inherited: str) -> None:
    assert visible_list(inherited) == []
    with pytest.raises(GpuNotUsable, match="no GPU is visible here"):
        choose_device(0, inherited, 4, "four", allow_cpu=False)


def test_no_gpu_refuses_unless_the_cpu_is_allowed() -> None:
    with pytest.raises(GpuNotUsable) as refused:
        choose_device(0, None, *NONE_HERE, allow_cpu=False)
    message = str(refused.value)
    assert "nvidia-smi not found" in message
    assert "--allow-cpu" in message and "FACTORY_WORKER_ALLOW_CPU=1" in message
    allowed = choose_device(0, None, *NONE_HERE, allow_cpu=True)
    assert allowed.on_cpu and allowed.cuda_visible_devices == ""
    assert allowed.note and "on the CPU" in allowed.note
    # Allowed on the CPU: an index that is not visible runs there too, and says so.
    elsewhere = choose_device(3, "0", 1, "one", allow_cpu=True)
    assert elsewhere.on_cpu and "--gpu 3" in (elsewhere.note or "")
    # A visible GPU is used even when the CPU is allowed.
    assert choose_device(0, "0", 1, "one", allow_cpu=True).cuda_visible_devices == "0"
