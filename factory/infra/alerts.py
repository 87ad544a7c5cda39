"""Webhook alerts: a job failed, a batch completed (with its summary).

`FACTORY_WEBHOOK_URL` receives a JSON POST per alert; `FACTORY_WEBHOOK_TOKEN`, if set, goes
as `Authorization: Bearer …` and nowhere else: redirects are not followed (urllib would
carry the header to whatever host a redirect names), so a moved receiver is reported as
refused. The URL must be https:// (http:// only to this host, for tests). Every payload
has a `text` line, so Slack, Mattermost and Teams-style incoming webhooks show it as is.
Connection errors, timeouts, 429 and 5xx are retried with backoff (FACTORY_WEBHOOK_ATTEMPTS,
5; FACTORY_WEBHOOK_BACKOFF, 1 s doubling); an alert that still cannot be delivered is
logged, never raised: alerts never fail a job. Payloads pass through factory/infra/redact.py.

The alerts hang on one hook: `watch` (called by factory/wiring.py for every process that
opens the factory) makes the Alerter a listener of the state machine, which calls it once
for each write that settles a job (done, failed, cancelled, parked in review), after the
commit. Workers, the sweeper and operators settle jobs; none of them calls the alerts.

A batch's completion alert goes out once: the first process to see every job of the batch
terminal marks `batches.notified_at` (a compare-and-set) and sends it.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from factory.config.webhook import WebhookSettings
from factory.db.state import JobStateMachine
from factory.infra.redact import redact_value, register_secrets
from factory.job import Job
from factory.stages import Stage

log = logging.getLogger("factory.alerts")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None  # the 3xx surfaces as an HTTPError: reported, never followed


_OPENER = urllib.request.build_opener(_NoRedirects)


class Alerter:
    def __init__(
        self,
        settings: WebhookSettings,
        machine: JobStateMachine,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.machine = machine
        self.sleep = sleep
        register_secrets([settings.token])

    # --- what is sent --------------------------------------------------------------------

    def job_settled(self, job: Job) -> None:
        """What follows a job reaching done, failed or cancelled: its failure alert, and the
        batch's summary if it was the last one; a job parked in review: the batch's wait for
        review once nothing else of it is running. Never raises: alerts never fail a job."""
        try:
            if job.stage is Stage.REVIEW:
                self.review_waiting_if_ready(job.batch)
                return
            if job.stage is Stage.FAILED:
                self.job_failed(job)
            self.batch_done_if_complete(job.batch)
        except Exception as error:  # the database is away: the alert waits for the next job
            log.warning("alert.skipped", extra={"job_id": job.job_id, "error": str(error)})

    def job_failed(self, job: Job) -> bool:
        error = job.last_error or {}
        stage = error.get("stage") or (job.stopped_stage.value if job.stopped_stage else "?")
        message = str(error.get("message", ""))[:500]
        payload = {
            "event": "job.failed",
            "batch": job.batch,
            "job_id": job.job_id,
            "stage": stage,
            "kind": error.get("kind"),
            "message": message,
            "next": f"factory status {job.job_id}; factory requeue {job.job_id}",
            "text": f"factory: job {job.job_id} FAILED in {stage}: {message[:200]}",
        }
        return self.send(payload)

    def batch_done_if_complete(self, batch: str) -> bool:
        """Send the batch's summary if every job is finished and nobody has sent it yet."""
        jobs = self.machine.list_jobs(batch=batch)
        if not jobs or not all(job.stage.is_terminal for job in jobs):
            return False
        if not self.machine.mark_batch_notified(batch):
            return False  # another process sent it
        ids = [j.job_id for j in jobs]
        published = {k: v.outputs or {} for k, v in self.machine.current_versions(ids).items()}
        summary = batch_summary(jobs, self.machine.segment_seconds(ids), published)
        text = (
            f"factory: batch {batch} complete: {summary['delivered']} delivered, "
            f"{summary['failed']} failed, {summary['cancelled']} cancelled; "
            f"{summary['gpu_hours']:.2f} GPU-hours; QC {summary['qc']['passed']} passed, "
            f"{summary['qc']['failed']} failed"
        )
        return self.send({"event": "batch.completed", "batch": batch, "summary": summary,
                          "text": text})  # fmt: skip

    def review_waiting_if_ready(self, batch: str) -> bool:
        """Once every job of the batch is either waiting for review or finished, say which
        wait (once per wait: an approval or rejection re-arms it)."""
        jobs = self.machine.list_jobs(batch=batch)
        waiting = [j.job_id for j in jobs if j.stage is Stage.REVIEW]
        if not waiting or not all(j.stage.is_terminal or j.stage.is_parked for j in jobs):
            return False
        if not self.machine.mark_review_notified(batch):
            return False
        text = (
            f"factory: batch {batch}: {len(waiting)} video(s) passed QC and wait for review "
            f"(console: /batches/{batch}; CLI: factory approve JOB / factory reject JOB)"
        )
        return self.send({"event": "batch.review_waiting", "batch": batch, "waiting": waiting,
                          "text": text})  # fmt: skip

    # --- how -----------------------------------------------------------------------------

    def send(self, payload: dict[str, Any]) -> bool:
        if not self.settings.url:
            return False
        body = json.dumps(redact_value({**payload, "at": datetime.now(UTC).isoformat()})).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "video-factory"}
        if self.settings.token:
            headers["Authorization"] = f"Bearer {self.settings.token}"
        attempts = self.settings.attempts
        for attempt in range(1, attempts + 1):
            problem = self._post(body, headers)
            if problem is None:
                log.info("alert.sent", extra={"alert": payload["event"], "attempt": attempt})
                return True
            if problem.startswith("refused"):
                break  # a 4xx other than 429: sending the same again cannot help
            if attempt < attempts:
                self.sleep(min(60.0, self.settings.backoff * 2 ** (attempt - 1)))
        log.warning("alert.not_sent", extra={"alert": payload["event"], "error": problem})
        return False

    def _post(self, body: bytes, headers: dict[str, str]) -> str | None:
        request = urllib.request.Request(
            self.settings.url or "", data=body, headers=headers, method="POST"
        )
        try:
            with _OPENER.open(request, timeout=self.settings.timeout) as response:
                response.read()
            return None
        except urllib.error.HTTPError as error:
            if 300 <= error.code < 400:
                where = "set FACTORY_WEBHOOK_URL to the final address"
                return f"refused: answered {error.code}, a redirect, not followed: {where}"
            if error.code == 429 or error.code >= 500:
                return f"answered {error.code}"
            return f"refused: answered {error.code}"
        except (urllib.error.URLError, OSError) as error:
            return f"unreachable: {getattr(error, 'reason', error)}"


def batch_summary(
    jobs: list[Job],
    generated: dict[str, tuple[int, float]],
    published: dict[str, dict[str, str]],
) -> dict[str, Any]:
    """``generated``: per job, its segments and their generation seconds (job_segments);
    ``published``: per delivered job, the files of its current version (job_versions)."""
    delivered = [j for j in jobs if j.stage is Stage.DONE]
    failed = [j for j in jobs if j.stage is Stage.FAILED]
    qc = [j.progress.get("qc") for j in jobs]
    seconds = sum(total for _, total in generated.values())
    started = min(j.created_at for j in jobs)
    ended = max(j.updated_at for j in jobs)
    return {
        "jobs": len(jobs),
        "delivered": len(delivered),
        "failed": len(failed),
        "cancelled": sum(j.stage is Stage.CANCELLED for j in jobs),
        "gpu_hours": round(seconds / 3600, 6),
        "wall_seconds": round((ended - started).total_seconds(), 1),
        "qc": {
            "passed": sum(1 for q in qc if q and q.get("passed")),
            "failed": sum(1 for q in qc if q and not q.get("passed")),
            "not_run": sum(1 for q in qc if not q),
        },
        "failures": [
            {
                "job_id": j.job_id,
                "stage": (j.last_error or {}).get("stage"),
                "message": str((j.last_error or {}).get("message", ""))[:200],
            }
            for j in failed
        ],
        "outputs": {j.job_id: published.get(j.job_id, {}) for j in delivered},
    }


def watch(machine: JobStateMachine, settings: WebhookSettings) -> Alerter | None:
    """With a webhook set, the alerts follow `machine`: every job it settles (done, failed,
    cancelled, parked in review), once, after the commit, whoever settled it."""
    if not settings.url:
        return None
    alerter = Alerter(settings, machine)
    machine.on_settled(alerter.job_settled)
    return alerter
