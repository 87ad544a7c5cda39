"""`nvidia-smi topo -m` parsing on the fixtures in tests/data/topology (every NAME.txt with
its NAME.expected.json), placement on NVLink-connected GPUs, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.gpu.topology import (
    GpuInfo,
    Topology,
    TopologyError,
    parse_cpu_list,
    parse_gpu_list,
    parse_topology,
)

FIXTURES = Path(__file__).parents[1] / "data" / "topology"
CASES = sorted(p.name.removesuffix(".expected.json") for p in FIXTURES.glob("*.expected.json"))


def test_every_fixture_has_its_expectations():
    assert {p.stem for p in FIXTURES.glob("*.txt")} == set(CASES)
    assert len(CASES) >= 5


@pytest.mark.parametrize("name", CASES)
def test_fixture(name: str):
    topology = parse_topology((FIXTURES / f"{name}.txt").read_text())
    expected = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    assert topology.indexes == list(range(expected["gpus"]))
    assert topology.groups() == expected["groups"]
    for pair, width in expected["nvlinks"].items():
        a, b = map(int, pair.split("-"))
        assert topology.nvlinks(a, b) == topology.nvlinks(b, a) == width, pair
    assert [g.numa for g in topology.gpus] == expected["numa"]
    assert {len(g.cpus) for g in topology.gpus} == {expected["cpus_per_gpu"]}
    for gpu, nics in expected["nearest_nics"].items():
        assert topology.gpu(int(gpu)).nearest_nics == nics, gpu
    for nic, name_ in expected["nic_names"].items():
        assert topology.nic_names[nic] == name_
    for count, chosen in expected["place"].items():
        assert topology.place(int(count)) == chosen, count
    # What is recorded in the database reads back the same.
    again = Topology.from_dict(json.loads(json.dumps(topology.to_dict())))
    assert again == topology and again.groups() == topology.groups()


def test_tabs_and_spaces_read_the_same():
    text = (FIXTURES / "a100-pcie-4gpu-bridged.txt").read_text()
    spaced = parse_topology(text.replace("\t", "    "))
    assert spaced == parse_topology(text)


def test_terminal_underlining_is_ignored():
    text = (FIXTURES / "a100-pcie-4gpu-bridged.txt").read_text()
    header, rest = text.split("\n", 1)
    underlined = "\x1b[4m" + header + "\x1b[0m\n" + rest
    assert parse_topology(underlined).groups() == [[0, 1], [2, 3]]


def test_placement_takes_only_free_gpus_and_prefers_one_numa_node():
    topology = parse_topology((FIXTURES / "h100-sxm5-8gpu-nvswitch.txt").read_text())
    assert topology.place(2, free=[1, 3, 4]) == [1, 3]  # same NUMA node beats lower numbers
    assert topology.place(3, free=[1, 3, 4]) == [1, 3, 4]
    assert topology.place(4, free=[1, 3, 4]) is None
    mesh = parse_topology((FIXTURES / "v100-sxm2-8gpu-cube-mesh.txt").read_text())
    # 0 and 5 are in one NVLink group but share no link: never placed together.
    assert mesh.place(2, free=[0, 5]) is None
    assert mesh.place(2, free=[0, 5, 7]) == [5, 7]
    with pytest.raises(ValueError):
        mesh.place(0)


def test_gpu_list_joins_the_topology():
    text = (
        "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559\n"
        "1, GPU-bbbb, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 81559\n"
    )
    infos = parse_gpu_list(text)
    assert infos[1] == GpuInfo(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0", 81559)
    topology = parse_topology((FIXTURES / "workstation-2gpu-pasted.txt").read_text())
    joined = topology.with_info(infos)
    assert joined.gpu(1).info.uuid == "GPU-bbbb"
    assert Topology.from_dict(joined.to_dict()) == joined


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("No devices were found\n", "no header line with GPU0"),
        ("\tGPU0\tGPU1\tCPU Affinity\n", "no GPU rows"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tSYS\t X \n", "disagree on their NVLink"),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tSYS\t X \n", "line 2: GPU0 has 1 cells for 2"),
        ("\tGPU0\tGPU1\nGPU0\tSYS\t X \nGPU1\tSYS\t X \n", "should be X against itself"),
        ("\tGPU0\tGPU1\nGPU0\t X \tSYS\n", "do not match the header's GPU columns"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-a\n", "CPU affinity '0-a'"),
    ],
)
def test_bad_output_is_named(text: str, message: str):
    with pytest.raises(TopologyError, match=message):
        parse_topology(text)


def test_cpu_lists():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []
    with pytest.raises(ValueError, match="descending"):
        parse_cpu_list("5-2")
    with pytest.raises(TopologyError, match="line 1"):
        parse_gpu_list("GPU 0: H100 (UUID: GPU-x)\n")
