"""The caps that bound a hang in the tests. None of them asserts on speed.

Each is sized for a loaded 2-core CI machine (load 9 was seen), where a
``python -m basalt.admin`` run alone takes seconds before it does anything:
a cap that is hit there says the thing hung, not that it was slow.
pytest-timeout (300 s a test, pyproject.toml) is the outer net.
"""

from __future__ import annotations

#: Cap on one subprocess a test starts and waits for: a CLI run
#: (``subprocess.run(..., timeout=)``, ``wait_for(proc.communicate(), ...)``),
#: a child program, a service process's exit after a signal.
SUBPROCESS_TIMEOUT_S = 120.0

#: Cap on a whole ``async`` test run by :func:`tests.support.aio.async_test`.
ASYNC_TEST_TIMEOUT_S = 45.0

#: Cap on a whole ``async`` test that runs CLI subprocesses (a dozen ``basalt``
#: runs, or ``basalt cluster up``): 45 s killed two such tests at load 9.
#: Below pytest-timeout, so the test fails with asyncio's traceback.
SUBPROCESS_TEST_TIMEOUT_S = 240.0
