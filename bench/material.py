"""What a studio's own material costs (issue 38), each figure a ratio to a baseline measured in
the same run (docs/benchmarks.md, "Material"):

    python bench/material.py [--seconds 120] [--json FILE]

1. the sound track of a SECONDS-long video: a bed with 12 cues and a loudness target (mix
   and measure, probe the limiter's gain, gain, limiter, AAC and measure) against the bed
   alone (one step), wall time, the least of three runs each (target <= 3: the track is made
   once per video, in mux);
2. procedural segments (48 frames at 640x360): with a reference picture, and with a picture
   and a camera move, against none, wall time, the least of three (target <= 1.5 each);
3. the motion track of a 10 s camera-move template at 640x360, 24 fps: seconds, once per
   worker (it is cached);
4. the check at submit of each kind of material (issue 49: identified by its bytes, opened by
   that one reader, limits measured on what is read) against a plain decode of the same
   file, CPU time, the least of three, and the check's peak RSS in a fresh process (VmHWM,
   imports included; target <= 512 MiB): a 20 s WAV bed, a 10 s 640x360 H.264 camera move,
   an 8000x5000 16-bit grey PNG and a 24 MP JPEG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import least  # noqa: E402
from factory.generate.base import SegmentSpec  # noqa: E402
from factory.generate.procedural import ProceduralGenerator  # noqa: E402
from factory.media.audio import audio_argv  # noqa: E402
from factory.media.control import motion_track  # noqa: E402
from factory.media.ffmpeg import ffmpeg_exe, run  # noqa: E402
from factory.media.sound import Cue, make_track  # noqa: E402

WIDTH, HEIGHT, FRAMES = 640, 360, 48


def sound(folder: Path, seconds: float) -> dict[str, float]:
    exe = ffmpeg_exe()
    for name, source in (
        ("bed.wav", "anoisesrc=d=20:c=brown:r=48000:a=0.1"),
        ("cue.wav", "aevalsrc='0.5*sin(2*PI*880*t)*exp(-4*t)':d=1:s=48000"),
    ):
        subprocess.run([exe, "-v", "error", "-y", "-f", "lavfi", "-i", source,
                        str(folder / name)], check=True)  # fmt: skip
    cues = [Cue(at, folder / "cue.wav", -3.0) for at in np.linspace(1, seconds - 2, 12)]
    plain = least(3, lambda: run(audio_argv(exe, folder / "bed.wav", seconds,
                                            folder / "plain.m4a")))  # fmt: skip
    mixed = least(3, lambda: make_track(folder / "bed.wav", cues, seconds, folder / "mix.m4a",
                                        folder, loudness=(-14.0, -1.0)))  # fmt: skip
    return {"bed_s": plain, "cues_loudness_s": mixed, "ratio": mixed / plain}


def segments() -> dict[str, float]:
    generator = ProceduralGenerator()
    prompt = generator.encode_prompt("A harbor wall in morning light")
    rng = np.random.default_rng(1)
    picture = rng.integers(0, 255, (HEIGHT, WIDTH, 3)).astype(np.uint8)
    track = np.stack([np.arange(FRAMES) * 3.0, np.zeros(FRAMES)], axis=1).astype(np.float32)
    kinds = {
        "none": {},
        "picture": {"image": picture, "image_role": "reference"},
        "picture_camera": {"image": picture, "image_role": "reference", "control_track": track},
    }
    timed = {}
    for name, extra in kinds.items():
        spec = SegmentSpec(1, FRAMES, WIDTH, HEIGHT, 24, 48, 0, 1, **extra)
        timed[name] = least(3, lambda spec=spec: generator.generate(spec, prompt, None, 7))
    return {**{f"{k}_s": v for k, v in timed.items()},
            "picture_ratio": timed["picture"] / timed["none"],
            "picture_camera_ratio": timed["picture_camera"] / timed["none"]}  # fmt: skip


def tracking() -> float:
    rng = np.random.default_rng(2)
    texture = rng.integers(0, 255, (HEIGHT, WIDTH + 480, 3)).astype(np.uint8)
    frames = np.stack([texture[:, 2 * i : 2 * i + WIDTH] for i in range(240)])
    started = time.perf_counter()
    motion_track(frames)
    return time.perf_counter() - started


DECODE_AUDIO = "with av.open(str(path), format='wav') as c:\n    for f in c.decode(audio=0): pass"
DECODE_VIDEO = "with av.open(str(path), format='mov') as c:\n    for f in c.decode(video=0): pass"
LOAD_PICTURE = "Image.open(path).load()"
CHECKS = {  # kind -> (the check's module and function, a plain decode of the same file)
    "sound": ("factory.media.sound", "check_sound_file", DECODE_AUDIO),
    "camera move": ("factory.media.control", "control_problem", DECODE_VIDEO),
    "16-bit picture": ("factory.media.images", "image_problem", LOAD_PICTURE),
    "JPEG picture": ("factory.media.images", "image_problem", LOAD_PICTURE),
}


def material_files(folder: Path) -> dict[str, Path]:
    from PIL import Image

    exe = ffmpeg_exe()
    files = {
        "sound": folder / "bed.wav",
        "camera move": folder / "move.mp4",
        "16-bit picture": folder / "grey16.png",
        "JPEG picture": folder / "photo.jpg",
    }
    subprocess.run([exe, "-v", "error", "-y", "-f", "lavfi", "-i",
                    "anoisesrc=d=20:c=pink:r=48000:a=0.1", str(files["sound"])],
                   check=True)  # fmt: skip
    subprocess.run([exe, "-v", "error", "-y", "-f", "lavfi", "-i",
                    f"testsrc2=s={WIDTH}x{HEIGHT}:r=24:d=10", "-c:v", "libx264",
                    "-pix_fmt", "yuv420p", str(files["camera move"])], check=True)  # fmt: skip
    ramp = (np.arange(8000, dtype=np.uint32)[None, :] * 8).astype(np.uint16)
    Image.fromarray(np.repeat(ramp, 5000, axis=0)).save(files["16-bit picture"])
    rng = np.random.default_rng(4)
    small = rng.integers(0, 255, (150, 200, 3)).astype(np.uint8)
    Image.fromarray(small).resize((6000, 4000)).save(files["JPEG picture"], quality=90)
    return files


def _in_a_fresh_process(setup: str, code: str, path: Path) -> tuple[float, int]:
    """CPU seconds of ``code`` (which reads ``path``) in a new interpreter after ``setup``
    (its imports, not timed), and the process's peak RSS in KiB, imports included (VmHWM:
    counted from exec, unlike ru_maxrss, which carries the peak of the process forked)."""
    script = (f"import sys, time\nfrom pathlib import Path\npath = Path(sys.argv[1])\n{setup}\n"
              f"t = time.process_time()\n{code}\nt = time.process_time() - t\n"
              "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
              "print(t, hwm)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, str(path)], check=True, text=True,
                          capture_output=True, cwd=REPO)  # fmt: skip
    seconds, peak = done.stdout.split()
    return float(seconds), int(peak)


def ingest(folder: Path) -> dict[str, dict[str, float]]:
    figures = {}
    for kind, path in material_files(folder).items():
        module, function, plain = CHECKS[kind]
        checking = f"problem = {function}(path)\nassert problem is None, problem"
        runs = [_in_a_fresh_process(f"from {module} import {function}", checking, path)
                for _ in range(3)]  # fmt: skip
        decodes = [_in_a_fresh_process("import av\nfrom PIL import Image", plain, path)
                   for _ in range(3)]  # fmt: skip
        checked, decoded = min(r[0] for r in runs), min(d[0] for d in decodes)
        figures[kind] = {"check_s": checked, "decode_s": decoded, "ratio": checked / decoded,
                         "check_peak_mib": max(r[1] for r in runs) / 1024,
                         "decode_peak_mib": max(d[1] for d in decodes) / 1024}  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"sound": sound(Path(tmp), args.seconds), "segments": segments(),
                  "track_seconds": tracking(), "ingest": ingest(Path(tmp))}  # fmt: skip
    s, g = result["sound"], result["segments"]
    print(
        f"sound track, {args.seconds:g} s: 12 cues + loudness / bed alone  {s['ratio']:.2f}  "
        f"({s['cues_loudness_s']:.2f} s / {s['bed_s']:.2f} s; target <= 3)"
    )
    print(
        f"procedural segment ({FRAMES} frames at {WIDTH}x{HEIGHT}): picture / none  "
        f"{g['picture_ratio']:.2f}; picture + camera / none  {g['picture_camera_ratio']:.2f}"
        f"  ({g['none_s']:.2f} s plain; target <= 1.5)"
    )
    print(
        f"motion track of a 10 s template at {WIDTH}x{HEIGHT}: "
        f"{result['track_seconds']:.2f} s (once per worker)"
    )
    for kind, figure in result["ingest"].items():
        print(
            f"check at submit, {kind}: / plain decode  {figure['ratio']:.2f}  "
            f"({figure['check_s']:.3f} s / {figure['decode_s']:.3f} s CPU); peak RSS "
            f"{figure['check_peak_mib']:.0f} MiB (plain decode {figure['decode_peak_mib']:.0f} MiB;"
            " target <= 512)"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
