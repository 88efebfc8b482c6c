"""What the tests share, in one place: no test module imports another.

* :mod:`~tests.support.polling`: :func:`eventually`, the one way to wait for a state;
* :mod:`~tests.support.timeouts`: the caps that bound a hang;
* :mod:`~tests.support.aio`: ``@async_test`` (async tests without pytest-asyncio);
* :mod:`~tests.support.stores`: small store configurations, a filled store, the
  store fixtures;
* :mod:`~tests.support.strategies`: Hypothesis strategies for records;
* :mod:`~tests.support.damage`: the catalogue of ways to damage a stopped store root;
* :mod:`~tests.support.etcd`: real etcd processes and their fixtures;
* :mod:`~tests.support.nodes`: store-nodes, pull-services and the admin service
  in the test's process, on port 0;
* :mod:`~tests.support.rpc`: requests and refusals of the generated stubs;
* :mod:`~tests.support.sessions`: the consumer's side of a pull-service Session;
* :mod:`~tests.support.consumers`: what the SDK consumer tests share;
* :mod:`~tests.support.processes`: the ``basalt`` CLI runner, service processes,
  the pull path as processes;
* :mod:`~tests.support.absent`: Python and ``basalt`` processes in which an
  extra's modules cannot be imported (a base install);
* :mod:`~tests.support.imports`: who imports whom, read from modules' ASTs
  (the layout and layering tests);
* child programs the tests start: :mod:`~tests.support.push_worker`,
  :mod:`~tests.support.crash_writer`, :mod:`~tests.support.offset_writer`.

Fixtures are registered by ``tests/conftest.py``, which imports them from here.
"""
