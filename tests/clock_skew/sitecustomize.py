"""A process whose wall clock is off: put this folder first on PYTHONPATH and set
FACTORY_TEST_CLOCK_SKEW (seconds, + ahead, - behind). Every `time.time()` and
`datetime.now()` of the process (Celery's, SQLAlchemy's, the factory's) is shifted, as on a
node whose NTP is broken; monotonic clocks and the database server's clock are untouched.

(libfaketime was the first choice; its clock_nanosleep and pthread_cond_timedwait wrappers
hang or fail with EINVAL under Python 3.11 here, whichever monotonic setting is used.)
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time

_offset = float(os.environ.get("FACTORY_TEST_CLOCK_SKEW") or 0)

if _offset:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _offset
    _time.time_ns = lambda: _real_time_ns() + int(_offset * 1e9)
    _shift = _datetime.timedelta(seconds=_offset)

    class _SkewedDatetime(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + _shift

        @classmethod
        def utcnow(cls):
            return super().utcnow() + _shift

        @classmethod
        def today(cls):
            return super().today() + _shift

    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]
