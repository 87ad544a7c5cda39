"""The job state machine: the only code that writes a job's stage.

Workers hold an ``attempt`` number as a fencing token. A claim bumps it with a
compare-and-set; every later write by that worker carries ``AND attempt = :mine``, so a
writer holding a stale attempt (a duplicate delivery, a worker the sweeper gave up on, a
job an operator cancelled or requeued) changes nothing and gets ``StaleAttempt``.

Operator actions (``cancel``, ``requeue``) bump the attempt too, which is how a running
worker learns at its next checkpoint or heartbeat that it must stop. Every change is
appended to ``job_events`` with the job's trace id, in the same transaction.

The machine is one object made of its roles, each in a module of its own under factory/db/:
the reads (reads.py), the fenced writes a worker makes while it holds a job
(worker_writes.py, and delivery.py for the deliver stage's versions), what operators do
(operator_actions.py: create, cancel, requeue, approve, reject; operator_redo.py: a redo of a
delivered job), the sweeper's, gc's and the alerts' upkeep (upkeep.py), and what all of them
stand on: the clock, the fence and the timeline (core.py).
"""

from __future__ import annotations

from factory.db.delivery import Delivery
from factory.db.operator_actions import OperatorActions
from factory.db.reads import Reads
from factory.db.upkeep import Upkeep
from factory.db.worker_writes import WorkerWrites


class JobStateMachine(Reads, WorkerWrites, Delivery, Upkeep, OperatorActions):
    """Every role on one object: ``JobStateMachine(database, clock=None)``
    (factory/db/core.py says which clock its writes take their timestamps from)."""
