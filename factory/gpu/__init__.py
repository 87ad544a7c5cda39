"""The GPU node: which GPUs this machine has, which worker runs on each, their memory, reports."""
