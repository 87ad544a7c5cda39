"""Redo benchmark: a 10 s redo inside a 120 s video against making the whole video, and what
stays bit for bit the same.

    python bench/redo.py [--duration 120] [--range 70-80] [--second-range 53-58]
                         [--resolution 640x360] [--keyframes every-2s|segments|both]

One video as the nightly example makes them (16 fps, segments of 48 frames with 8 of overlap,
three renditions, the procedural generator), made once in this process (version 1: the
baseline), then `factory redo --range` of it with a new seed (version 2), then a redo of a
second range whose first changed frame is not on the 2 s keyframe grid (version 3, against
version 2); for each keyframe layout (`every-2s`, the default, and `segments`). Reported:
- wall time of the redo / wall time of version 1 (both: generate, encode, mux, QC, deliver),
  and the same for the generate + encode stages (the issue's target: <= 0.15);
- frames encoded again per rendition (only the GOPs holding changed frames) of the video's;
- frames: the lossless segments outside the changed range compared with version 1's, bit for
  bit; each delivered rendition decoded and compared frame by frame: outside the re-encoded
  GOPs (copied packets), inside them but outside the changed range (PSNR), and (the issue's
  criterion) outside the redone segments and the segment joined into;
- the bits the `segments` layout costs: version 1's delivered size against `every-2s`'s;
- (every-2s) after both redos, gc and `requeue --from generate`: the time the segments took
  against version 1's (replaying the two joins makes past segments again: the ratio to
  expect is (segments + past segments) / segments), and the lossless frames against the
  current version's (all identical: a regeneration replays the joins).

`--regeneration-only [--rounds 2]`: that cost alone against a baseline in the same run, a
twin video without redos regenerated in turns with the redone one (steadier on a busy
machine than against version 1, made minutes before).
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

STAGES = ("generate", "encode")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.manifest import parse_manifest  # noqa: E402
from factory.media.intermediate import read_frames  # noqa: E402
from factory.plan.chunks import chunk_keyframes, plan_chunks  # noqa: E402
from factory.plan.video import video_plan  # noqa: E402
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


def run_layout(args: argparse.Namespace, layout: str) -> dict:
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
            f"renditions: [master, mobile, compat], keyframes: {layout}}}\n"
            "videos:\n  - {id: long, prompt: 'a harbor at dawn, boats, gulls, slow pan'}\n"
        )
        manifest = Path(scratch) / "m.yaml"
        manifest.write_text(text)
        store = home / "store"
        video = parse_manifest(text).videos[0]
        whole, _ = factory("run", str(manifest), env=env)
        before = status(env)
        result = {"layout": layout, "frames_total": video.frames_total, "whole": whole,
                  "redos": []}  # fmt: skip
        # The range, then one whose first changed frame is not on the 2 s grid.
        for number, text_range in enumerate((args.range, args.second_range), start=2):
            plan = json.loads(factory("redo", "bench.long", "--range", text_range,
                                      "--dry-run", "--json", env=env)[1].stdout)  # fmt: skip
            redo, _ = factory("redo", "bench.long", "--range", text_range, "--seed",
                              str(number), "--reason", "bench", env=env)  # fmt: skip
            after = status(env)
            figures = compare(store, video, plan, before, after, (width, height), number)
            figures |= {"range": text_range, "plan": plan, "wall": redo,
                        "gen_encode": gen_encode(after)}  # fmt: skip
            result["redos"].append(figures)
            if number == 2:
                result["v1_gen_encode"] = gen_encode(before)
                result["v1_generate"] = segment_seconds(before)
            before = after
        if layout == "every-2s":
            result["regeneration"] = regenerate(manifest, store, video, before, (width, height),
                                                env)  # fmt: skip
        return result


def segment_seconds(status_json: dict) -> float:
    """The seconds the job's current segments took to make (a segment that needed past
    segments made again counts them)."""
    return sum(s["seconds"] or 0.0 for s in status_json["segments_made"])


def regenerate(manifest: Path, store: Path, video, current: dict, size: tuple[int, int],
               env: dict[str, str]) -> dict:  # fmt: skip
    """After both joined redos: gc, then `requeue --from generate` makes the video again from
    nothing; its lossless frames against the current version's, and what replaying the
    joins cost (the past segments made again)."""
    width, height = size
    made = {s["index"]: s.get("attempt") for s in current["segments_made"]}
    kept = lossless(store, made, width, height)
    factory("gc", "--older-than", "0", env=env)
    factory("requeue", "bench.long", "--from", "generate", env=env)
    wall, _ = factory("run", str(manifest), env=env)
    after = status(env)
    again = lossless(store, {s["index"]: s.get("attempt") for s in after["segments_made"]},
                     width, height)  # fmt: skip
    events = json.loads(factory("events", "bench.long", "--json", env=env)[1].stdout)
    # (only a regeneration makes past segments: a redo reads the stored ones)
    pasts = [p for e in events for p in (e.get("detail") or {}).get("past_segments_made", [])]
    same = sum(np.array_equal(a, b) for a, b in zip(kept, again, strict=True))
    return {"wall": wall, "generate": segment_seconds(after), "pasts": len(pasts),
            "segments": len(video_plan(video)), "same": (same, len(kept)),
            "version": after["version"]}  # fmt: skip


def gen_encode(status_json: dict) -> float:
    timings = status_json["progress"]["timings"]
    return sum(timings.get(stage, {}).get("seconds", 0.0) for stage in STAGES)


def compare(store: Path, video, plan: dict, before: dict, after: dict, size: tuple[int, int],
            version: int) -> dict:  # fmt: skip
    """Version ``version`` against the one before it: lossless frames, and each rendition
    decoded, in three sets: GOPs copied, GOPs encoded again but outside the changed frames,
    and (the issue's criterion) everything outside the redone segments and the joined one."""
    width, height = size
    old_records = {s["index"]: s.get("attempt") for s in before["segments_made"]}
    new_records = {s["index"]: s.get("attempt") for s in after["segments_made"]}
    start, end = plan["changed_start"], plan["changed_end"]
    a = lossless(store, old_records, width, height)
    b = lossless(store, new_records, width, height)
    outside = np.ones(len(a), bool)
    outside[start:end] = False
    same = [np.array_equal(a[i], b[i]) for i in np.flatnonzero(outside)]
    plans = video_plan(video)
    last = plan["join"] if plan["join"] is not None else plan["segments"][-1]
    redone = np.zeros(len(a), bool)
    redone[plans[plan["segments"][0]].write_start : plans[last].write_end] = True
    reencoded = np.zeros(len(a), bool)
    for chunk in plan_chunks(video):
        if chunk.index not in plan["chunks"]:
            continue
        starts = chunk_keyframes(video, chunk)
        for lo, hi in zip(starts, [*starts[1:], chunk.frames], strict=True):
            first = chunk.first_frame
            if first + lo < end and first + hi > start:
                reencoded[first + lo : first + hi] = True
    figures: dict = {"lossless": (sum(same), len(same)), "renditions": {}}
    for rendition in ("master", "mobile", "compat"):
        old_file = store / keys.output("bench", "long", rendition, version - 1)
        old = decode_all(old_file)
        new = decode_all(store / keys.output("bench", "long", rendition, version))
        equal = [np.array_equal(old[i], new[i]) for i in range(len(old))]
        copied = [equal[i] for i in range(len(old)) if outside[i] and not reencoded[i]]
        margin = [i for i in range(len(old)) if outside[i] and reencoded[i]]
        worst = min((psnr(old[i], new[i]) for i in margin), default=float("inf"))
        kept = [equal[i] for i in range(len(old)) if not redone[i]]
        figures["renditions"][rendition] = {
            "copied": (sum(copied), len(copied)),
            "margin": (sum(equal[i] for i in margin), len(margin), worst),
            "outside_redone": (sum(kept), len(kept)),
            "bytes": old_file.stat().st_size,
        }
    return figures


def report(r: dict) -> None:
    print(f"\n== keyframes: {r['layout']}; version 1 made in {r['whole']:.1f} s")
    for redo in r["redos"]:
        plan, g1, g2 = redo["plan"], r["v1_gen_encode"], redo["gen_encode"]
        print(f"-- redo {redo['range']}: segments {plan['segments'][0]}-{plan['segments'][-1]}, "
              f"join {plan['join']}, chunks {plan['chunks']} of {plan['chunks_total']}, "
              f"changed frames {plan['changed_start']}-{plan['changed_end'] - 1}")  # fmt: skip
        print(f"wall time: redo {redo['wall']:.1f} s / version 1 {r['whole']:.1f} s: "
              f"ratio {redo['wall'] / r['whole']:.3f}")  # fmt: skip
        print(f"generate + encode stages: redo {g2:.1f} s / version 1 {g1:.1f} s: "
              f"ratio {g2 / g1:.3f} (target <= 0.15)")  # fmt: skip
        print(f"frames encoded again per rendition: {plan['encode_frames']} of "
              f"{r['frames_total']} (the changed chunks hold {plan['chunks_frames']})")  # fmt: skip
        same, total = redo["lossless"]
        print(f"lossless frames outside the changed range: {same} of {total} identical")
        for rendition, figures in redo["renditions"].items():
            copied, margin, kept = figures["copied"], figures["margin"], figures["outside_redone"]
            print(f"{rendition:7} decoded: copied GOPs {copied[0]}/{copied[1]} identical; "
                  f"re-encoded, unchanged frames {margin[0]}/{margin[1]}"
                  + (f" (worst PSNR {margin[2]:.1f} dB)" if margin[1] else "")
                  + f"; outside the redone and joined segments {kept[0]}/{kept[1]}")  # fmt: skip


def regeneration_ab(args: argparse.Namespace) -> None:
    """The cost of replaying joins against a baseline in the same run: two videos of one spec,
    `long` redone twice (joined ranges) and `twin` never; then, in turns (twin, long, twin,
    long, ...), `requeue --from generate` of each: the seconds their segments took, and
    long's / twin's per round (the machine's load drifts alike for both in a round)."""
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        blank = ("FACTORY_DATABASE_URL", "FACTORY_BROKER_URL", "FACTORY_STORE_URL",
                 "FACTORY_REDIS_URL")  # fmt: skip
        env = {**os.environ, "FACTORY_HOME": str(home)} | dict.fromkeys(blank, "")
        manifest = Path(scratch) / "m.yaml"
        manifest.write_text(
            f"batch: bench\ndefaults: {{duration: {args.duration:g}, fps: 16, "
            f"resolution: {args.resolution}, segment: {{frames: 48, overlap: 8}}, "
            "renditions: [mobile]}\nvideos:\n"
            "  - {id: long, prompt: 'a harbor at dawn, boats, gulls, slow pan'}\n"
            "  - {id: twin, prompt: 'a harbor at dawn, boats, gulls, slow pan'}\n"
        )
        factory("run", str(manifest), env=env)
        for number, text_range in enumerate((args.range, args.second_range), start=2):
            factory("redo", "bench.long", "--range", text_range, "--seed", str(number), env=env)
        print(f"\n== replaying joins: requeue --from generate, {args.duration:g} s at "
              f"{args.resolution}, long (two joined redos) against twin (none)")  # fmt: skip
        for round_ in range(1, args.rounds + 1):
            seconds = {}
            for name in ("twin", "long"):
                factory("requeue", f"bench.{name}", "--from", "generate", env=env)
                factory("run", str(manifest), env=env)
                made = json.loads(factory("status", f"bench.{name}", "--json", env=env)[1].stdout)
                seconds[name] = segment_seconds(made)
            long, twin = seconds["long"], seconds["twin"]
            print(f"round {round_}: segments long {long:.1f} s / twin {twin:.1f} s: "
                  f"ratio {long / twin:.3f}")  # fmt: skip


def report_regeneration(r: dict) -> None:
    g = r["regeneration"]
    print(f"\n== gc, then requeue --from generate after both joined redos (version {g['version']})")
    print(f"segments: {g['generate']:.1f} s / version 1's {r['v1_generate']:.1f} s: ratio "
          f"{g['generate'] / r['v1_generate']:.3f}; past segments made again to replay the "
          f"joins: {g['pasts']} (the video has {g['segments']}: expected ratio "
          f"{(g['segments'] + g['pasts']) / g['segments']:.3f})")  # fmt: skip
    print(f"wall time: {g['wall']:.1f} s / version 1's {r['whole']:.1f} s: ratio "
          f"{g['wall'] / r['whole']:.3f}")  # fmt: skip
    same, total = g["same"]
    print(f"lossless frames against the current version's: {same} of {total} identical")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=120)
    parser.add_argument("--range", default="70-80")
    parser.add_argument("--second-range", default="53-58")
    parser.add_argument("--resolution", default="640x360")
    parser.add_argument("--keyframes", choices=("every-2s", "segments", "both"), default="both")
    parser.add_argument(
        "--regeneration-only",
        action="store_true",
        help="only the cost of replaying joins, against a twin without redos",
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.regeneration_only:
        regeneration_ab(args)
        return
    layouts = ("every-2s", "segments") if args.keyframes == "both" else (args.keyframes,)
    results = [run_layout(args, layout) for layout in layouts]
    for result in results:
        report(result)
        if "regeneration" in result:
            report_regeneration(result)
    if len(results) == 2:
        sizes = [r["redos"][0]["renditions"] for r in results]
        print("\nversion 1's delivered bytes, segments / every-2s layout: " + ", ".join(
            f"{name} {sizes[1][name]['bytes'] / sizes[0][name]['bytes']:.3f}" for name in sizes[0]
        ))  # fmt: skip


if __name__ == "__main__":
    main()
