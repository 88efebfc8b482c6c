"""Where ``basalt admin``'s topic and reset verbs run: over etcd directly, or
through the admin service (``--server``).

:class:`TopicAdmin` is what those verbs need; :class:`DirectAdmin` runs it
here (:mod:`basalt.admin.topics`, :mod:`basalt.admin.ops`), :class:`ServiceAdmin` asks an
admin service (admin.proto). Both answer with the same values, so a verb
builds one table whichever ran it. Two differences, both admin.proto's:

* a reset some store-node failed is an error from the service (the partial
  table stays on the server's side), where the direct run prints the
  partial table with the failure;
* mqadmin's updateTopic changes only the fields given, while UpdateTopic
  stores a whole config: :meth:`ServiceAdmin.update_topic` reads the topic
  (GetTopic), applies the change and writes at the revision read, again
  when another writer came in between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import grpc

from basalt.admin import ops, topics
from basalt.admin.errors import AdminError
from basalt.common.status import response_code_of
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import admin_pb2_grpc as adm_grpc
from basalt.v1 import common_pb2 as pb

if TYPE_CHECKING:
    from basalt.services.meta import MetaClient  # etcd's client: the server extra

#: Read-change-write rounds an updateTopic through the service tries before
#: giving up on a topic that other writers keep changing.
MAX_UPDATE_ATTEMPTS = 16
#: Each call's deadline, beyond a reset's wait for its consumers.
CALL_TIMEOUT_S = 30.0


class TopicAdmin(Protocol):
    """The verbs the admin service offers, as ``basalt admin`` runs them."""

    async def update_topic(self, topic: str, change: topics.TopicChange) -> topics.TopicWrite:
        """Create the topic or apply ``change`` (mqadmin updateTopic)."""
        ...

    async def delete_topic(self, topic: str) -> None: ...

    async def topic_names(self) -> list[str]:
        """Every topic, sorted."""
        ...

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int, *, force: bool, ack_timeout_ms: int
    ) -> ops.ResetOutcome: ...


class DirectAdmin:
    """:class:`TopicAdmin` over a connected MetaClient, in this process."""

    def __init__(self, meta: MetaClient) -> None:
        self.meta = meta

    async def update_topic(self, topic: str, change: topics.TopicChange) -> topics.TopicWrite:
        return await topics.update_topic(self.meta, topic, change)

    async def delete_topic(self, topic: str) -> None:
        await topics.delete_topic(self.meta, topic)

    async def topic_names(self) -> list[str]:
        return await topics.topic_names(self.meta)

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int, *, force: bool, ack_timeout_ms: int
    ) -> ops.ResetOutcome:
        return await ops.reset_offset_by_time(
            self.meta, group, topic, timestamp_ms, force=force, ack_timeout_ms=ack_timeout_ms
        )


class ServiceAdmin:
    """:class:`TopicAdmin` through the admin service at ``address`` on
    ``channel``. A refused call raises AdminError with the service's message
    (what the direct run would have printed); a service that did not answer,
    AdminError naming its address."""

    def __init__(self, channel: grpc.aio.Channel, address: str) -> None:
        self.stub = adm_grpc.AdminStub(channel)
        self.address = address

    async def update_topic(self, topic: str, change: topics.TopicChange) -> topics.TopicWrite:
        for _ in range(MAX_UPDATE_ATTEMPTS):
            try:
                got = await self.stub.GetTopic(
                    adm.GetTopicRequest(topic=topic), timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as e:
                if response_code_of(e) != pb.RESPONSE_CODE_TOPIC_NOT_EXIST:
                    raise self._error(e) from None
                # Empty brokers: the service puts a new topic on every store-node.
                config, expected, created = change.new_topic(topic), 0, True
            else:
                current = topics.topic_config_from_pb(got.config)
                config, expected, created = change.apply(current), got.mod_revision, False
            try:
                written = await self.stub.UpdateTopic(
                    adm.UpdateTopicRequest(
                        config=topics.topic_config_pb(config), expected_mod_revision=expected
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as e:
                if e.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.ALREADY_EXISTS):
                    continue  # another writer came in between: read again
                raise self._error(e) from None
            return topics.TopicWrite(
                topics.topic_config_from_pb(written.config), created, written.mod_revision
            )
        raise AdminError(
            f"topic {topic!r} changed under each of {MAX_UPDATE_ATTEMPTS} attempts to update "
            "it; nothing was written, retry later"
        )

    async def delete_topic(self, topic: str) -> None:
        try:
            await self.stub.DeleteTopic(adm.DeleteTopicRequest(topic=topic), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None

    async def topic_names(self) -> list[str]:
        try:
            listed = await self.stub.TopicList(adm.TopicListRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
        return list(listed.topics)

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int, *, force: bool, ack_timeout_ms: int
    ) -> ops.ResetOutcome:
        try:
            reset = await self.stub.ResetOffsetByTime(
                adm.ResetOffsetByTimeRequest(
                    group=group,
                    topic=topic,
                    timestamp_ms=timestamp_ms,
                    force=force,
                    ack_timeout_ms=ack_timeout_ms,
                ),
                timeout=ack_timeout_ms / 1000 + CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as e:
            raise self._error(e) from None
        # No acks: the group had no live consumer (a store-node failure is an error).
        return ops.ResetOutcome(list(reset.offsets), {}, list(reset.consumer_acks) or None)

    def _error(self, e: grpc.aio.AioRpcError) -> AdminError:
        if response_code_of(e) is not None:  # the service refused: its message says why
            return AdminError(e.details() or e.code().name)
        return AdminError(f"admin service at {self.address}: {e.code().name}: {e.details()}")
