"""Users and ACLs on etcd (``/basalt/<cluster>/users/<name>``, ``acls/<name>``).

:class:`AuthStore` is what the admin verbs write through: straight to etcd,
MetaUnavailableError when it does not answer (a user or an ACL is never
believed stored when it was not). :class:`AuthCache` is what a server's
interceptor reads: two watched caches that keep serving their last state
while etcd is unreachable, so known users and their ACLs keep deciding and
an unknown user stays unknown (fail closed).

ACL verbs follow mqadmin's: ``createAcl`` adds an entry to a subject's ACL,
``updateAcl`` replaces the entries naming the same resources, ``deleteAcl``
drops the entries naming the given resources (none given: the whole ACL).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from basalt.services.auth.cipher import SecretCipher
from basalt.services.auth.model import (
    Acl,
    AuthModelError,
    Policy,
    ResourcePattern,
    User,
    check_username,
)
from basalt.services.meta import MetaClient, MetaValidationError
from basalt.services.meta.watch import MetaWatcher

log = logging.getLogger(__name__)

USERS = "users"
ACLS = "acls"


class AuthConflictError(Exception):
    """A create of what exists (``exists``), or an update or delete of what
    does not (``exists`` False)."""

    def __init__(self, message: str, *, exists: bool) -> None:
        super().__init__(message)
        self.exists = exists


def _username(subject: str) -> str:
    return subject.partition(":")[2]


class AuthStore:
    """The users and ACLs of ``meta``'s cluster; secrets sealed with ``cipher``."""

    def __init__(self, meta: MetaClient, cipher: SecretCipher) -> None:
        self._meta = meta
        self._cipher = cipher

    # -- users -------------------------------------------------------------------------

    async def create_user(self, user: User) -> None:
        """Raises AuthConflictError when the user exists."""
        raw = user.to_json(self._cipher.seal(user.secret_key))
        if not await self._meta.put_auth(USERS, user.username, raw, create=True):
            raise AuthConflictError(f"user {user.username} exists", exists=True)

    async def update_user(self, user: User) -> None:
        """Replace a user; AuthConflictError when there is none."""
        raw = user.to_json(self._cipher.seal(user.secret_key))
        if not await self._meta.put_auth(USERS, user.username, raw, create=False):
            raise AuthConflictError(f"user {user.username} does not exist", exists=False)

    async def get_user(self, username: str) -> User | None:
        """The user, None when there is none. AuthModelError for a malformed name."""
        check_username(username)
        raw = await self._meta.get_auth(USERS, username)
        return None if raw is None else self._user(raw)

    async def delete_user(self, username: str) -> None:
        """Delete a user and its ACL; AuthConflictError when there is no user,
        AuthModelError for a malformed name."""
        check_username(username)
        if not await self._meta.delete_auth(USERS, username):
            raise AuthConflictError(f"user {username} does not exist", exists=False)
        await self._meta.delete_auth(ACLS, username)

    async def list_users(self) -> list[User]:
        raws = await self._meta.list_auth(USERS)
        return [self._user(raws[name]) for name in sorted(raws)]

    def _user(self, raw: bytes) -> User:
        return User.from_json(raw, self._cipher.open(User.sealed_secret(raw)))

    # -- ACLs --------------------------------------------------------------------------

    async def get_acl(self, subject: str) -> Acl | None:
        raw = await self._meta.get_auth(ACLS, _username(Acl(subject, ()).subject))
        return None if raw is None else Acl.from_json(raw)

    async def create_acl(self, subject: str, policy: Policy) -> Acl:
        """Add ``policy`` to the subject's ACL (made if absent); AuthConflictError
        when an entry already names one of its resources (use update)."""
        acl = await self.get_acl(subject)
        if acl is None:
            acl = Acl(subject, (policy,))
            if not await self._meta.put_auth(ACLS, _username(subject), acl.to_json(), create=True):
                raise AuthConflictError(
                    f"ACL of {subject} was created concurrently; retry", exists=True
                )
            return acl
        if any(set(p.resources) & set(policy.resources) for p in acl.policies):
            raise AuthConflictError(
                f"{subject} already has an entry for {_texts(policy.resources)}", exists=True
            )
        return await self._replace(Acl(subject, (*acl.policies, policy)))

    async def update_acl(self, subject: str, policy: Policy) -> Acl:
        """Replace the entries naming ``policy``'s resources; AuthConflictError when
        the subject has no ACL."""
        acl = await self._existing(subject)
        return await self._replace(
            Acl(subject, (*_without(acl.policies, policy.resources), policy))
        )

    async def delete_acl(self, subject: str, resources: Sequence[ResourcePattern] = ()) -> None:
        """Drop the entries naming ``resources`` (none: the whole ACL)."""
        acl = await self._existing(subject)
        kept = _without(acl.policies, resources) if resources else ()
        if kept:
            await self._replace(Acl(subject, kept))
        else:
            await self._meta.delete_auth(ACLS, _username(subject))

    async def list_acls(self) -> list[Acl]:
        raws = await self._meta.list_auth(ACLS)
        return [Acl.from_json(raws[name]) for name in sorted(raws)]

    async def _existing(self, subject: str) -> Acl:
        acl = await self.get_acl(subject)
        if acl is None:
            raise AuthConflictError(f"{subject} has no ACL", exists=False)
        return acl

    async def _replace(self, acl: Acl) -> Acl:
        if not await self._meta.put_auth(ACLS, _username(acl.subject), acl.to_json(), create=False):
            raise AuthConflictError(f"ACL of {acl.subject} was deleted concurrently", exists=False)
        return acl


def _without(
    policies: Sequence[Policy], resources: Sequence[ResourcePattern]
) -> tuple[Policy, ...]:
    gone = set(resources)
    out = []
    for p in policies:
        left = tuple(r for r in p.resources if r not in gone)
        if left:
            out.append(Policy(left, p.actions, p.decision, p.source_ips))
    return tuple(out)


def _texts(resources: Sequence[ResourcePattern]) -> str:
    return ", ".join(r.text for r in resources)


class AuthCache:
    """Watched users (secrets opened) and ACLs of one cluster, for verifiers.
    Reads never raise and serve the last known state through etcd outages."""

    def __init__(self, meta: MetaClient, cipher: SecretCipher) -> None:
        def user(name: str, raw: bytes) -> User:
            try:
                return User.from_json(raw, cipher.open(User.sealed_secret(raw)))
            except AuthModelError as e:
                raise MetaValidationError(str(e)) from None

        def acl(name: str, raw: bytes) -> Acl:
            try:
                return Acl.from_json(raw)
            except AuthModelError as e:
                raise MetaValidationError(str(e)) from None

        self.users: MetaWatcher[User] = meta.auth_cache(USERS, user)
        self.acls: MetaWatcher[Acl] = meta.auth_cache(ACLS, acl)

    async def start(self) -> None:
        """Start both watchers, waiting for their first listing (MetaUnavailableError
        past the etcd timeout; they keep trying)."""
        await self.users.start()
        await self.acls.start()

    def user(self, username: str) -> User | None:
        return self.users.get(username)

    def acl(self, username: str) -> Acl | None:
        return self.acls.get(username)
