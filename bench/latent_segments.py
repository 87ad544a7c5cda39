"""Latent families on the CPU: what continuing from latents costs per segment, against the
generation itself, with the tiny random models of the tests (docs/benchmarks.md).

    python bench/latent_segments.py [--segments 6] [--repeats 3]

For Helios-Distilled (a chunk of 36 frames per segment) and AnyFlow-FAR (two chunks of 12
frames), segment after segment through the factory's generator, measured in this run:

- generation: the pipeline call making the segment's new latents (the baseline);
- persistence: the carry serialised to safetensors, stored in a file store, read back and
  parsed, as a cold worker would (what a warm worker skips);
- context decode: the warm decode (the previous segment's last latent frames, then the new
  ones) less a decode of the new latents alone, i.e. what seamlessness costs;
each as a ratio to the generation, median over the segments after the first. Tiny models
make the generation cheap and the VAE relatively dear, so these ratios are upper bounds for
real sizes, where a 14B transformer's steps dwarf the decode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from factory.generate.base import SegmentSpec, segment_seed  # noqa: E402
from factory.generate.latent_backend import carry_from_bytes  # noqa: E402
from factory.store.file import FileStore  # noqa: E402
from tests.latent_segments import NEGATIVE, OVERLAP, PROMPT, loaded  # noqa: E402
from tests.tiny_models import save_anyflow_far, save_helios  # noqa: E402

FAMILIES = {
    "helios": (lambda folder: save_helios(folder, "distilled"), 36),
    "anyflow-far": (save_anyflow_far, 24),
}


def measure(family: str, folder: Path, segments: int) -> dict[str, float]:
    import torch

    save, new = FAMILIES[family]
    generator = loaded(family, str(save(folder / family)))
    prompt = generator.encode_prompt(PROMPT, NEGATIVE)
    store = FileStore(folder / "store")
    carry = None
    rows = []
    for index in range(segments):
        context = OVERLAP if index else 0
        spec = SegmentSpec(index, new + context, 128, 64, 24, 0, context)
        _, carry = generator.generate_continuing(spec, prompt, carry, segment_seed(7, index))
        phases = generator.last_phases or {}
        started = time.perf_counter()
        key = f"lat/v/segments/{index:05d}.a1.carry.safetensors"
        store.put_bytes(key, carry)
        with store.local_path(key) as path:
            state, _ = carry_from_bytes(path.read_bytes())
        persisted = time.perf_counter() - started
        latents = state["latents"][:, :, -(new // 4) :]
        started = time.perf_counter()
        with torch.no_grad():
            generator._decode(SegmentSpec(0, new, 128, 64, 24, 0, 0), None, latents)
        alone = time.perf_counter() - started
        rows.append(
            {
                "generation": phases["denoise_seconds"],
                "persistence": persisted,
                "context_decode": max(phases["decode_seconds"] - alone, 0.0),
                "decode": phases["decode_seconds"],
                "carry_kib": len(carry) / 1024,
            }
        )
    later = rows[1:]
    base = statistics.median(r["generation"] for r in later)
    return {
        "generation_s": base,
        "persistence": statistics.median(r["persistence"] for r in later) / base,
        "context_decode": statistics.median(r["context_decode"] for r in later) / base,
        "decode": statistics.median(r["decode"] for r in later) / base,
        "carry_kib": statistics.median(r["carry_kib"] for r in later),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.segments} segments, median of {args.repeats} runs; ratios to the generation\n")
    print("| family | generation (s) | persistence | context decode | whole decode | carry |")
    print("|---|---|---|---|---|---|")
    for family in FAMILIES:
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="bench-latent-") as scratch:
                runs.append(measure(family, Path(scratch), args.segments))
        row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {family} | {row['generation_s']:.3f} | {row['persistence']:.3f}x | "
            f"{row['context_decode']:.3f}x | {row['decode']:.3f}x | {row['carry_kib']:.0f} KiB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
