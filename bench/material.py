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
   worker (it is cached).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"sound": sound(Path(tmp), args.seconds), "segments": segments(),
                  "track_seconds": tracking()}  # fmt: skip
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
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
