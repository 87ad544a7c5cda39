"""Delivery benchmark: a 200 MB rendition through the mutual-TLS gateway against the same
upload straight to the S3 server, in the same run (tests/s3stand.py: moto behind Debian
nginx running docker/nginx-mtls.conf).

    python bench/delivery.py [--mb 200] [--rounds 3] [--json FILE]

Both paths go through the factory's S3Store (sha256, multipart with per-part MD5 checks,
verification after upload). Figures: throughput through the gateway / direct, for the
upload (put_file) and the download (local_path, sha256-checked), median over the rounds;
and the no-op re-delivery (same content already there) against the upload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from factory.store.s3 import S3Store  # noqa: E402
from tests.s3stand import ACCESS_KEY, SECRET_KEY, S3Stand  # noqa: E402


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stand = S3Stand(root / "stand")
        stand.root.mkdir()
        stand.start()
        try:
            figures = run(stand, root, args.mb, args.rounds)
        finally:
            stand.stop()
    for name, value in figures.items():
        print(f"{name:<48} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def run(stand: S3Stand, root: Path, mb: int, rounds: int) -> dict[str, float]:
    stand.make_bucket("bench")
    production = dict(multipart_bytes=8 << 20, part_bytes=8 << 20, attempts=5, backoff=1.0)
    through = S3Store("s3://bench/gateway", stand.settings(**production))
    direct = S3Store(
        "s3://bench/direct",
        stand.settings(None, endpoint_url=stand.direct_endpoint, ca_bundle=None, **production),
    )
    rendition = root / "master.mp4"
    size = mb * 1_000_000
    times: dict[str, list[float]] = {k: [] for k in ("up_gw", "up_direct", "down_gw",
                                                      "down_direct", "again_gw")}  # fmt: skip
    for round_ in range(rounds):
        rendition.write_bytes(os.urandom(size))  # new content each round: no skipping
        key = f"r{round_}/out/master.mp4"
        order = [(through, "gw"), (direct, "direct")]
        if round_ % 2:
            order.reverse()  # neither path always goes first
        for store, name in order:
            times[f"up_{name}"].append(timed(lambda s=store, k=key: s.put_file(k, rendition)))
        times["again_gw"].append(timed(lambda k=key: through.put_file(k, rendition)))
        for store, name in order:

            def download(s: S3Store = store, k: str = key) -> None:
                with s.local_path(k):
                    pass

            times[f"down_{name}"].append(timed(download))
        for store in (through, direct):
            store.delete(key)
    median = {k: statistics.median(v) for k, v in times.items()}
    mbps = {k: size / 1e6 / v for k, v in median.items()}
    return {
        "size_mb": mb,
        "rounds": rounds,
        "upload_gateway_MBps": round(mbps["up_gw"], 1),
        "upload_direct_MBps": round(mbps["up_direct"], 1),
        "upload throughput, gateway / direct": round(mbps["up_gw"] / mbps["up_direct"], 3),
        "download_gateway_MBps": round(mbps["down_gw"], 1),
        "download_direct_MBps": round(mbps["down_direct"], 1),
        "download throughput, gateway / direct": round(mbps["down_gw"] / mbps["down_direct"], 3),
        "re-delivery (no-op) time / upload time": round(median["again_gw"] / median["up_gw"], 3),
    }


if __name__ == "__main__":
    main()
