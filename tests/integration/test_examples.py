"""The examples as a newcomer uses them: every manifest in examples/ validates on a fresh home
(its assets beside it), and a video of the nightly batch passes its own quality gate end to end.

The whole nightly batch (8 videos of two minutes, 20-30 minutes here) is `.ci/run`'s second
half, after the suite (`scripts/demo` on a fresh home: all 8 must be delivered). Here one of
its videos runs as the file defines it, cut to its first 40 seconds (two of its three scenes,
its cut to a new shot, its audio bed, its three renditions and its quality gate at the
nightly resolution, fps and segment length): market-day, the one whose drift check once
failed the gate on procedural content."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import av
import pytest
import yaml

from factory.media.images import load_image
from tests.conftest import REPO, embedded_env, run_cli
from tests.integration.test_shots import psnr_y

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("manifest", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_validates_as_it_is(tmp_path: Path, manifest: Path):
    env = embedded_env(tmp_path / "home")
    shown = run_cli("validate", str(manifest), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    videos = yaml.safe_load(manifest.read_text())["videos"]
    jobs = json.loads(shown.stdout)
    assert [j["video_id"] for j in jobs] == [v["id"] for v in videos]
    for job in jobs:  # beds, cues and pictures beside the manifest: named by their content
        audio = job["audio"] or {}
        named = [audio.get("asset"), *(cue["asset"] for cue in audio.get("cues", [])),
                 *(s[kind]["asset"] for s in job["scenes"] for kind in ("image", "camera")
                   if kind in s)]  # fmt: skip
        assert all(a.startswith("assets/sha256/") for a in named if a is not None), audio
    assert not (tmp_path / "home" / "store").exists() or not any(
        (tmp_path / "home" / "store").rglob("*.ogg")
    )  # validate writes nothing


def test_a_nightly_video_is_delivered_as_the_example_defines_it(tmp_path: Path):
    nightly = yaml.safe_load((REPO / "examples" / "nightly.yaml").read_text())
    nightly["videos"] = [v for v in nightly["videos"] if v["id"] == "market-day"]
    video = nightly["videos"][0]
    video["duration"] = 40
    video["scenes"] = [scene for scene in video["scenes"] if scene["start"] < 40]
    assert len(video["scenes"]) == 2
    folder = tmp_path / "examples"
    shutil.copytree(REPO / "examples" / "assets", folder / "assets")
    manifest = folder / "nightly-one.yaml"
    manifest.write_text(yaml.safe_dump(nightly, sort_keys=False))
    env = embedded_env(tmp_path / "home")
    done = run_cli("run", str(manifest), env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 of 1 videos delivered" in done.stdout
    status = json.loads(run_cli("status", "nightly.market-day", "--json", env=env).stdout)
    assert status["stage"] == "done"
    assert status["progress"]["qc"]["passed"] is True
    # its second scene starts a new shot with a cut, judged as a cut by its gate
    assert video["scenes"][1]["join"] == "cut"
    report = json.loads((tmp_path / "home/store/nightly/market-day/qc.json").read_text())
    [cut] = report["cuts"]
    assert cut["seconds"] == 35.0 and cut["passed"] and "transition" not in cut


def test_the_production_example_delivers_its_sound_as_defined(tmp_path: Path):
    """examples/production.yaml as it is: a first frame and a reference picture, cues over a
    bed and over silence, each video brought to its delivery profile's loudness in every
    rendition."""
    env = embedded_env(tmp_path / "home")
    done = run_cli("run", str(REPO / "examples" / "production.yaml"), env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 of 2 videos delivered" in done.stdout
    targets = {"brand-sting": -14, "newsroom-open": -23}
    for video, target in targets.items():
        report = json.loads((tmp_path / f"home/store/production/{video}/qc.json").read_text())
        assert report["passed"], report["failures"]
        for rendition, entry in report["renditions"].items():
            loudness = entry["loudness"]
            assert loudness["target"] == target, (video, rendition)
            assert abs(loudness["integrated"] - target) <= 1 and loudness["true_peak"] <= -1
    # brand-sting starts from the product still, as delivered
    product = load_image(REPO / "examples/assets/product.png", 320, 192, "pad")
    master = tmp_path / "home/store/production/brand-sting/out/master.mp4"
    with av.open(str(master)) as container:
        first = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert psnr_y(first, product) >= 35


def test_preload_warms_the_production_material_by_priority(tmp_path: Path):
    """`factory preload` on examples/production.yaml: its camera move first, then its picture,
    its sound cues, its bed, each fetched into this node's cache once."""
    env = embedded_env(tmp_path / "home")
    manifest = str(REPO / "examples" / "production.yaml")
    done = run_cli("preload", manifest, "--all", "--json", env=env)
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["assets"]["items"]
    assert [i["kind"] for i in items] == ["camera", "picture", "cue", "cue", "bed"]
    assert {i["outcome"] for i in items} == {"fetched"}
    again = json.loads(run_cli("preload", manifest, "--all", "--json", env=env).stdout)
    assert {i["outcome"] for i in again["assets"]["items"]} == {"hit"}
