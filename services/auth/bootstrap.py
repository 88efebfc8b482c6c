"""The files that turn auth on for a cluster: its admin user and its key.

``basalt cluster up --auth`` (and the Helm chart, from a Secret) gives every
service the same two files: the internal super user's credentials, with
which the services sign their calls to each other and the CLI signs its own,
and the cluster key that seals users' secrets in etcd. Made once and kept, so
a cluster started again still opens the secrets it sealed before.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from basalt.common.auth import Credentials
from basalt.common.local_cluster import LOCAL_CLUSTER_KEY, LOCAL_CREDENTIALS
from basalt.services.auth.cipher import new_cluster_key

#: The generated admin user's access key.
ADMIN_USER = "admin"


def ensure_local_auth(data_dir: Path) -> dict[str, str]:
    """Make ``data_dir``'s admin credentials and cluster key where absent (owner
    read-only); returns the environment that turns auth on for a service
    (``BASALT_AUTH_*``, :class:`basalt.services.auth.AuthConfig`)."""
    credentials = data_dir / LOCAL_CREDENTIALS
    key = data_dir / LOCAL_CLUSTER_KEY
    if not credentials.is_file():
        Credentials(ADMIN_USER, secrets.token_urlsafe(24)).to_file(credentials)
    if not key.is_file():
        key.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(new_cluster_key())
    return {
        "BASALT_AUTH_ENABLED": "true",
        "BASALT_AUTH_CREDENTIALS_FILE": str(credentials),
        "BASALT_AUTH_CLUSTER_KEY_FILE": str(key),
    }
