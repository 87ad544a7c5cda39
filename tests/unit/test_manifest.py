from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from factory.errors import ManifestError
from factory.manifest import MAX_MANIFEST_BYTES, load_manifest, parse_manifest, revalidated_spec
from factory.spec import VideoSpec

BAD = Path(__file__).parent.parent / "data" / "bad_manifests"
JSON_EXPECTATIONS = {
    "json_duplicate_key.json": ("", "duplicate key 'batch'"),
    "json_wrong_type.json": ("videos[0].fps", "valid integer"),
}


def bad_manifest_cases() -> list[tuple[Path, str, str]]:
    cases = []
    for path in sorted(BAD.iterdir()):
        if path.suffix == ".json":
            expect, says = JSON_EXPECTATIONS[path.name]
        else:
            header = path.read_text().splitlines()[:2]
            expect = re.fullmatch(r"# expect: ?(.*)", header[0])[1]
            says = re.fullmatch(r"# says: (.*)", header[1])[1]
        cases.append((path, expect, says))
    return cases


BAD_CASES = bad_manifest_cases()


def test_the_corpus_is_large_enough():
    assert len(BAD_CASES) >= 25


@pytest.mark.parametrize(("path", "expect", "says"), BAD_CASES, ids=[c[0].name for c in BAD_CASES])
def test_bad_manifest_names_the_field_and_the_rule(path: Path, expect: str, says: str):
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    problems = caught.value.problems
    matching = [p for p in problems if p.path == expect]
    assert matching, f"no problem at {expect!r}; got {[str(p) for p in problems]}"
    assert any(says in p.message for p in matching), [str(p) for p in matching]
    assert caught.value.exit_code == 2


NIGHTLY = """
batch: nightly-2026-11-29
defaults:
  fps: 24
  resolution: 640x360
  duration: 120
  segment: {frames: 48, overlap: 8}
  renditions: [master, compat]
videos:
  - id: harbor
    seed: 7
    scenes:
      - {start: 0, prompt: "A harbor at dawn"}
      - {start: 40, end: 80, prompt: "Boats leave"}
      - {start: 80, prompt: "Seagulls over the water"}
  - prompt: "a forest"
    duration: 30
    fps: 16
    model: {family: timed, seconds_per_segment: 0.5}
    audio: {asset: beds/forest.wav, gain_db: -6}
"""


def test_defaults_apply_and_videos_override():
    manifest = parse_manifest(NIGHTLY)
    harbor, forest = manifest.videos
    assert harbor.job_id == "nightly-2026-11-29.harbor"
    assert (harbor.fps, harbor.width, harbor.height, harbor.duration) == (24, 640, 360, 120.0)
    assert [(s.start, s.end) for s in harbor.scenes] == [(0, 40), (40, 80), (80, 120)]
    assert harbor.renditions == ("master", "compat")
    assert harbor.model.family == "procedural" and harbor.audio is None
    assert (forest.fps, forest.duration, forest.frames_total) == (16, 30.0, 480)
    assert forest.model.seconds_per_segment == 0.5
    assert forest.audio is not None and forest.audio.gain_db == -6
    assert (forest.segment_frames, forest.segment_overlap) == (48, 8)


def test_unnamed_video_gets_a_stable_id_and_seed_from_its_content():
    first = parse_manifest(NIGHTLY).videos[1]
    again = parse_manifest(NIGHTLY).videos[1]
    changed = parse_manifest(NIGHTLY.replace('"a forest"', '"a pine forest"')).videos[1]
    assert first.video_id == again.video_id and first.video_id.startswith("v-")
    assert first.seed == again.seed
    assert changed.video_id != first.video_id and changed.seed != first.seed


def test_batch_name_does_not_change_a_derived_video_id():
    other = parse_manifest(NIGHTLY, batch="nightly-2026-11-30").videos[1]
    assert other.video_id == parse_manifest(NIGHTLY).videos[1].video_id
    assert other.job_id == f"nightly-2026-11-30.{other.video_id}"


def test_prompt_and_single_scene_are_the_same_canonical_spec():
    a = parse_manifest("batch: b\nvideos:\n  - {id: x, prompt: hello, duration: 5}\n")
    b = parse_manifest(
        "batch: b\nvideos:\n  - id: x\n    duration: 5.0\n    scenes: [{start: 0, prompt: hello}]\n"
    )
    assert a.videos[0].canonical_json() == b.videos[0].canonical_json()
    assert a.videos[0].sha256() == b.videos[0].sha256()


def test_canonical_spec_round_trips():
    for video in parse_manifest(NIGHTLY).videos:
        assert VideoSpec.from_dict(json.loads(video.canonical_json())) == video


def test_json_manifest_is_accepted(tmp_path: Path):
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps({"batch": "j", "videos": [{"id": "a", "prompt": "x", "duration": 3}]})
    )
    assert load_manifest(path).videos[0].job_id == "j.a"


def test_date_like_batch_stays_a_string():
    manifest = parse_manifest("batch: 2026-11-29\nvideos:\n  - {id: a, prompt: x, duration: 2}\n")
    assert manifest.batch == "2026-11-29"


def test_batch_override_is_validated():
    with pytest.raises(ManifestError) as caught:
        parse_manifest(NIGHTLY, batch="no/slashes")
    assert caught.value.problems[0].path == "batch (--batch)"


def test_every_problem_is_reported_at_once():
    text = (
        "batch: b\nvideos:\n  - {id: a, prompt: ok, duration: -1}\n"
        "  - {id: b, prompt: ok, duration: 5, fps: 0}\n"
        "  - {id: c, prompt: ok, duration: 5}\n"
        "  - {id: c, prompt: again, duration: 5}\n"
        "  - {id: d, duration: 5}\n"
    )
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    assert [p.path for p in caught.value.problems] == [
        "videos[0].duration",
        "videos[1].fps",
        "videos[4].prompt",
        "videos[3].id",
    ]
    assert "4 problems" in str(caught.value)


def test_oversized_file_is_refused_before_parsing(tmp_path: Path):
    path = tmp_path / "big.yaml"
    path.write_text("batch: b\n# " + "x" * MAX_MANIFEST_BYTES + "\n")
    with pytest.raises(ManifestError, match="the limit is 1024 KiB"):
        load_manifest(path)


def test_missing_file_is_bad_input(tmp_path: Path):
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "nope.yaml")


def test_non_utf8_file_is_bad_input(tmp_path: Path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("batch: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ManifestError, match="not UTF-8"):
        load_manifest(path)


def test_deep_nesting_is_refused():
    deep = "batch: b\nx: " + "[" * 200 + "]" * 200 + "\n"
    with pytest.raises(ManifestError, match="nesting deeper"):
        parse_manifest(deep)


def test_alias_bomb_is_refused_without_expanding():
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        levels.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    with pytest.raises(ManifestError, match="aliases"):
        parse_manifest("\n".join(levels) + "\n")


def test_loras_reach_the_spec_and_its_assets_and_leave_old_hashes_alone():
    base = (
        "batch: b\nvideos:\n  - id: a\n    prompt: ok\n    duration: 4\n"
        "    segment: {frames: 17, overlap: 5}\n    audio: {asset: beds/sea.ogg}\n"
        "    model: {family: wan, path: /models/wan%s}\n"
    )
    plain = parse_manifest(base % "").videos[0]
    styled = parse_manifest(
        base % ", lora: [{asset: 's3://loras/ink.safetensors', scale: 0.6}]"
    ).videos[0]
    assert [(lora.asset, lora.scale) for lora in styled.model.loras] == [
        ("s3://loras/ink.safetensors", 0.6)
    ]
    assert styled.assets == ("s3://loras/ink.safetensors", "beds/sea.ogg")
    assert "loras" not in plain.to_dict()["model"]  # a spec without LoRAs hashes as before
    assert VideoSpec.from_dict(styled.to_dict()) == styled
    assert plain.sha256() != styled.sha256()


def test_cues_and_loudness_reach_the_spec_and_leave_old_hashes_alone():
    base = "batch: b\nvideos:\n  - id: a\n    prompt: ok\n    duration: 8\n    audio: %s\n"
    plain = parse_manifest(base % "{asset: beds/sea.ogg}").videos[0]
    assert plain.to_dict()["audio"] == {"asset": "beds/sea.ogg", "gain_db": 0.0, "loop": True}
    # The digest this bed-only spec had before cues existed (fd31978): the same job.
    assert plain.sha256() == "bda564f1885b22eeedd4892360f7d90e156cacd1fa7501bdb3bf71a4d635cbfa"
    sound = parse_manifest(base % (
        "{asset: beds/sea.ogg, cues: [{at: 5, asset: fx/gull.wav}, "
        "{at: 1.5, asset: fx/bell.wav, gain_db: -3}], loudness: broadcast}"
    )).videos[0]  # fmt: skip
    assert [(c.at, c.asset, c.gain_db) for c in sound.audio.cues] == [
        (1.5, "fx/bell.wav", -3.0),
        (5.0, "fx/gull.wav", 0.0),
    ]  # fmt: skip  (in time order, whatever order the manifest gives)
    assert (sound.audio.loudness.integrated, sound.audio.loudness.true_peak) == (-23.0, -1.0)
    assert sound.assets == ("beds/sea.ogg", "fx/bell.wav", "fx/gull.wav")
    assert VideoSpec.from_dict(sound.to_dict()) == sound
    assert revalidated_spec(sound.to_dict()) == sound  # the stored spec resolves to itself
    own = parse_manifest(base % "{cues: [{at: 0, asset: fx/bell.wav}], loudness: "
                                "{profile: streaming, integrated: -16}}").videos[0]  # fmt: skip
    assert own.audio.asset is None and own.assets == ("fx/bell.wav",)
    assert (own.audio.loudness.integrated, own.audio.loudness.true_peak) == (-16.0, -1.0)


def test_scene_pictures_reach_the_spec_and_leave_old_hashes_alone():
    head = "batch: b\nvideos:\n  - id: a\n    duration: 8\n%s    scenes:\n"
    plain = parse_manifest(head % "" + "      - {start: 0, prompt: ok}\n").videos[0]
    assert "image" not in plain.to_dict()["scenes"][0] and "image_fit" not in plain.to_dict()
    shown = parse_manifest(head % "    image_fit: crop\n" + (
        "      - {start: 0, prompt: ok, image: {asset: pics/hero.png}}\n"
        "      - {start: 4, prompt: later, image: {asset: pics/look.jpg, as: reference}}\n"
    )).videos[0]  # fmt: skip
    assert [(s.image.asset, s.image.role) for s in shown.scenes] == [
        ("pics/hero.png", "first-frame"), ("pics/look.jpg", "reference")
    ]  # fmt: skip
    assert shown.image_fit == "crop" and shown.assets == ("pics/hero.png", "pics/look.jpg")
    assert VideoSpec.from_dict(shown.to_dict()) == shown
    assert revalidated_spec(shown.to_dict()) == shown
    assert shown.sha256() != plain.sha256()


def family_manifest(family: str, segment: str = "") -> str:
    return (
        f"batch: b\nvideos:\n  - id: a\n    prompt: ok\n    duration: 20\n{segment}"
        "    resolution: 320x192\n"
        f"    model: {{family: {family}, path: /models/{family}}}\n"
    )


@pytest.mark.parametrize(
    ("family", "frames", "overlap"),
    [
        ("skyreels-v2-df", 97, 17),
        ("wan", 81, 17),
        ("ltx-video", 121, 25),
        ("helios", 152, 8),
        ("anyflow-far", 56, 8),
    ],
)
def test_a_family_without_segment_settings_gets_its_own(family: str, frames: int, overlap: int):
    video = parse_manifest(family_manifest(family)).videos[0]
    assert (video.segment_frames, video.segment_overlap) == (frames, overlap)


def test_a_segment_given_in_part_is_completed_to_suit_the_family():
    video = parse_manifest(family_manifest("ltx-video", "    segment: {frames: 40}\n")).videos[0]
    assert (video.segment_frames, video.segment_overlap) == (40, 17)  # 8k+1, at most half
    video = parse_manifest(family_manifest("wan", "    segment: {overlap: 9}\n")).videos[0]
    assert (video.segment_frames, video.segment_overlap) == (81, 9)
    plain = parse_manifest(
        "batch: b\nvideos:\n  - {id: a, prompt: ok, duration: 4, segment: {frames: 30}}\n"
    ).videos[0]
    assert (plain.segment_frames, plain.segment_overlap) == (30, 4)  # procedural: as before


@pytest.mark.parametrize(
    ("family", "segment", "problem"),
    [
        ("helios", "{frames: 150, overlap: 8}", r"segment\.frames: 150 does not suit helios: "
         r"segment\.frames must be whole chunks of 36 frames \(9 latent frames\) plus the "
         r"overlap \(8\), e.g. 44, 80, 152"),
        ("anyflow-far", "{frames: 16, overlap: 8}", r"segment\.frames: 16 does not suit "
         r"anyflow-far: the new frames of a segment \(8\) must be more than the overlap"),
        ("helios", "{frames: 160, overlap: 16}", r"segment\.overlap: 16 does not suit helios: "
         r"the overlap is cross-faded from frames decoded again, at most 12"),
    ],
)  # fmt: skip
def test_latent_families_take_whole_chunks(family: str, segment: str, problem: str):
    with pytest.raises(ManifestError, match=problem):
        parse_manifest(family_manifest(family, f"    segment: {segment}\n"))
    spec = parse_manifest(family_manifest(family)).videos[0]
    assert spec.first_segment_short == spec.segment_overlap == 8


def test_assets_beside_the_manifest_are_paths_and_their_fields_are_known():
    manifest = parse_manifest(
        "batch: b\ndefaults: {audio: {asset: ./beds/calm.ogg}}\nvideos:\n"
        "  - {id: a, prompt: ok, duration: 4}\n"
        "  - {id: c, prompt: ok, duration: 4, audio: {asset: ./shared/pulse.ogg}}\n"
    )
    assert [v.audio.asset for v in manifest.videos] == ["./beds/calm.ogg", "./shared/pulse.ogg"]
    assert manifest.field(0, "audio") == "defaults.audio"
    assert manifest.field(1, "audio") == "videos[1].audio"
    assert manifest.field(1, "model") == "videos[1].model"
    with pytest.raises(ManifestError, match=r"videos\[0\]\.audio\.asset: './beds/' names a"):
        parse_manifest(
            "batch: b\nvideos:\n  - {id: a, prompt: ok, duration: 4, audio: {asset: ./beds/}}\n"
        )


def test_a_huge_integer_is_a_manifest_error_not_an_internal_one() -> None:
    digits = "9" * 5000
    for text, fmt in ((f"batch: b\nvideos:\n  - {{id: a, prompt: p, seed: {digits}}}\n", "yaml"),
                      ('{"batch": "b", "videos": [{"id": "a", "prompt": "p", "seed": '
                       f"{digits}}}]}}", "json")):  # fmt: skip
        with pytest.raises(ManifestError, match="a number of 5000 characters"):
            parse_manifest(text, fmt=fmt)
