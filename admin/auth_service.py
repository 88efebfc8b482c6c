"""The Admin service's user and ACL methods (mqadmin's createUser ... listAcl).

Thin, as every servicer: check and decode the request, call
:class:`basalt.services.auth.store.AuthStore`, encode the answer. Who may call
them (super users only) is the auth interceptor's business, not this
module's. A secret key never leaves in an answer nor enters a log line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from basalt.services.auth.cipher import SecretCipher
from basalt.services.auth.model import (
    Acl,
    AuthModelError,
    Decision,
    Policy,
    ResourcePattern,
    User,
    UserStatus,
    UserType,
    parse_enum,
)
from basalt.services.auth.store import AuthConflictError, AuthStore
from basalt.services.errors import Outcome, Refusal, invalid
from basalt.services.meta import MetaClient
from basalt.services.rpc import rpc_method
from basalt.v1 import admin_pb2 as adm

R = TypeVar("R")
Context = grpc.aio.ServicerContext[Any, Any]


def policy_of(message: adm.AclPolicy) -> Policy:
    """Raises AuthModelError for an unknown action, decision or a bad resource."""
    return Policy.from_dict(
        {
            "resources": list(message.resources),
            "actions": list(message.actions),
            "decision": message.decision or Decision.ALLOW.value,
            "sourceIps": list(message.source_ips),
        }
    )


def acl_pb(acl: Acl) -> adm.AclInfo:
    return adm.AclInfo(
        subject=acl.subject,
        policies=[
            adm.AclPolicy(
                resources=d["resources"],
                actions=d["actions"],
                decision=d["decision"],
                source_ips=d["sourceIps"],
            )
            for d in (p.to_dict() for p in acl.policies)
        ],
    )


def user_pb(user: User) -> adm.UserInfo:
    """A user as ListUser answers it: without its secret."""
    return adm.UserInfo(
        username=user.username, user_type=user.user_type.value, user_status=user.status.value
    )


class AuthAdminServicer:
    """Mixed into the Admin servicer: ``self.meta`` connected, ``self.cipher``
    the cluster key's (None: these methods answer FAILED_PRECONDITION)."""

    meta: MetaClient
    cipher: SecretCipher | None

    async def _store(self, run: Callable[[AuthStore], Awaitable[R]]) -> R:
        if self.cipher is None:
            raise Refusal.of(
                Outcome.AUTH_NOT_CONFIGURED,
                "users and ACLs need the admin service run with --auth-cluster-key-file",
            )
        try:
            return await run(AuthStore(self.meta, self.cipher))
        except AuthModelError as e:
            raise invalid(str(e)) from None
        except AuthConflictError as e:
            outcome = Outcome.AUTH_ENTRY_EXISTS if e.exists else Outcome.AUTH_ENTRY_MISSING
            raise Refusal.of(outcome, str(e)) from None

    @rpc_method
    async def CreateUser(
        self, request: adm.CreateUserRequest, context: Context
    ) -> adm.CreateUserResponse:
        async def run(store: AuthStore) -> None:
            u = request.user
            await store.create_user(
                User(
                    u.username,
                    u.secret_key,
                    _enum(UserType, u.user_type, UserType.NORMAL),
                    _enum(UserStatus, u.user_status, UserStatus.ENABLE),
                )
            )

        await self._store(run)
        return adm.CreateUserResponse()

    @rpc_method
    async def UpdateUser(
        self, request: adm.UpdateUserRequest, context: Context
    ) -> adm.UpdateUserResponse:
        async def run(store: AuthStore) -> None:
            u = request.user
            old = await store.get_user(u.username)
            if old is None:
                raise AuthConflictError(f"user {u.username} does not exist", exists=False)
            await store.update_user(
                User(
                    old.username,
                    u.secret_key or old.secret_key,
                    _enum(UserType, u.user_type, old.user_type),
                    _enum(UserStatus, u.user_status, old.status),
                )
            )

        await self._store(run)
        return adm.UpdateUserResponse()

    @rpc_method
    async def DeleteUser(
        self, request: adm.DeleteUserRequest, context: Context
    ) -> adm.DeleteUserResponse:
        await self._store(lambda store: store.delete_user(request.username))
        return adm.DeleteUserResponse()

    @rpc_method
    async def ListUser(
        self, request: adm.ListUserRequest, context: Context
    ) -> adm.ListUserResponse:
        users = await self._store(lambda store: store.list_users())
        return adm.ListUserResponse(users=[user_pb(u) for u in users])

    @rpc_method
    async def CreateAcl(
        self, request: adm.CreateAclRequest, context: Context
    ) -> adm.CreateAclResponse:
        acl = await self._store(
            lambda store: store.create_acl(request.subject, policy_of(request.policy))
        )
        return adm.CreateAclResponse(acl=acl_pb(acl))

    @rpc_method
    async def UpdateAcl(
        self, request: adm.UpdateAclRequest, context: Context
    ) -> adm.UpdateAclResponse:
        acl = await self._store(
            lambda store: store.update_acl(request.subject, policy_of(request.policy))
        )
        return adm.UpdateAclResponse(acl=acl_pb(acl))

    @rpc_method
    async def DeleteAcl(
        self, request: adm.DeleteAclRequest, context: Context
    ) -> adm.DeleteAclResponse:
        await self._store(
            lambda store: store.delete_acl(
                request.subject, [ResourcePattern(r) for r in request.resources]
            )
        )
        return adm.DeleteAclResponse()

    @rpc_method
    async def ListAcl(self, request: adm.ListAclRequest, context: Context) -> adm.ListAclResponse:
        async def run(store: AuthStore) -> list[Acl]:
            if request.subject:
                one = await store.get_acl(request.subject)
                return [] if one is None else [one]
            return await store.list_acls()

        return adm.ListAclResponse(acls=[acl_pb(a) for a in await self._store(run)])


def _enum(kind: Any, text: str, default: Any) -> Any:
    """``text`` as a member of ``kind`` (empty: ``default``); AuthModelError if not one."""
    return parse_enum(kind, text) if text else default
