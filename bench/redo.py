"""Redo benchmark: a 10 s redo inside a 120 s video against making the whole video, and what
stays bit for bit the same.

    python bench/redo.py [--duration 120] [--range 70-80] [--resolution 640x360]

One video as the nightly example makes them (16 fps, segments of 48 frames with 8 of overlap,
three renditions, the procedural generator), made once in this process (version 1: the
baseline), then `factory redo --range` of it with a new seed (version 2). Reported:
- wall time of the redo / wall time of version 1 (both: generate, encode, mux, QC, deliver),
  and the same for generate + encode only (the issue's target: <= 0.15);
- encoder runs: chunks encoded for version 1 and for the redo, per rendition;
- frames: the lossless segments (what every rendition is encoded from) outside the planned
  changed frames compared with version 1's, bit for bit; and each delivered rendition decoded
  and compared frame by frame: identical outside the re-encoded chunks; frames in re-encoded
  chunks but outside the changed range are re-encoded (PSNR given), not copied.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.manifest import parse_manifest  # noqa: E402
from factory.media.intermediate import read_frames  # noqa: E402
from factory.pipeline.chunks import plan_chunks  # noqa: E402
from factory.store import keys  # noqa: E402


def factory(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "factory", *args], env=env, cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"factory {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return time.monotonic() - started, done


def status(env: dict[str, str]) -> dict:
    return json.loads(factory("status", "bench.long", "--json", env=env)[1].stdout)


def lossless(store: Path, records: dict[int, int | None], width: int, height: int) -> np.ndarray:
    return np.concatenate(
        [
            read_frames(store / keys.segment("bench", "long", i, a), width, height)
            for i, a in sorted(records.items())
        ]
    )


def decode_all(path: Path) -> list[np.ndarray]:
    """Every picture of a delivered file, in presentation order, as 8-bit RGB."""
    import av

    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=120)
    parser.add_argument("--range", default="70-80")
    parser.add_argument("--resolution", default="640x360")
    args = parser.parse_args()
    width, height = (int(v) for v in args.resolution.split("x"))
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        env = {
            **os.environ,
            "FACTORY_HOME": str(home),
            "FACTORY_DATABASE_URL": "",
            "FACTORY_BROKER_URL": "",
            "FACTORY_STORE_URL": "",
            "FACTORY_REDIS_URL": "",
        }
        text = (
            f"batch: bench\ndefaults: {{duration: {args.duration:g}, fps: 16, "
            f"resolution: {args.resolution}, segment: {{frames: 48, overlap: 8}}, "
            "renditions: [master, mobile, compat]}\n"
            "videos:\n  - {id: long, prompt: 'a harbor at dawn, boats, gulls, slow pan'}\n"
        )
        manifest = Path(scratch) / "m.yaml"
        manifest.write_text(text)
        store = home / "store"
        whole, _ = factory("run", str(manifest), env=env)
        v1 = status(env)
        v1_records = {s["index"]: s.get("attempt") for s in v1["segments_made"]}
        chunk_dir = store / "bench" / "long" / "chunks"
        renditions = ("master", "mobile", "compat")
        before = {r: {p.name for p in (chunk_dir / r).iterdir()} for r in renditions}
        plan = json.loads(factory("redo", "bench.long", "--range", args.range, "--dry-run",
                                  "--json", env=env)[1].stdout)  # fmt: skip
        redo, _ = factory("redo", "bench.long", "--range", args.range, "--seed", "7",
                          "--reason", "bench", env=env)  # fmt: skip
        v2 = status(env)
        v2_records = {s["index"]: s.get("attempt") for s in v2["segments_made"]}
        made = {r: len({p.name for p in (chunk_dir / r).iterdir()} - before[r]) for r in before}

        def gen_encode(timings: dict) -> float:
            stages = ("generate", "encode")
            return sum(timings.get(stage, {}).get("seconds", 0.0) for stage in stages)

        print(f"video {args.duration:g} s at 16 fps, {args.resolution}; redo {args.range} "
              f"(segments {plan['segments'][0]}-{plan['segments'][-1]}, join {plan['join']}, "
              f"chunks {plan['chunks']} of {plan['chunks_total']})")  # fmt: skip
        print(f"wall time: version 1 {whole:.1f} s, redo {redo:.1f} s: ratio {redo / whole:.3f}")
        g1, g2 = gen_encode(v1["progress"]["timings"]), gen_encode(v2["progress"]["timings"])
        print(f"generate + encode stages: version 1 {g1:.1f} s, redo {g2:.1f} s: "
              f"ratio {g2 / g1:.3f} (target <= 0.15)")  # fmt: skip
        total = plan["chunks_total"]
        print("chunks encoded by the redo per rendition: "
              + ", ".join(f"{r} {n} of {total}" for r, n in made.items()))  # fmt: skip

        start, end = plan["changed_start"], plan["changed_end"]
        a = lossless(store, v1_records, width, height)
        b = lossless(store, v2_records, width, height)
        outside = np.ones(len(a), bool)
        outside[start:end] = False
        same = [np.array_equal(a[i], b[i]) for i in np.flatnonzero(outside)]
        print(f"lossless frames outside {start}-{end - 1}: {sum(same)} of {len(same)} identical")

        video = parse_manifest(text).videos[0]
        bounds, first = [], 0
        for chunk in plan_chunks(video):
            bounds.append((chunk.index, first, first + chunk.frames))
            first += chunk.frames
        redone = set(plan["chunks"])
        for rendition in ("master", "mobile", "compat"):
            old = decode_all(store / keys.output("bench", "long", rendition, 1))
            new = decode_all(store / keys.output("bench", "long", rendition, 2))
            kept_same = kept_total = reenc_total = reenc_same = 0
            worst = float("inf")
            for index, lo, hi in bounds:
                for i in range(lo, hi):
                    if not outside[i]:
                        continue
                    equal = np.array_equal(old[i], new[i])
                    if index in redone:
                        reenc_total += 1
                        reenc_same += equal
                        worst = min(worst, psnr(old[i], new[i]))
                    else:
                        kept_total += 1
                        kept_same += equal
            print(f"{rendition:7} decoded: untouched chunks {kept_same} of {kept_total} frames "
                  f"identical; re-encoded chunks, outside the range: {reenc_same} of "
                  f"{reenc_total} identical, worst PSNR {worst:.1f} dB")  # fmt: skip


if __name__ == "__main__":
    main()
