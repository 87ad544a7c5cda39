"""Delivered versions are records that never change: a requeue after a redo delivers a new
version instead of rewriting version 1, a rejected or cancelled redo goes back to the version
delivered before it, review decisions name what the reviewer saw, and a delivery that dies
part-way leaves no mix of files under a delivered version (issue 32, defects 1-3, 6, 7, 10).
Embedded (SQLite, file store) and PostgreSQL, real ffmpeg."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from factory.config import Settings
from factory.errors import InvalidOperation
from factory.ops import Operations
from factory.stages import Stage
from factory.store import keys
from factory.wiring import Factory
from tests.conftest import HomeSnapshot, run_cli_here
from tests.integration.test_pipeline import home_env

TINY = (
    "batch: {batch}\n{review}defaults: {{duration: 4, fps: 12, resolution: 160x96, "
    "segment: {{frames: 24, overlap: 4}}, renditions: [mobile], seed: 5}}\n"
    "videos:\n  - {{id: clip, prompt: 'a harbor at dawn, slow pan'}}\n"
)  # 48 frames: 3 segments


def _ops(home: Path, database_url: str = "") -> Operations:
    env = home_env(home) | ({"FACTORY_DATABASE_URL": database_url} if database_url else {})
    return Operations(Factory.open(Settings.from_env(env)))


def _delivered(tmp_path: Path, *, review: bool = False, database_url: str = "") -> Operations:
    home = tmp_path / "home"
    env = home_env(home) | ({"FACTORY_DATABASE_URL": database_url} if database_url else {})
    manifest = tmp_path / "m.yaml"
    manifest.write_text(TINY.format(batch="ver", review="review: required\n" if review else ""))
    if database_url:
        upgraded = run_cli_here("db", "upgrade", env=env)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    done = run_cli_here("run", str(manifest), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    ops = _ops(home, database_url)
    if review:
        ops.approve("ver.clip", actor="test:alice")
    assert ops.job("ver.clip").stage is Stage.DONE
    return ops


@pytest.fixture(scope="module")
def plain_snapshot(tmp_path_factory) -> HomeSnapshot:
    """ver.clip delivered as version 1 (no review, SQLite), made once for the module."""
    return HomeSnapshot(tmp_path_factory.mktemp("ver-v1"), lambda home: _delivered(home.parent))


@pytest.fixture
def delivered(plain_snapshot: HomeSnapshot, tmp_path: Path) -> Operations:
    """What _delivered(tmp_path) makes, put back from the module's snapshot: the home is the
    snapshot's (ops.settings.home), the manifest is tmp_path/m.yaml."""
    home = plain_snapshot.restore()
    (tmp_path / "m.yaml").write_text(TINY.format(batch="ver", review=""))
    return _ops(home)


def _store(ops: Operations) -> Path:
    return Path(ops.settings.store_url.removeprefix("file://"))


def _version_files(ops: Operations, version: int) -> dict[str, str]:
    """Every file of a delivered version, with its SHA-256."""
    store = _store(ops)
    prefix = keys.delivery_prefix("ver", "clip", version)
    names = [f"{prefix}/out/mobile.mp4", f"{prefix}/qc.json", f"{prefix}/contact.png"]
    return {n: hashlib.sha256((store / n).read_bytes()).hexdigest() for n in names}


def _redo(ops: Operations, **options) -> None:
    ops.redo("ver.clip", range_text="0:01-0:02", actor="test:bob", seed=77, **options)
    ops.run_here("ver.clip", "redo")


def _view(ops: Operations) -> dict:
    view = ops.job_view("ver.clip").to_dict()
    # (before versions were records, the current one was progress.deliver: kept readable so
    # that these tests failed on that code for what it did, not for a missing key)
    deliver = view["progress"].get("deliver", {})
    view.setdefault("version", deliver.get("version"))
    view.setdefault("versions", view["progress"].get("versions", []))
    return view


def _current(ops: Operations) -> int:
    return _view(ops)["version"]


def _lossless(ops: Operations) -> list:
    """The current segments' lossless frames, in order."""
    from factory.media.intermediate import read_frames

    store = _store(ops)
    made = ops.job_view("ver.clip").segments
    return [
        read_frames(store / keys.segment("ver", "clip", i, r.attempt), 160, 96)
        for i, r in sorted(made.items())
    ]


@pytest.mark.parametrize("start", ["deliver", "qc", "mux", "encode"])
def test_a_requeue_after_a_redo_delivers_a_new_version_and_keeps_v1_and_v2(
    delivered: Operations, tmp_path: Path, start: str
) -> None:
    ops = delivered
    v1 = _version_files(ops, 1)
    _redo(ops)
    assert _current(ops) == 2
    v2 = _version_files(ops, 2)

    ops.requeue("ver.clip", from_stage=Stage(start), actor="test:carol")
    # While the rerun goes, the delivered version is still shown with its files.
    waiting = _view(ops)
    assert waiting["version"] == 2
    assert waiting["outputs"]["mobile"].endswith("/v2/out/mobile.mp4")
    ops.run_here("ver.clip", "requeue")

    view = _view(ops)
    assert view["stage"] == "done" and view["version"] == 3
    assert [v["version"] for v in view["versions"]] == [1, 2, 3]
    assert _version_files(ops, 1) == v1, "version 1's files were rewritten"
    assert _version_files(ops, 2) == v2, "version 2's files were rewritten"
    # The new version continues from the current version's content (the redo's frames).
    assert view["versions"][2]["segments_from"] == view["versions"][1]["segments_from"]


def test_a_requeue_from_generate_after_gc_makes_the_current_version_again(
    delivered: Operations, tmp_path: Path
) -> None:
    ops = delivered
    v1 = _version_files(ops, 1)
    _redo(ops)
    v2 = _version_files(ops, 2)
    env = home_env(ops.settings.home)
    gone = run_cli_here("gc", "--older-than", "0", env=env)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    ops.requeue("ver.clip", from_stage=Stage.GENERATE, actor="test:carol")
    ops.run_here("ver.clip", "requeue")
    assert _current(ops) == 3
    assert _version_files(ops, 1) == v1 and _version_files(ops, 2) == v2


def test_a_rejected_redo_goes_back_to_the_version_delivered_before(tmp_path: Path) -> None:
    ops = _delivered(tmp_path, review=True)
    before = ops.job_view("ver.clip")
    made_before = {i: r.attempt for i, r in before.segments.items()}
    _redo(ops)
    assert ops.job("ver.clip").stage is Stage.REVIEW

    job = ops.reject("ver.clip", actor="test:alice", reason="the gull looks fake")
    assert job.stage is Stage.DONE, "a rejected redo must leave the job done at its version"
    view = ops.job_view("ver.clip")
    assert _current(ops) == 1
    assert {i: r.attempt for i, r in view.segments.items()} == made_before
    assert not job.progress.get("redo") and not job.progress.get("prompts")
    assert not job.progress.get("seeds")
    events = [e.event for e in ops.events("ver.clip")]
    assert "redo.discarded" in events
    # A new redo is accepted at once, and a requeue of the job redelivers version 1's content.
    ops.redo("ver.clip", range_text="0:01-0:02", actor="test:bob", seed=3)
    assert ops.job("ver.clip").stage is Stage.GENERATE


def test_a_cancelled_redo_goes_back_to_the_version_delivered_before(
    delivered: Operations, tmp_path: Path
) -> None:
    ops = delivered
    v1 = _version_files(ops, 1)
    ops.redo("ver.clip", range_text="0:01-0:02", actor="test:bob", seed=77)
    job = ops.cancel("ver.clip", reason="wrong range", actor="test:bob")
    assert job.stage is Stage.DONE and _current(ops) == 1
    assert _version_files(ops, 1) == v1
    # A failed redo can be dropped the same way (cancel a failed job that holds a redo).
    ops.redo("ver.clip", range_text="0:01-0:02", actor="test:bob", seed=78)
    job = ops.cancel("ver.clip", reason="changed my mind", actor="test:bob")
    assert job.stage is Stage.DONE


def test_review_decisions_name_the_attempt_and_version_seen(tmp_path: Path, pg_url: str) -> None:
    ops = _delivered(tmp_path, review=True, database_url=pg_url)
    _redo(ops)
    seen = ops.job("ver.clip")
    assert seen.stage is Stage.REVIEW
    candidate = ops.job_view("ver.clip").to_dict()["review_candidate"]
    assert candidate == {"attempt": seen.attempt, "version": 2}
    # Another redo reached review in between: the page the reviewer had is out of date.
    ops.reject("ver.clip", actor="test:alice", reason="no", attempt=seen.attempt, version=2)
    _redo(ops)
    with pytest.raises(InvalidOperation, match="attempt"):
        ops.approve("ver.clip", actor="test:alice", attempt=seen.attempt, version=2)
    assert ops.job("ver.clip").stage is Stage.REVIEW
    now = ops.job("ver.clip")
    ops.approve("ver.clip", actor="test:alice", attempt=now.attempt, version=2)
    assert _current(ops) == 2


def test_a_stale_redo_plan_cannot_write_a_delivered_version(tmp_path: Path, pg_url: str) -> None:
    ops = _delivered(tmp_path, database_url=pg_url)
    _, stale_plan = ops.redo_plan("ver.clip", range_text="0:01-0:02", cascade=False)
    assert stale_plan.version == 2
    _redo(ops)  # another operator's redo is delivered as version 2 meanwhile
    v2 = _version_files(ops, 2)
    ops.machine.start_redo("ver.clip", plan=stale_plan.to_dict(), seed=5, prompt=None,
                           reason="late", actor="test:dave")  # fmt: skip
    ops.run_here("ver.clip", "redo")
    assert _current(ops) == 3
    assert _version_files(ops, 2) == v2


def test_a_delivery_that_dies_part_way_leaves_no_mixed_version(
    delivered: Operations, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = delivered
    v1 = _version_files(ops, 1)
    ops.requeue("ver.clip", from_stage=Stage.DELIVER, actor="test:carol")
    from factory.store.file import FileStore

    real_put = FileStore.put_file
    calls = []

    def dies_on_second_put(self, key, path, *args, **kwargs):
        calls.append(key)
        if len(calls) == 2:
            raise OSError("disk gone")
        return real_put(self, key, path, *args, **kwargs)

    monkeypatch.setattr(FileStore, "put_file", dies_on_second_put)
    job = ops.run_here("ver.clip", "requeue")
    assert job.stage is Stage.FAILED
    monkeypatch.setattr(FileStore, "put_file", real_put)
    assert _current(ops) == 1 and _version_files(ops, 1) == v1
    assert not calls[0].startswith("ver/clip/out/"), "the re-delivery wrote into version 1"
    # What the next delivery will be (a reviewer's candidate, a redo plan) is what it takes.
    assert ops.machine.next_version("ver.clip") == 2
    _, plan = ops.redo_plan("ver.clip", range_text="0:01-0:02", cascade=False)
    assert plan.version == 2
    ops.requeue("ver.clip", from_stage=None, actor="test:carol")
    ops.run_here("ver.clip", "requeue")
    view = _view(ops)
    # The dead delivery's number was never published: the next delivery takes it over and
    # writes (and verifies) every file of it again before publishing it.
    assert view["version"] == 2 and [v["version"] for v in view["versions"]] == [1, 2]
    assert _version_files(ops, 1) == v1
    store = _store(ops)
    for name, url in view["outputs"].items():
        path = Path(url.removeprefix("file://"))
        assert path.is_relative_to(store / "ver/clip/v2"), name


def test_a_plain_requeue_starts_the_interruption_count_again(
    delivered: Operations, tmp_path: Path
) -> None:
    """A job waiting for the sweeper after an interruption, requeued by hand: the give-up
    clock starts again (it used to keep `since` from the first interruption, so after a long
    outage the first transient error failed the job with NoProgress)."""
    ops = delivered
    ops.requeue("ver.clip", from_stage=Stage.QC, actor="test:carol")
    job = ops.machine.claim("ver.clip", seen_attempt=ops.job("ver.clip").attempt, worker="w")
    job = ops.machine.interrupt("ver.clip", attempt=job.attempt, reason="gateway down")
    assert job.progress.get("interrupted")
    job = ops.requeue("ver.clip", from_stage=None, actor="test:carol")
    assert "interrupted" not in job.progress


def test_a_requeue_from_generate_after_a_joined_redo_makes_the_same_frames(
    delivered: Operations,
    tmp_path: Path,
) -> None:
    ops = delivered
    _redo(ops)  # segments 0-1 made again, joined into segment 2

    v2 = _lossless(ops)
    ops.requeue("ver.clip", from_stage=Stage.GENERATE, actor="test:carol")
    ops.run_here("ver.clip", "requeue")
    assert _current(ops) == 3
    v3 = _lossless(ops)
    for index, (before, after) in enumerate(zip(v2, v3, strict=True)):
        assert (before == after).all(), f"segment {index} differs from the current version's"


def test_a_regeneration_after_gc_replays_joins_into_joined_segments(
    delivered: Operations, tmp_path: Path
) -> None:
    """Two joined redos, the second joined into a segment the first made: making the video
    again from nothing makes each segment's past again (segment 2 as the first run made it,
    segment 1 as the first redo made it), not the same frames with today's seeds."""
    ops = delivered
    ops.redo("ver.clip", range_text="0:02-0:03", actor="test:bob", seed=31)  # 1, into 2
    ops.run_here("ver.clip", "redo")
    ops.redo("ver.clip", range_text="0:00.5-0:01", actor="test:bob", seed=47)  # 0, into 1
    ops.run_here("ver.clip", "redo")
    assert _current(ops) == 3

    v3 = _lossless(ops)
    gone = run_cli_here("gc", "--older-than", "0", env=home_env(ops.settings.home))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    ops.requeue("ver.clip", from_stage=Stage.GENERATE, actor="test:carol")
    ops.run_here("ver.clip", "requeue")
    assert _current(ops) == 4
    for index, (before, after) in enumerate(zip(v3, _lossless(ops), strict=True)):
        assert (before == after).all(), f"segment {index} differs from the current version's"
    made_again = [
        tuple(made)
        for e in ops.events("ver.clip")
        for made in e.detail.get("past_segments_made", [])
    ]
    # The first run's segments 0-2 (for segment 2's past) and the first redo's segment 1.
    assert sorted(made_again) == [(0, 0), (0, 1), (0, 2), (1, 1)]


def test_an_embedded_requeue_says_what_runs_it_and_factory_run_does(
    delivered: Operations, tmp_path: Path
) -> None:
    ops = delivered
    env = home_env(ops.settings.home)
    requeued = run_cli_here("requeue", "ver.clip", "--from", "deliver", env=env)
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    assert "nothing runs it until `factory run MANIFEST`" in requeued.stderr
    assert ops.job("ver.clip").stage is Stage.DELIVER  # recorded, not run
    done = run_cli_here("run", str(tmp_path / "m.yaml"), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _current(ops) == 2
