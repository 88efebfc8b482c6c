"""Secret keys at rest: encrypted with the cluster key, never hashed.

The signature is HMAC-SHA1 keyed by the user's secret, so the verifier must
hold the secret itself: a one-way hash (as for passwords) could not check it.
etcd therefore stores each secret sealed with Fernet (AES-128-CBC plus
HMAC-SHA256, from PyPI ``cryptography``) under a cluster key that lives in a
file (a Kubernetes Secret, or ``basalt cluster up --auth``'s data dir), never in
etcd: a copy of etcd alone reveals no secret.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from basalt.services.auth.model import AuthModelError


def new_cluster_key() -> bytes:
    """A fresh cluster key (url-safe base64 text, the key file's content)."""
    return Fernet.generate_key()


class SecretCipher:
    """Seals and opens secret keys with one cluster key."""

    def __init__(self, key: bytes) -> None:
        try:
            self._fernet = Fernet(key.strip())
        except ValueError:
            raise AuthModelError(
                "the cluster key is not a Fernet key (32 url-safe base64 bytes)"
            ) from None

    @classmethod
    def from_file(cls, path: str | Path) -> SecretCipher:
        """Raises OSError when unreadable, AuthModelError when malformed."""
        return cls(Path(path).read_bytes())

    def seal(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode()).decode()

    def open(self, sealed: str) -> str:
        """Raises AuthModelError when ``sealed`` was not made with this key."""
        try:
            return self._fernet.decrypt(sealed.encode()).decode()
        except InvalidToken:
            raise AuthModelError("secret sealed with another cluster key") from None
