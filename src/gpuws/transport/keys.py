"""The keys ``ssh`` would offer for a target, in its order: the agent's, then files.

An ``IdentityFile`` counts by its public half (``key.pub``, or the file itself when it
is a public key), so ``IdentitiesOnly`` with a ``.pub`` file selects that key in the
agent (1Password, Secretive, a YubiKey), and a key file missing on disk is no obstacle
while the agent holds the key. ``CertificateFile`` certificates are paired with the key
they certify, in the agent or on disk. A key with a passphrase that is not in the agent
is skipped (gpuws cannot ask for it) and named if authentication fails.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import asyncssh

from .sshconfig import SSHTarget


@dataclass
class OfferedKeys:
    """What authentication will try.

    Attributes:
        keys: agent keys first, then keys loaded from files (none twice).
        agent: the agent connection the agent keys sign through; close it after login.
        from_agent: how many of ``keys`` the agent holds.
        skipped: key files (or the agent) that could not be used, and why.
    """

    keys: list[asyncssh.SSHKeyPair] = field(default_factory=list)
    agent: asyncssh.SSHAgentClient | None = None
    from_agent: int = 0
    skipped: list[str] = field(default_factory=list)

    async def close(self) -> None:
        """Close the agent connection (login is over: no more signatures needed)."""
        if self.agent is not None:
            self.agent.close()
            with contextlib.suppress(Exception):
                await self.agent.wait_closed()
            self.agent = None


async def offered_keys(t: SSHTarget) -> OfferedKeys:
    """The keys for ``t`` (see the module notes)."""
    offered = OfferedKeys()
    certs: list[asyncssh.SSHCertificate] = []
    for path in t.certificate_files:
        with contextlib.suppress(OSError, asyncssh.KeyImportError):
            certs.append(asyncssh.read_certificate(path))
    identities: list[bytes] = []
    files: list[asyncssh.SSHKeyPair] = []
    for path in t.identity_files:
        public = _public_half(path)
        if public is not None and public.public_data not in identities:
            identities.append(public.public_data)
        if not os.path.isfile(path) or _is_public(path):
            continue
        try:
            loaded = asyncssh.load_keypairs([path], certlist=certs, ignore_encrypted=True)
        except (OSError, asyncssh.KeyImportError, ValueError) as exc:
            offered.skipped.append(f"{path} ({exc})")
            continue
        if not loaded:
            offered.skipped.append(f"{path} (has a passphrase)")
        files.extend(loaded)
    agent_path = (t.identity_agent if t.identity_agent is not None
                  else os.environ.get("SSH_AUTH_SOCK", ""))
    from_agent: list[asyncssh.SSHKeyPair] = []
    # IdentitiesOnly with no identity to name: ssh offers no agent key at all.
    if agent_path and not (t.identities_only and not identities):
        try:
            offered.agent = await asyncssh.connect_agent(agent_path)
            from_agent = list(await offered.agent.get_keys(identities if t.identities_only
                                                           else None))
        except (OSError, ValueError, asyncssh.Error) as exc:
            offered.skipped.append(f"the agent at {agent_path} ({exc})")
            await offered.close()
            from_agent = []
    if t.identities_only:  # in IdentityFile order, as ssh offers them
        from_agent.sort(key=lambda k: identities.index(k.public_data)
                        if k.public_data in identities else len(identities))
    by_key = {c.key.public_data: c for c in certs}
    for key in from_agent:
        cert = by_key.get(key.public_data)
        if cert is not None:
            key.set_certificate(cert)
    held = {k.public_data for k in from_agent}
    offered.from_agent = len(from_agent)
    offered.keys = from_agent + [k for k in files if k.public_data not in held]
    return offered


def _is_public(path: str) -> bool:
    """The file holds no private key (a ``.pub`` file or a certificate named as identity).

    Looked at, not parsed: asyncssh's public-key reader also accepts a private key file.
    """
    try:
        with open(path, "rb") as f:
            return b"PRIVATE KEY" not in f.read(1 << 16)
    except OSError:
        return False


def _public_half(path: str) -> asyncssh.SSHKey | None:
    """The public key an ``IdentityFile`` stands for: ``path.pub``, ``path`` itself when it
    is a public key, or the public half of an unencrypted private key."""
    for candidate in (path + ".pub", path):
        with contextlib.suppress(OSError, asyncssh.KeyImportError, ValueError):
            return asyncssh.read_public_key(candidate)
    with contextlib.suppress(OSError, asyncssh.KeyImportError, ValueError):
        return asyncssh.read_private_key(path).convert_to_public()
    return None
