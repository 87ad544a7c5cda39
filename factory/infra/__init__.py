"""The infrastructure every part shares: idempotent submission, heartbeats and stopping,
alerts, metrics and health endpoints, logs and redaction, and their settings."""
