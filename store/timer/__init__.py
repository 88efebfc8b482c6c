"""RocketMQ 5's timers: arbitrary delivery times (docs/timers.md).

:mod:`.park` (the put path: a message asking for a time is parked in
``rmq_sys_wheel_timer``), :mod:`.files` (the TimerLog and the wheel),
:mod:`.checkpoint` (``config/timercheck``), :mod:`.service` (the thread that
files parked messages in the wheel and delivers due ones), :mod:`.api`
(recall, status, replication progress), :mod:`.check` (``store check``).
No network imports: the service layer calls it through MessageStore.
"""

from basalt.store.timer.api import RecallFailed, TimerStatus, TimerTopicStatus
from basalt.store.timer.park import BadTimer, park_timer, tick_of
from basalt.store.timer.service import TimerMessageService

__all__ = [
    "BadTimer",
    "RecallFailed",
    "TimerMessageService",
    "TimerStatus",
    "TimerTopicStatus",
    "park_timer",
    "tick_of",
]
