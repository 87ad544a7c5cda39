"""CLI commands for GPU generation: `factory preload` (assets and prompt embeddings ahead of
the batch),
`factory gpu plan` (memory per component, from the model config) and `factory gpu report`
(what segments really used)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from factory.cli import common
from factory.cli.common import err, out
from factory.config import Settings
from factory.errors import BadInput
from factory.spec import DIFFUSERS_FAMILIES, ModelChoice
from factory.wiring import Factory

gpu_app = typer.Typer(
    help="GPU memory: plan before a batch, report after it.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.command()(preload)
    app.add_typer(gpu_app, name="gpu")


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.2f} GiB"


def preload(
    manifest: Path = typer.Argument(..., help="Manifest whose assets and prompts to warm."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    all_assets: bool = typer.Option(
        False, "--all", help="Warm every asset here, not only this node's share of the ring."
    ),
) -> None:
    """Warm a batch before it starts: the assets it references (scene pictures and LoRAs
    first, then sound cues, then beds, the most used first) into this node's asset cache,
    this node's share by consistent hashing over FACTORY_NODES, and the prompt
    embeddings into the shared cache, so GPU workers load only the transformer and the VAE.
    Run it on every node (scripts/nightly.sh does, before submitting)."""
    from factory.manifest import load_manifest
    from factory.ops import check_manifest, preflight
    from factory.ops.views import preload_order
    from factory.store import open_store

    settings = common.settings()
    checked = check_manifest(load_manifest(manifest), settings)  # a bad asset: exit 2 here too
    for warning in checked.warnings:
        err.print(f"warning: {warning}", markup=False)
    parsed = checked.manifest
    factory = Factory.open(settings)
    store = open_store(settings.store_url, settings.s3)
    preflight.upload(checked, store)
    ordered = preload_order(parsed.videos)  # what generation reads first (ops/views.py)
    references = [reference for reference, _ in ordered]
    kinds = dict(ordered)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    report: dict[str, Any] = {"node": settings.node_name, "nodes": list(settings.nodes)}
    with Progress(*columns, console=err, disable=as_json or not err.is_terminal) as bar:
        report["assets"] = _warm_assets(settings, store, references, all_assets, bar)
        for item in report["assets"]["items"]:
            item["kind"] = kinds[item["asset"]]
        report["embeddings"] = _warm_embeddings(factory, parsed, bar)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    _print_asset_report(report)
    _print_embedding_report(report["embeddings"])


def _warm_assets(
    settings: Settings, store: Any, references: list[str], all_assets: bool, bar: Progress
) -> dict[str, Any]:
    """This node's share of the assets (all of them with --all) into its asset cache."""
    from factory.store.assets import node_ring, open_asset_cache

    assets = open_asset_cache(settings, store)
    task = bar.add_task("assets", total=len(references))
    outcomes: dict[str, str] = {}

    def each(reference: str, outcome: str) -> None:
        outcomes[reference] = outcome
        bar.advance(task)

    warmed = assets.warm(
        references,
        ring=None if all_assets else node_ring(settings),
        node=settings.node_name,
        replicas=settings.asset_replicas,
        on_each=each,
    )
    return {
        "referenced": len(references),
        "hits": warmed.hits,
        "misses": warmed.misses,
        "skipped": warmed.skipped,
        "bytes_fetched": warmed.bytes_fetched,
        "items": [
            {"asset": ref, "owners": warmed.owners[ref], "outcome": outcomes[ref]}
            for ref in references
        ],
        "cache": assets.stats(),
    }


def _warm_embeddings(factory: Factory, parsed: Any, bar: Progress) -> dict[str, Any]:
    from factory.pipeline.prompts import EnsureResult, PromptService, open_embedding_cache
    from factory.store import open_store

    settings = factory.settings
    wanted: dict[ModelChoice, list[tuple[str, str]]] = {}
    for video in parsed.videos:
        if video.model.family in DIFFUSERS_FAMILIES:
            pairs = wanted.setdefault(video.model, [])
            pairs += [(s.prompt, video.negative_prompt) for s in video.scenes]
    report: dict[str, Any] = {"models": [], "hits": 0, "misses": 0, "not_stored": 0}
    if not wanted:
        report["skipped"] = "no video of a diffusers family"
        return report
    store = open_store(settings.store_url, settings.s3)
    cache = open_embedding_cache(settings, factory.database, store)
    if cache is None:
        report["skipped"] = "FACTORY_EMBEDDING_CACHE is off: GPU workers encode prompts"
        return report
    service = PromptService(cache, settings.text_encoder_device)
    total = EnsureResult()
    for model, pairs in wanted.items():
        unique = list(dict.fromkeys(pairs))
        task = bar.add_task(f"{model.family} prompts", total=len(unique))
        result = service.ensure(model, unique, on_each=lambda _, t=task: bar.advance(t))
        total.add(result)
        report["models"].append(
            {
                "model": f"{model.family}:{model.path}",
                "prompts": len(unique),
                "hits": result.hits,
                "misses": result.misses,
                "text_encoder_bytes": _text_encoder_bytes(model),
            }
        )
    report.update(
        hits=total.hits,
        misses=total.misses,
        not_stored=total.not_stored,
        cache=_cache_summary(cache.stats()),
    )
    return report


def _print_asset_report(report: dict[str, Any]) -> None:
    a = report["assets"]
    if not a["referenced"]:
        out.print("assets: the manifest references none")
    else:
        elsewhere = sorted({o for item in a["items"] if item["outcome"] == "skipped"
                            for o in item["owners"]})  # fmt: skip
        out.print(
            f"assets on {report['node']}: {a['referenced']} referenced, {a['hits']} already "
            f"cached, {a['misses']} fetched ({a['bytes_fetched'] / 1e6:.1f} MB)"
            + (f", {a['skipped']} warmed by {', '.join(elsewhere)}" if a["skipped"] else "")
        )
        for item in a["items"]:
            out.print(
                f"  {item['outcome']:<8} {item['asset']}  (nodes: {', '.join(item['owners'])})"
            )
    c = a["cache"]
    out.print(
        f"asset cache: {c['objects']} files, {c['bytes'] / 1e6:.1f} MB of "
        f"{c['capacity'] / 1e9:.1f} GB"
    )


def _print_embedding_report(report: dict[str, Any]) -> None:
    if "skipped" in report:
        out.print(f"prompt embeddings: nothing to encode ({report['skipped']})")
        return
    for entry in report["models"]:
        out.print(
            f"{entry['model']}: {entry['prompts']} prompts, {entry['hits']} already cached, "
            f"{entry['misses']} encoded; text encoder {gib(entry['text_encoder_bytes'])} "
            "(bf16) that GPU workers do not load"
        )
    stats = report["cache"]
    rate = "-" if stats["hit_rate"] is None else f"{stats['hit_rate']:.0%}"
    out.print(
        f"embedding cache: {stats['entries']} entries, {gib(stats['bytes'])} of "
        f"{gib(stats['capacity'])}, hit rate {rate} "
        f"({stats['hits']} hits, {stats['misses']} misses)"
    )
    if report["not_stored"]:
        err.print(
            f"{report['not_stored']} embedding(s) larger than FACTORY_EMBEDDING_CACHE_BYTES "
            "were not stored"
        )


def _text_encoder_bytes(model: ModelChoice) -> int | None:
    from factory.generate.memory_plan import plan

    try:
        found = plan(model.family, 64, 64, 9, model.path)
    except BadInput:
        return None
    return next((line.bytes for line in found.lines if line.component.startswith("text")), None)


@gpu_app.command("plan")
def gpu_plan(
    family: str = typer.Option(..., "--family", help=f"One of {', '.join(DIFFUSERS_FAMILIES)}."),
    resolution: str = typer.Option(..., "--resolution", help="WIDTHxHEIGHT, e.g. 832x480."),
    segment_frames: int = typer.Option(..., "--segment-frames", min=1, max=1025),
    model: Path | None = typer.Option(None, "--model", help="Model directory (config only)."),
    fp8: bool = typer.Option(False, "--fp8", help="Layerwise casting: weights stored in fp8."),
    offload: bool = typer.Option(False, "--group-offload", help="Group offload, block level."),
    tiling: bool = typer.Option(False, "--vae-tiling", help="VAE tiling."),
    size: str | None = typer.Option(
        None, "--size", help="A released size without --model: anyflow-far 1.3B or 14B."
    ),
    first_frame: bool = typer.Option(
        False, "--first-frame", help="The segment starts from a scene's picture."
    ),
    reference_images: int = typer.Option(
        0, "--reference-images", min=0, max=16, help="VACE reference pictures (wan)."
    ),
    control: bool = typer.Option(False, "--control", help="A camera move's control frames."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Estimated GPU memory per component for one segment (weights exact, the rest estimated);
    without --model, the released model's config (Wan/SkyReels 1.3B, LTX-Video 2B, Helios
    14B, AnyFlow-FAR 1.3B or --size 14B)."""
    from factory.generate.memory_plan import plan

    match = re.fullmatch(r"(\d+)x(\d+)", resolution)
    if not match:
        raise BadInput(f"{resolution!r} is not WIDTHxHEIGHT", field="--resolution")
    width, height = int(match[1]), int(match[2])
    found = plan(
        family,
        width,
        height,
        segment_frames,
        str(model) if model else None,
        layerwise_fp8=fp8,
        group_offload=offload,
        vae_tiling=tiling,
        size=size,
        first_frame=first_frame,
        reference_images=reference_images,
        control=control,
    )
    if as_json:
        sys.stdout.write(json.dumps(found.to_dict(), indent=2) + "\n")
        return
    table = Table(
        title=f"{family} {width}x{height}, {segment_frames} frames ({found.tokens} tokens)"
    )
    for column in ("component", "memory", "on the GPU", "how"):
        table.add_column(column)
    for line in found.lines:
        where = "yes" if line.on_gpu else "no (embedding cache)"
        table.add_row(line.component, gib(line.bytes), where, line.how)
    table.add_row("total on the GPU", gib(found.gpu_total), "", "")
    out.print(table)


@gpu_app.command("report")
def gpu_report(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Measured per-segment memory and time, by family, resolution, segment length, GPU and
    attention backend, from every recorded job; and the embedding cache's hit rate."""
    from factory.pipeline.prompts import open_embedding_cache
    from factory.store import open_store

    factory = common.open_factory()
    settings = factory.settings
    from factory.gpu.report import gpu_rows

    rows = gpu_rows(factory.database)
    cache = open_embedding_cache(
        settings, factory.database, open_store(settings.store_url, settings.s3)
    )
    summary = _cache_summary(cache.stats()) if cache else None
    if as_json:
        data = {"segments": [r.to_dict() for r in rows], "embedding_cache": summary}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    if not rows:
        out.print("no measured segments yet (only diffusers segments record memory)")
    else:
        out.print(_measured_table(rows))
    if summary:
        rate = "-" if summary["hit_rate"] is None else f"{summary['hit_rate']:.0%}"
        out.print(
            f"embedding cache: {summary['entries']} entries, {gib(summary['bytes'])}, "
            f"hit rate {rate} ({summary['hits']} hits, {summary['misses']} misses)"
        )


def _measured_table(rows: list[Any]) -> Table:
    table = Table(title="measured per segment")
    for column in (
        "family",
        "resolution",
        "frames",
        "device",
        "attention",
        "segments",
        "s/segment",
        "peak allocated",
        "peak reserved",
        "fragmentation",
        "peak RSS",
        "OOM retries",
    ):
        table.add_column(column)
    for r in rows:
        frag = "-" if r.fragmentation is None else f"{r.fragmentation:.1%}"
        table.add_row(
            r.family,
            r.resolution,
            str(r.segment_frames),
            r.device,
            r.attention,
            str(r.segments),
            f"{r.median_seconds:.2f}",
            gib(r.peak_allocated),
            gib(r.peak_reserved),
            frag,
            gib(r.peak_rss),
            str(r.oom_retries),
        )
    return table


def _cache_summary(stats: Any) -> Any:
    from factory.gpu.report import cache_summary  # (redis: imported when the cache is read)

    return cache_summary(stats)
