"""Shots as a manifest gives them (docs/manifest.md, "Shots"): every join form and every way
to get one wrong, specs without joins unchanged, the chunks of any video with cuts and
transitions (every delivered frame once, a cut or transition always a chunk's start, a
transition made by both neighbours), redo within a shot, and the cut check."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.errors import ManifestError
from factory.manifest import parse_manifest
from factory.plan.chunks import plan_chunks
from factory.plan.redo import plan_redo
from factory.plan.video import video_plan, video_shots
from factory.qc.cuts import BLEND_RATIO_LIMIT, judge_cut
from factory.spec import TRANSITIONS, VideoSpec, with_joins

HEAD = "batch: j\ndefaults: {duration: 12, fps: 24, resolution: 320x192}\nvideos:\n  - id: v\n"


def video(scenes: str, head: str = HEAD) -> VideoSpec:
    return parse_manifest(head + "    scenes:\n" + scenes).videos[0]


def problems(scenes: str) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        video(scenes)
    return [str(p) for p in caught.value.problems]


def test_every_join_form():
    spec = video(
        "      - {start: 0, prompt: a}\n"
        "      - {start: 3, prompt: b, join: continue}\n"
        "      - {start: 6, prompt: c, join: cut}\n"
        "      - {start: 9, prompt: d, join: {transition: wipe-left, seconds: 0.5}}\n"
    )
    assert [(s.join, s.transition_seconds) for s in spec.scenes] == [
        ("continue", 0.0), ("continue", 0.0), ("cut", 0.0), ("wipe-left", 0.5)
    ]  # fmt: skip
    shots = video_shots(spec)
    # Each shot before a cut or a transition runs on for the video's `run_on` (1 s, 24
    # frames) at least, the 0.5 s wipe's 12 frames included: a redo may change either join.
    assert [(s.start, s.end, s.make_end, s.join.kind) for s in shots] == [
        (0, 144, 168, "continue"), (144, 216, 240, "cut"), (216, 288, 288, "wipe-left")
    ]  # fmt: skip
    again = VideoSpec.from_dict(spec.to_dict())  # the stored form reads back the same
    assert again == spec and again.sha256() == spec.sha256()


def test_run_on_sets_what_a_shot_makes_past_a_cut_and_stays_out_of_the_default_hash():
    scenes = (
        "      - {start: 0, prompt: a}\n      - {start: 6, prompt: b, join: cut}\n"
        "      - {start: 9, prompt: c, join: {transition: dissolve, seconds: 2}}\n"
    )
    default = video(scenes)
    none = video(scenes, HEAD.replace("duration: 12", "duration: 12, run_on: 0"))
    long = video(scenes, HEAD.replace("duration: 12", "duration: 12, run_on: 3"))
    assert [s.run_on for s in video_shots(default)] == [24, 48, 0]
    assert [s.run_on for s in video_shots(none)] == [0, 48, 0]  # a transition's own frames
    # never past the next shot's end: the shot after the cut is 3 s (72 frames) long
    assert [s.run_on for s in video_shots(long)] == [72, 72, 0]
    assert "run_on" not in default.canonical_json() and "run_on" in none.canonical_json()
    assert VideoSpec.from_dict(none.to_dict()) == none
    assert "run_on" in " ".join(problems_in(HEAD.replace("duration: 12", "duration: 12, "
                                                         "run_on: 4"), scenes))  # fmt: skip


def problems_in(head: str, scenes: str) -> list[str]:
    with pytest.raises(ManifestError) as caught:
        video(scenes, head)
    return [str(p) for p in caught.value.problems]


def test_a_video_without_joins_keeps_its_id_seed_and_hash():
    plain = video("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b}\n")
    said = video("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b, join: continue}\n")
    assert "join" not in plain.canonical_json()
    assert (said.sha256(), said.seed, said.job_id) == (plain.sha256(), plain.seed, plain.job_id)
    cut = video("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b, join: cut}\n")
    assert cut.sha256() != plain.sha256() and cut.seed != plain.seed  # another video


@pytest.mark.parametrize(
    ("scenes", "expected"),
    [
        ("      - {start: 0, prompt: a, join: cut}\n",
         "videos[0].scenes[0].join: the first scene has nothing to cut from"),
        ("      - {start: 0, prompt: a, join: {transition: dissolve, seconds: 1}}\n",
         "videos[0].scenes[0].join: the first scene has nothing to blend from"),
        ("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b, join: jump}\n",
         "videos[0].scenes[1].join: 'jump' is not a join: use continue, cut, or {transition"),
        ("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b, join: dissolve}\n",
         "a transition needs its length: {transition: dissolve, seconds: 1}"),
        ("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b, join: 3}\n",
         "videos[0].scenes[1].join: must be continue, cut, or {transition: NAME, seconds: S}, "
         "not int"),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 6, prompt: b, join: {transition: swirl, seconds: 1}}\n",
         "videos[0].scenes[1].join.transition: 'swirl' is not a transition: use one of "
         + ", ".join(TRANSITIONS)),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 6, prompt: b, join: {transition: dissolve, seconds: 3.5}}\n",
         "videos[0].scenes[1].join.seconds: 3.5 is outside 0.5 to 3 s"),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 6, prompt: b, join: {transition: dissolve, seconds: 0.25}}\n",
         "videos[0].scenes[1].join.seconds: 0.25 is outside 0.5 to 3 s"),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 6, prompt: b, join: {transition: fade-black}}\n",
         "videos[0].scenes[1].join.seconds: required: the transition's length, 0.5 to 3 s"),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 6, prompt: b, join: {transition: dissolve, seconds: 1, ease: in}}\n",
         "videos[0].scenes[1].join.ease: not a field of a transition (transition, seconds)"),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 11.5, prompt: b, join: {transition: dissolve, seconds: 1}}\n",
         "videos[0].scenes[1].join: its shot is 0.5 s (12 frames), shorter than the 1 s "
         "transition into it"),
        ("      - {start: 0, prompt: a}\n"
         "      - {start: 6, prompt: b, join: {transition: dissolve, seconds: 2}}\n"
         "      - {start: 7, prompt: c}\n"
         "      - {start: 8, prompt: d, join: cut}\n",
         "videos[0].scenes[1].join: its shot is 2 s (48 frames), shorter than the 2 s"),
    ],
)  # fmt: skip
def test_a_bad_join_is_named_with_its_field(scenes: str, expected: str):
    if "its shot is 2 s" in expected:  # exactly as long as its transition: allowed
        assert video(scenes).scenes[1].join == "dissolve"
        return
    found = problems(scenes)
    assert any(expected in p for p in found), found


@st.composite
def specs(draw) -> VideoSpec:
    fps = draw(st.sampled_from([12, 24, 30]))
    frames = draw(st.integers(8, 40))
    overlap = draw(st.integers(0, frames // 2 - 1))
    family = draw(st.sampled_from(["procedural", "procedural", "timed"]))
    count = draw(st.integers(1, 6))
    starts = sorted(draw(st.lists(st.integers(1, 40), min_size=count - 1, max_size=count - 1,
                                  unique=True)))  # fmt: skip
    starts = [0] + [s / 2 for s in starts]
    duration = starts[-1] + draw(st.integers(2, 8)) / 2
    lines = []
    for i, start in enumerate(starts):
        kind = "continue" if i == 0 else draw(st.sampled_from(["continue", "cut", "dissolve"]))
        join = ""
        if kind == "cut":
            join = ", join: cut"
        elif kind == "dissolve":
            end = next((s for s in starts[i + 1 :]), duration)
            join = f", join: {{transition: dissolve, seconds: {min(1.0, max(0.5, end - start))}}}"
        lines.append(f"      - {{start: {start}, prompt: p{i}{join}}}\n")
    head = (f"batch: j\ndefaults: {{duration: {duration}, fps: {fps}, resolution: 320x192, "
            f"segment: {{frames: {frames}, overlap: {overlap}}}, model: {{family: {family}"
            f"{', seconds_per_segment: 0.01' if family == 'timed' else ''}}}}}\n"
            "videos:\n  - id: v\n")  # fmt: skip
    try:
        return video("".join(lines), head)
    except ManifestError:  # a shot shorter than its transition: drawn again
        from hypothesis import reject

        reject()


@settings(max_examples=200, deadline=None)
@given(specs())
def test_chunks_deliver_every_frame_once_and_start_at_every_cut_and_transition(spec):
    plans, chunks, shots = video_plan(spec), plan_chunks(spec), video_shots(spec)
    delivered = []
    for chunk in chunks:
        frames = []
        for segment in chunk.segments:
            assert segment.owned_count > 0
            frames += range(segment.write_start, segment.write_start + segment.owned_count)
        assert frames == list(range(chunk.segments[0].write_start, frames[-1] + 1))
        assert len(frames) == chunk.frames
        delivered += frames
        assert len({s.shot for s in chunk.segments}) == 1  # never spans two shots
    assert delivered == list(range(spec.frames_total))  # every frame, once, in order
    starts = {c.segments[0].write_start for c in chunks}
    for shot in shots[1:]:
        assert shot.start in starts  # a cut or transition is a chunk's first frame: a keyframe
        blended = [c for c in chunks if c.blend is not None and c.segments[0].shot == shot.index]
        if not shot.join.is_transition:
            assert not blended
            continue
        [chunk] = blended
        blend = chunk.blend
        # made by both neighbours: the shot before writes the transition's frames as run-on
        made = sorted({f for s in blend.outgoing
                       for f in range(s.write_start, s.write_end)
                       if shot.start <= f < shot.start + blend.frames})  # fmt: skip
        assert made == list(range(shot.start, shot.start + blend.frames))
        assert all(s.shot == shot.index - 1 for s in blend.outgoing)
        assert chunk.frames >= blend.frames  # blended within one chunk
    for plan in plans:
        assert plan.run_on == 0 or plan.shot < len(shots) - 1
    # Any join a redo may give (within the run-on each shot was made with) keeps the plan:
    # the same segments, the same chunks by frame; only the blends differ.
    for shot in shots[1:]:
        before = shots[shot.index - 1]
        scene = shot.scenes[0]
        seconds = before.run_on / spec.fps
        for change in ({"join": "cut"}, {"join": "wipe-left", "seconds": seconds}):
            if change["join"] == shot.join.kind or (change.get("seconds", 1) < 0.5):
                continue
            if before.run_on > shot.end - shot.start:
                continue
            changed = with_joins(spec, {str(scene): change})
            assert video_plan(changed) == plans
            again = plan_chunks(changed)
            assert [c.segments for c in again] == [c.segments for c in chunks]
            [blended] = [c for c in again if c.segments[0].index == shot.segments[0].index]
            kind = blended.blend.transition if blended.blend else "cut"
            assert kind == change["join"]


def test_a_redo_inside_a_shot_never_touches_the_next():
    spec = video(
        "      - {start: 0, prompt: a}\n"
        "      - {start: 4, prompt: b, join: cut}\n"
        "      - {start: 8, prompt: c, join: {transition: dissolve, seconds: 1}}\n",
        head=HEAD.replace("320x192", "320x192, segment: {frames: 24, overlap: 4}"),
    )
    plans, chunks = video_plan(spec), plan_chunks(spec)
    members = [(c.index, tuple(s.index for s in c.segments)) for c in chunks]
    first, second = ([p.index for p in plans if p.shot == k] for k in (0, 1))
    # a range that ends in a shot's last segment that owns frames, before a cut: joined into
    # the shot's run-on past the cut (made for a redo that changes the join), never further
    redo = plan_redo(spec, plans, members, {}, start=2.5, end=3.9, cascade=False, version=2)
    assert redo.join == first[-1] and plans[first[-1]].owned_count == 0
    assert redo.segments[-1] == first[-2]
    # without a run-on past the cut (`run_on: 0`), nothing after the shot's end is joined
    bare = video(
        "      - {start: 0, prompt: a}\n      - {start: 4, prompt: b, join: cut}\n",
        head=HEAD.replace("320x192", "320x192, run_on: 0, segment: {frames: 24, overlap: 4}"),
    )
    bare_plans = video_plan(bare)
    bare_members = [(c.index, tuple(s.index for s in c.segments)) for c in plan_chunks(bare)]
    redo = plan_redo(bare, bare_plans, bare_members, {}, start=2.5, end=3.9, cascade=False,
                     version=2)  # fmt: skip
    assert redo.join is None and bare_plans[redo.segments[-1] + 1].starts_shot
    assert "starts the next shot from nothing" in redo.why
    # --cascade stops at the end of its shot: its run-on into the dissolve, never the next
    redo = plan_redo(spec, plans, members, {}, start=4.5, end=5, cascade=True, version=2)
    assert redo.segments == tuple(range(redo.segments[0], second[-1] + 1))
    assert plans[second[-1]].run_on and plans[second[-1] + 1].shot == 2
    # inside a shot that runs on into a transition, the run-on is joined like any segment
    redo = plan_redo(spec, plans, members, {}, start=6.5, end=7.9, cascade=False, version=2)
    assert redo.join is not None and plans[redo.join].shot == 1


def _frames(values: list[int]) -> np.ndarray:
    rng = np.random.default_rng(values[0])
    base = rng.integers(0, 60, (len(values), 48, 64, 3)).astype(np.int16)
    return np.clip(base + np.array(values)[:, None, None, None], 0, 255).astype(np.uint8)


def test_a_clean_cut_passes_and_a_half_blended_frame_fails():
    shot_a = _frames([40, 41, 42])  # dark, slowly changing
    shot_b = _frames([180, 181, 182])
    clean = judge_cut(shot_a, shot_b, cut=5, frame=120, fps=24)
    assert clean.passed and clean.blend is not None and clean.blend > BLEND_RATIO_LIMIT
    for smeared_at in ("before", "after"):
        a, b = shot_a.copy(), shot_b.copy()
        half = ((a[-1].astype(np.int16) + b[0]) // 2).astype(np.uint8)
        if smeared_at == "before":
            a[-1] = half
        else:
            b[0] = half
        score = judge_cut(a, b, cut=5, frame=120, fps=24)
        assert not score.passed and score.blend < BLEND_RATIO_LIMIT, smeared_at
        assert "half" not in score.failures[0] and "blend of the two shots" in score.failures[0]
    alike = judge_cut(shot_a, shot_a[::-1].copy(), cut=5, frame=120, fps=24)
    assert alike.passed and alike.blend is None  # nothing visible to smear


def test_planning_is_the_same_for_a_video_of_one_shot():
    spec = video("      - {start: 0, prompt: a}\n      - {start: 6, prompt: b}\n")
    [shot] = video_shots(spec)
    assert [p.starts_shot for p in video_plan(spec)] == [True] + [False] * (len(shot.segments) - 1)
    assert all(not p.run_on for p in video_plan(spec))
    assert list(itertools.chain.from_iterable(c.segments for c in plan_chunks(spec))) == list(
        shot.segments
    )
