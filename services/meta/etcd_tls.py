"""An etcd client that dials with TLS: aetcd's ``Client`` opens a plaintext
channel only, so :class:`TlsEtcdClient` replaces its ``connect`` with one
that opens :func:`basalt.common.dial.channel` (the CA to trust, and the
process's certificate for an etcd run with ``--client-cert-auth``).

It sets up what aetcd's own ``connect`` sets up, minus etcd's user/password
authentication, which Basalt does not use (mutual TLS identifies a client).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd  # type: ignore[import-untyped]  # ships no type information
import aetcd.rpc  # type: ignore[import-untyped]
import aetcd.watcher  # type: ignore[import-untyped]

from basalt.common import dial
from basalt.common import tls as transport


class TlsEtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """``aetcd.Client`` over a TLS channel made from ``tls`` (enabled)."""

    def __init__(self, *, tls: transport.TlsConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tls = tls
        # aetcd sets these untyped; declared here for the checker.
        self._is_connecting: bool = self._is_connecting

    async def connect(self) -> None:
        """Open the channel and the stubs (once; concurrent callers wait for
        the first). Raises OSError when a TLS file cannot be read."""
        if self._connected.is_set():
            return
        if self._is_connecting:
            async with asyncio.timeout(self._connect_wait_timeout):
                await self._connected.wait()
            return
        try:
            self._is_connecting = True
            self.channel = dial.channel(
                f"{self._host}:{self._port}",
                self._tls,
                options=tuple(self._options.items()),
                signed=False,  # etcd takes `authorization` for its own token
            )
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False
