"""The quality gate: checks on the outputs, a JSON report, and (later) seam scores and pictures."""
