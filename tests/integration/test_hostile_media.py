"""Media from outside is hostile until ingested (issue 49). A file brought as a sound, a camera
move or a picture is identified by its bytes against a short list per kind and opened by
exactly the reader those bytes name (factory/media/identify.py), with `file` the only
protocol: a playlist, a manifest or a concat script that names other files is refused at
submit with its field named, and a worker handed one anyway (a store or database that was
written behind the factory's back) refuses it too. The file each names (the canary) is
never opened: its access time, set older than its modification time, would move on any
read (the file system is mounted relatime; checked on a control file first).

Also: limits measured on what is decoded, not on what a container says (a camera move's
frames' times against its edited duration tags), a 16-bit picture's check within a memory
budget, one seed rule, and the asset rule for material read back from the database."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from factory.errors import PermanentError
from factory.media.audio import audio_argv
from factory.media.control import control_problem, load_template
from factory.media.ffmpeg import ffmpeg_exe, run
from factory.media.sound import Cue, mix_argv
from factory.spec import with_material
from tests.conftest import REPO, run_cli_here
from tests.footage import tone
from tests.integration.test_camera import HEIGHT, WIDTH, manifest, pan_template, texture_picture
from tests.integration.test_pipeline import home_env

BED = REPO / "examples" / "assets" / "calm-bed.ogg"


class Canary:
    """A file the hostile media point at; `untouched()` is False once anything has read it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        control = path.with_name("control-" + path.name)
        control.write_bytes(b"x")
        self._age(control)
        before = control.stat().st_atime
        control.read_bytes()
        if control.stat().st_atime == before:
            pytest.fail(f"reading {control} does not move its access time (noatime?): the canary "
                        "cannot tell a read", pytrace=False)  # fmt: skip
        self._age(path)
        self.atime = path.stat().st_atime

    @staticmethod
    def _age(path: Path) -> None:
        made = path.stat().st_mtime
        os.utime(path, (made - 1000, made))

    def untouched(self) -> bool:
        return self.path.stat().st_atime == self.atime


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    """A real sound in MP4 elsewhere on the host, as a DASH or HLS manifest would name it."""
    secret = tmp_path / "elsewhere" / "secret.m4a"
    secret.parent.mkdir()
    run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", "sine=frequency=880:duration=2",
         "-c:a", "aac", str(secret)])  # fmt: skip
    return Canary(secret)


def dash_manifest(path: Path, target: Path) -> Path:
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" minBufferTime="PT1S"'
        ' mediaPresentationDuration="PT2S" profiles="urn:mpeg:dash:profile:isoff-on-demand:2011">'
        '<Period><AdaptationSet mimeType="audio/mp4"><Representation id="a" bandwidth="96000"'
        ' codecs="mp4a.40.2" audioSamplingRate="44100">'
        f"<BaseURL>file://{target}</BaseURL></Representation></AdaptationSet></Period></MPD>\n"
    )
    return path


def hls_playlist(path: Path, target: Path) -> Path:
    path.write_text(
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n"
        f"#EXTINF:2.0,\n{target}\n#EXT-X-ENDLIST\n"
    )
    return path


def concat_script(path: Path, target: Path) -> Path:
    path.write_text(f"ffconcat version 1.0\nfile '{target}'\n")
    return path


def sound_manifest(folder: Path, bed: str) -> Path:
    path = folder / "m.yaml"
    path.write_text(
        "batch: hostile\nvideos:\n  - id: v\n    prompt: a calm sea\n    duration: 2\n"
        "    fps: 8\n    resolution: 64x64\n    renditions: [mobile]\n"
        f"    audio: {{asset: {bed}}}\n"
    )
    return path


# --- 1. a sound whose bytes are a manifest, a playlist or a script ---------------------------

POINTERS = {"dash": dash_manifest, "hls": hls_playlist, "ffconcat": concat_script}
SOUND_NAMES = ["poly.g722", "poly.wav", "poly.ogg", "poly.mp3", "poly.m4a", "poly.flac"]


@pytest.mark.parametrize("name", SOUND_NAMES)
@pytest.mark.parametrize("kind", sorted(POINTERS))
def test_a_sound_that_points_elsewhere_is_refused_at_submit(
    tmp_path: Path, canary: Canary, kind: str, name: str
) -> None:
    POINTERS[kind](tmp_path / name, canary.path)
    env = home_env(tmp_path / "home")
    refused = run_cli_here("submit", str(sound_manifest(tmp_path, f"./{name}")), env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"videos[0].audio.asset: ./{name} is not a sound file" in refused.stderr
    assert "no job" in run_cli_here("status", "hostile.v", env=env).stderr
    assert canary.untouched(), f"submit read {canary.path}, which the {kind} file names"


@pytest.mark.parametrize("kind", sorted(POINTERS))
def test_a_worker_never_follows_a_stored_sound_that_points_elsewhere(
    tmp_path: Path, canary: Canary, kind: str
) -> None:
    """As if the store held one behind the factory's back: the cached copy has no extension,
    so ffmpeg alone would decide the reader by its content."""
    stored = POINTERS[kind](tmp_path / "cached-asset", canary.path)
    out = tmp_path / "out"
    for argv in (
        lambda: audio_argv(ffmpeg_exe(), stored, 1.0, out / "a.m4a"),
        lambda: mix_argv(ffmpeg_exe(), stored, [], 1.0, out / "m.wav"),
        lambda: mix_argv(ffmpeg_exe(), BED, [Cue(0.5, stored)], 1.0, out / "c.wav"),
    ):
        out.mkdir(exist_ok=True)
        with pytest.raises(PermanentError, match="not a sound file"):
            run(argv())
    assert canary.untouched(), f"a worker's ffmpeg read {canary.path}"


def test_every_sound_reader_gets_its_format_and_file_only(tmp_path: Path) -> None:
    """A real bed: the one demuxer its bytes name, and no protocol but `file`."""
    flac = tone(tmp_path / "bed.flac", seconds=1.0).rename(tmp_path / "bed")  # as cached
    argv = audio_argv(ffmpeg_exe(), flac, 1.0, tmp_path / "a.m4a")
    at = argv.index(str(flac))
    assert argv[at - 5 : at] == ["-f", "flac", "-protocol_whitelist", "file", "-i"], argv
    run(argv)
    assert (tmp_path / "a.m4a").stat().st_size > 0


# --- the corpus: every kind's hostile files, by the checks submit runs (in the child) -------


def corpus(folder: Path, canary: Path) -> dict[str, tuple[str, Path, str | None]]:
    """name -> (kind, file, what its refusal says; None: accepted)."""
    made: dict[str, tuple[str, Path, str | None]] = {}

    def put(name: str, kind: str, data: bytes, said: str | None) -> None:
        (folder / name).write_bytes(data)
        made[name] = (kind, folder / name, said)

    bed = tone(folder / "real.flac").read_bytes()
    wav = tone(folder / "real.wav").read_bytes()
    move = (REPO / "examples" / "assets" / "camera-pan.mp4").read_bytes()
    png = (REPO / "examples" / "assets" / "product.png").read_bytes()
    sdp = "v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\nm=audio 5004 RTP/AVP 0\n"
    hls_key = (f'#EXTM3U\n#EXT-X-KEY:METHOD=AES-128,URI="file://{canary}"\n#EXTINF:1,\n'
               f"file://{canary}\n#EXT-X-ENDLIST\n")  # fmt: skip
    for kind, names in (("sound", ("x.wav", "x.mp3")), ("video", ("x.mkv", "x.mp4"))):
        for name in names:
            what = "not a sound file" if kind == "sound" else "not a video file"
            put(f"sdp-{kind}-{name}", kind, sdp.encode(), what)
            put(f"hls-key-{kind}-{name}", kind, hls_key.encode(), what)
            put(f"empty-{kind}-{name}", kind, b"", what)
            put(f"png-polyglot-{kind}-{name}", kind, png + sdp.encode(), "holds PNG")
    put("truncated.wav", "sound", wav[:30], "does not decode as audio")
    put("wav-then-dash.wav", "sound", wav[:12] + b'<?xml version="1.0"?><MPD>', "")
    put("pattern-%03d.flac", "sound", bed, None)  # a name like an image sequence: read as named
    put("truncated.mp4", "video", move[:2000], "")
    put("empty.png", "picture", b"", "not a picture")
    put("svg.png", "picture", b'<svg xmlns="http://www.w3.org/2000/svg"/>', "not a picture")
    chunk_bomb = png[:33] + _png_chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"\x00" * (64 << 20)))
    put("chunk-bomb.png", "picture", chunk_bomb + png[33:], "")
    frames = [Image.new("RGB", (32, 32), (40 * i, 0, 0)) for i in range(3)]
    frames[0].save(folder / "animated.webp", "WEBP", save_all=True, append_images=frames[1:])
    made["animated.webp"] = ("picture", folder / "animated.webp", "is animated (3 frames)")
    Image.new("CMYK", (8000, 5000), (10, 80, 0, 20)).save(folder / "cmyk.jpg", quality=80)
    made["cmyk-40mp.jpg"] = ("picture", folder / "cmyk.jpg", None)
    Image.new("P", (8000, 5000), 3).save(folder / "palette.png")
    made["palette-40mp.png"] = ("picture", folder / "palette.png", None)
    return made


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return (len(data).to_bytes(4, "big") + kind + data
            + (zlib.crc32(kind + data) & 0xFFFFFFFF).to_bytes(4, "big"))  # fmt: skip


def test_the_hostile_corpus_is_refused_or_read_as_named(tmp_path: Path, canary: Canary) -> None:
    """Each file by the check submit runs on it (factory/media/sandbox.py, in the child): a
    refusal with its words ("" for any refusal), or acceptance; the canary never read."""
    from factory.media import sandbox

    checks = {"sound": sandbox.sound_problem, "video": sandbox.video_problem,
              "picture": sandbox.picture_problem}  # fmt: skip
    wrong = {}
    for name, (kind, path, said) in corpus(tmp_path, canary.path).items():
        verdict = checks[kind](path)
        if (verdict is None) != (said is None) or (said and said not in verdict):
            wrong[name] = verdict
        assert verdict is None or str(tmp_path) not in verdict, verdict
    assert not wrong, wrong
    assert canary.untouched()


# --- 2. a camera move longer by its frames' times than its tags say --------------------------


def timestamp_bomb(path: Path) -> Path:
    """Four 64x64 frames, the last at 10,000 s, then its DURATION tag edited to 1 s (in place:
    the tag is text of the same length)."""
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=8)
        stream.width = stream.height = 64
        stream.pix_fmt = "bgr0"
        for i, at in enumerate((0, 1, 2, 80_000)):  # in eighths of a second
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 40 * i, np.uint8), "rgb24")
            frame.pts = at
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    data = path.read_bytes()
    stated = b"02:46:40.1250"
    assert stated in data, "the muxer's DURATION tag moved: fix the test's edit"
    path.write_bytes(data.replace(stated, b"00:00:01.0000"))
    with av.open(str(path), format="matroska") as container:
        assert container.streams.video[0].metadata["DURATION"].startswith("00:00:01.0")
    return path


def test_a_camera_move_whose_frames_outrun_its_stated_length_is_refused(tmp_path: Path) -> None:
    bomb = timestamp_bomb(tmp_path / "pan.mkv")
    texture_picture(tmp_path / "wall.png")
    refused = run_cli_here("validate", str(manifest(tmp_path)), env=home_env(tmp_path / "home"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ("videos[0].scenes[1].camera.asset: ./pan.mkv is 10000 s long by its frames' times; "
            "at most 120 s") in refused.stderr  # fmt: skip
    # A worker handed it anyway stops before it holds more than the limit's frames.
    with pytest.raises(ValueError, match="10000 s long"):
        load_template(bomb, WIDTH, HEIGHT, 8, "pad")


def test_a_still_or_another_codec_is_no_camera_move(tmp_path: Path) -> None:
    pan_template(tmp_path / "one.mkv", frames=1)
    assert control_problem(tmp_path / "one.mkv") == (
        "is a still (one frame): a camera move is a video of the move"
    )
    run([ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=s=64x64:r=8:d=1",
         "-c:v", "mpeg4", str(tmp_path / "old.mp4")])  # fmt: skip
    assert control_problem(tmp_path / "old.mp4") == (
        "is mpeg4; a video file here is av1, ffv1, h264, hevc, prores or vp9"
    )


def test_an_hls_playlist_as_a_camera_move_is_refused_without_opening_what_it_lists(
    tmp_path: Path, canary: Canary
) -> None:
    segment = canary.path.with_name("secret.ts")
    pan_template(tmp_path / "real.mkv", frames=12)
    run([ffmpeg_exe(), "-v", "error", "-y", "-f", "matroska", "-i", str(tmp_path / "real.mkv"),
         "-c:v", "libx264", "-f", "mpegts", str(segment)])  # fmt: skip
    listed = Canary(segment)
    hls_playlist(tmp_path / "pan.mkv", segment)
    texture_picture(tmp_path / "wall.png")
    refused = run_cli_here("submit", str(manifest(tmp_path)), env=home_env(tmp_path / "home"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "videos[0].scenes[1].camera.asset: ./pan.mkv is not a video file" in refused.stderr
    assert str(segment) not in refused.stderr  # no oracle for what exists on the server
    assert listed.untouched(), "submit opened the file the playlist lists"


# --- 3. a 16-bit picture within a memory budget ----------------------------------------------


def test_a_large_16_bit_picture_is_checked_within_the_memory_budget(tmp_path: Path) -> None:
    """78 KB on disk, 8000x5000 16-bit grey (inside the 40 MP limit): the check took 1.1 GiB
    (a float64 copy). The whole checking process, imports included, stays within 512 MiB."""
    picture = tmp_path / "grey16.png"
    ramp = (np.arange(8000, dtype=np.uint32)[None, :] * 8).astype(np.uint16)
    Image.fromarray(np.repeat(ramp, 5000, axis=0)).save(picture)
    # The peak as the kernel counts it since exec (VmHWM): ru_maxrss would carry the peak of
    # the process it was forked from, this test run's.
    script = (
        "import sys\nfrom pathlib import Path\nfrom factory.media.images import image_problem\n"
        "print(image_problem(Path(sys.argv[1])))\n"
        "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(picture)], capture_output=True,
                          text=True, check=True, cwd=REPO)  # fmt: skip
    problem, peak_kib = done.stdout.split("\n")[:2]
    assert problem == "None"
    assert int(peak_kib) < 512 * 1024, f"peak RSS {int(peak_kib) >> 10} MiB"


# --- the checks run in a child under limits ---------------------------------------------------


def test_a_picture_that_needs_more_memory_than_the_budget_is_refused_not_the_process(
    tmp_path: Path,
) -> None:
    """40 MP of RGBA in 160 KB: within the pixel limit, 160 MB decoded. With 64 MiB for the
    decoding, the child that checks it runs out, and submit refuses the picture naming the
    field and the limit: the process that asked stays within its own memory."""
    Image.new("RGBA", (8000, 5000), (10, 200, 30, 128)).save(tmp_path / "wall.png")
    pan_template(tmp_path / "pan.mkv")
    env = {**home_env(tmp_path / "home"), "FACTORY_MEDIA_CHECK_MEMORY": "64"}
    refused = run_cli_here("validate", str(manifest(tmp_path)), env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ("videos[0].scenes[1].image.asset: ./wall.png needs more than 64 MiB to decode "
            "(FACTORY_MEDIA_CHECK_MEMORY): refused") in refused.stderr  # fmt: skip
    env["FACTORY_MEDIA_CHECK_MEMORY"] = "1024"  # the default: it decodes
    assert run_cli_here("validate", str(manifest(tmp_path)), env=env).returncode == 0


def test_the_check_limits_are_named_when_set_wrong() -> None:
    from factory.errors import ConfigError
    from factory.media.sandbox import limits

    assert limits({}) == (1024, 60)
    for name, value in (("FACTORY_MEDIA_CHECK_MEMORY", "0"), ("FACTORY_MEDIA_CHECK_SECONDS", "x")):
        with pytest.raises(ConfigError, match=name):
            limits({name: value})


@pytest.mark.parametrize("command", ["validate", "submit"])
def test_validate_and_submit_of_the_largest_pictures_stay_within_512_mib(
    tmp_path: Path, command: str
) -> None:
    """The CLI process's own peak (VmHWM, imports included) with 40 MP pictures of each kind
    a studio sends (16-bit grey, CMYK JPEG, palette PNG) and a camera move: the decoding
    happens in the checking child, bounded by FACTORY_MEDIA_CHECK_MEMORY."""
    ramp = (np.arange(8000, dtype=np.uint32)[None, :] * 8).astype(np.uint16)
    Image.fromarray(np.repeat(ramp, 5000, axis=0)).save(tmp_path / "grey16.png")
    Image.new("CMYK", (8000, 5000), (10, 80, 0, 20)).save(tmp_path / "cmyk.jpg", quality=80)
    Image.new("P", (8000, 5000), 3).save(tmp_path / "wall.png")
    pan_template(tmp_path / "pan.mkv")
    path = manifest(tmp_path)
    text = path.read_text().replace(
        "      - {start: 0, prompt: a calm sea}\n",
        "      - {start: 0, prompt: a calm sea, image: {asset: ./grey16.png}}\n"
        "      - {start: 1, prompt: a calm sea, image: {asset: ./cmyk.jpg, as: reference}}\n",
    )
    path.write_text(text)
    script = ("import atexit, runpy, sys\n"
              "def peak():\n"
              "    hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
              "    sys.stderr.write(f'VmHWM {hwm}\\n')\n"
              "atexit.register(peak)\n"
              "sys.argv = ['factory', *sys.argv[1:]]\n"
              "runpy.run_module('factory', run_name='__main__')\n")  # fmt: skip
    env = {**os.environ, **home_env(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", script, command, str(path)], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    peak_kib = int(done.stderr.rsplit("VmHWM ", 1)[1].split()[0])
    print(f"{command}: peak RSS {peak_kib >> 10} MiB")
    assert peak_kib < 512 * 1024, f"{command}: peak RSS {peak_kib >> 10} MiB"


# --- 5. one seed rule ------------------------------------------------------------------------


def test_a_redo_seed_beyond_the_manifests_range_is_refused(tmp_path: Path) -> None:
    from factory.config import Settings
    from factory.errors import BadInput
    from factory.ops import Operations
    from factory.wiring import Factory

    env = home_env(tmp_path / "home")
    ops = Operations(Factory.open(Settings.from_env({**os.environ, **env})))
    with pytest.raises(BadInput) as refused:
        ops.redo("no.such", range_text="0-1", seed=2**32, actor="test")
    assert refused.value.field == "--seed" and "4294967295" in str(refused.value)
    cli = run_cli_here("redo", "no.such", "--range", "0-1", "--seed", str(10**30), env=env)
    assert cli.returncode == 2 and "--seed" in cli.stderr, cli.stderr


# --- 6. material read back from the database is held to the asset rule ----------------------


@pytest.mark.parametrize(
    "forged",
    [
        "http://evil.example/x.png",
        "materials/../../../etc/passwd",
        "gopher://x/y",
        "./beside.png",
        "/etc/passwd",
        "",
    ],
)
def test_material_read_back_from_the_database_is_held_to_the_asset_rule(forged: str) -> None:
    from tests.unit.test_material_swap import VIDEO

    with pytest.raises(ValueError):
        with_material(VIDEO, {"0": {"image": {"asset": forged, "as": "first-frame"}}})
