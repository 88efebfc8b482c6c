"""Registrations: a key bound to a lease that this process keeps alive.

A store-node registers ``brokers/<name>``, a pull-service
``pull-services/<id>`` and each consumer session ``consumers/<group>/<id>``.
The key lives exactly as long as the lease: a process that dies stops sending
keepalives and etcd deletes its keys one TTL later; a clean close revokes the
lease and the keys go at once.

One background task per registration, on the loop that registered it:

- every ``ttl / 3`` it refreshes the lease;
- etcd unreachable: it logs once and keeps trying every
  ``min(reconnect_backoff_max_s, ttl / 3)``. etcd persists leases and renews
  their TTL when it restarts, so a registration whose process lived through
  the outage is still there afterwards; the task re-puts the key anyway in
  case it was lost (e.g. etcd restored from an older snapshot);
- the lease is gone (keepalive answers TTL 0: we were cut off longer than the
  TTL, or etcd lost its data): it grants a new lease and puts the key again,
  then runs the :meth:`Registration.on_granted` hooks (keys that share the
  lease, e.g. a group master's route, are put again by them).

Each registration has its own TTL (a broker group's member uses
``ha_lease_ttl_s``, 3 s, not ``MetaConfig.lease_ttl_s``) and records when
its lease was last confirmed (:attr:`Registration.last_renewed_monotonic`):
a master fences itself by it (docs/replication.md#election-and-fencing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from basalt.services.meta.config import MetaKeys
from basalt.services.meta.errors import MetaUnavailableError, MetaValidationError
from basalt.services.meta.model import Registrable
from basalt.services.meta.session import EtcdSession

log = logging.getLogger(__name__)


class Registration:
    """A leased key kept alive by a background task. Create with
    :meth:`basalt.services.meta.client.MetaClient.register`; end with :meth:`close`.

    All methods run on the loop that created it.
    """

    def __init__(
        self,
        session: EtcdSession,
        keys: MetaKeys,
        value: Registrable,
        ttl_s: int,
        *,
        on_closed: Callable[[Registration], None] | None = None,
    ) -> None:
        self._session = session
        self._on_closed = on_closed
        self._keys = keys
        self._value = value
        self.key = keys.of(value.key_suffix())
        self.ttl_s = ttl_s
        self._lease_id: int | None = None
        #: The value changed (update() while etcd was away): put it again.
        self._dirty = False
        self._alive = False
        self._closed = False
        self._wake = asyncio.Event()
        self._registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_renewed: float | None = None
        self._hooks: list[Callable[[int], Awaitable[object]]] = []

    @property
    def last_renewed_monotonic(self) -> float | None:
        """``time.monotonic()`` taken just before sending the last grant or
        keepalive that etcd confirmed (None before the first; kept through an
        outage). The lease runs at least ``ttl_s`` from then: etcd restarts
        the TTL when it handles the request, which is after it was sent, so
        ``last_renewed_monotonic + ttl_s`` never overestimates how long the
        lease (and every key under it) lasts."""
        return self._last_renewed

    def on_granted(self, hook: Callable[[int], Awaitable[object]]) -> Callable[[], None]:
        """Run ``hook(lease_id)`` after each new lease the background task
        grants once the first is lost (the key is already put again then), so
        keys that share the lease come back with it. A hook that raises is
        logged. Returns the function that removes the hook."""
        self._hooks.append(hook)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._hooks.remove(hook)

        return remove

    @property
    def value(self) -> Registrable:
        return self._value

    @property
    def lease_id(self) -> int | None:
        """The lease currently holding the key, None before the first grant or after loss."""
        return self._lease_id

    @property
    def alive(self) -> bool:
        """True when the last exchange with etcd confirmed the lease and the key."""
        return self._alive

    async def start(self, *, wait: bool = True) -> None:
        """Register and start keeping the lease alive.

        With ``wait`` the first grant and put happen here and their
        MetaUnavailableError propagates (nothing is left running); without it
        the background task makes every attempt, retrying until etcd answers.
        """
        if self._task is not None:
            raise RuntimeError(f"registration {self.key} already started")
        if wait:
            await self._register()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"basalt-lease:{self.key}"
        )

    async def wait_registered(self, timeout_s: float | None = None) -> bool:
        """Wait until the key has been put at least once; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._registered.wait()
        except TimeoutError:
            return False
        return True

    async def update(self, value: Registrable) -> None:
        """Replace the registered value (same key, same lease).

        Raises MetaValidationError (a ValueError) if ``value`` belongs under
        another key, RuntimeError once closed. If etcd is unreachable the new
        value is kept and put by the background task once etcd returns, and
        MetaUnavailableError is raised to say it is not there yet.
        """
        key = self._keys.of(value.key_suffix())
        if key != self.key:
            raise MetaValidationError(f"registration {self.key} cannot take a value for {key}")
        if self._closed:
            raise RuntimeError(f"registration {self.key} is closed")
        self._value = value
        self._dirty = True
        if self._lease_id is None:  # not registered yet: the background task puts it
            self._wake.set()
            return
        await self._session.put(self.key, value.to_json(), lease=self._lease_id)
        # Unless another update() came in meanwhile, etcd now holds the newest value.
        self._dirty = self._value is not value

    async def close(self, *, revoke: bool = True) -> None:
        """Stop the keepalives and, with ``revoke``, revoke the lease so the key goes now.

        If etcd is unreachable the revoke is skipped (logged) and the key expires
        one TTL later. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        if self._on_closed is not None:
            self._on_closed(self)
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        lease, self._lease_id = self._lease_id, None
        self._alive = False
        if revoke and lease is not None:
            try:
                await self._session.revoke(lease)
            except MetaUnavailableError as e:
                log.warning("%s not revoked, it expires within %d s: %s", self.key, self.ttl_s, e)

    async def _register(self) -> None:
        sent = time.monotonic()
        lease = await self._session.grant(self.ttl_s)
        value = self._value
        try:
            previous = await self._session.put(self.key, value.to_json(), lease=lease)
        except BaseException:
            # Do not leave a lease behind; if etcd is away it expires by itself.
            with contextlib.suppress(MetaUnavailableError):
                await self._session.revoke(lease)
            raise
        if previous is not None and previous.lease not in (0, lease, self._lease_id):
            # Most often our own previous life (killed, restarted within the TTL);
            # two live processes with one name would keep taking it from each other.
            log.info("%s taken over from lease %x", self.key, previous.lease)
        self._lease_id = lease
        self._last_renewed = sent
        self._dirty = value is not self._value
        self._alive = True
        self._registered.set()

    async def _run_hooks(self, lease: int) -> None:
        for hook in list(self._hooks):
            try:
                await hook(lease)
            except Exception:
                log.exception("%s: a hook on the new lease %x failed", self.key, lease)

    async def _run(self) -> None:
        """The keepalive loop; never raises until cancelled."""
        interval_s = self.ttl_s / 3
        retry_s = min(self._session.config.reconnect_backoff_max_s, interval_s)
        outage = False
        while not self._closed:
            pause = interval_s
            try:
                sent = time.monotonic()
                lease = self._lease_id
                if lease is None:
                    await self._register()
                    if outage:
                        log.info("%s registered (etcd reachable again)", self.key)
                    if self._lease_id is not None:
                        await self._run_hooks(self._lease_id)
                elif await self._session.keepalive(lease) <= 0:
                    log.warning("lease of %s expired in etcd; registering again", self.key)
                    self._lease_id = None
                    self._alive = False
                    continue
                else:
                    self._last_renewed = sent
                if lease is not None and (outage or self._dirty):
                    # Back from an outage (or holding a newer value): make sure the
                    # key is there with our value.
                    value = self._value
                    await self._session.put(self.key, value.to_json(), lease=lease)
                    self._dirty = value is not self._value
                    if outage:
                        log.info("%s: etcd reachable again, lease kept", self.key)
                outage = False
                self._alive = True
            except MetaUnavailableError as e:
                if not outage:
                    log.warning("%s: %s; retrying until etcd answers", self.key, e)
                outage = True
                self._alive = False
                pause = retry_s
            except Exception:
                log.exception("%s: keepalive failed; retrying", self.key)
                outage = True
                self._alive = False
                pause = retry_s
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()
