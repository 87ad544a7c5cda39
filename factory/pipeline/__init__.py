"""The stage functions: what `factory run` calls in-process and the Celery tasks call on
workers. Each takes a claimed job (its attempt is the fencing token), does its stage's
work with checkpoints through the state machine, and moves the job to the next stage.
"""
