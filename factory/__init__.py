"""The long-video batch factory: manifests in, generated, stitched, encoded, checked videos out."""

__version__ = "0.1.0"
