"""The infrastructure every part shares: idempotent submission, heartbeats and stopping,
alerts, metrics and health endpoints, logs and redaction, the confinement of what a spec may
make the factory read, and their settings."""
