"""``basalt admin <verb>`` for users and ACLs, in mqadmin's names (ACL 2.0)::

    basalt admin createUser -u NAME -p SECRET [--user-type Super|Normal]
    basalt admin updateUser -u NAME [-p SECRET] [--user-type T] [--user-status Enable|Disable]
    basalt admin deleteUser -u NAME
    basalt admin listUser
    basalt admin createAcl -s User:NAME -r Topic:orders [-r Group:g ...] -a Pub [-a Sub ...]
                           [-d Allow|Deny] [-i 10.0.0.0/8 ...]
    basalt admin updateAcl   (the same flags)
    basalt admin deleteAcl -s User:NAME [-r RESOURCE ...]
    basalt admin listAcl [-s User:NAME]

They always go through the admin service (``--server HOST:PORT``; default:
the local cluster's), which holds the cluster key that seals secrets, and
are signed with ``--credentials FILE`` (default: env ``BASALT_CREDENTIALS``,
else the local cluster's admin user). ``listUser`` never prints a secret.
Exit status 0, 1 when the service refused (its reason on stderr), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import IO, Any

import grpc

from basalt.common import auth, dial
from basalt.common.local_cluster import (
    CREDENTIALS_HELP,
    ClusterNotFoundError,
    discover,
    discover_credentials,
    discover_tls,
)
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import admin_pb2_grpc as adm_grpc

EXIT_FAILED = 1
EXIT_USAGE = 2

Table = tuple[list[str], list[list[Any]]]
#: A verb's call through the admin service (the async stub is a stub-file type only).
Call = Callable[["adm_grpc.AdminAsyncStub", argparse.Namespace], Coroutine[Any, Any, Table]]

_DONE: Table = (["result"], [["OK"]])


def _policy(a: argparse.Namespace) -> adm.AclPolicy:
    return adm.AclPolicy(
        resources=a.resource, actions=a.action, decision=a.decision, source_ips=a.source_ip or ()
    )


def _acl_rows(acls: Any) -> Table:
    rows = [
        [
            acl.subject,
            ",".join(p.resources),
            ",".join(p.actions),
            p.decision,
            ",".join(p.source_ips) or "*",
        ]
        for acl in acls
        for p in acl.policies
    ]
    return ["subject", "resources", "actions", "decision", "source_ips"], rows


def _user(a: argparse.Namespace) -> adm.UserInfo:
    return adm.UserInfo(
        username=a.username,
        secret_key=a.password or "",
        user_type=a.user_type or "",
        user_status=getattr(a, "user_status", None) or "",
    )


async def _create_user(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    await stub.CreateUser(adm.CreateUserRequest(user=_user(a)))
    return _DONE


async def _update_user(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    await stub.UpdateUser(adm.UpdateUserRequest(user=_user(a)))
    return _DONE


async def _delete_user(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    await stub.DeleteUser(adm.DeleteUserRequest(username=a.username))
    return _DONE


async def _list_user(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    answer = await stub.ListUser(adm.ListUserRequest())
    return ["username", "user_type", "user_status"], [
        [u.username, u.user_type, u.user_status] for u in answer.users
    ]


async def _create_acl(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    answer = await stub.CreateAcl(adm.CreateAclRequest(subject=a.subject, policy=_policy(a)))
    return _acl_rows([answer.acl])


async def _update_acl(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    answer = await stub.UpdateAcl(adm.UpdateAclRequest(subject=a.subject, policy=_policy(a)))
    return _acl_rows([answer.acl])


async def _delete_acl(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    await stub.DeleteAcl(adm.DeleteAclRequest(subject=a.subject, resources=a.resource or ()))
    return _DONE


async def _list_acl(stub: adm_grpc.AdminAsyncStub, a: argparse.Namespace) -> Table:
    answer = await stub.ListAcl(adm.ListAclRequest(subject=a.subject or ""))
    return _acl_rows(answer.acls)


def _user_flags(
    required_secret: bool, with_status: bool
) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("-u", "--username", required=True, help="the user's access key")
        p.add_argument("-p", "--password", required=required_secret, help="the secret key")
        p.add_argument("--user-type", choices=["Super", "Normal"])
        if with_status:
            p.add_argument("--user-status", choices=["Enable", "Disable"])

    return add


def _acl_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-s", "--subject", required=True, help="User:<name>")
    p.add_argument(
        "-r",
        "--resource",
        action="append",
        required=True,
        help="Topic:x, Group:x, Cluster, * (repeat)",
    )
    p.add_argument(
        "-a",
        "--action",
        action="append",
        required=True,
        help="Pub Sub Create Update Delete Get List All (repeat)",
    )
    p.add_argument("-d", "--decision", default="Allow", choices=["Allow", "Deny"])
    p.add_argument("-i", "--source-ip", action="append", help="an address or CIDR (repeat)")


#: verb -> (help, argument adder, call)
VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], object], Call]] = {
    "createUser": (
        "create a user (access key and secret key)",
        _user_flags(True, False),
        _create_user,
    ),
    "updateUser": (
        "change a user's secret, type or status",
        _user_flags(False, True),
        _update_user,
    ),
    "deleteUser": (
        "delete a user and its ACL",
        lambda p: p.add_argument("-u", "--username", required=True),
        _delete_user,
    ),
    "listUser": ("every user (never a secret)", lambda p: None, _list_user),
    "createAcl": ("add an ACL entry for a subject", _acl_flags, _create_acl),
    "updateAcl": ("replace a subject's entries for these resources", _acl_flags, _update_acl),
    "deleteAcl": (
        "drop a subject's entries for these resources (none: every entry)",
        lambda p: (
            p.add_argument("-s", "--subject", required=True, help="User:<name>"),
            p.add_argument("-r", "--resource", action="append"),
        ),
        _delete_acl,
    ),
    "listAcl": (
        "every ACL, or one subject's",
        lambda p: p.add_argument("-s", "--subject", help="User:<name>"),
        _list_acl,
    ),
}


def add_commands(verbs: Any, *, format_table: Callable[[list[str], list[list[Any]]], str]) -> None:
    """Add the user and ACL verbs to ``basalt admin``'s sub-parsers ``verbs``."""
    for name, (help_text, add_arguments, call) in VERBS.items():
        sub = verbs.add_parser(name, help=help_text, description=help_text)
        add_arguments(sub)
        add_credentials_flag(sub)
        sub.add_argument(
            "--server", metavar="HOST:PORT", help="the admin service (default: the local cluster's)"
        )
        sub.add_argument("--json", action="store_true", help="one JSON document")
        sub.set_defaults(handler=_handler(call, format_table))


def add_credentials_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--credentials", metavar="FILE", help=CREDENTIALS_HELP)


def use_credentials(args: argparse.Namespace) -> None:
    """Sign this command's calls with :func:`basalt.common.local_cluster.discover_credentials`'s.
    Raises OSError, ValueError for a named file that cannot be read."""
    auth.use_process_credentials(discover_credentials(args.credentials))


def _handler(
    call: Call, format_table: Callable[[list[str], list[list[Any]]], str]
) -> Callable[[argparse.Namespace, IO[str], IO[str]], int]:
    def run(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
        try:
            address = discover("admin", flag="--server", given=args.server)
            use_credentials(args)
        except (ClusterNotFoundError, OSError, ValueError) as e:
            print(f"basalt admin {args.verb}: {e}", file=stderr)
            return EXIT_USAGE
        try:
            header, rows = asyncio.run(_through(address, args, call))
        except grpc.aio.AioRpcError as e:
            print(f"basalt admin {args.verb}: {e.code().name}: {e.details()}", file=stderr)
            return EXIT_FAILED
        if args.json:
            json.dump([dict(zip(header, row, strict=True)) for row in rows], stdout, indent=2)
            stdout.write("\n")
        else:
            stdout.write(format_table(header, rows))
        return 0

    return run


async def _through(address: str, args: argparse.Namespace, call: Call) -> Table:
    async with dial.channel(address, discover_tls()) as channel:
        return await call(adm_grpc.AdminStub(channel), args)  # type: ignore[arg-type]
